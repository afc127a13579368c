"""The Hugging Face weight layout: one name-mapping table, params <-> HF tensors, a lazy reader.

One table (``hf_layout``) describes, for a ``ModelConfig``, every Hugging Face tensor and the
``Transformer`` parameter(s) it holds. Both directions go through it:

* ``params_to_hf(model)`` walks the table and produces HF-named, HF-laid-out numpy arrays
  (``hf.save_model`` writes them, shard by shard);
* ``params_from_hf(config, tensors)`` walks the same table backwards (``hf.load_model`` feeds it a
  lazy view of the safetensors files, ``_SafetensorsReader``; ``gguf.load_gguf`` the tensors it
  dequantized).

Layout rules: our kernels are ``[in, out]``. A ``torch.nn.Linear`` weight is ``[out, in]`` (Llama
family, untied ``lm_head``) -> transposed. GPT-2's ``Conv1D`` weights are already ``[in, out]``, and
its ``c_attn`` packs q, k, v along the output axis -> split / concatenated. Phi-3's ``qkv_proj``
and ``gate_up_proj`` are torch Linears packing several of our kernels along their output rows ->
transposed and split / concatenated then transposed. Embeddings (``[vocab, hidden]``) and
norm/bias vectors (Qwen3's and Gemma 3's per-head ``q_norm``/``k_norm`` too; Gemma's norm weights
as stored, around 0, since ``Norm`` adds the 1) are copied as they are.
``inv_freq`` is not a parameter: it is derived from the config and never saved.

Its own module so that both checkpoint formats' readers (``hf``, ``gguf``) import it and neither
imports the other's loader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.config import SLIDING_ATTENTION, ModelConfig, rope_inverse_frequencies
from specjax.models.transformer import Transformer

# How one HF tensor relates to our parameter(s).
COPY = "copy"  # same array (embeddings, norms, biases, GPT-2 Conv1D weights)
TRANSPOSE = "transpose"  # torch Linear [out, in] <-> our kernel [in, out]
CONCAT = "concat"  # GPT-2 c_attn: q, k, v concatenated along the last (output) axis
FUSED = "fused"  # Phi-3 qkv_proj / gate_up_proj: CONCAT of our kernels, then TRANSPOSE

Path = tuple  # an nnx state path, e.g. ("layers", 0, "attn", "q", "kernel")


@dataclasses.dataclass(frozen=True)
class Entry:
  """One Hugging Face tensor ``hf_name`` and the ``Transformer`` parameter paths it holds."""

  hf_name: str
  kind: str  # COPY | TRANSPOSE | CONCAT | FUSED
  paths: tuple[Path, ...]


# Names that HF checkpoints may carry but that are not parameters (buffers, derived from the config);
# they are skipped on load. Matched against canonical names (see ``_canonical_name``).
_IGNORED_BUFFERS = {
    "llama": re.compile(r"^model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq$"),
    "gpt2": re.compile(r"^transformer\.h\.\d+\.attn\.(bias|masked_bias)$"),  # causal-mask buffers
    # A multimodal Gemma 3 checkpoint's vision tower and projector: only its language model loads.
    "gemma3_text": re.compile(r"^model\.((layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq$|"
                              r"(vision_tower|multi_modal_projector)\.)"),
}
# Where Gemma3ForConditionalGeneration keeps its language model (its 5.x module names; the names
# of the released checkpoints, which transformers 5.24's save_pretrained writes too) and its head
# (untied: both spellings): read as a Gemma3ForCausalLM's ``model.*`` and ``lm_head``.
_GEMMA3_TEXT_PREFIXES = ("model.language_model.", "language_model.model.")
_GEMMA3_HEAD = "language_model.lm_head.weight"


# --------------------------------------------------------------------------------------------------
# The name-mapping table.


def hf_layout(config: ModelConfig) -> list[Entry]:
  """Every HF tensor of a checkpoint for ``config``, in HF's order, with the params it maps to."""
  c = config
  table: list[Entry] = []

  def add(hf_name: str, kind: str, *paths: Path) -> None:
    table.append(Entry(hf_name, kind, tuple(paths)))

  if c.model_type == "gpt2":
    if not (c.attention_bias and c.attention_out_bias and c.mlp_bias):
      raise ValueError("GPT-2 checkpoints have biases everywhere: the config needs attention_bias, "
                       "attention_out_bias and mlp_bias set to True")
    add("transformer.wte.weight", COPY, ("embed",))
    add("transformer.wpe.weight", COPY, ("pos_embed",))
    for i in range(c.num_layers):
      h, layer = f"transformer.h.{i}.", ("layers", i)
      for hf_norm, norm in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
        add(f"{h}{hf_norm}.weight", COPY, layer + (norm, "scale"))
        add(f"{h}{hf_norm}.bias", COPY, layer + (norm, "bias"))
      for leaf, hf_leaf in (("kernel", "weight"), ("bias", "bias")):
        add(f"{h}attn.c_attn.{hf_leaf}", CONCAT,
            *(layer + ("attn", proj, leaf) for proj in ("q", "k", "v")))
        add(f"{h}attn.c_proj.{hf_leaf}", COPY, layer + ("attn", "o", leaf))
        add(f"{h}mlp.c_fc.{hf_leaf}", COPY, layer + ("mlp", "up", leaf))
        add(f"{h}mlp.c_proj.{hf_leaf}", COPY, layer + ("mlp", "down", leaf))
    add("transformer.ln_f.weight", COPY, ("final_norm", "scale"))
    add("transformer.ln_f.bias", COPY, ("final_norm", "bias"))
  else:  # Llama family and Gemma: torch Linear layers.
    add("model.embed_tokens.weight", COPY, ("embed",))
    for i in range(c.num_layers):
      table += llama_layer(c, f"model.layers.{i}.", ("layers", i))
    add("model.norm.weight", COPY, ("final_norm", "scale"))
  if not c.tie_word_embeddings:
    add("lm_head.weight", TRANSPOSE, ("lm_head",))
  return table


def linear(hf_name: str, path: Path, bias: bool) -> list[Entry]:
  """A torch ``nn.Linear`` named ``hf_name`` <-> our ``Dense`` at ``path``."""
  weight = [Entry(f"{hf_name}.weight", TRANSPOSE, (path + ("kernel",),))]
  return weight + ([Entry(f"{hf_name}.bias", COPY, (path + ("bias",),))] if bias else [])


def llama_layer(c: ModelConfig, prefix: str, layer: Path, input_norm: bool = True) -> list[Entry]:
  """A Llama decoder layer's tensors (``prefix`` e.g. ``"model.layers.0."``) <-> our ``Block``
  at ``layer``; ``input_norm=False``: no ``input_layernorm`` (an EAGLE head's first layer)."""
  p = prefix
  out = []
  if input_norm:
    out.append(Entry(f"{p}input_layernorm.weight", COPY, (layer + ("attn_norm", "scale"),)))
  out += projections(c, f"{p}self_attn.", layer + ("attn",), ("q", "k", "v"), "qkv",
                     c.attention_bias)
  out += linear(f"{p}self_attn.o_proj", layer + ("attn", "o"), c.attention_out_bias)
  if c.qk_norm:
    for norm in ("q_norm", "k_norm"):
      out.append(Entry(f"{p}self_attn.{norm}.weight", COPY, (layer + ("attn", norm, "scale"),)))
  norm = lambda hf_name, ours: Entry(f"{p}{hf_name}.weight", COPY, (layer + (ours, "scale"),))
  if c.sandwich_norms:  # Gemma: HF's post_attention_layernorm normalises the attention output
    out += [norm("post_attention_layernorm", "post_attn_norm"),
            norm("pre_feedforward_layernorm", "mlp_norm")]
  else:
    out.append(norm("post_attention_layernorm", "mlp_norm"))
  out += projections(c, f"{p}mlp.", layer + ("mlp",), ("gate", "up"), "gate_up", c.mlp_bias)
  out += linear(f"{p}mlp.down_proj", layer + ("mlp", "down"), c.mlp_bias)
  if c.sandwich_norms:
    out.append(norm("post_feedforward_layernorm", "post_mlp_norm"))
  return out


def projections(c: ModelConfig, prefix: str, module: Path, names: Sequence[str], fused: str,
                bias: bool) -> list[Entry]:
  """Parallel projections ``names`` of one input (q/k/v, gate/up): one torch Linear each
  (``{prefix}q_proj``), or, with ``c.fused_projections``, the one Linear ``{prefix}{fused}_proj``
  packing them in order along its output rows (Phi-3's ``qkv_proj``, ``gate_up_proj``), which has
  no bias (``ModelConfig`` refuses biases for Phi-3)."""
  if not c.fused_projections:
    return [e for n in names for e in linear(f"{prefix}{n}_proj", module + (n,), bias)]
  assert not bias, "fused projections have no bias"
  return [Entry(f"{prefix}{fused}_proj.weight", FUSED,
                tuple(module + (n, "kernel") for n in names))]


def _hf_shape(entry: Entry, shapes: Mapping[Path, tuple[int, ...]]) -> tuple[int, ...]:
  """The HF tensor's shape, from the shapes of the parameters it holds."""
  first = tuple(shapes[entry.paths[0]])
  if entry.kind == COPY:
    return first
  if entry.kind == TRANSPOSE:
    return first[::-1]
  concat = first[:-1] + (sum(shapes[p][-1] for p in entry.paths),)
  return concat[::-1] if entry.kind == FUSED else concat


def _to_hf(entry: Entry, arrays: Sequence[np.ndarray]) -> np.ndarray:
  if entry.kind == COPY:
    out = arrays[0]
  elif entry.kind == TRANSPOSE:
    out = arrays[0].T
  else:
    out = np.concatenate(arrays, axis=-1)
    out = out.T if entry.kind == FUSED else out
  return np.ascontiguousarray(out)


def _from_hf(entry: Entry, tensor: jax.Array,
             shapes: Mapping[Path, tuple[int, ...]]) -> list[jax.Array]:
  if entry.kind == COPY:
    return [tensor]
  if entry.kind == TRANSPOSE:
    return [tensor.T]
  splits = np.cumsum([shapes[p][-1] for p in entry.paths])[:-1]
  return list(jnp.split(tensor.T if entry.kind == FUSED else tensor, splits, axis=-1))


# --------------------------------------------------------------------------------------------------
# Model -> HF tensors.


def _iter_hf_tensors(model: Transformer, table: Sequence[Entry] | None = None,
                     ) -> Iterator[tuple[str, np.ndarray]]:
  """(HF name, HF-laid-out host array) per table entry; one tensor is materialised at a time."""
  params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  for entry in table if table is not None else hf_layout(model.config):
    arrays = [np.asarray(params[p].get_value()) for p in entry.paths]
    yield entry.hf_name, _to_hf(entry, arrays)


def params_to_hf(model: Transformer) -> dict[str, np.ndarray]:
  """All parameters as ``{HF tensor name: numpy array}`` in HF layout and the model's dtype
  (bfloat16 as ``ml_dtypes.bfloat16``). The inverse of ``params_from_hf``."""
  return dict(_iter_hf_tensors(model))


# --------------------------------------------------------------------------------------------------
# HF tensors -> model.


def _canonical_name(config: ModelConfig, name: str) -> str:
  """Adds the base-model prefix that headless checkpoints (e.g. the original ``gpt2``) omit, and
  names a multimodal Gemma 3's language model as a Gemma3ForCausalLM's."""
  if config.model_type == "gemma3_text":
    text = next((p for p in _GEMMA3_TEXT_PREFIXES if name.startswith(p)), None)
    if text is not None:
      return "model." + name[len(text):]
    if name == _GEMMA3_HEAD:
      return "lm_head.weight"
  prefix = "transformer." if config.model_type == "gpt2" else "model."
  if name.startswith((prefix, "lm_head.")):
    return name
  return prefix + name


def _tensor_shape(tensors: Mapping[str, Any], name: str) -> tuple[int, ...]:
  shape_fn = getattr(tensors, "shape", None)
  if callable(shape_fn):  # _SafetensorsReader: from the header, without reading the data
    return tuple(shape_fn(name))
  return tuple(tensors[name].shape)


def params_from_hf(config: ModelConfig, tensors: Mapping[str, Any], source: str = "checkpoint",
                   mesh=None, sharding_rules=None) -> Transformer:
  """Builds a ``Transformer`` for ``config`` from HF-named tensors (the inverse of ``params_to_hf``).

  ``tensors`` maps HF names to arrays (numpy, jax, or anything ``jnp.asarray`` takes); it may be
  lazy: every name and shape is checked first (via ``tensors.shape(name)`` when it has one), then
  each tensor is read, converted to ``config.dtype`` and placed, one at a time.

  The module is built abstractly (``nnx.eval_shape``: shapes only, no random initialisation), so the
  only full copy of the weights is the one being filled in; the host holds at most the one checkpoint
  tensor being converted (plus its converted copy) on top of it.

  Names tolerated and skipped: HF's non-parameter buffers (``rotary_emb.inv_freq``; GPT-2's
  ``attn.bias`` / ``attn.masked_bias`` causal masks), a multimodal Gemma 3's vision tower and
  projector (its language model is read as a ``gemma3_text`` one, ``_canonical_name``) and, in a tied checkpoint, an ``lm_head.weight``
  of the embedding's shape: with tied embeddings the head *is* the embedding, which is also what
  transformers uses. Any other extra name, a missing name or a wrong shape is a ``ValueError``.

  ``mesh``: each tensor goes onto the mesh by ``sharding_rules`` (``specjax.sharding``) as soon as
  it is converted, each device receiving its own shard; no device ever holds the whole model.
  """
  placer = None if mesh is None else _mesh_placer(config, mesh, sharding_rules)
  # Names: canonical -> as stored.
  stored: dict[str, str] = {}
  for name in tensors.keys():
    canonical = _canonical_name(config, name)
    if canonical in stored:
      raise ValueError(f"{source}: tensor {name!r} appears twice (as {stored[canonical]!r})")
    stored[canonical] = name
  ignored = _IGNORED_BUFFERS.get(config.model_type, _IGNORED_BUFFERS["llama"])
  embed_shape = (config.vocab_size, config.hidden_size)
  tolerated = lambda name: bool(ignored.match(name)) or (
      name == "lm_head.weight" and config.tie_word_embeddings
      and _tensor_shape(tensors, stored[name]) == embed_shape)
  derived = ({("inv_freq",): jnp.asarray(rope_inverse_frequencies(config))}
             if config.llama_like else {})
  if config.rope_local_theta is not None:
    derived[("local_inv_freq",)] = jnp.asarray(rope_inverse_frequencies(config, SLIDING_ATTENTION))
  return fill_from_hf(
      lambda: Transformer(config, nnx.Rngs(0)), hf_layout(config), tensors, stored, source,
      jnp.dtype(config.dtype), missing_note=f"for model_type {config.model_type!r}",
      unexpected_note=f"not a parameter of a {config.model_type!r} model with this config",
      tolerated=tolerated, derived=derived, placer=placer)


def _mesh_placer(config: ModelConfig, mesh, sharding_rules):
  """``fill_from_hf``'s placer for ``mesh``: each value onto its shard by ``sharding_rules``, after
  checking that the mesh splits every parameter."""
  from specjax import sharding  # here: sharding imports the models package
  placement = sharding.placement(mesh, sharding_rules)

  def placer(abstract_state):
    sharding.check_divisible(config, abstract_state, placement.mesh, placement.rules, "model")
    shard_of = {path: var.get_value() for path, var in nnx.to_flat_state(
        sharding.shardings(abstract_state, placement.mesh, placement.rules))}
    return lambda path, value: sharding.put(value, shard_of[path])
  return placer


def fill_from_hf(build: Callable[[], nnx.Module], table: Sequence[Entry],
                 tensors: Mapping[str, Any], stored: Mapping[str, str], source: str, dtype,
                 missing_note: str, unexpected_note: str,
                 tolerated: Callable[[str], bool] = lambda name: False,
                 derived: Mapping[Path, Any] | None = None, placer=None) -> nnx.Module:
  """``build()``'s module, built abstractly and filled by ``table`` from HF-named ``tensors``
  (``stored``: table name -> the name in ``tensors``), one tensor at a time in ``dtype``.

  Checked first, each a ``ValueError`` naming ``source``: a table name missing from ``stored``,
  a stored name neither in the table nor ``tolerated``, a wrong shape. ``derived``: values of
  non-parameter variables (rotary frequencies). ``placer(abstract_state)`` returns how each
  value is placed (a mesh), else values stay where they are. What ``params_from_hf`` and the
  heads' loaders (``specjax.heads.layout``) share.
  """
  abstract = nnx.eval_shape(build)
  graphdef, abstract_state = nnx.split(abstract)
  place = placer(abstract_state) if placer is not None else (lambda path, value: value)
  flat = list(nnx.to_flat_state(abstract_state))
  shapes = {path: tuple(var.get_value().shape) for path, var in flat}

  covered = [p for e in table for p in e.paths]
  params = {path for path, var in flat if isinstance(var, nnx.Param)}
  if sorted(map(str, covered)) != sorted(map(str, params)):  # a bug in the table, not the data
    raise AssertionError(f"the layout table does not cover the module's parameters exactly: "
                         f"{set(map(str, covered)) ^ set(map(str, params))}")
  expected = {e.hf_name: _hf_shape(e, shapes) for e in table}
  missing = [n for n in expected if n not in stored]
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise ValueError(f"{source}: missing tensor {missing[0]!r}{more} {missing_note}")
  for name in stored:
    if name not in expected and not tolerated(name):
      raise ValueError(f"{source}: unexpected tensor {stored[name]!r} ({unexpected_note})")
  for name, shape in expected.items():
    actual = _tensor_shape(tensors, stored[name])
    if actual != shape:
      raise ValueError(f"{source}: tensor {stored[name]!r} has shape {actual}, expected {shape}")

  values: dict[Path, jax.Array] = {}
  for entry in table:
    tensor = jnp.asarray(tensors[stored[entry.hf_name]]).astype(dtype)  # cast first: less to move
    for path, value in zip(entry.paths, _from_hf(entry, tensor, shapes)):
      values[path] = place(path, value)
    del tensor
  for path, value in (derived or {}).items():
    values[path] = place(path, value)
  for path, var in flat:
    if path not in values:
      raise AssertionError(f"no value for model variable {path}")
    var.set_value(values.pop(path))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def read_pickled(file: str, keep: Callable[[str], bool] = lambda name: True) -> dict:
  """The tensors of a pickled torch checkpoint ``file`` whose names pass ``keep``, read with
  ``torch.load(weights_only=True)`` (no code runs from the file): floats as float32 jax arrays,
  integers as numpy (jax would narrow int64). Needs torch, which the library does not install."""
  try:
    import torch
  except ImportError:
    raise ValueError(f"reading {file} needs torch (torch.load(weights_only=True)); install torch "
                     f"or convert the file to safetensors") from None
  state = torch.load(file, map_location="cpu", weights_only=True)
  return {name: t.numpy() if not t.is_floating_point() else jnp.asarray(t.float().numpy())
          for name, t in state.items() if keep(name)}


class _SafetensorsReader(Mapping):
  """A lazy ``{name: tensor}`` view over safetensors files (read with ``safe_open``).

  Tensors come back as jax arrays: ``framework="numpy"`` cannot represent bfloat16, while
  ``framework="flax"`` can (and places each tensor on the default device straight away).
  """

  def __init__(self, files: Sequence[str]):
    from safetensors import SafetensorError, safe_open

    self._error_type = SafetensorError
    self._stack = contextlib.ExitStack()
    self._handles: dict[str, Any] = {}
    self._file_of: dict[str, str] = {}
    try:
      for file in files:
        handle = self._guard(file, lambda: self._stack.enter_context(safe_open(file, "flax")))
        for name in handle.keys():
          if name in self._file_of:
            raise ValueError(f"tensor {name!r} appears in both {self._file_of[name]} and {file}")
          self._handles[name] = handle
          self._file_of[name] = file
    except BaseException:
      self._stack.close()
      raise

  def _guard(self, file: str, fn: Callable[[], Any]) -> Any:
    try:
      return fn()
    except self._error_type as e:
      raise ValueError(f"cannot read safetensors file {file} (truncated or corrupt?): {e}") from e

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._guard(self._file_of[name],
                             lambda: self._handles[name].get_slice(name).get_shape()))

  def __getitem__(self, name: str) -> jax.Array:
    if name not in self._handles:
      raise KeyError(name)
    return self._guard(self._file_of[name], lambda: self._handles[name].get_tensor(name))

  def __iter__(self):
    return iter(self._handles)

  def __len__(self) -> int:
    return len(self._handles)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._stack.close()
