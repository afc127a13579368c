"""Finding a run's models and datastore before anything loads: checkpoint directories, GGUF files
and registered names (their ``config.json`` or GGUF metadata only), the embedded pair and the
SmolLM2 draft (built on first use), vocabulary and context checks, and the stdlib datastore."""

from __future__ import annotations

import dataclasses
import json
import os

from experiments.errors import ConfigError
from experiments.methods import METHODS, NO_DATASTORE, base_of
from experiments.runconfig import (AUTO, DEFAULT, RANDOM_PREFIX, SMOLLM2_DRAFT, SMOLLM2_HEADS,
                                   SMOLLM2_VOCAB, datastore_vocab, pass_room, uses_retrieval)

UNTRAINED = "untrained"  # a resolved head field: an untrained head (random targets only)


def resolve_datastore(config, target: ModelSpec, verbose: bool = True) -> None:
  """Sets ``config.datastore`` for methods "retrieval" and "suffix": the stdlib datastore of the
  target's tokenizer (``experiments.build_datastore.ensure_datastore``, built on first use) when
  empty; its vocabulary must be the target's."""
  if config.datastore == NO_DATASTORE:
    return
  if not config.datastore:
    if target.path is None or config.tokenizer == "bytes":
      raise ConfigError(f"methods 'retrieval' and 'suffix' with the byte tokenizer (target "
                        f"{target.spec}) need datastore=<dir> (python -m "
                        f"experiments.build_datastore; 'suffix' also runs with datastore=none)")
    from experiments import build_datastore
    named = target.spec != DEFAULT and _is_named(target.spec)  # e.g. smollm2-135m
    tokenizer = config.tokenizer or (target.spec if named else target.path)
    config.datastore = os.fspath(build_datastore.ensure_datastore(
        tokenizer, int(config.datastore_bytes), verbose=verbose))
  vocab = datastore_vocab(config.datastore)
  if vocab != target.vocab_size:
    raise ConfigError(f"datastore {config.datastore} has vocab_size {vocab} but the target "
                      f"{target.spec} has {target.vocab_size}; build it with the target's "
                      f"tokenizer")


def resolve_heads(config, target: ModelSpec, verbose: bool = True) -> None:
  """Sets each head field the run's methods need (``eagle_head``, ``eagle3_head``,
  ``medusa_heads``, ``hydra_heads``, ``mtp_head``) to a
  head directory (SmolLM2's heads built on first use) or ``UNTRAINED`` (a random target's);
  reads only the directory's ``config.json`` and checks its vocabulary is the target's."""
  for field in sorted({METHODS[m].head for m in config.methods if METHODS[m].head}):
    spec = config[field]
    if spec == AUTO:
      if target.random_name is not None:
        config[field] = UNTRAINED
        continue
      if target.vocab_size != SMOLLM2_VOCAB or "smollm" not in target.spec.lower():
        raise ConfigError(f"{field}='auto' has a built-in head for SmolLM2 only (target "
                          f"{target.spec}): give {field}=<a head directory> (sj.save_head)")
      spec = SMOLLM2_HEADS[field]
    if spec in SMOLLM2_HEADS.values():
      if target.vocab_size != SMOLLM2_VOCAB:
        raise ConfigError(f"{spec!r} drafts for SmolLM2 (vocab_size {SMOLLM2_VOCAB}); target "
                          f"{target.spec} has vocab_size {target.vocab_size}")
      from experiments import smollm2_eagle
      kind = {"eagle_head": "eagle", "eagle3_head": "eagle3", "medusa_heads": "medusa",
              "hydra_heads": "hydra", "mtp_head": "mtp"}[
          next(f for f, name in SMOLLM2_HEADS.items() if name == spec)]
      config[field] = os.fspath(smollm2_eagle.ensure_smollm2_head(kind, verbose=verbose))
      continue
    path = os.path.expanduser(spec)
    if not os.path.isdir(path):
      raise ConfigError(f"{field} {spec!r} is neither 'auto', a built-in head "
                        f"({', '.join(SMOLLM2_HEADS.values())}) nor a head directory")
    try:
      with open(os.path.join(path, "config.json")) as f:
        vocab = json.load(f).get("vocab_size")
    except (OSError, ValueError) as e:
      raise ConfigError(f"{field} {path}: no readable config.json ({e})") from None
    if vocab is not None and vocab != target.vocab_size:  # None: Medusa heads on the target's
      raise ConfigError(f"{field} {path} has vocab_size {vocab} but the target {target.spec} has "
                        f"{target.vocab_size}")
    config[field] = path


def needs_draft(config) -> bool:
  return any(METHODS[m].needs_draft or base_of(config, m).needs_draft for m in config.methods)


# ---------------------------------------------------------------------------------- checkpoints


@dataclasses.dataclass
class ModelSpec:
  role: str
  spec: str  # as configured
  path: str | None  # checkpoint directory, None for random models
  random_name: str | None
  vocab_size: int
  max_positions: int
  hf_config: dict


def _check_dir(role: str, path: str) -> dict:
  if not os.path.isdir(path):
    raise ConfigError(f"{role} checkpoint directory {path} does not exist")
  config_file = os.path.join(path, "config.json")
  if not os.path.isfile(config_file):
    raise ConfigError(f"{role} checkpoint {path} has no config.json")
  if not (os.path.isfile(os.path.join(path, "model.safetensors"))
          or os.path.isfile(os.path.join(path, "model.safetensors.index.json"))):
    raise ConfigError(f"{role} checkpoint {path} has no model.safetensors (nor "
                      f"model.safetensors.index.json)")
  try:
    with open(config_file) as f:
      hf = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ConfigError(f"{role} checkpoint {config_file} is not valid JSON: {e}") from None
  from specjax.models.hf_config import language_model_dict  # a multimodal one's text part
  hf = dict(language_model_dict(hf))
  if not isinstance(hf.get("vocab_size"), int):
    raise ConfigError(f"{role} checkpoint {config_file} has no integer vocab_size")
  return hf


def _is_named(spec: str) -> bool:
  """Not a path: a registered checkpoint name (``specjax.models.checkpoints``), or a mistake."""
  return os.sep not in spec and not os.path.exists(spec)


def _gguf_config(role: str, spec: str) -> tuple[dict, str]:
  """(HF config dict, file) of a GGUF checkpoint given as a path or a registered name, from its
  metadata (specjax.models.gguf; imports specjax, after validation has passed)."""
  from specjax.models import checkpoints, gguf
  if not spec.lower().endswith(".gguf") and spec not in checkpoints.CHECKPOINTS:
    raise ConfigError(f"{role} checkpoint {spec!r} is neither a directory, a .gguf file nor a "
                      f"checkpoint name ({', '.join(sorted(checkpoints.CHECKPOINTS))})")
  try:
    path = checkpoints.resolve_path(spec)
    if not os.path.isfile(path):
      raise ValueError(f"{role} checkpoint {spec} does not exist")
    return gguf.read_hf_config(path), path
  except ValueError as e:
    raise ConfigError(str(e)) from None


def resolve_checkpoints(config, verbose: bool = True) -> dict[str, ModelSpec]:
  """{role: ModelSpec} for target (and draft when a method needs it).

  ``"default"`` calls ``experiments.default_pair.ensure_default_pair`` (trains the pair on first
  use). Checks directories, files and that target and draft share one vocabulary size, reading only
  ``config.json``.
  """
  specs: dict[str, ModelSpec] = {}
  roles = ("target", "draft") if needs_draft(config) else ("target",)
  default_dirs = None
  # Explicit directories and random models first: a typo there fails before the default pair is
  # (possibly) trained.
  for role in sorted(roles, key=lambda r: config[r] in (DEFAULT, SMOLLM2_DRAFT)):
    spec = config[role]
    if spec.startswith(RANDOM_PREFIX):
      from experiments import random_models
      name = spec[len(RANDOM_PREFIX):]
      mc = random_models.model_config(name)
      specs[role] = ModelSpec(role, spec, None, name, mc.vocab_size, mc.max_position_embeddings,
                              {"model_type": mc.model_type, "num_hidden_layers": mc.num_layers,
                               "hidden_size": mc.hidden_size, "vocab_size": mc.vocab_size})
      continue
    if spec == DEFAULT:
      if default_dirs is None:
        from experiments import default_pair
        default_dirs = default_pair.ensure_default_pair(verbose=verbose)
      path = os.fspath(default_dirs[0 if role == "target" else 1])
    elif spec == SMOLLM2_DRAFT:
      target = specs.get("target")
      if target is not None and target.vocab_size != SMOLLM2_VOCAB:  # before minutes of training
        raise ConfigError(f"{SMOLLM2_DRAFT!r} drafts for SmolLM2 (vocab_size {SMOLLM2_VOCAB}); "
                          f"target {target.spec} has vocab_size {target.vocab_size}")
      from experiments import smollm2_draft
      path = os.fspath(smollm2_draft.ensure_smollm2_draft(verbose=verbose))
    else:
      path = os.path.expanduser(spec)
    if path.lower().endswith(".gguf") or _is_named(path):
      hf, path = _gguf_config(role, path)
    else:
      hf = _check_dir(role, path)
    max_pos = hf.get("max_position_embeddings", hf.get("n_positions", 1 << 30))
    specs[role] = ModelSpec(role, spec, path, None, int(hf["vocab_size"]), int(max_pos), hf)
  specs = {role: specs[role] for role in roles}
  if "draft" in specs and specs["draft"].vocab_size != specs["target"].vocab_size:
    raise ConfigError(f"vocabulary mismatch: target {specs['target'].spec} has vocab_size "
                      f"{specs['target'].vocab_size}, draft {specs['draft'].spec} has "
                      f"{specs['draft'].vocab_size}; target and draft must share one tokenizer")
  if uses_retrieval(config):
    resolve_datastore(config, specs["target"], verbose)
  resolve_heads(config, specs["target"], verbose)
  hf = specs["target"].hf_config
  layers = hf.get("num_hidden_layers", hf.get("n_layer"))
  if layers is not None and any(base_of(config, m).name == "self_speculative"
                                for m in config.methods):
    if max(config.skip, default=-1) >= layers or len(config.skip) >= layers:
      raise ConfigError(f"skip {list(config.skip)} does not fit the target's {layers} layers "
                        f"(indices 0..{layers - 1}, at least one kept)")
  need = config.max_prompt_tokens + config.max_new_tokens + pass_room(config) + 2
  for s in specs.values():
    if need > s.max_positions:
      raise ConfigError(f"max_prompt_tokens {config.max_prompt_tokens} + max_new_tokens "
                        f"{config.max_new_tokens} (+ the largest gamma or tree + 2) = {need} exceeds "
                        f"the {s.role} "
                        f"model's context of {s.max_positions} positions")
  tok = config.tokenizer
  if tok not in ("", "bytes"):
    return specs
  if tok == "" and specs["target"].path is not None and os.path.isdir(specs["target"].path):
    path = specs["target"].path
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json",
                                                               "tokenizer_config.json")):
      raise ConfigError(f"no tokenizer files in {path}: set tokenizer to a tokenizer directory "
                        f"(or 'bytes' for a 256-token byte vocabulary)")
  if (tok == "bytes" or specs["target"].path is None) and specs["target"].vocab_size < 256:
    raise ConfigError(f"the byte tokenizer needs vocab_size >= 256, the target has "
                      f"{specs['target'].vocab_size}")
  return specs
