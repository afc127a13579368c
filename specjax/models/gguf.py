"""GGUF (llama.cpp) checkpoints -> ``Transformer``: read, dequantize, rename to HF, cache.

A GGUF file holds llama.cpp's metadata, tokenizer and (often quantized) tensors under ggml names.
``convert_gguf`` turns it into what a Hugging Face checkpoint holds: a ``config.json``-style dict
(so ``from_hf_dict`` maps it to a ``ModelConfig``) and float32 tensors under HF names, in HF's
layout. The model is then built by ``hf_layout.params_from_hf``, the one weight-mapping mechanism, so a
GGUF model and the same weights saved by transformers load identically.

Reading uses the ``gguf`` package (numpy only): ``GGUFReader`` memory-maps the file and
``gguf.quants.dequantize`` expands every type it implements (F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0,
the K-quants, the IQ types, ...) to float32. Names are mapped with gguf's own ``TensorNameMap``
(the table llama.cpp's converter writes with), walked from ``hf_layout(config)``.

llama.cpp's converter permutes the rows of Llama's q/k projections (weights and biases) so that
its rotary kernel sees each head's two rotated halves interleaved; ``_unpermute_rows`` undoes that.
Qwen2 and Qwen3 use llama.cpp's NEOX rotary and are written unpermuted (Qwen3's per-head
``attn_q_norm``/``attn_k_norm`` weights too; its ``attention.key_length`` gives head_dim).
Mistral GGUFs declare ``llama`` (llama.cpp has no ``mistral`` architecture and runs them without
a sliding window), so they load as Llama: what llama.cpp computes.

Gemma 3 (``gemma3``, its text model): llama.cpp's converter stores every RMSNorm weight with the
1 of Gemma's ``(1 + w)`` already added (``norm_shift``), which ``_unshift_norm`` takes back off
(as transformers' ``Gemma2TensorProcessor`` does). What the metadata leaves out, llama.cpp fixes
in code (``llama-model.cpp``, LLM_ARCH_GEMMA3) and so do we: every 6th layer global (the others
local with ``attention.sliding_window``), local rotary base 10000 unscaled (the global layers
take ``rope.freq_base`` and ``rope.scaling``), scores scaled by ``key_length ** -0.5`` (by
``(hidden / heads) ** -0.5`` for the 62-layer 27B model), no soft-capping.

Dequantizing a large file takes long, so ``load_gguf`` caches the converted checkpoint as one
float32 safetensors file (the HF config in its metadata) under
``cache_root()/gguf-v1/<sha256>.safetensors``, keyed by the GGUF file's content hash; later loads
memory-map it. float32, because dequantized values (scale * q + min, in float32) do not fit
bfloat16/float16 exactly: a 135M model takes 540 MB. The tokenizer (``gguf_tokenizer``: built
from the GGUF's vocabulary with the ``tokenizers`` library, which takes seconds) is cached too.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import warnings
from typing import Any

import numpy as np

from specjax.cache import atomic_path, cache_root, file_sha256
from specjax.models.config import ModelConfig
from specjax.models.hf_config import from_hf_dict
from specjax.models.hf_layout import _SafetensorsReader, hf_layout, params_from_hf
from specjax.models.transformer import Transformer

CACHE_VERSION = "gguf-v1"  # bump when the conversion changes, so that stale entries are not read
TOKENIZER_CACHE_VERSION = "gguf-tokenizer-v2"  # v1 (gguf-v1/*.tokenizer) was transformers'-built
# GGUF general.architecture -> model_type. Not (yet) phi3, refused by name: its tensors would map
# (attn_qkv / ffn_up hold HF's fused qkv_proj / gate_up_proj), but what llama.cpp makes of its
# metadata (sliding_window 0 or not, partial rotary as rope.dimension_count, LongRoPE factor
# tensors) is unchecked, and transformers' GGUF loader, the reference, reads neither.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_PERMUTED_QK = ("llama",)  # architectures whose q/k rows llama.cpp's converter permutes
_SHIFTED_NORMS = ("gemma3",)  # architectures whose norm weights llama.cpp stores as 1 + w
# llama.cpp's Gemma 3 constants (llama-model.cpp): the layer pattern, the local rotary base, and
# the block count of the 27B model, whose attention scale is (hidden / heads) ** -0.5.
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_BLOCKS = 62
_REQUIRED = object()
# What a broken file makes GGUFReader / dequantize raise (they do not validate lengths themselves).
_READ_ERRORS = (ValueError, IndexError, KeyError, TypeError, struct.error, UnicodeDecodeError,
                OverflowError, EOFError)


def _open(path: str):
  import gguf

  try:
    return gguf.GGUFReader(path)
  except _READ_ERRORS as e:
    raise ValueError(f"cannot read GGUF file {path} (truncated or corrupt?): {e}") from e


def _field(reader, key: str, path: str, default: Any = _REQUIRED) -> Any:
  field = reader.fields.get(key)
  if field is None:
    if default is _REQUIRED:
      raise ValueError(f"GGUF file {path} lacks the metadata key {key!r}")
    return default
  return field.contents()


def _hf_config(reader, path: str) -> dict[str, Any]:
  """The HF ``config.json`` dict equivalent to the GGUF metadata (llama.cpp's key names)."""
  arch = _field(reader, "general.architecture", path)
  if arch not in ARCHITECTURES:
    raise ValueError(f"unsupported GGUF architecture {arch!r} in {path}; supported: "
                     f"{', '.join(ARCHITECTURES)}")
  get = lambda key, default=_REQUIRED: _field(reader, f"{arch}.{key}", path, default)
  names = {t.name for t in reader.tensors}
  if "rope_freqs.weight" in names:  # Llama 3.1-style per-frequency rope factors
    raise ValueError(f"GGUF file {path} has a rope_freqs.weight tensor (Llama 3.1 rope scaling); "
                     f"not supported")
  embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
  if embed is None:
    raise ValueError(f"GGUF file {path} has no tensor 'token_embd.weight'")
  hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
  head_dim = int(get("attention.key_length", hidden // heads))
  if int(get("attention.value_length", head_dim)) != head_dim:
    raise ValueError(f"GGUF file {path}: attention.value_length {get('attention.value_length')} "
                     f"!= key_length {head_dim} is not supported")
  rotary = int(get("rope.dimension_count", head_dim))
  if rotary != head_dim:
    raise ValueError(f"GGUF file {path}: partial rotary (rope.dimension_count {rotary} of head_dim "
                     f"{head_dim}) is not supported")
  scaling = get("rope.scaling.type", "none")
  if scaling == "none":
    rope_scaling = None
  elif scaling == "linear":
    rope_scaling = dict(rope_type="linear", factor=float(get("rope.scaling.factor")))
  else:
    raise ValueError(f"GGUF file {path}: unsupported rope.scaling.type {scaling!r}")
  token = lambda key: _field(reader, f"tokenizer.ggml.{key}_token_id", path, None)
  layers = int(get("block_count"))
  if arch == "gemma3":
    gemma = dict(sliding_window=int(get("attention.sliding_window")),
                 sliding_window_pattern=GEMMA3_SLIDING_WINDOW_PATTERN,
                 rope_local_base_freq=GEMMA3_LOCAL_ROPE_BASE,
                 query_pre_attn_scalar=hidden // heads if layers == GEMMA3_27B_BLOCKS else head_dim)
  else:
    gemma = {}
  return dict(
      **gemma,
      model_type=ARCHITECTURES[arch],
      vocab_size=int(embed.shape[-1]),  # ggml shape [hidden, vocab]: the file's own truth
      hidden_size=hidden,
      num_hidden_layers=layers,
      num_attention_heads=heads,
      num_key_value_heads=int(get("attention.head_count_kv", heads)),
      head_dim=head_dim,
      intermediate_size=int(get("feed_forward_length")),
      max_position_embeddings=int(get("context_length", 2048)),
      rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
      rope_theta=float(get("rope.freq_base", 10000.0)),
      rope_scaling=rope_scaling,
      tie_word_embeddings="output.weight" not in names,
      attention_bias="blk.0.attn_q.bias" in names,
      mlp_bias="blk.0.ffn_up.bias" in names,
      bos_token_id=token("bos"),
      eos_token_id=token("eos"),
      pad_token_id=token("padding"),
  )


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
  """The file's model description as an HF ``config.json`` dict, from the metadata alone (no
  tensor is read or dequantized): what a runner checks before loading anything."""
  path = os.fspath(path)
  return _hf_config(_open(path), path)


def _gguf_names(config: ModelConfig, arch: str) -> dict[str, str]:
  """{GGUF tensor name: HF tensor name} for every tensor a checkpoint of ``config`` holds."""
  import gguf

  arch_id = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
  name_map = gguf.get_tensor_name_map(arch_id, config.num_layers)
  out = {}
  for entry in hf_layout(config):
    base, suffix = entry.hf_name.rsplit(".", 1)
    name = name_map.get_name(base)
    if name is None:  # a bug in the table, not in the file
      raise AssertionError(f"gguf's name map has no name for {entry.hf_name!r}")
    out[f"{name}.{suffix}"] = entry.hf_name
  return out


def _unpermute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's q/k permutation: per head, rows (d0 a, d0 b, d1 a, ...) -> (a..., b...)."""
  return w.reshape(num_heads, -1, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unshift_norm(w: np.ndarray) -> np.ndarray:
  """A Gemma norm weight as HF stores it (``w``) from llama.cpp's ``1 + w``."""
  return w - np.float32(1.0)


def convert_gguf(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(HF config dict, {HF name: float32 array in HF layout}) of a GGUF file.

  Raises ValueError, naming the file, for an unsupported architecture, a tensor type that
  ``gguf.quants`` cannot dequantize, an unknown or missing tensor, and a truncated/corrupt file.
  """
  from gguf.quants import dequantize

  path = os.fspath(path)
  reader = _open(path)
  hf = _hf_config(reader, path)
  config = from_hf_dict(hf)
  arch = _field(reader, "general.architecture", path)
  to_hf = _gguf_names(config, arch)
  heads = {".attn_q.": config.num_heads, ".attn_k.": config.num_kv_heads}
  for t in reader.tensors:  # cheap checks first: no dequantization if the file cannot load
    if t.name not in to_hf:
      raise ValueError(f"GGUF file {path}: unexpected tensor {t.name!r} for architecture {arch!r}")
  missing = sorted(set(to_hf) - {t.name for t in reader.tensors})
  if missing:
    raise ValueError(f"GGUF file {path}: missing tensor {missing[0]!r}")
  tensors = {}
  for t in reader.tensors:
    try:
      w = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
    except NotImplementedError as e:
      raise ValueError(f"GGUF file {path}: tensor {t.name!r} has type {t.tensor_type.name}, which "
                       f"gguf.quants cannot dequantize") from e
    except _READ_ERRORS as e:
      raise ValueError(f"cannot read tensor {t.name!r} of GGUF file {path} (truncated or "
                       f"corrupt?): {e}") from e
    expected = tuple(int(n) for n in reversed(t.shape))  # ggml shapes list the fastest axis first
    if w.shape != expected:
      raise ValueError(f"GGUF file {path}: tensor {t.name!r} holds {w.shape} values, its header "
                       f"says {expected} (truncated or corrupt?)")
    if arch in _PERMUTED_QK:
      for key, n in heads.items():
        if key in t.name:
          w = _unpermute_rows(w, n)
    if arch in _SHIFTED_NORMS and t.name.endswith("norm.weight"):
      w = _unshift_norm(w)
    tensors[to_hf[t.name]] = np.ascontiguousarray(w)
  return hf, tensors


def _cache_files(path: str) -> tuple[pathlib.Path, pathlib.Path]:
  """(converted weights, tokenizer directory) cache paths for the GGUF file ``path``."""
  digest = file_sha256(path)
  return ((cache_root() / CACHE_VERSION / digest).with_suffix(".safetensors"),
          cache_root() / TOKENIZER_CACHE_VERSION / digest)


def _write_cache(file: pathlib.Path, hf: dict[str, Any], tensors: dict[str, np.ndarray],
                 source: str) -> None:
  from safetensors.numpy import save_file

  metadata = {"format": "pt", "config": json.dumps(hf), "source": os.path.basename(source)}
  try:
    with atomic_path(file) as tmp:
      save_file(tensors, tmp, metadata=metadata)
  except OSError as e:  # a read-only or full cache only costs the next load its speed
    warnings.warn(f"could not cache the converted GGUF file {source} at {file}: {e}")


def load_gguf(path: str | os.PathLike, dtype: str | None = None, mesh=None,
              sharding_rules=None) -> Transformer:
  """Loads a GGUF file as a ``Transformer`` in ``dtype`` (default float32), via the cache; on
  ``mesh`` by ``sharding_rules`` when given (``params_from_hf``).

  The first load dequantizes the file and writes the cache; later loads (same content, any path)
  only hash the file and memory-map the cached safetensors.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file {path} does not exist")
  cached, _ = _cache_files(path)
  if not cached.is_file():
    hf, tensors = convert_gguf(path)
    _write_cache(cached, hf, tensors, path)
    return params_from_hf(from_hf_dict(hf, dtype=dtype), tensors, source=path, mesh=mesh,
                          sharding_rules=sharding_rules)
  from safetensors import safe_open

  with _SafetensorsReader([str(cached)]) as tensors:
    with safe_open(cached, "numpy") as f:
      hf = json.loads((f.metadata() or {})["config"])
    return params_from_hf(from_hf_dict(hf, dtype=dtype), tensors, source=str(cached), mesh=mesh,
                          sharding_rules=sharding_rules)
