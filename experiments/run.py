r"""Speculative-decoding experiments: sweeps, interleaved timing, report with tables and plots.

    python -m experiments.run --config=configs/default.py
    python -m experiments.run --config=configs/leviathan.py:gamma=2,temperature=1
    python -m experiments.run --config=configs/tiny.py --config.output_dir=/tmp/tiny \
        --config.gammas=1,2 --config.repeats=2

A config (``configs/*.py``, fields in ``experiments/runconfig.py``) names the target and draft
checkpoints, the prompts, the methods and the sweeps (gammas, temperatures), batch size, token
budget, repeats and the output directory. The run:

1. validates the config (one line per problem, before anything heavy);
2. loads the models once and tokenizes the prompts;
3. measures the draft/target cost ratio c (one jitted decoding step of each, interleaved);
4. warms up (compiles) every setting (method, gamma, sampling) once, on the first batch (all
   batches share one padded shape), timing it separately;
5. times ``repeats`` passes with the settings *interleaved* batch by batch (AR, spec g=1, spec g=2,
   ..., AR, ...; the starting setting rotates), so machine noise hits all of them alike;
   tokens/s is the median over repeats;
6. prints a table, the greedy continuations of one prompt by AR and speculative decoding, and
   writes ``results.json``, ``report.md`` and PNG plots to ``output_dir``.

Devices: ``config.meshes`` runs every setting on one device ("") and on meshes ("2x4": 2
data-parallel x 4 tensor-parallel devices, ``specjax.sharding``) side by side;
``--multihost`` makes this process one of several (``jax.distributed.initialize``; see
``experiments/launch_local.py``), and process 0 alone writes the report.

``run_experiment(config)`` does the same in-process and returns the results dict.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any

from absl import app, flags
from ml_collections import config_flags

from experiments import prompts as prompts_lib
from experiments import runconfig
from experiments.runconfig import ConfigError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "experiment config file, e.g. configs/default.py[:key=value,...]",
    lock_config=True)
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "one process of a multi-host run: jax.distributed.initialize() (cluster "
    "auto-detection on TPU VMs, SLURM, Open MPI, or the three flags below), then every process "
    "runs the same program over the global mesh; process 0 writes the report")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "multihost: host:port of process 0 (default: auto-detect)")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "multihost: how many processes")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "multihost: this process's index")


def start_jax(config, multihost: bool = False, coordinator_address: str | None = None,
              num_processes: int | None = None, process_id: int | None = None) -> None:
  """Sets what must be set before JAX starts its backends: ``config.cpu_devices`` host devices,
  and (``multihost``) the distributed runtime with CPU collectives over gloo (ignored on
  accelerators)."""
  import jax
  if config.cpu_devices:
    try:
      jax.config.update("jax_num_cpu_devices", int(config.cpu_devices))
    except RuntimeError:
      pass  # JAX has started already: checked below
  if multihost:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  if config.cpu_devices and jax.default_backend() == "cpu" and (
      jax.local_device_count() != int(config.cpu_devices)):
    raise ConfigError(f"cpu_devices={config.cpu_devices}, but JAX has started with "
                      f"{jax.local_device_count()} devices in this process: set it before JAX "
                      f"starts (a fresh process, or "
                      f"XLA_FLAGS=--xla_force_host_platform_device_count={config.cpu_devices})")


def _log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def _one_line(msg: str) -> str:
  return " ".join(str(msg).split())


# ------------------------------------------------------------------------------------- settings


def make_settings(config) -> list[dict]:
  """Every (method, gamma or tree, temperature) to time, in interleaving order
  (temperature-major)."""
  settings = []
  for t in config.temperatures:
    for m in config.methods:
      gammas = tuple(config.gammas) if m in runconfig.GAMMA_METHODS else (None,)
      trees = (tuple(config.trees) if m in runconfig.TREE_METHODS else
               tuple(config.lookahead) if m == "lookahead" else (None,))  # WxNxG specs
      for g in gammas:
        for tree in trees:
          for mesh in (("",) if m in runconfig.HF_METHODS else tuple(config.meshes)):
            settings.append(dict(method=m, gamma=g, tree=tree, temperature=float(t),
                                 top_k=int(config.top_k), top_p=float(config.top_p), mesh=mesh))
  return settings


def setting_key(s: dict) -> tuple:
  """What tells two settings apart (besides top_k/top_p, fixed per run)."""
  return s["method"], s["gamma"], s.get("tree"), s["temperature"], s.get("mesh", "")


def setting_label(s: dict) -> str:
  g = f" g={s['gamma']}" if s["gamma"] is not None else ""
  tree = f" {s['tree']}" if s.get("tree") else ""
  mesh = f" mesh={s['mesh']}" if s.get("mesh") else ""
  return f"{s['method']}{g}{tree}{mesh} T={s['temperature']:g}"


def tree_method(spec: str, draft):
  """(label, method, nodes verified per call) for a tree spec (``runconfig.parse_tree_spec``):
  ``sj.TreeSpeculative`` over a static or dynamic tree, or ``sj.SpecTr`` (K-SEQ / naive)."""
  import specjax as sj
  kind, sizes, children = runconfig.parse_tree_spec(spec)
  if kind in ("spectr", "naive"):
    k, length = sizes
    return (f"spectr {'k_seq' if kind == 'spectr' else 'naive'} K={k} L={length}",
            sj.SpecTr(draft, num_drafts=k, gamma=length,
                      selection="k_seq" if kind == "spectr" else "naive"), k * length)
  if kind == "dynamic":
    tree = sj.DynamicTree(depth=sizes[0], width=sizes[1], nodes=sizes[2])
  elif kind == "full":
    tree = sj.Tree.full(depth=sizes[0], branching=sizes[1])
  elif kind == "chains":
    tree = sj.Tree.chains(num=sizes[0], depth=sizes[1])
  else:  # comb: the draft's top-1 chain of depth D with W - 1 extra leaf siblings per depth
    d, w = sizes
    tree = sj.Tree.from_paths([(0,) * i for i in range(1, d + 1)]
                              + [(0,) * i + (r,) for i in range(d) for r in range(1, w)])
  return (f"tree {spec} ({tree.num_nodes} nodes, depth {tree.max_depth})",
          sj.TreeSpeculative(draft, tree, children=children), tree.num_nodes)


def retrieval_method(config, num_tokens: int, per_request: bool = False):
  """``sj.Retrieval`` over ``config.datastore`` (loaded once per directory; ``resolve_datastore``
  has set it; "none": no datastore) with the config's tree sizes: REST, or with ``per_request``
  SuffixDecoding (the rows' own text too, trees capped at ``max_spec_factor`` x the match)."""
  import specjax as sj
  none = config.datastore == runconfig.NO_DATASTORE
  factor = float(config.max_spec_factor) if per_request and config.max_spec_factor else None
  return sj.Retrieval(None if none else _load_datastore(config.datastore), num_tokens=num_tokens,
                      nodes=int(config.retrieval_nodes), branches=int(config.retrieval_branches),
                      max_suffix=int(config.max_suffix), per_request=per_request,
                      max_spec_factor=factor)


@functools.lru_cache(maxsize=2)
def _load_datastore(path: str):
  import specjax as sj
  t0 = time.perf_counter()
  store = sj.Datastore.load(path)
  _log(f"[run] loaded {store} ({time.perf_counter() - t0:.1f}s)")
  return store


# ---------------------------------------------------------------------------------------- models


class _Models:
  """Loaded models (specjax, and transformers when an hf_* method runs) and the tokenizer."""

  def __init__(self, config, specs: dict, tmpdir: str):
    import specjax as sj
    from experiments import random_models

    self.specs = specs
    self.sj: dict[str, Any] = {}
    seed = int(config.seed)
    for role, spec in specs.items():
      t0 = time.perf_counter()
      if spec.random_name is not None:
        self.sj[role] = random_models.build(spec.random_name, seed=seed)
      elif role == "draft" and config.draft_vocab == "auto":
        from specjax.models.reduced_vocab import load_reduced
        self.sj[role] = load_reduced(spec.path, dtype=config.dtype)
      else:
        self.sj[role] = sj.load_model(spec.path, dtype=config.dtype)
      kept = getattr(self.sj[role], "kept_ids", None)
      _log(f"[run] loaded {role} {spec.spec}: {self.sj[role].config.num_params() / 1e6:.2f}M "
           f"parameters" + (f", a {kept.shape[0]}-token head" if kept is not None else "")
           + f" ({time.perf_counter() - t0:.1f}s)")
    if config.tokenizer == "bytes" or (config.tokenizer == "" and specs["target"].path is None):
      self.tokenizer = random_models.ByteTokenizer()
    else:
      self.tokenizer = sj.load_tokenizer(config.tokenizer or specs["target"].path)
    self.hf: dict[str, Any] = {}
    if any(m in runconfig.HF_METHODS for m in config.methods):
      self._load_hf(config, tmpdir)

  def _load_hf(self, config, tmpdir: str):
    try:
      import torch
      import transformers
    except ImportError as e:  # validate() checked find_spec; this is a broken install
      raise ConfigError(f"hf_* methods need torch and transformers: {e}") from None
    transformers.logging.set_verbosity_error()  # its per-call deprecation chatter
    import specjax as sj
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    for role, spec in self.specs.items():
      path = spec.path
      if path is None:  # a random model: write it as an HF checkpoint first
        path = os.path.join(tmpdir, role)
        sj.save_model(self.sj[role], path)
      if path.lower().endswith(".gguf"):  # transformers dequantizes the same file
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype)
      else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
      self.hf[role] = model.eval()

  def encode(self, texts: list[str], max_tokens: int, add_bos: bool,
             chat: bool = False) -> list[list[int]]:
    """Token ids per prompt, cut to their last ``max_tokens``. ``chat``: each text becomes a user
    message in the tokenizer's chat template, ending where the assistant's reply starts."""
    bos = getattr(self.tokenizer, "bos_token_id", None) if add_bos and not chat else None
    out, cut = [], []
    for text in texts:
      if chat:
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                  tokenize=False, add_generation_prompt=True)
      ids = list(self.tokenizer.encode(text, add_special_tokens=False))
      if bos is not None:
        ids = [int(bos)] + ids
      out.append([int(i) for i in ids[-max_tokens:]])
      if len(ids) > max_tokens:
        cut.append(len(ids))
    if cut:  # said, not silent: a chat prompt loses its template's head, a code prompt its start
      _log(f"[run] {len(cut)} of {len(texts)} prompts ({min(cut)}-{max(cut)} tokens) are longer "
           f"than max_prompt_tokens={max_tokens} and keep their last {max_tokens} tokens")
    return out

  def decode(self, ids) -> str:
    return self.tokenizer.decode([int(i) for i in ids if int(i) >= 0])


# ---------------------------------------------------------------------------------------- timing


def load_pair(target: str, draft: str | None, prompts: str, batch_size: int, prompt_tokens: int,
              gammas, temperature: float, max_new_tokens: int):
  """For the side tools (cost_split, tree_vs_chain, search_skip): the runner's own config checks,
  checkpoint resolution ("default" builds the embedded pair on first use), model loading and
  prompt encoding (BOS included), so that every tool times the same thing. Returns (target, draft,
  prompts, specs), the draft None (not loaded) when ``draft`` is None; raises
  ``runconfig.ConfigError`` with a one-line message."""
  config = runconfig.base_config()
  config.target, config.draft, config.prompts = target, draft or runconfig.DEFAULT, prompts
  if draft is None:
    config.methods = ("autoregressive",)
  config.gammas = tuple(int(g) for g in gammas)
  config.temperatures = (temperature,)
  config.batch_size = batch_size
  config.max_prompt_tokens = prompt_tokens
  config.max_new_tokens = max_new_tokens
  runconfig.validate(config)
  specs = runconfig.resolve_checkpoints(config)
  texts = prompts_lib.load_prompts(prompts)
  if len(texts) < batch_size:
    raise ConfigError(f"--batch_size={batch_size} needs that many prompts; {prompts!r} has "
                      f"{len(texts)}")
  with tempfile.TemporaryDirectory() as tmpdir:
    models = _Models(config, specs, tmpdir)
  encoded = models.encode(texts[:batch_size], prompt_tokens, bool(config.add_bos),
                          bool(config.chat_template))
  return models.sj["target"], models.sj.get("draft"), encoded, specs


def _steps_fn():
  import functools

  import jax
  import jax.numpy as jnp
  from flax import nnx

  @functools.partial(jax.jit, static_argnums=(0, 4), donate_argnums=3)
  def steps(graphdef, state, tokens, cache, k):
    """``k`` forward steps in one ``fori_loop``, each writing at the same cache slots and feeding
    its argmax to the next (a data dependence, as in decoding): per-step cost without dispatch."""
    model = nnx.merge(graphdef, state)
    lengths = cache.lengths

    def body(_, carry):
      tokens, cache = carry
      logits, cache = model(tokens, cache.with_lengths(lengths))
      nxt = jnp.argmax(logits[:, -1], axis=-1).astype(tokens.dtype)
      return jnp.broadcast_to(nxt[:, None], tokens.shape), cache

    tokens, cache = jax.lax.fori_loop(0, k, body, (tokens, cache))
    return tokens, cache

  return steps


def _bare_iterations_fn():
  import functools

  import jax
  import jax.numpy as jnp
  from flax import nnx

  import specjax as sj
  from specjax.proposers import draft_chain

  @functools.partial(jax.jit, static_argnums=(0, 2, 6, 7), donate_argnums=(4, 5))
  def iterations(target_graphdef, target_state, draft_graphdef, draft_state, target_cache,
                 draft_cache, gamma, k):
    """``k`` bare speculative iterations in one ``fori_loop``: the draft proposes ``gamma`` greedy
    tokens (``draft_chain.propose``, the decoding loop's own proposer), then the target runs one
    ``gamma + 1``-token pass, whose last argmax feeds the next iteration; no verification,
    rollback or bookkeeping, and both caches write at the same slots every time. The two models'
    work per iteration as the decoding loop runs it, one after the other."""
    target = nnx.merge(target_graphdef, target_state)
    draft = nnx.merge(draft_graphdef, draft_state)
    batch = target_cache.lengths.shape[0]
    keys = jnp.broadcast_to(jax.random.key(0), (batch, gamma))  # greedy: never drawn from
    t_len, d_len = target_cache.lengths, draft_cache.lengths

    def body(_, carry):
      pending, target_cache, draft_cache = carry
      state = draft_chain.DraftChainState(draft_cache.with_lengths(d_len),
                                          behind=jnp.zeros((batch,), bool),
                                          last_draft=jnp.zeros((batch,), jnp.int32))
      drafts, _, state = draft_chain.propose(draft, state, pending, keys,
                                             sj.Sampling(temperature=0.0), gamma)
      tokens = jnp.concatenate([pending[:, None], drafts], axis=1)
      logits, target_cache = target(tokens, target_cache.with_lengths(t_len))
      pending = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
      return pending, target_cache, state.cache

    return jax.lax.fori_loop(0, k, body, (jnp.ones((batch,), jnp.int32), target_cache,
                                          draft_cache))

  return iterations


def measure_step_costs(models: _Models | dict, batch: int, context: int, cache_length: int,
                       widths=(1,), gammas=(), steps_per_call: int = 16,
                       min_seconds: float = 0.3, max_iters: int = 100) -> dict:
  """Median seconds of one decoding step of each model (``models``: the runner's, or a dict
  ``{"target": ..., "draft": ...}``; target at every width in ``widths``, draft at width 1) at
  ``batch`` rows, with ``context`` tokens already in a cache of ``cache_length`` slots; and, for
  each ``gammas`` entry, of one bare speculative iteration (``_bare_iterations_fn``: gamma draft
  steps, then a gamma + 1 token target pass).

  Each call runs ``steps_per_call`` steps inside one jitted ``fori_loop``, as the decoding loop
  does, so the per-call dispatch cost (which dwarfs a tiny draft's step when timed one jitted call
  at a time, and so overstated c) is spread over the steps. The calls alternate between the jobs
  so noise hits all alike. A bare iteration can cost more than gamma draft steps plus a
  verification pass timed apart (the default pair on a 2-core CPU at gamma 1: 1.77 target steps
  against c + v = 1.31): run in turn, the two models share caches and threads."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from specjax.models.kv_cache import init_cache

  steps, iterations = _steps_fn(), _bare_iterations_fn()
  k = int(steps_per_call)
  sj_models = models if isinstance(models, dict) else models.sj

  def cache_for(model):
    return init_cache(model.config, batch, cache_length).with_lengths(
        jnp.full((batch,), context, jnp.int32))

  def step_job(model, w):
    graphdef, state = nnx.split(model)
    carry = {"cache": cache_for(model)}
    tokens = jnp.ones((batch, w), jnp.int32)

    def run():
      out, carry["cache"] = steps(graphdef, state, tokens, carry["cache"], k)
      return out
    return run

  def iteration_job(gamma, target_split, draft_split):
    carry = {"caches": (cache_for(sj_models["target"]), cache_for(sj_models["draft"]))}

    def run():
      out, *carry["caches"] = iterations(*target_split, *draft_split, *carry["caches"],
                                         int(gamma), k)
      return out
    return run

  jobs = {}  # name -> a call running k steps
  for role, model in sj_models.items():
    for w in (widths if role == "target" else (1,)):
      jobs[f"{role}_w{w}"] = step_job(model, w)
  if "draft" in sj_models:
    target_split, draft_split = nnx.split(sj_models["target"]), nnx.split(sj_models["draft"])
    for g in gammas:
      jobs[f"iteration_g{g}"] = iteration_job(g, target_split, draft_split)
  times: dict[str, list[float]] = {name: [] for name in jobs}
  t_compile = time.perf_counter()
  for run in jobs.values():  # compile
    jax.block_until_ready(run())
  compile_s = time.perf_counter() - t_compile
  start = time.perf_counter()
  for it in range(max_iters):
    for name, run in jobs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(run())
      times[name].append((time.perf_counter() - t0) / k)
    if it >= 4 and time.perf_counter() - start > min_seconds * len(jobs):
      break
  medians = {name: statistics.median(v) for name, v in times.items()}
  result = {"batch": batch, "context": context, "steps_per_call": k,
            "iterations": len(times["target_w1"]), "compile_s": compile_s, "seconds": medians,
            "target_step_ms": medians["target_w1"] * 1e3}
  if "draft_w1" in medians:
    result["draft_step_ms"] = medians["draft_w1"] * 1e3
    result["cost_ratio"] = medians["draft_w1"] / medians["target_w1"]
  result["target_verify_ms"] = {str(w - 1): medians[f"target_w{w}"] * 1e3 for w in widths if w > 1}
  result["iteration_ms"] = {str(g): medians[f"iteration_g{g}"] * 1e3 for g in gammas
                            if f"iteration_g{g}" in medians}
  return result


def draft_free_pass(config, setting: dict) -> int:
  """Tokens a draft-free setting's target pass scores besides the pending one (0: not draft-free):
  its guesses (prompt lookup, Jacobi), its tree's nodes (retrieval, suffix) or its window and
  n-grams (lookahead)."""
  method = setting["method"]
  if method in ("prompt_lookup", "jacobi"):
    return int(setting["gamma"])
  if method in runconfig.RETRIEVAL_METHODS:
    return int(config.retrieval_nodes)
  if method == "lookahead":
    return runconfig.lookahead_tokens(setting["tree"])
  return 0


def _busy_over_baseline(entry: dict, base: dict | None) -> float:
  """The share of rows a setting kept busy, relative to its autoregressive baseline's (1 when
  there is none or it is unknown): a batch iterates until its slowest row is done."""
  base_busy = (base or {}).get("row_utilisation", 1.0)
  return entry["row_utilisation"] / (base_busy if math.isfinite(base_busy) else 1.0)


def modelled_speedup(alpha: float, gamma: int, iteration_cost: float, busy: float = 1.0) -> float:
  """The runs' cost model: Eq. 1's expected tokens per iteration (Leviathan et al. 2023) over a
  bare iteration's measured cost in target steps (``measure_step_costs``), times the rows kept
  busy (vs the autoregressive baseline's). What it leaves out is the loop's own work:
  verification, rollback, bookkeeping, each call's setup and prefills."""
  from specjax import metrics
  return metrics.expected_tokens_per_iteration(alpha, gamma) / iteration_cost * busy


class _Runner:
  """Runs one setting on one batch; returns (seconds, tokens int32[B, N] with -1 padding, stats)."""

  def __init__(self, config, models: _Models, prompt_width: int):
    import jax
    import specjax as sj
    self.jax, self.sj = jax, sj
    self.config = config
    self.models = models
    self.prompt_width = prompt_width  # every batch padded alike: one compilation per setting
    self.eos = None
    if config.stop_at_eos:
      self.eos = getattr(models.tokenizer, "eos_token_id", None)
    self.methods = {}
    self.meshes = {}  # mesh spec -> jax Mesh
    self.placed = {"": models.sj}  # mesh spec -> {role: the model placed on that mesh}

  def mesh(self, spec: str):
    """The mesh of a ``meshes`` entry (None for "": one device)."""
    if spec and spec not in self.meshes:
      from specjax import sharding
      data, model = runconfig.parse_mesh_spec(spec)
      self.meshes[spec] = sharding.make_mesh(data, model)  # run_experiment checked the size
    return self.meshes.get(spec)

  def models_on(self, spec: str) -> dict:
    """The models placed on mesh ``spec`` (copies: the one-device models stay where they are)."""
    if spec not in self.placed:
      from flax import nnx

      from specjax import sharding
      mesh, placed = self.mesh(spec), {}
      for role, model in self.models.sj.items():
        rules = (sharding.REPLICATED if role == "draft" and
                 self.config.draft_sharding == "replicated" else sharding.RULES)
        placed[role] = sharding.shard_model(nnx.clone(model), mesh, rules, role)
      self.placed[spec] = placed
    return self.placed[spec]

  def method(self, s: dict):
    key = (s["method"], s["gamma"], s.get("tree"), s.get("mesh", ""))
    if key not in self.methods:
      sj = self.sj
      models = self.models_on(s.get("mesh", ""))
      if s["method"] == "autoregressive":
        self.methods[key] = ("target", sj.Autoregressive())
      elif s["method"] == "draft_autoregressive":
        self.methods[key] = ("draft", sj.Autoregressive())
      elif s["method"] == "speculative":
        self.methods[key] = ("target", sj.Speculative(draft=models["draft"],
                                                      gamma=int(s["gamma"])))
      elif s["method"] == "self_speculative":
        self.methods[key] = ("target", sj.SelfSpeculative(skip=tuple(self.config.skip),
                                                          gamma=int(s["gamma"])))
      elif s["method"] == "prompt_lookup":
        self.methods[key] = ("target", sj.PromptLookup(max_ngram=int(self.config.max_ngram),
                                                       num_tokens=int(s["gamma"])))
      elif s["method"] == "jacobi":
        self.methods[key] = ("target", sj.Jacobi(block=int(s["gamma"])))
      elif s["method"] == "lookahead":
        w, n, g = runconfig.parse_lookahead_spec(s["tree"])
        self.methods[key] = ("target", sj.Lookahead(window=w, ngram=n, guesses=g))
      elif s["method"] in runconfig.RETRIEVAL_METHODS:
        self.methods[key] = ("target", retrieval_method(self.config, int(s["gamma"]),
                                                        per_request=s["method"] == "suffix"))
      elif s["method"] == "tree":
        self.methods[key] = ("target", tree_method(s["tree"], models["draft"])[1])
    return self.methods[key]

  def _generate_args(self, s: dict, batch: list[list[int]], key_seed: tuple[int, int]):
    """``sj.generate``'s (args, kwargs) for setting ``s`` on ``batch``."""
    jax, sj = self.jax, self.sj
    role, method = self.method(s)
    sampling = sj.Sampling(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"])
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.config.seed), key_seed[0]),
                             key_seed[1])
    mesh = s.get("mesh", "")
    return (self.models_on(mesh)[role], batch), dict(
        method=method, sampling=sampling, max_new_tokens=int(self.config.max_new_tokens),
        key=key, eos_token_id=self.eos, prompt_width=self.prompt_width, mesh=self.mesh(mesh),
        draft_sharding=self.config.draft_sharding if mesh else "rules")

  def memory(self, s: dict, batch: list[list[int]]) -> dict | None:
    """Bytes per device of the setting's compiled loop (``sj.compile_generate``: after the
    warm-up a cache hit, no second compilation)."""
    if s["method"].startswith("hf_"):
      return None
    args, kwargs = self._generate_args(s, batch, (0, 0))
    stats = self.sj.compile_generate(*args, **kwargs).memory_analysis()
    if stats is None:
      return None
    return {"argument_bytes": int(stats.argument_size_in_bytes),
            "output_bytes": int(stats.output_size_in_bytes),
            "temp_bytes": int(stats.temp_size_in_bytes),
            "alias_bytes": int(stats.alias_size_in_bytes)}

  def __call__(self, s: dict, batch: list[list[int]], key_seed: tuple[int, int]):
    import numpy as np
    if s["method"].startswith("hf_"):
      return self._hf(s, batch, key_seed)
    jax, sj = self.jax, self.sj
    args, kwargs = self._generate_args(s, batch, key_seed)
    t0 = time.perf_counter()
    out = sj.generate(*args, **kwargs)
    jax.block_until_ready(out.tokens)
    seconds = time.perf_counter() - t0
    return seconds, np.asarray(out.tokens), out.stats

  def _hf(self, s: dict, batch: list[list[int]], key_seed: tuple[int, int]):
    import numpy as np
    import torch
    if len(batch) != 1:
      raise ValueError("hf methods run one prompt at a time")
    target = self.models.hf["target"]
    n = int(self.config.max_new_tokens)
    kwargs: dict[str, Any] = dict(max_new_tokens=n, pad_token_id=0)
    if not self.config.stop_at_eos:
      kwargs["min_new_tokens"] = n
    if s["temperature"] > 0:
      kwargs.update(do_sample=True, temperature=s["temperature"], top_k=s["top_k"],
                    top_p=s["top_p"])
      torch.manual_seed(hash(key_seed) % (1 << 31) + self.config.seed)
    else:
      kwargs.update(do_sample=False)
    if s["method"] == "hf_assisted":
      draft = self.models.hf["draft"]
      # transformers 5.x reads these three from the *assistant's* generation_config (see
      # candidate_generator.AssistedCandidateGenerator.__init__); the constant schedule and a zero
      # confidence threshold make it draft exactly gamma tokens per iteration, like ours.
      draft.generation_config.num_assistant_tokens = int(s["gamma"])
      draft.generation_config.num_assistant_tokens_schedule = "constant"
      draft.generation_config.assistant_confidence_threshold = 0.0
      kwargs.update(assistant_model=draft, num_assistant_tokens=int(s["gamma"]),
                    num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
    elif s["method"] == "hf_prompt_lookup":  # its own PromptLookupCandidateGenerator
      kwargs.update(prompt_lookup_num_tokens=int(s["gamma"]),
                    max_matching_ngram_size=int(self.config.max_ngram))
    ids = torch.tensor([batch[0]], dtype=torch.long)
    t0 = time.perf_counter()
    with torch.no_grad():
      out = target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    seconds = time.perf_counter() - t0
    new = out[:, ids.shape[1]:].numpy().astype(np.int32)
    tokens = np.full((1, n), -1, np.int32)
    tokens[:, :new.shape[1]] = new[:, :n]
    return seconds, tokens, None


# ------------------------------------------------------------------------------------ statistics


class _StatsSum:
  """Sums ``sj.DecodeStats`` over calls, so that rates are exact ratios of totals."""

  def __init__(self):
    self.n = 0
    self.sums: dict[str, Any] = {}

  def add(self, stats) -> None:
    import numpy as np
    if stats is None:
      return
    self.n += 1
    fields = dict(rows=np.size(stats.generated),
                  target_calls=stats.target_calls, draft_calls=stats.draft_calls,
                  row_target_calls=np.sum(stats.row_target_calls),
                  generated=np.sum(stats.generated), proposed=np.sum(stats.proposed),
                  accepted=np.sum(stats.accepted), alpha_sum=stats.alpha_sum,
                  alpha_count=stats.alpha_count,
                  accepted_per_position=stats.accepted_per_position,
                  proposed_per_position=stats.proposed_per_position,
                  accepted_length_counts=stats.accepted_length_counts)
    for k, v in fields.items():
      v = np.asarray(v, np.float64)
      self.sums[k] = self.sums[k] + v if k in self.sums else v

  def summary(self) -> dict:
    import numpy as np
    nan = float("nan")
    if not self.n:
      return dict(acceptance_rate=nan, expected_alpha=nan, tokens_per_target_call=nan,
                  tokens_per_iteration=nan, row_utilisation=nan,
                  acceptance_by_position=[], accepted_length_histogram=[], target_calls=None,
                  draft_calls=None)
    s = self.sums
    div = lambda a, b: float(a) / float(b) if float(b) else nan
    by_pos = [div(a, p) for a, p in zip(s["accepted_per_position"], s["proposed_per_position"])]
    return dict(acceptance_rate=div(s["accepted"], s["proposed"]),
                expected_alpha=div(s["alpha_sum"], s["alpha_count"]),
                tokens_per_target_call=div(s["generated"], s["row_target_calls"]),
                # Without the prefill (one call, one token per row): the iterations of Eq. 1.
                tokens_per_iteration=div(s["generated"] - s["rows"],
                                         s["row_target_calls"] - s["rows"]),
                # Candidates the target verified per iteration (gamma; a tree's node count).
                nodes_per_call=div(s["proposed"], s["row_target_calls"] - s["rows"]),
                acceptance_by_position=by_pos,
                # Share of row-iterations that accepted exactly n drafts, n = 0..gamma.
                accepted_length_histogram=[div(c, sum(s["accepted_length_counts"]))
                                           for c in s["accepted_length_counts"]],
                # Busy rows per loop iteration / batch size: a batch iterates until its slowest
                # row is done, so ragged acceptance leaves rows idle (1.0 = none ever idle).
                row_utilisation=div(s["row_target_calls"] - s["rows"],
                                    (s["target_calls"] - self.n) * s["rows"] / self.n),
                target_calls=int(s["target_calls"]) // self.n,
                draft_calls=int(s["draft_calls"]) // self.n,
                proposed=int(s["proposed"]) // self.n, accepted=int(s["accepted"]) // self.n)


# ------------------------------------------------------------------------------------ experiment


def _versions() -> dict:
  import importlib.metadata as md
  out = {"python": platform.python_version()}
  for name in ("jax", "jaxlib", "flax", "numpy", "transformers", "torch", "ml_collections"):
    try:
      out[name] = md.version(name)
    except md.PackageNotFoundError:
      pass
  try:
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "setup.cfg"))
    out["specjax"] = cfg.get("metadata", "version")
  except Exception:  # pylint: disable=broad-except
    pass
  return out


def _machine() -> dict:
  import jax
  devices = jax.devices()
  return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "jax_backend": jax.default_backend(),
          "devices": sorted({str(d.device_kind) for d in devices}),
          "device_count": len(devices), "process_count": jax.process_count()}


def _progress(total: int, desc: str, enabled: bool):
  import jax
  if not enabled or jax.process_index() != 0:
    return contextlib.nullcontext(None)
  from tqdm.auto import tqdm
  return tqdm(total=total, desc=desc, unit="call", file=sys.stderr, dynamic_ncols=True,
              leave=True)


def _check_meshes(config, specs: dict) -> None:
  """Every mesh of ``config.meshes`` fits the devices and splits every model: ConfigError
  otherwise, before any model is loaded."""
  import jax

  from experiments import random_models
  from specjax import sharding
  from specjax.models.config import from_hf_dict
  for spec in config.meshes:
    sizes = runconfig.parse_mesh_spec(spec)
    if not sizes:
      continue
    if sizes[0] * sizes[1] != jax.device_count():
      raise ConfigError(
          f"meshes entry {spec!r} needs {sizes[0] * sizes[1]} devices, but there are "
          f"{jax.device_count()}" + (
              f" (on a CPU: cpu_devices={sizes[0] * sizes[1] // jax.process_count()})"
              if jax.default_backend() == "cpu" else ""))
    if int(config.batch_size) % sizes[0]:
      raise ConfigError(f"meshes entry {spec!r}: batch_size {config.batch_size} does not divide "
                        f"its data axis of {sizes[0]} devices")
    for role, model in specs.items():
      rules = (sharding.REPLICATED if role == "draft" and config.draft_sharding == "replicated"
               else sharding.RULES)
      model_config = (random_models.model_config(model.random_name) if model.random_name
                      else from_hf_dict(model.hf_config))
      try:
        sharding.check_config(model_config, *sizes, rules, role)
      except ValueError as e:
        raise ConfigError(f"meshes entry {spec!r}: {e}") from None


def run_experiment(config, command: str | None = None) -> dict:
  """Runs the experiment of ``config``; writes the report; returns the results dict.

  Raises ``ConfigError`` (a ``ValueError``) with a one-line message on a bad config, before any
  model is loaded.
  """
  t_start = time.perf_counter()
  runconfig.validate(config)
  settings = make_settings(config)
  if config.dry_run:
    plan = {"dry_run": True, "settings": settings, "config": config.to_dict()}
    print(f"[run] dry run: {len(settings)} settings")
    for s in settings:
      print(f"  {setting_label(s)}")
    return plan
  specs = runconfig.resolve_checkpoints(config)
  start_jax(config)  # cpu_devices (main() has already started JAX, multi-host or not)
  _check_meshes(config, specs)
  texts = prompts_lib.load_prompts(config.prompts)
  if config.num_prompts:
    texts = texts[:config.num_prompts]
  if config.sample_prompt >= len(texts):
    raise ConfigError(f"sample_prompt {config.sample_prompt} is out of range: there are "
                      f"{len(texts)} prompts")

  import numpy as np

  from experiments import report as report_lib
  from specjax import metrics

  with tempfile.TemporaryDirectory(prefix="specjax-run-") as tmpdir:
    models = _Models(config, specs, tmpdir)
    prompts = models.encode(texts, int(config.max_prompt_tokens), bool(config.add_bos),
                            bool(config.chat_template))
    bsz = int(config.batch_size)
    # Fill the last batch by cycling the prompts: every batch has the same shape.
    n_rows = -(-len(prompts) // bsz) * bsz
    rows = [prompts[i % len(prompts)] for i in range(n_rows)]
    batches = [rows[i:i + bsz] for i in range(0, n_rows, bsz)]
    prompt_lengths = [len(p) for p in prompts]
    _log(f"[run] {len(texts)} prompts ({config.prompts}), {min(prompt_lengths)}-"
         f"{max(prompt_lengths)} tokens; {len(batches)} batches of {bsz}; {len(settings)} settings; "
         f"{config.repeats} repeats")

    # The cost ratio c: one draft step vs one target step, inside a jitted loop, at the run's
    # batch size.
    cost: dict[str, Any] = {}
    context = int(np.mean(prompt_lengths)) + int(config.max_new_tokens) // 2
    tree_nodes = sorted({runconfig.tree_nodes(t) for t in config.trees}
                        if "tree" in config.methods else ())
    cache_len = (max(prompt_lengths) + int(config.max_new_tokens)
                 + max([*tuple(config.gammas), *tree_nodes, 0]) + 2)
    # Draft-free settings: what a pass over [pending, N guesses] costs the target.
    passes = sorted({draft_free_pass(config, s) for s in settings} - {0})
    if "draft" in models.sj:
      spec_gammas = tuple(int(g) for g in config.gammas) if any(
          m == "speculative" for m in config.methods) else ()
      # Verification passes over gamma + 1 tokens, over a tree's N + 1 (the mask does not
      # change the cost) and over the draft-free settings' 1 + N, all in one measurement.
      widths = tuple(sorted({1, *(g + 1 for g in spec_gammas), *(n + 1 for n in tree_nodes),
                             *(n + 1 for n in passes)}))
      _log(f"[run] measuring the draft/target cost ratio (decoding steps in a jitted loop, "
           f"batch {bsz}, context {context})")
      cost = measure_step_costs(models, bsz, context, cache_len + max(passes, default=0),
                                widths=widths, gammas=spec_gammas)
      _log(f"[run]   target step {cost['target_step_ms']:.3f} ms, draft step "
           f"{cost['draft_step_ms']:.3f} ms: c = {cost['cost_ratio']:.3f}")
    if "self_speculative" in config.methods:  # the same for the target without layers skip
      from specjax.models.transformer import skip_layers
      gammas = tuple(int(g) for g in config.gammas)
      view = skip_layers(models.sj["target"], tuple(config.skip))
      cost["self_speculative"] = measure_step_costs(
          {"target": models.sj["target"], "draft": view}, bsz, context, cache_len,
          widths=(1,) + tuple(g + 1 for g in gammas), gammas=gammas)
      _log(f"[run]   self-speculative draft (skip {list(config.skip)}): c = "
           f"{cost['self_speculative']['cost_ratio']:.3f}")
    if passes:
      cost["draft_free"] = ({k: cost[k] for k in ("target_step_ms", "target_verify_ms")}
                            if "draft" in models.sj else
                            measure_step_costs({"target": models.sj["target"]}, bsz, context,
                                               cache_len + max(passes),
                                               widths=(1, *(n + 1 for n in passes))))
      steps = cost["draft_free"]
      _log("[run]   draft-free passes, in target steps: " + ", ".join(
          f"1 + {n} tokens {steps['target_verify_ms'][str(n)] / steps['target_step_ms']:.2f}"
          for n in passes))

    runner = _Runner(config, models, prompt_width=max(prompt_lengths))
    records = [dict(s, warmup_s=0.0, times=[], tokens=[], first_batch_s=[], stats=_StatsSum(),
                    outputs=None) for s in settings]

    # Warm-up: compile every setting once, on the first batch (all batches share one padded
    # shape, so the others run the same executable), timed apart.
    with _progress(len(records), "warm-up (compile)", config.progress) as bar:
      for rec in records:
        if bar is not None:
          bar.set_postfix_str(setting_label(rec), refresh=False)
        rec["warmup_s"], _, _ = runner(rec, batches[0], (0, 0))
        rec["memory"] = runner.memory(rec, batches[0])
        if bar is not None:
          bar.update(1)

    # Timed repeats, interleaved: for each repeat and batch, every setting in turn; the starting
    # setting rotates, so that no setting always runs right after the same neighbour. The first
    # repeat's outputs are each setting's outputs (samples, greedy = AR, their hash).
    with _progress(int(config.repeats) * len(batches) * len(records), "timed runs",
                   config.progress) as bar:
      for r in range(int(config.repeats)):
        per = [[0.0, 0] for _ in records]
        outs = [[] for _ in records]
        for b, batch in enumerate(batches):
          shift = (r * len(batches) + b) % len(records)
          for i in [*range(shift, len(records)), *range(shift)]:
            rec = records[i]
            seconds, tokens, stats = runner(rec, batch, (r + 1, b))
            per[i][0] += seconds
            per[i][1] += int(np.sum(tokens >= 0))
            outs[i].append(tokens)
            if b == 0:
              rec["first_batch_s"].append(seconds)
            rec["stats"].add(stats)
            if bar is not None:
              bar.update(1)
        for rec, (seconds, ntok), out in zip(records, per, outs):
          rec["times"].append(seconds)
          rec["tokens"].append(ntok)
          if r == 0:
            rec["outputs"] = np.concatenate(out)[:len(prompts)]

    if config.profile_dir:  # one more call of every setting, traced (after the timed runs)
      import jax
      with jax.profiler.trace(config.profile_dir):
        for rec in records:
          with jax.profiler.TraceAnnotation(setting_label(rec)):
            runner(rec, batches[0], (0, 0))
      _log(f"[run] profiler trace of one call per setting in {config.profile_dir} (open it with "
           f"TensorBoard's profile plugin or Perfetto)")

  # Figures per setting.
  results_settings = []
  for rec in records:
    tps = [n / t for n, t in zip(rec["tokens"], rec["times"])]
    entry = {k: rec[k] for k in ("method", "gamma", "tree", "temperature", "top_k", "top_p",
                                 "mesh", "memory")}
    # The greedy/sampled outputs of the first timed repeat, to compare runs (e.g. one process
    # against several) without storing every token.
    entry["outputs_sha256"] = hashlib.sha256(
        np.ascontiguousarray(rec["outputs"], np.int32).tobytes()).hexdigest()
    entry.update(rec["stats"].summary())
    entry.update(
        tokens_per_s=statistics.median(tps), tokens_per_s_runs=tps, seconds_runs=rec["times"],
        tokens_per_pass=statistics.median(rec["tokens"]), warmup_s=rec["warmup_s"],
        compile_s=max(0.0, rec["warmup_s"] - statistics.median(rec["first_batch_s"])))
    if rec["method"] == "hf_autoregressive":
      entry["tokens_per_target_call"] = 1.0  # by definition
    results_settings.append(entry)

  def find(method, temperature, gamma=None, tree=None, mesh=""):
    for e in results_settings:
      if setting_key(e) == (method, gamma, tree, temperature, mesh):
        return e
    return None

  # Cost ratio used for the theory.
  cost_ratio, source = None, None
  if config.cost_ratio > 0:
    cost_ratio, source = float(config.cost_ratio), "config"
  ar_ratios = {}
  for t in config.temperatures:
    ar, dr = find("autoregressive", float(t)), find("draft_autoregressive", float(t))
    if ar and dr:
      ar_ratios[float(t)] = ar["tokens_per_s"] / dr["tokens_per_s"]
  if ar_ratios:
    cost["cost_ratio_ar"] = statistics.median(ar_ratios.values())
    cost["cost_ratio_ar_by_temperature"] = {str(k): v for k, v in ar_ratios.items()}
  if cost_ratio is None:
    if config.cost_ratio_source == "ar" and "cost_ratio_ar" in cost:
      cost_ratio, source = cost["cost_ratio_ar"], "ar"
    elif "cost_ratio" in cost:
      cost_ratio, source = cost["cost_ratio"], "step"
  cost["used"], cost["used_source"] = cost_ratio, source

  for e in results_settings:
    # Speedup: vs the same library's autoregressive decoding at the same sampling settings.
    is_hf = e["method"].startswith("hf_")
    base = find("hf_autoregressive" if is_hf else "autoregressive", e["temperature"],
                mesh=e["mesh"])
    e["speedup"] = e["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
    if base:  # each repeat's ratio: the two settings ran interleaved in the same pass
      e["speedup_runs"] = [a / b for a, b in zip(e["tokens_per_s_runs"],
                                                  base["tokens_per_s_runs"])]
    # Ours vs transformers: AR vs HF greedy/sampling generate, speculative vs HF assisted.
    counterpart = {"autoregressive": ("hf_autoregressive", None),
                   "speculative": ("hf_assisted", e["gamma"]),
                   "prompt_lookup": ("hf_prompt_lookup", e["gamma"])}.get(e["method"])
    if counterpart and find(counterpart[0], e["temperature"], counterpart[1]):
      e["tokens_per_s_over_hf"] = e["tokens_per_s"] / find(
          counterpart[0], e["temperature"], counterpart[1])["tokens_per_s"]
      if e["method"] == "speculative":
        e["tokens_per_s_over_hf_assisted"] = e["tokens_per_s_over_hf"]
    if is_hf and e["temperature"] == 0.0 and find("autoregressive", 0.0) is not None:
      e["greedy_match_vs_specjax"] = _match(records, e, find("autoregressive", 0.0))
    if e["method"] in ("speculative", "self_speculative"):
      # Each draft against its own costs: the self-speculative draft's were measured apart.
      pair_cost, ratio = cost, cost_ratio
      if e["method"] == "self_speculative":
        pair_cost = cost["self_speculative"]
        ratio = pair_cost["cost_ratio"]
      alpha = e["expected_alpha"]
      a = min(max(alpha, 0.0), 1.0) if alpha == alpha else None  # None: no verified position
      if ratio is not None and a is not None:
        e["theoretical_speedup"] = metrics.expected_speedup(a, e["gamma"], ratio)
        e["measured_over_theoretical"] = e["speedup"] / e["theoretical_speedup"]
        verify_ms = (pair_cost.get("target_verify_ms") or {}).get(str(e["gamma"]))
        if verify_ms is not None:  # the (gamma + 1)-token pass in target steps (Thm 3.8: 1)
          e["verify_cost"] = verify_ms / pair_cost["target_step_ms"]
        iteration_ms = (pair_cost.get("iteration_ms") or {}).get(str(e["gamma"]))
        if iteration_ms is not None:
          busy = _busy_over_baseline(e, base)
          e["iteration_cost"] = iteration_ms / pair_cost["target_step_ms"]
          e["modelled_speedup"] = modelled_speedup(a, e["gamma"], e["iteration_cost"], busy)
          e["measured_over_modelled"] = e["speedup"] / e["modelled_speedup"]
      if a is not None:
        e["expected_tokens_per_call"] = metrics.expected_tokens_per_iteration(a, e["gamma"])
    guesses = draft_free_pass(config, e)
    if e["method"] == "tree" or guesses:
      if e["method"] == "tree":
        nodes, pass_cost = runconfig.tree_nodes(e["tree"]), cost
      else:
        nodes, pass_cost = guesses, cost.get("draft_free", {})
      verify_ms = (pass_cost.get("target_verify_ms") or {}).get(str(nodes))
      if verify_ms is not None:  # the pass over [pending, N nodes] in target steps
        e["verify_cost"] = verify_ms / pass_cost["target_step_ms"]
        if e["method"] != "tree":  # no draft: an iteration is that one pass
          busy = _busy_over_baseline(e, base)
          e["modelled_speedup"] = e["tokens_per_iteration"] / e["verify_cost"] * busy
          e["measured_over_modelled"] = e["speedup"] / e["modelled_speedup"]
    if e["mesh"]:  # the same setting on one device: its speed, and the very same tokens
      alone = find(e["method"], e["temperature"], e["gamma"], e["tree"])
      if alone is not None:
        e["over_one_device"] = e["tokens_per_s"] / alone["tokens_per_s"]
        e["same_as_one_device"] = _match(records, e, alone)
    # Every exact method must reproduce the target's greedy tokens.
    ar = find("autoregressive", e["temperature"], mesh=e["mesh"])
    if (e["temperature"] == 0.0 and ar is not None and not is_hf
        and e["method"] not in ("autoregressive", "draft_autoregressive")):
      e["greedy_match"] = _match(records, e, ar)

  # Optimal gamma by the formula, per temperature (alpha averaged over the gammas run).
  optimal = {}
  for t in config.temperatures:
    alphas = [e["expected_alpha"] for e in results_settings
              if e["method"] == "speculative" and e["temperature"] == float(t)
              and e["expected_alpha"] == e["expected_alpha"]]
    if alphas and cost_ratio is not None:
      a = min(max(float(np.mean(alphas)), 0.0), 1.0)
      g = metrics.optimal_gamma(a, cost_ratio, max_gamma=16)
      optimal[str(float(t))] = {"alpha": a, "gamma": int(g),
                                "speedup": metrics.expected_speedup(a, int(g), cost_ratio)}

  # Greedy sample text for one prompt.
  samples = {}
  i = int(config.sample_prompt)
  sample_settings = [r for r in records if r["temperature"] == 0.0] or \
      [r for r in records if r["temperature"] == min(config.temperatures)]
  if sample_settings:
    samples = {"prompt_index": i, "prompt": texts[i], "temperature": sample_settings[0]["temperature"],
               "continuations": {setting_label(r): models.decode(r["outputs"][i])
                                 for r in sample_settings}}

  results = {
      "name": config.name,
      "created": datetime.datetime.now().isoformat(timespec="seconds"),
      "command": command or "(in-process: experiments.run.run_experiment)",
      "config": config.to_dict(),
      "versions": _versions(),
      "machine": _machine(),
      "models": {role: {"spec": s.spec, "path": s.path,
                        "params": int(models.sj[role].config.num_params()),
                        "layers": models.sj[role].config.num_layers,
                        "hidden_size": models.sj[role].config.hidden_size,
                        "vocab_size": s.vocab_size} for role, s in specs.items()},
      "prompts": {"source": config.prompts, "count": len(texts),
                  "tokens_min": min(prompt_lengths), "tokens_max": max(prompt_lengths),
                  "tokens_mean": float(np.mean(prompt_lengths)), "batches": len(batches),
                  "batch_size": bsz},
      "cost": cost,
      "optimal_gamma": optimal,
      "settings": results_settings,
      "samples": samples,
      "wall_s": time.perf_counter() - t_start,
  }
  import jax
  if jax.process_index() != 0:  # a multi-host run: process 0 alone writes and prints
    return results
  paths = report_lib.write_report(results, config.output_dir, plots=bool(config.plots))
  results["files"] = paths
  print(report_lib.format_table(results))
  print(report_lib.format_samples(results))
  print(f"\n[run] wrote {', '.join(sorted(os.path.basename(p) for p in paths.values()))} to "
        f"{config.output_dir} ({results['wall_s']:.0f}s)")
  return results


def _match(records, a: dict, b: dict) -> float:
  """Fraction of prompts whose outputs (the first timed repeat's) of settings ``a`` and ``b`` are
  identical."""
  import numpy as np

  def output(entry):
    for r in records:
      if setting_key(r) == setting_key(entry):
        return r["outputs"]
    raise KeyError(setting_label(entry))

  return float(np.mean(np.all(output(a) == output(b), axis=1)))


# ------------------------------------------------------------------------------------------ main


def command_line(argv) -> str:
  return "python -m experiments.run " + " ".join(shlex.quote(a) for a in argv[1:])


def _flag_error_line(e: BaseException) -> str:
  """One line from a flag-parsing error; for errors raised inside a config file's get_config
  (which config_flags wraps with the traceback), the exception's own last line."""
  text = str(e)
  lines = [l.strip() for l in text.splitlines() if l.strip()]
  if "Traceback (most recent call last)" in text and lines:
    last = lines[-1]
    head, sep, tail = last.partition(": ")
    return tail if sep and head.rsplit(".", 1)[-1].endswith(("Error", "Exception")) else last
  return _one_line(text)


def _parse_flags(argv):
  """absl's flag parsing, with any error printed as one line (not absl's usage dump)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f"error: {_flag_error_line(e)}")
  except (AttributeError, KeyError) as e:  # --config.<unknown field>=...
    bad = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    sys.exit(f"error: unknown config field {_one_line(e).strip(chr(34) + chr(39))} (in {', '.join(bad)}); the fields are "
             f"listed in experiments/runconfig.py:base_config")


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments: {' '.join(argv[1:])} (did you mean --config.x=...?)")
  from absl import logging
  if not flags.FLAGS["verbosity"].present:  # orbax logs each checkpoint save at INFO
    logging.set_verbosity(logging.WARNING)
  try:
    config = _CONFIG.value
    if config is None:
      sys.exit("error: --config is required, e.g. --config=configs/default.py")
    config.keys()  # config_flags reports a missing/broken config file only on first access
  except OSError as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    sys.exit(f"error: cannot load the config file: {lines[-1] if lines else e}")
  try:
    runconfig.validate(config)
    start_jax(config, _MULTIHOST.value, _COORDINATOR.value, _NUM_PROCESSES.value,
              _PROCESS_ID.value)
    run_experiment(config, command=command_line(sys.argv))
  except ConfigError as e:
    sys.exit(f"error: {_one_line(e)}")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
