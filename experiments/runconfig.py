"""Experiment configs for ``experiments/run.py``: defaults, ``get_config(arg)`` overrides, validation.

Config files (``configs/*.py``) start from ``base_config()``, set their fields, and finish with
``apply_arg(config, arg)`` so that ``--config=configs/x.py:gamma=2,temperature=1`` works for all of
them. ``validate(config)`` checks everything that can be checked without loading a model, each
failure a ``ConfigError`` with a one-line message; ``resolve_checkpoints`` then finds the model
directories and checks their files and vocabularies (it reads only ``config.json``).

This module must stay light to import (no jax): bad configs are refused in well under a second.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import ml_collections

from experiments import prompts as prompts_lib
from experiments.errors import ConfigError
from experiments.methods import METHODS as METHODS_TABLE
from experiments.methods import (ADAPTIVE_BASES, ADAPTIVE_RULES, ADAPTIVE_SWEEP,
                                 DRAFT_MODEL_BASES, HEAD_SWEEP, NO_DATASTORE,
                                 adaptive_draft_widths, adaptive_menu, adaptive_passes,
                                 parse_head_tree_spec, parse_lookahead_spec, parse_tree_spec,
                                 tree_of)
from specjax import options

# The methods a config may list, and everything about them: experiments/methods.py.
METHODS = tuple(METHODS_TABLE)
COST_RATIO_SOURCES = ("step", "ar")

RANDOM_PREFIX = "random:"
DEFAULT = "default"
# A draft for SmolLM2-135M distilled on this machine on first use (experiments/smollm2_draft.py).
SMOLLM2_DRAFT = "smollm2-draft"
SMOLLM2_VOCAB = 49152
# EAGLE heads: "auto" (SmolLM2's heads, trained on first use, for a SmolLM2 target; an untrained
# head for a random target), a built-in name, or a head directory (sj.load_head).
AUTO = "auto"
SMOLLM2_HEADS = {"eagle_head": "smollm2-eagle", "eagle3_head": "smollm2-eagle3",
                 "medusa_heads": "smollm2-medusa", "hydra_heads": "smollm2-hydra",
                 "mtp_head": "smollm2-mtp"}
DRAFT_VOCABS = ("auto", "full")


def retrieval_methods(config) -> list[str]:
  """The run's datastore methods (REST, SuffixDecoding), the adaptive method's base among them."""
  names = [m for m in config.methods if METHODS_TABLE[m].datastore]
  if "adaptive" in config.methods and METHODS_TABLE[config.adaptive_method].datastore:
    names.append(config.adaptive_method)
  return names


def uses_retrieval(config) -> bool:
  """Whether the run builds an ``sj.Retrieval`` (``retrieval_methods``)."""
  return bool(retrieval_methods(config))


def pass_room(config) -> int:
  """The most tokens any of the run's settings scores in one target pass besides the pending
  one (the cache room a pass needs past the text)."""
  return max([METHODS_TABLE[m].pass_tokens(config, setting(config, m, value))
              for m in config.methods for value in sweep_values(config, m)] + [0])


def sweep_values(config, method: str) -> tuple:
  """The values ``method`` is swept over in ``config`` ((None,) when it sweeps nothing)."""
  sweep = METHODS_TABLE[method].sweep
  if sweep == HEAD_SWEEP:
    return tuple(config.gammas) + tuple(config.head_trees)
  return tuple(config[sweep]) if sweep else (None,)


TYPICAL_METHODS = ("medusa", "hydra")  # the methods head_verify="typical" applies to

def setting(config, method: str, value, temperature: float = 0.0, mesh: str = "") -> dict:
  """One setting: a method at one value of its sweep (``gamma``, or ``tree`` for tree and
  lookahead specs), one temperature and one mesh."""
  sweep = METHODS_TABLE[method].sweep
  if sweep == ADAPTIVE_SWEEP:  # gamma: the largest choice (the cache room, what reports read)
    menu = adaptive_menu(config.adaptive_choices, value)
    drafted = ({"draft_widths": adaptive_draft_widths(config, menu),
                "base_tree": str(config.adaptive_tree)}
               if config.adaptive_method == "tree" else {})  # a draft's tree: its spec, passes
    return dict(method=method, gamma=menu[-1], tree=None, rule=value, choices=menu,
                passes=adaptive_passes(config, config.adaptive_method, menu),
                base=config.adaptive_method, temperature=float(temperature),
                top_k=int(config.top_k), top_p=float(config.top_p), mesh=mesh, **drafted)
  gamma_sweep = sweep == "gammas" or (sweep == HEAD_SWEEP and not isinstance(value, str))
  lossy = method in TYPICAL_METHODS and config.head_verify == "typical" and temperature > 0
  return dict(method=method, gamma=value if gamma_sweep else None,
              tree=None if gamma_sweep else value, temperature=float(temperature),
              top_k=int(config.top_k), top_p=float(config.top_p), mesh=mesh,
              **({"verify": "typical"} if lossy else {}))


def setting_key(s: dict) -> tuple:
  """What tells two settings apart (besides top_k/top_p, fixed per run)."""
  return (s["method"], s["gamma"], s.get("tree"), s["temperature"], s.get("mesh", ""),
          s.get("rule"))


def setting_label(s: dict) -> str:
  g = f" {s['rule']} g={s['gamma']}" if s.get("rule") else (
      f" g={s['gamma']}" if s["gamma"] is not None else "")
  tree = f" {s['tree']}" if s.get("tree") else ""
  mesh = f" mesh={s['mesh']}" if s.get("mesh") else ""
  lossy = " typical(LOSSY)" if s.get("verify") == "typical" else ""
  return f"{s['method']}{g}{tree}{lossy}{mesh} T={s['temperature']:g}"


def base_config() -> ml_collections.ConfigDict:
  """Every field ``run.py`` reads, with its default."""
  c = ml_collections.ConfigDict()
  c.name = "experiment"
  # Models: "default" (the embedded pair, trained on first use), a local HF checkpoint directory,
  # or "random:<name>" (tiny random models built in-process; see experiments/random_models.py).
  c.target = DEFAULT
  c.draft = DEFAULT  # also "smollm2-draft": SmolLM2's distilled draft (trained on first use)
  # "auto": a draft with a reduced-vocabulary head (reduced_vocab.VOCAB_FILE) decodes through it
  # (q = 0 outside its ids: lossless, cheaper; hf_assisted: the full head); "full": whole head.
  c.draft_vocab = "auto"
  c.dtype = "float32"
  c.tokenizer = ""  # "" -> the target's directory (or bytes for random models); "bytes"; a dir
  # Prompts: a built-in set (experiments/prompts.py) or a file (.txt one per line, .jsonl, .json).
  c.prompts = "python"
  c.num_prompts = 0  # 0 = all
  c.max_prompt_tokens = 64  # longer prompts keep their last tokens
  c.add_bos = True  # prepend the tokenizer's BOS (the default pair's document separator)
  # Wrap each prompt as a user message in the tokenizer's chat template (instruction-tuned models
  # such as SmolLM2-135M-Instruct); the template supplies its own special tokens (add_bos unused).
  c.chat_template = False
  # Methods and sweeps.
  c.methods = ("autoregressive", "speculative")
  c.gammas = (1, 2, 3, 4, 6)
  c.skip = ()  # the layers self_speculative's draft leaves out (experiments/search_skip.py)
  # Method "adaptive" (sj.Adaptive): a draft length per iteration from the menu adaptive_choices
  # (0 = plain decoding) over adaptive_method (speculative, self_speculative, prompt_lookup,
  # jacobi; retrieval / suffix, entry k their tree cut to depth k: retrieval_branches nodes a
  # level within retrieval_nodes; tree, below), one setting per rule of adaptive_rules: "cost"
  # (the run's measured cost table), "schedule" (HF's +2/-1), "confidence" (draft-model bases:
  # the draft stops below adaptive_threshold; menu 1..max); opt-in "checked": correct=True.
  c.adaptive_method = "speculative"
  # adaptive_method "tree": the draft's tree (a spec as in config.trees) cut to each depth of
  # the menu (a dynamic tree's nodes prorated by depth; SpecTr's chains that long)
  c.adaptive_tree = "dynamic:6x4x24"
  c.adaptive_choices = (0, 1, 2, 3, 4, 6)
  c.adaptive_rules = options.ADAPTIVE_RULES  # not "checked"
  for name, value in options.ADAPTIVE_DEFAULTS.items():  # sj.Adaptive's own defaults
    c[f"adaptive_{name}"] = value
  c.adaptive_drift = options.ADAPTIVE_DRIFTS[0]  # untested positions drift toward: first / prior
  # The cost rule's timed calls start from its warm-up's estimates (sj.Adaptive.warmed), not
  c.adaptive_warm = True  # adaptive_prior; results.json records each setting's "prior"
  # > 0: the cost rule's table priced by its own loop (sj.Adaptive.calibrated: this many repeats
  c.adaptive_calibration = 3  # on the first batch; docs/benchmarks.md, session 44); 0: bare
  # sj.Adaptive(probe_every=): a timed call priced plain runs a cycle of this many, the draft
  c.adaptive_probe_every = 4  # skipped in all but the last (the probe; cost rules); 0: off
  c.max_ngram = 3  # prompt_lookup: the longest n-gram looked up in the row's own text
  # Token trees and multi-draft methods run by method "tree", one setting per spec
  # (parse_tree_spec): full:DxB, chains:NxD, comb:DxW, dynamic:DxWxN (EAGLE-2), spectr:KxL
  # (SpecTr K-SEQ), naive:KxL (SpecInfer's rule on SpecTr's drafts); a static tree may add how
  # its children are drawn: full:3x2:top_k (default sampled; or iid).
  c.trees = ()
  # Lookahead decoding (method "lookahead"), one setting per WxNxG spec: window columns x n-gram
  # size x guesses verified per pass (parse_lookahead_spec), e.g. ("5x3x5", "7x4x7").
  c.lookahead = ()
  # EAGLE heads (methods "eagle", "eagle3"): each runs every gamma as a chain and every
  # head_trees spec (full:DxB, chains:NxD, comb:DxW with an optional children suffix, or
  # dynamic:DxWxN) as a tree. eagle_head / eagle3_head: "auto" (for SmolLM2 its heads, trained
  # on first use: smollm2-eagle, smollm2-eagle3; for a random target an untrained head), one of
  # those names, or a head directory (sj.load_head: the EAGLE repository's layout). Medusa
  # (method "medusa") and Hydra (method "hydra") the same with medusa_heads / hydra_heads
  # (smollm2-medusa, smollm2-hydra; their repositories' layouts), static head_trees only and
  # gammas up to the number of heads. A DeepSeek-V3 MTP module (method "mtp", sj.MTP) the same
  # as EAGLE with mtp_head (smollm2-mtp, or a checkpoint directory with num_nextn_predict_layers).
  c.head_trees = ()
  c.eagle_head = AUTO
  c.eagle3_head = AUTO
  c.medusa_heads = AUTO
  # Methods medusa / hydra at T > 0: "exact" (the lossless tree and chain rules) or "typical"
  # (Medusa's typical acceptance, epsilon 0.09, delta 0.3: LOSSY, labelled so in the report).
  c.head_verify = "exact"
  c.hydra_heads = AUTO
  c.mtp_head = AUTO
  # Retrieval (method "retrieval", REST: sj.Retrieval; method "suffix", SuffixDecoding: the same
  # with per_request=True, each row's own text beside the datastore), swept over gammas
  # (num_tokens). datastore: a directory written by experiments/build_datastore.py; "" = the
  # Python stdlib's sources (datastore_bytes of them) tokenized with the target's tokenizer, built
  # on first use; "none" (method "suffix" only) = the rows' own text alone.
  c.datastore = ""
  c.datastore_bytes = 4_000_000
  c.retrieval_nodes = 16  # tokens verified per pass (>= every gamma)
  c.retrieval_branches = 4  # children per node at most
  c.max_suffix = 12  # the longest suffix of the text looked up
  c.max_spec_factor = 1.0  # "suffix": tree depth <= this x the match length (0 = no cap)
  # Sampling: every method runs at every temperature (0 = greedy); top_k / top_p apply to all.
  c.temperatures = (0.0, 1.0)
  c.top_k = 0
  c.top_p = 1.0
  c.batch_size = 4
  c.max_new_tokens = 64
  c.stop_at_eos = False  # False: every row generates exactly max_new_tokens (cleaner timing)
  c.repeats = 3
  c.seed = 0
  # The draft/target cost ratio c (Leviathan et al.): "step" times draft against target steps in
  # a jitted loop (as decoding runs them) at the run's batch; "ar": draft-alone vs target-alone
  # autoregressive tokens/s (needs "draft_autoregressive" in methods); cost_ratio > 0: this.
  c.cost_ratio_source = "step"
  c.cost_ratio = 0.0
  c.output_dir = "runs/experiment"
  c.plots = True
  c.progress = True  # tqdm progress bars (stderr)
  c.sample_prompt = 0  # index of the prompt whose greedy continuations are printed
  c.dry_run = False  # validate and print the plan, load nothing
  # Devices (specjax.sharding): every setting runs once per entry of meshes, "" = one device,
  # "DxM" = a mesh of D data-parallel x M tensor-parallel devices (of every process); the report
  # gives each sharded row's tokens/s over one device's and the loop's memory per device. The
  # draft is split like the target ("rules") or whole on every model-axis device ("replicated").
  c.meshes = ("",)
  c.draft_sharding = "rules"
  # > 0: run on this many host (CPU) devices, as XLA_FLAGS=--xla_force_host_platform_device_count
  # would (set before JAX starts; per process in a multi-host run).
  c.cpu_devices = 0
  c.profile_dir = ""  # "": no trace; else one jax.profiler trace of one call of every setting
  return c


# ------------------------------------------------------------------------------- get_config(arg)

_ALIASES = {"gamma": "gammas", "temperature": "temperatures", "method": "methods",
            "batch": "batch_size", "out": "output_dir", "n": "max_new_tokens"}


def _parse_scalar(text: str, like: Any, key: str):
  try:
    if isinstance(like, bool):
      if text.lower() in ("1", "true", "yes"):
        return True
      if text.lower() in ("0", "false", "no"):
        return False
      raise ValueError
    if isinstance(like, int):
      return int(text)
    if isinstance(like, float):
      return float(text)
  except ValueError:
    raise ConfigError(f"config arg {key}={text!r}: expected a {type(like).__name__}") from None
  return text


def _parse_item(text: str):
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def apply_arg(config: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
  """Applies ``key=value,key=value`` from the config-file argument (after the ``:``).

  Sweep fields take several values separated by ``/`` or ``+``: ``gammas=1/2/4``; singular
  aliases set a one-element sweep: ``gamma=2``, ``temperature=1``, ``method=speculative``.
  """
  if not arg:
    return config
  for part in arg.split(","):
    part = part.strip()
    if not part:
      continue
    if "=" not in part:
      raise ConfigError(f"config arg {part!r} is not key=value (e.g. gamma=2,temperature=1)")
    key, value = (s.strip() for s in part.split("=", 1))
    key = _ALIASES.get(key, key)
    if key not in config:
      raise ConfigError(f"unknown config field {key!r} in config arg {arg!r}; fields: "
                        f"{', '.join(sorted(config.keys()))}")
    current = config[key]
    if isinstance(current, (tuple, list)):
      items = [v for v in value.replace("+", "/").split("/") if v != ""]
      config[key] = tuple(_parse_item(v) for v in items)
    else:
      config[key] = _parse_scalar(value, current, key)
  return config


# ----------------------------------------------------------------------------------- validation


def parse_mesh_spec(spec: str) -> tuple[int, int] | None:
  """``"2x4"`` -> ``(data, model)`` = ``(2, 4)``; ``""`` -> None (one device)."""
  if spec == "":
    return None
  try:
    sizes = tuple(int(x) for x in str(spec).split("x"))
  except ValueError:
    sizes = ()
  if len(sizes) != 2 or min(sizes) < 1:
    raise ConfigError(f"mesh spec {spec!r}: expected DxM (data x model devices, e.g. 2x4) or '' "
                      f"(one device)")
  return sizes


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _check_int(config, name: str, minimum: int) -> None:
  value = config[name]
  if not _is_int(value) or value < minimum:
    raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


def validate(config) -> None:
  """Checks every field that needs no model; raises ``ConfigError`` (one line) on the first bad one.

  Also normalises ``methods``: ``--config.methods=autoregressive,speculative`` reaches us as one
  string (ml_collections' tuple parser keeps unquoted words whole), so items are split on commas.
  """
  raw = config.methods if isinstance(config.methods, (tuple, list)) else (config.methods,)
  methods = tuple(p.strip() for m in raw for p in str(m).replace("/", ",").split(",") if p.strip())
  if methods != tuple(config.methods):
    config.methods = methods
  if not methods:
    raise ConfigError("methods is empty; give at least one of: " + ", ".join(METHODS))
  for m in methods:
    if m not in METHODS:
      raise ConfigError(f"unknown method {m!r}; known methods: {', '.join(METHODS)}")
  if len(set(methods)) != len(methods):
    raise ConfigError(f"methods lists a method twice: {list(methods)}")
  table = {m: METHODS_TABLE[m] for m in methods}
  if any(t.sweep in ("gammas", HEAD_SWEEP) for t in table.values()):
    if not tuple(config.gammas):
      raise ConfigError("gammas is empty, but speculative methods need at least one gamma")
  for g in config.gammas:
    if not _is_int(g) or g < 1:
      raise ConfigError(f"gamma must be an integer >= 1, got {g!r}")
  if len(set(config.gammas)) != len(tuple(config.gammas)):
    raise ConfigError(f"gammas lists a value twice: {list(config.gammas)}")
  for field, what, example, parse in (
      ("trees", "tree spec", "('full:3x2', 'spectr:4x4')", parse_tree_spec),
      ("lookahead", "WxNxG spec", "('7x4x7',)", parse_lookahead_spec)):
    specs = tuple(config[field])
    for method in (m for m, t in table.items() if t.sweep == field and not specs):
      raise ConfigError(f"method {method!r} needs at least one {what} in {field} (e.g. "
                        f"{field}={example})")
    for spec in specs:
      parse(spec)
    if len(set(specs)) != len(specs):
      raise ConfigError(f"{field} lists a spec twice: {list(specs)}")
  static_heads = [m for m in config.methods if m in TYPICAL_METHODS]
  for spec in tuple(config.head_trees):
    if parse_head_tree_spec(spec)[0] == "dynamic" and static_heads:
      raise ConfigError(f"head_trees spec {spec!r}: methods {', '.join(static_heads)} draft "
                        f"static trees only (their heads do not rerank per row)")
  if len(set(config.head_trees)) != len(tuple(config.head_trees)):
    raise ConfigError(f"head_trees lists a spec twice: {list(config.head_trees)}")
  _check_int(config, "max_ngram", 1)
  if "adaptive" in methods:
    _check_adaptive(config)
  if uses_retrieval(config):
    for name in ("retrieval_branches", "max_suffix", "datastore_bytes"):
      _check_int(config, name, 1)
    swept = any(t.datastore for t in table.values())  # over gammas, each a tree's depth
    menu = tuple(config.adaptive_choices) if config.adaptive_method in retrieval_methods(
        config) else ()  # an adaptive menu of tree depths
    _check_int(config, "retrieval_nodes", max((*(config.gammas if swept else ()), *menu)))
    factor = config.max_spec_factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 <= factor < 1e9:
      raise ConfigError(f"max_spec_factor must be a number >= 0 (0 = no cap), got {factor!r}")
    if config.datastore == NO_DATASTORE:
      for m in (m for m in retrieval_methods(config) if METHODS_TABLE[m].datastore == "required"):
        raise ConfigError(f"method {m!r} needs a datastore; datastore={NO_DATASTORE!r} only "
                          f"serves method 'suffix' (the rows' own text)")
    elif config.datastore:
      datastore_vocab(config.datastore)
  meshes = tuple(config.meshes)
  if not meshes:
    raise ConfigError("meshes is empty; give at least one ('' = one device, '2x4' = a mesh)")
  for spec in meshes:
    parse_mesh_spec(spec)
  if len(set(meshes)) != len(meshes):
    raise ConfigError(f"meshes lists a mesh twice: {list(meshes)}")
  for m, t in ((m, t) for m, t in table.items() if t.head):
    if not isinstance(config[t.head], str) or not config[t.head]:
      raise ConfigError(f"method {m!r}: {t.head} must be {AUTO!r}, {SMOLLM2_HEADS[t.head]!r} or "
                        f"a head directory, got {config[t.head]!r}")
    if any(meshes):
      raise ConfigError(f"method {m!r} runs on one device in the runner (sj.generate(mesh=) "
                        f"shards EAGLE heads from Python): drop it or the meshes")
  hf_methods = [m for m, t in table.items() if t.hf]
  if hf_methods and any(meshes):
    raise ConfigError("hf_* methods run transformers on one device: drop them or the meshes")
  if config.head_verify not in ("exact", "typical"):
    raise ConfigError(f"head_verify must be 'exact' or 'typical', got {config.head_verify!r}")
  if config.draft_sharding not in options.DRAFT_SHARDINGS:
    raise ConfigError(f"draft_sharding must be one of {', '.join(options.DRAFT_SHARDINGS)}, got "
                      f"{config.draft_sharding!r}")
  _check_int(config, "cpu_devices", 0)
  skip = tuple(config.skip)
  for i in skip:
    if not _is_int(i) or i < 0:
      raise ConfigError(f"skip must list layer indices >= 0, got {i!r}")
  if len(set(skip)) != len(skip):
    raise ConfigError(f"skip lists a layer twice: {list(skip)}")
  temps = tuple(config.temperatures)
  if not temps:
    raise ConfigError("temperatures is empty; give at least one (0 = greedy)")
  for t in temps:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
      raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
  if len(set(float(t) for t in temps)) != len(temps):
    raise ConfigError(f"temperatures lists a value twice: {list(temps)}")
  if not _is_int(config.top_k) or config.top_k < 0:
    raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {config.top_k!r}")
  top_p = config.top_p
  if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
    raise ConfigError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
  for name, minimum in (("batch_size", 1), ("max_new_tokens", 1), ("repeats", 1),
                        ("max_prompt_tokens", 1), ("num_prompts", 0), ("sample_prompt", 0),
                        ("seed", 0)):
    _check_int(config, name, minimum)
  if config.draft_vocab not in DRAFT_VOCABS:
    raise ConfigError(f"draft_vocab must be one of {', '.join(DRAFT_VOCABS)}, got "
                      f"{config.draft_vocab!r}")
  if config.target == SMOLLM2_DRAFT:
    raise ConfigError(f"{SMOLLM2_DRAFT!r} is a draft; use it as draft (target smollm2-135m)")
  if config.dtype not in ("float32", "bfloat16"):
    raise ConfigError(f"dtype must be float32 or bfloat16, got {config.dtype!r}")
  if config.cost_ratio_source not in COST_RATIO_SOURCES:
    raise ConfigError(f"cost_ratio_source must be one of {', '.join(COST_RATIO_SOURCES)}, got "
                      f"{config.cost_ratio_source!r}")
  if config.cost_ratio_source == "ar" and config.cost_ratio <= 0 and (
      "draft_autoregressive" not in methods or "autoregressive" not in methods):
    raise ConfigError("cost_ratio_source='ar' needs both 'autoregressive' and "
                      "'draft_autoregressive' in methods")
  if not (isinstance(config.cost_ratio, (int, float)) and math.isfinite(config.cost_ratio)
          and config.cost_ratio >= 0):
    raise ConfigError(f"cost_ratio must be >= 0 (0 = measure it), got {config.cost_ratio!r}")
  if not config.output_dir:
    raise ConfigError("output_dir is empty")
  for m in (m for m, t in table.items() if t.batch_one):
    if config.batch_size != 1:
      raise ConfigError(f"{m} needs batch_size=1 (transformers' assisted generation refuses "
                        f"batches), got batch_size={config.batch_size}")
  if hf_methods:
    import importlib.util
    if importlib.util.find_spec("torch") is None:
      raise ConfigError("hf_* methods need PyTorch, which is not "
                        "installed: pip install torch (or pip install 'specjax[hf]')")
  try:
    prompts_lib.check_source(config.prompts)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if config.tokenizer not in ("", "bytes") and not os.path.isdir(config.tokenizer):
    raise ConfigError(f"tokenizer directory {config.tokenizer!r} does not exist")
  for role in ("target", "draft"):
    spec = config[role]
    if not isinstance(spec, str) or not spec:
      raise ConfigError(f"{role} must be 'default', 'random:<name>' or a checkpoint directory, "
                        f"got {spec!r}")
    if spec.startswith(RANDOM_PREFIX):
      from experiments import random_models  # light: no model is built
      name = spec[len(RANDOM_PREFIX):]
      if name not in random_models.RANDOM_MODELS:
        raise ConfigError(f"{role}: unknown random model {name!r}; known: "
                          f"{', '.join(random_models.RANDOM_MODELS)}")


def _check_adaptive(config) -> None:
  """Method "adaptive"'s fields, as ``sj.Adaptive`` checks them (without importing JAX)."""
  if config.adaptive_method not in ADAPTIVE_BASES:
    raise ConfigError(f"adaptive_method must be one of {', '.join(ADAPTIVE_BASES)}, got "
                      f"{config.adaptive_method!r}")
  try:  # sj.Adaptive's own checks (specjax.options: no JAX), under the config's field names
    options.check_adaptive_menu(list(config.adaptive_choices), "adaptive_choices")
    for name in (f"adaptive_{name}" for name in options.ADAPTIVE_DEFAULTS):
      options.check_unit_number(config[name], name, open_at_zero=name == "adaptive_decay")
    options.check_adaptive_drift(config.adaptive_drift, "adaptive_drift")
    options.check_probe_every(config.adaptive_probe_every, "adaptive_probe_every")
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _check_int(config, "adaptive_calibration", 0)
  rules = tuple(config.adaptive_rules)
  if not rules:
    raise ConfigError(f"adaptive_rules is empty; give at least one of {', '.join(ADAPTIVE_RULES)}")
  unknown = [r for r in rules if r not in ADAPTIVE_RULES]
  if unknown:
    raise ConfigError(f"adaptive_rules: unknown rule {unknown[0]!r}; known: "
                      f"{', '.join(ADAPTIVE_RULES)}")
  if len(set(rules)) != len(rules):
    raise ConfigError(f"adaptive_rules lists a rule twice: {list(rules)}")
  if config.adaptive_method == "tree":
    depth = tree_of(config.adaptive_tree)[0].max_depth  # parse_tree_spec's checks first
    if max(config.adaptive_choices) > depth:
      raise ConfigError(f"adaptive_choices {list(config.adaptive_choices)} go deeper than "
                        f"adaptive_tree {config.adaptive_tree!r} ({depth} levels)")
  if "confidence" in rules and config.adaptive_method not in DRAFT_MODEL_BASES:
    raise ConfigError(f"adaptive rule 'confidence' stops a draft model by its own probabilities; "
                      f"adaptive_method {config.adaptive_method!r} has none (use "
                      f"{' or '.join(DRAFT_MODEL_BASES)}, or drop the rule)")


def datastore_vocab(path: str) -> int:
  """The vocabulary size in a datastore directory's ``datastore.json`` (only that file is read;
  ``specjax.retrieval.Datastore.load`` checks the rest)."""
  file = os.path.join(os.path.expanduser(path), "datastore.json")
  try:
    with open(file) as f:
      vocab = json.load(f).get("vocab_size")
  except (OSError, ValueError, AttributeError) as e:
    raise ConfigError(f"datastore {path} is not a datastore directory ({file}: {e}); build one "
                      f"with python -m experiments.build_datastore --out={path}") from None
  if not _is_int(vocab):
    raise ConfigError(f"datastore {file} has no integer vocab_size")
  return vocab
