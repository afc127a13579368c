"""Hugging Face checkpoints <-> ``Transformer``: safetensors load/save, the tokenizer, and the
front door that also reads GGUF files and named checkpoints.

The tensor mapping lives in ``hf_layout`` (shared with ``gguf``); this module finds the files,
reads ``config.json``, writes checkpoints shard by shard, and dispatches ``.gguf`` paths to
``gguf``. Only safetensors are read; pickled ``pytorch_model.bin`` files are refused (they can run
code).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models import checkpoints, gguf, gguf_tokenizer, reduced_vocab
from specjax.models.hf_config import from_hf_dict, to_hf_dict
from specjax.models.hf_layout import (  # noqa: F401 -- hf_layout, params_*: re-exported
    Entry, _hf_shape, _iter_hf_tensors, _SafetensorsReader, hf_layout, params_from_hf, params_to_hf)
from specjax.models.transformer import Transformer

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")

def _read_json(file: str) -> Any:
  try:
    with open(file) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{file} is not valid JSON: {e}") from e


def _weight_files(path: str) -> list[str]:
  single = os.path.join(path, WEIGHTS_NAME)
  index = os.path.join(path, WEIGHTS_INDEX_NAME)
  if os.path.isfile(single):
    return [single]
  if os.path.isfile(index):
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise ValueError(f"{index} has no 'weight_map'")
    files = []
    for shard in dict.fromkeys(weight_map.values()):  # ordered, unique
      file = os.path.join(path, shard)
      if not os.path.isfile(file):
        raise FileNotFoundError(f"shard {file} listed in {index} does not exist")
      files.append(file)
    return files
  pickled = [n for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")
             if os.path.exists(os.path.join(path, n))]
  note = (f" ({pickled[0]} is present, but pickled torch checkpoints are not loaded; convert it "
          f"to safetensors)") if pickled else ""
  raise FileNotFoundError(f"no weights in {path}: neither {single} nor {index} exists{note}")


def _dtype_name(dtype: Any) -> str | None:
  if dtype is None or isinstance(dtype, str):
    return dtype
  return jnp.dtype(dtype).name


def load_model(path: str | os.PathLike, dtype: Any = None, mesh=None, sharding_rules=None,
               head: str = "full") -> Transformer:
  """Loads a Hugging Face checkpoint directory (``config.json`` + safetensors) as a ``Transformer``.

  Args:
    path: local directory with ``config.json`` and ``model.safetensors``, or a sharded
      ``model.safetensors.index.json`` plus the shards it lists (a multimodal Gemma 3 directory:
      its language model, as ``gemma3_text``); or a ``.gguf`` file (dequantized and cached, see
      ``specjax.models.gguf``); or a name from ``checkpoints.CHECKPOINTS``.
    dtype: ``"float32"`` or ``"bfloat16"`` (or the jnp dtype); default: the checkpoint's own
      (``dtype`` / ``torch_dtype``; float16 and unknown become float32).
    mesh: a ``("data", "model")`` mesh (``specjax.sharding.make_mesh``): each tensor is placed on
      it by ``sharding_rules`` (default ``specjax.sharding.RULES``) as it is read, so that no
      device holds more than its shards (see ``params_from_hf``).
    head: ``"full"``, or ``"auto"``: a draft checkpoint with ``reduced_vocab.VOCAB_FILE`` beside
      its weights decodes through the reduced head those ids name (``reduced_vocab``: q = 0
      outside them, lossless, cheaper); one without it loads as it is.

  Memory: the module is built abstractly and filled tensor by tensor from memory-mapped files, so
  the host never holds two full copies of the weights (see ``params_from_hf``).

  Raises:
    FileNotFoundError: the directory, ``config.json``, the weights, or a listed shard is missing.
    ValueError: unsupported ``model_type``/dtype, missing/unexpected tensor, wrong shape, or a
      truncated/corrupt safetensors file (each message names the offender).
  """
  if head not in ("full", "auto"):
    raise ValueError(f"head must be 'full' or 'auto', got {head!r}")
  path = checkpoints.resolve_path(path)
  if path.lower().endswith(".gguf"):
    return gguf.load_gguf(path, dtype=_dtype_name(dtype), mesh=mesh,
                          sharding_rules=sharding_rules)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"model directory {path} does not exist")
  config_file = os.path.join(path, CONFIG_NAME)
  if not os.path.isfile(config_file):
    raise FileNotFoundError(f"{config_file} does not exist")
  config = from_hf_dict(_read_json(config_file), dtype=_dtype_name(dtype))
  with _SafetensorsReader(_weight_files(path)) as tensors:
    model = params_from_hf(config, tensors, source=path, mesh=mesh, sharding_rules=sharding_rules)
  ids = reduced_vocab.load_vocab_ids(path) if head == "auto" else None
  return model if ids is None else reduced_vocab.reduce_vocab(model, ids)


# --------------------------------------------------------------------------------------------------
# Saving.

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _parse_size(size: int | str) -> int:
  """Bytes in ``size``: an int, or a string like ``"5GB"`` (10**9) / ``"200MiB"`` (2**20)."""
  if isinstance(size, (int, np.integer)):
    value = int(size)
  else:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    if not m or m.group(2).upper() not in _SIZE_UNITS:
      raise ValueError(f"cannot parse max_shard_size {size!r}; use bytes or e.g. '5GB', '200MiB'")
    value = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])
  if value < 1:
    raise ValueError(f"max_shard_size must be positive, got {size!r}")
  return value


def save_model(model: Transformer, path: str | os.PathLike,
               max_shard_size: int | str | None = None) -> None:
  """Writes ``model`` as a Hugging Face checkpoint that ``AutoModelForCausalLM.from_pretrained`` loads.

  Writes ``config.json`` (``to_hf_dict``), ``generation_config.json`` (bos/eos/pad ids), and the
  weights with HF names and layouts in the model's dtype: ``model.safetensors``, or, when the
  weights exceed ``max_shard_size`` (bytes, or a string like ``"2GB"``), shards
  ``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json``. Stale weight files
  from an earlier save in ``path`` are removed first. Shards are filled greedily in HF order (a
  tensor larger than the limit gets a shard of its own) and materialised on the host one shard at a
  time.
  """
  from safetensors.numpy import save_file

  path = os.fspath(path)
  config = model.config
  table = hf_layout(config)
  hf_config = to_hf_dict(config)
  os.makedirs(path, exist_ok=True)
  for name in os.listdir(path):
    if name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME) or _SHARD_RE.match(name):
      os.remove(os.path.join(path, name))
  with open(os.path.join(path, CONFIG_NAME), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
    f.write("\n")
  generation = {k: hf_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                if hf_config.get(k) is not None}
  with open(os.path.join(path, GENERATION_CONFIG_NAME), "w") as f:
    json.dump(generation, f, indent=2, sort_keys=True)
    f.write("\n")

  params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  shapes = {p: tuple(v.get_value().shape) for p, v in params.items()}
  itemsize = jnp.dtype(config.dtype).itemsize
  sizes = [int(np.prod(_hf_shape(e, shapes))) * itemsize for e in table]
  limit = None if max_shard_size is None else _parse_size(max_shard_size)
  shards: list[list[Entry]] = [[]]
  current = 0
  for entry, size in zip(table, sizes):
    if limit is not None and shards[-1] and current + size > limit:
      shards.append([])
      current = 0
    shards[-1].append(entry)
    current += size

  metadata = {"format": "pt"}  # transformers expects it
  if len(shards) == 1:
    save_file(dict(_iter_hf_tensors(model, table)), os.path.join(path, WEIGHTS_NAME),
              metadata=metadata)
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(dict(_iter_hf_tensors(model, shard)), os.path.join(path, name), metadata=metadata)
    weight_map.update({e.hf_name: name for e in shard})
  index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
  with open(os.path.join(path, WEIGHTS_INDEX_NAME), "w") as f:
    json.dump(index, f, indent=2)
    f.write("\n")


# --------------------------------------------------------------------------------------------------
# Tokenizer.


def load_tokenizer(path: str | os.PathLike):
  """``transformers.AutoTokenizer`` from a local directory, a ``.gguf`` file or a checkpoint name
  (never the network)."""
  path = checkpoints.resolve_path(path)
  if path.lower().endswith(".gguf"):
    return gguf_tokenizer.load_gguf_tokenizer(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer directory {path} does not exist")
  from transformers import AutoTokenizer

  return AutoTokenizer.from_pretrained(path, local_files_only=True)
