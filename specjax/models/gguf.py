"""GGUF (llama.cpp) checkpoints -> ``Transformer``: read, dequantize, rename to HF, cache.

A GGUF file holds llama.cpp's metadata, tokenizer and (often quantized) tensors under ggml names.
``convert_gguf`` turns it into what a Hugging Face checkpoint holds: a ``config.json``-style dict
(so ``from_hf_dict`` maps it to a ``ModelConfig``) and float32 tensors under HF names, in HF's
layout. The model is then built by ``hf_layout.params_from_hf``, the one weight-mapping mechanism, so a
GGUF model and the same weights saved by transformers load identically.

The header (metadata and tensor-info table) is parsed from the file's bytes by ``read_header``:
``gguf.GGUFReader`` builds a numpy view per element of every metadata array, 10-20 s on Gemma 3's
262144-token vocabulary, against a fraction of a second here. Tensors are then read from a memory
map of the file and expanded to float32 by the ``gguf`` package's (numpy only)
``gguf.quants.dequantize``: every type it implements (F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, the
K-quants, the IQ types, ...). Names are mapped with gguf's own ``TensorNameMap`` (the table
llama.cpp's converter writes with), walked from ``hf_layout(config)``.

llama.cpp's converter permutes the rows of Llama's q/k projections (weights and biases) so that
its rotary kernel sees each head's two rotated halves interleaved; ``_unpermute_rows`` undoes that.
Qwen2 and Qwen3 use llama.cpp's NEOX rotary and are written unpermuted (Qwen3's per-head
``attn_q_norm``/``attn_k_norm`` weights too; its ``attention.key_length`` gives head_dim).
Mistral GGUFs declare ``llama`` (llama.cpp has no ``mistral`` architecture and runs them without
a sliding window), so they load as Llama: what llama.cpp computes.

Gemma 2 (``gemma2``) and Gemma 3 (``gemma3``, its text model): llama.cpp's converter stores every
RMSNorm weight with the 1 of Gemma's ``(1 + w)`` already added, which ``_unshift_norm`` takes
back off (as transformers' ``Gemma2TensorProcessor`` does). What the metadata leaves out,
llama.cpp fixes in code (``llama-model.cpp``) and so do we. Gemma 2: every 2nd layer global
(layers 0, 2, ... local, as transformers' ``Gemma2Config`` too), ``attention.sliding_window``
(default 4096), ``attn_logit_softcapping`` / ``final_logit_softcapping`` (defaults 50 / 30), one
rotary base (``rope.freq_base``, which the converter does not write: 10000), scores scaled by
``key_length ** -0.5`` (by ``(hidden / heads) ** -0.5`` for the 46-layer 27B model). Gemma 3:
every 6th layer global, local rotary base 10000 unscaled (the global layers take
``rope.freq_base`` and ``rope.scaling``), the same scale rule (27B: 62 layers), no soft-capping.

Dequantizing a large file takes long, so ``load_gguf`` caches the converted checkpoint as one
float32 safetensors file (the HF config in its metadata) under
``cache_root()/gguf-v1/<sha256>.safetensors``, keyed by the GGUF file's content hash; later loads
memory-map it. float32, because dequantized values (scale * q + min, in float32) do not fit
bfloat16/float16 exactly: a 135M model takes 540 MB. The tokenizer (``gguf_tokenizer``: built
from the GGUF's vocabulary with the ``tokenizers`` library, which takes seconds) is cached too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
import os
import pathlib
import struct
import warnings
from typing import Any

import numpy as np

from specjax.cache import atomic_path, cache_root, file_sha256
from specjax.models.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig
from specjax.models.hf_config import from_hf_dict
from specjax.models.hf_layout import _SafetensorsReader, hf_layout, params_from_hf
from specjax.models.transformer import Transformer

CACHE_VERSION = "gguf-v1"  # bump when the conversion changes, so that stale entries are not read
TOKENIZER_CACHE_VERSION = "gguf-tokenizer-v2"  # v1 (gguf-v1/*.tokenizer) was transformers'-built
# GGUF general.architecture -> model_type. Not (yet) phi3, refused by name: its tensors would map
# (attn_qkv / ffn_up hold HF's fused qkv_proj / gate_up_proj), but what llama.cpp makes of its
# metadata (sliding_window 0 or not, partial rotary as rope.dimension_count, LongRoPE factor
# tensors) is unchecked, and transformers' GGUF loader, the reference, reads neither.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                 "gemma3": "gemma3_text"}
_PERMUTED_QK = ("llama",)  # architectures whose q/k rows llama.cpp's converter permutes
_SHIFTED_NORMS = ("gemma2", "gemma3")  # architectures whose norm weights llama.cpp stores as 1 + w
# llama.cpp's Gemma constants (llama-model.cpp): every n-th layer global (layer i is local when
# i % n < n - 1), Gemma 3's local rotary base, Gemma 2's window and soft-caps where the file has
# none, and the block counts of the 27B models, whose attention scale is (hidden / heads) ** -0.5.
GEMMA2_SLIDING_WINDOW_PATTERN = 2
GEMMA2_SLIDING_WINDOW = 4096
GEMMA2_SOFTCAPS = (50.0, 30.0)  # (attention scores, final logits)
GEMMA2_27B_BLOCKS = 46
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_BLOCKS = 62
_REQUIRED = object()
# What a broken file makes the header parser / dequantize raise (neither validates lengths first).
_READ_ERRORS = (ValueError, IndexError, KeyError, TypeError, struct.error, UnicodeDecodeError,
                OverflowError, EOFError)
# GGUF metadata value types (gguf.GGUFValueType): the numbers, as numpy dtypes, and the two others.
_NUMBERS = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
            10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32  # of the data section, where the file sets no general.alignment
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """One entry of a GGUF file's tensor-info table."""
  name: str
  dims: tuple[int, ...]  # ggml order: the fastest-varying axis first
  type: int  # a gguf.GGMLQuantizationType value, kept raw: the file may name a type gguf lacks
  offset: int  # of the tensor's first byte, from the start of the file

  @property
  def shape(self) -> tuple[int, ...]:
    """numpy order: the slowest axis first."""
    return tuple(reversed(self.dims))


@dataclasses.dataclass(frozen=True)
class Header:
  """What precedes a GGUF file's tensor data: every metadata key -> value (as
  ``ReaderField.contents()`` gives it) and the tensor infos, in file order."""
  metadata: dict[str, Any]
  tensors: tuple[TensorInfo, ...]
  data_offset: int  # where the data section starts (aligned to general.alignment)
  file_size: int


class _Unsupported(Exception):
  """A well-formed file this reader does not read (not a sign of corruption)."""


def read_header(path: str | os.PathLike) -> Header:
  """The metadata and tensor infos of a little-endian GGUF v2/v3 file, parsed from its bytes.

  Raises ValueError naming the file for a big-endian file or another version, and for a
  truncated or corrupt header (tensor data is not read, so not checked, here).
  """
  path = os.fspath(path)
  try:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
      return _parse_header(buf)
  except _Unsupported as e:
    raise ValueError(f"GGUF file {path} is {e}") from None
  except _READ_ERRORS as e:
    raise ValueError(f"cannot read GGUF file {path} (truncated or corrupt?): {e}") from e


def _parse_header(buf: mmap.mmap) -> Header:
  magic, version = struct.unpack_from("<4sI", buf, 0)
  if magic != b"GGUF":
    raise ValueError(f"no GGUF magic (the file starts with {magic!r})")
  if version not in (2, 3):  # a big-endian file's version reads as 2 << 24 or 3 << 24 here
    big = version and not version & 0xFFFF
    raise _Unsupported("big-endian; only little-endian files are supported" if big
                       else f"of GGUF version {version}; supported: 2, 3")
  n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)

  def string(offset: int) -> tuple[str, int]:
    (size,) = struct.unpack_from("<Q", buf, offset)
    if offset + 8 + size > len(buf):
      raise ValueError("a string runs past the end of the file")
    return buf[offset + 8:offset + 8 + size].decode("utf-8"), offset + 8 + size

  def value(kind: int, offset: int) -> tuple[Any, int]:
    if kind == _STRING:
      return string(offset)
    if kind != _ARRAY:
      dtype = np.dtype(_NUMBERS[kind])
      return np.frombuffer(buf, dtype, 1, offset).item(), offset + dtype.itemsize
    item, size = struct.unpack_from("<IQ", buf, offset)
    offset += 12
    if item in _NUMBERS:  # one numpy read: Gemma 3's 262144 scores and types
      dtype = np.dtype(_NUMBERS[item])
      return np.frombuffer(buf, dtype, size, offset).tolist(), offset + size * dtype.itemsize
    items = []
    for _ in range(size):  # strings, or arrays of arrays
      element, offset = value(item, offset)
      items.append(element)
    return items, offset

  meta, offset = {}, 24
  for _ in range(n_kv):
    key, offset = string(offset)
    (kind,) = struct.unpack_from("<I", buf, offset)
    meta[key], offset = value(kind, offset + 4)
  infos = {}
  for _ in range(n_tensors):
    name, offset = string(offset)
    (n_dims,) = struct.unpack_from("<I", buf, offset)
    if n_dims > _MAX_DIMS:
      raise ValueError(f"tensor {name!r} has {n_dims} dimensions (ggml allows {_MAX_DIMS})")
    dims = struct.unpack_from(f"<{n_dims}Q", buf, offset + 4)
    kind, start = struct.unpack_from("<IQ", buf, offset + 4 + 8 * n_dims)
    offset += 4 + 8 * n_dims + 12
    if name in infos:
      raise ValueError(f"tensor {name!r} is listed twice")
    infos[name] = (dims, kind, start)
  alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
  if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
    raise ValueError(f"general.alignment {alignment!r} is not a power of two")
  data = -(-offset // alignment) * alignment
  tensors = tuple(TensorInfo(name, dims, kind, data + start)
                  for name, (dims, kind, start) in infos.items())
  return Header(meta, tensors, data, len(buf))


def _field(meta: dict[str, Any], key: str, path: str, default: Any = _REQUIRED) -> Any:
  if key not in meta:
    if default is _REQUIRED:
      raise ValueError(f"GGUF file {path} lacks the metadata key {key!r}")
    return default
  return meta[key]


def _hf_config(header: Header, path: str) -> dict[str, Any]:
  """The HF ``config.json`` dict equivalent to the GGUF metadata (llama.cpp's key names)."""
  arch = _field(header.metadata, "general.architecture", path)
  if arch not in ARCHITECTURES:
    raise ValueError(f"unsupported GGUF architecture {arch!r} in {path}; supported: "
                     f"{', '.join(ARCHITECTURES)}")
  get = lambda key, default=_REQUIRED: _field(header.metadata, f"{arch}.{key}", path, default)
  names = {t.name: t for t in header.tensors}
  if "rope_freqs.weight" in names:  # Llama 3.1-style per-frequency rope factors
    raise ValueError(f"GGUF file {path} has a rope_freqs.weight tensor (Llama 3.1 rope scaling); "
                     f"not supported")
  embed = names.get("token_embd.weight")
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
  token = lambda key: _field(header.metadata, f"tokenizer.ggml.{key}_token_id", path, None)
  layers = int(get("block_count"))
  is_27b = layers == {"gemma2": GEMMA2_27B_BLOCKS, "gemma3": GEMMA3_27B_BLOCKS}.get(arch)
  gemma = dict(query_pre_attn_scalar=hidden // heads if is_27b else head_dim)
  if arch == "gemma2":
    n = GEMMA2_SLIDING_WINDOW_PATTERN
    gemma.update(sliding_window=int(get("attention.sliding_window", GEMMA2_SLIDING_WINDOW)),
                 layer_types=[SLIDING_ATTENTION if i % n < n - 1 else FULL_ATTENTION
                              for i in range(layers)],
                 attn_logit_softcapping=float(get("attn_logit_softcapping", GEMMA2_SOFTCAPS[0])),
                 final_logit_softcapping=float(get("final_logit_softcapping",
                                                   GEMMA2_SOFTCAPS[1])))
  elif arch == "gemma3":
    gemma.update(sliding_window=int(get("attention.sliding_window")),
                 sliding_window_pattern=GEMMA3_SLIDING_WINDOW_PATTERN,
                 rope_local_base_freq=GEMMA3_LOCAL_ROPE_BASE)
  else:
    gemma = {}
  return dict(
      **gemma,
      model_type=ARCHITECTURES[arch],
      vocab_size=int(embed.dims[-1]),  # ggml shape [hidden, vocab]: the file's own truth
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
  return _hf_config(read_header(path), path)


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


def _byte_rows(t: TensorInfo, file_size: int, path: str) -> tuple[Any, tuple[int, ...]]:
  """(``gguf.GGMLQuantizationType``, the shape of ``t``'s bytes: [..., bytes per row]); raises
  if the type is unknown to gguf or the data does not fit in the file."""
  import gguf

  try:
    kind = gguf.GGMLQuantizationType(t.type)
  except ValueError:
    raise ValueError(f"GGUF file {path}: tensor {t.name!r} has ggml type {t.type}, unknown to the "
                     f"gguf package") from None
  block, size = gguf.GGML_QUANT_SIZES[kind]
  rows, row = t.shape[:-1], t.dims[0] if t.dims else 1
  n_bytes = math.prod(rows) * (row // block) * size
  if row % block or t.offset + n_bytes > file_size:
    raise ValueError(f"cannot read tensor {t.name!r} of GGUF file {path} (truncated or corrupt?): "
                     f"{t.dims} {kind.name} values at byte {t.offset} of {file_size}")
  return kind, (*rows, row // block * size)


def convert_gguf(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(HF config dict, {HF name: float32 array in HF layout}) of a GGUF file.

  Raises ValueError, naming the file, for an unsupported architecture, a tensor type that
  ``gguf.quants`` cannot dequantize, an unknown or missing tensor, and a truncated/corrupt file.
  """
  from gguf.quants import dequantize

  path = os.fspath(path)
  header = read_header(path)
  hf = _hf_config(header, path)
  config = from_hf_dict(hf)
  arch = header.metadata["general.architecture"]
  to_hf = _gguf_names(config, arch)
  heads = {".attn_q.": config.num_heads, ".attn_k.": config.num_kv_heads}
  layouts = {}
  for t in header.tensors:  # cheap checks first: no dequantization if the file cannot load
    if t.name not in to_hf:
      raise ValueError(f"GGUF file {path}: unexpected tensor {t.name!r} for architecture {arch!r}")
    layouts[t.name] = _byte_rows(t, header.file_size, path)
  missing = sorted(set(to_hf) - set(layouts))
  if missing:
    raise ValueError(f"GGUF file {path}: missing tensor {missing[0]!r}")
  data = np.memmap(path, np.uint8, "r")  # F32 tensors stay views of it
  tensors = {}
  for t in header.tensors:
    kind, byte_shape = layouts[t.name]
    raw = data[t.offset:t.offset + math.prod(byte_shape)].reshape(byte_shape)
    try:
      w = np.asarray(dequantize(raw, kind), np.float32)
    except NotImplementedError as e:
      raise ValueError(f"GGUF file {path}: tensor {t.name!r} has type {kind.name}, which "
                       f"gguf.quants cannot dequantize") from e
    except _READ_ERRORS as e:
      raise ValueError(f"cannot read tensor {t.name!r} of GGUF file {path} (truncated or "
                       f"corrupt?): {e}") from e
    if w.shape != t.shape:
      raise ValueError(f"GGUF file {path}: tensor {t.name!r} holds {w.shape} values, its header "
                       f"says {t.shape} (truncated or corrupt?)")
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
