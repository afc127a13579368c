"""Hydra heads (Ankner et al. 2024, "Hydra: Sequentially-Dependent Draft Heads for Medusa
Decoding", arXiv 2402.05109): Medusa heads that also see the tokens guessed before theirs.

Head ``k`` (0-based) reads the target's normed state ``h`` at the position that produced the
pending token ``x_1`` and the embeddings of the candidate path ``x_1 .. x_{k+1}`` (the pending
token and the k tokens its path guessed before), ``[h ; E(x_1) ; ... ; E(x_{k+1})]`` ((k + 2) E
wide), and guesses ``x_{k+2}``: a first residual block whose residual is a linear map down to E
(``res_connection(x) + SiLU(linear(x))``), ``num_layers - 1`` plain residual blocks
``x + SiLU(W x + b)``, and its own vocabulary projection with a bias (the Hydra repository's
``HydraMLP`` with ``grounded_heads=True``, ``hydra/model/hydra_heads/mlp_head.py``). Because a
head's law depends on the path, a tree's children of different parents at one depth get
different laws; each is still the law they are drawn from, so the exact tree rules apply.

The released layout: ``hydra_lm_head.pt`` (or ``.safetensors``), the state dict of
``HydraMLP``: ``hydra_mlp.{k}.0.linear.*``, ``hydra_mlp.{k}.0.res_connection.*``,
``hydra_mlp.{k}.{j}.linear.*`` (j >= 1) and ``hydra_lm_head.{k}.weight`` / ``.bias``; and
``config.json`` with ``hydra_num_heads``, ``hydra_num_layers``, ``hydra_head_arch`` ("mlp")
and ``grounded_heads`` (true).

Hydra++'s prefix layer (the paper's Hydra++ heads; the repository's ``HydraPrefixMLP``,
``hydra/model/hydra_heads/prefix_mlp_head.py``, ``hydra_head_arch: "prefix-mlp"``): one more
decoder layer of the target's architecture and its own final RMSNorm (a one-layer
``LlamaModel`` fed the target's normed states as ``inputs_embeds``) runs causally over the
whole sequence with its own KV cache; its output at the position of ``h`` replaces ``h`` in
every head's input. Its tensors: ``prefix_embeding_layer.layers.0.*`` (a Llama layer's names),
``prefix_embeding_layer.norm.weight`` and the unused ``prefix_embeding_layer.embed_tokens.weight``
(read and dropped; written from the target so the repository's strict load finds it).
``config.json`` then also carries the layer's config (``prefix_layer_config``, a Llama
``config.json`` dict), which the repository's files lack: ``load_head(target_config=)`` gives it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.heads.eagle import decoder_pass
from specjax.models.config import ModelConfig, rope_inverse_frequencies
from specjax.models.hf_config import from_hf_dict, to_hf_dict
from specjax.models.hf_layout import (COPY, Entry, _iter_hf_tensors, fill_from_hf, linear,
                                      llama_layer)
from specjax.models.kv_cache import KVCache
from specjax.models.transformer import NORMED, Block, Dense, Norm

HYDRA_FILE = "hydra_lm_head"  # .safetensors, or .pt (pickled; torch.load(weights_only=True))
PREFIX = "prefix_embeding_layer."  # sic: the repository's spelling
PREFIX_EMBED = PREFIX + "embed_tokens.weight"  # the repository's unused embedding


@dataclasses.dataclass(frozen=True)
class HydraConfig:
  hidden_size: int
  vocab_size: int
  num_heads: int  # K: head k guesses the token k + 2 after the state's position
  num_layers: int = 1  # residual blocks per head (the first one conditioned on the path)
  dtype: str = "float32"
  prefix: ModelConfig | None = None  # Hydra++'s prefix layer: its one-layer decoder's config

  def __post_init__(self):
    for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Hydra {name} must be an integer >= 1, got {value!r}")
    p = self.prefix
    if p is not None and not p.is_llama_family:
      raise ValueError(f"Hydra++'s prefix layer is a Llama-family decoder layer, got model_type "
                       f"{p.model_type!r}")
    if p is not None and (p.num_layers, p.hidden_size) != (1, self.hidden_size):
      raise ValueError(f"the prefix layer's config must have 1 layer of width "
                       f"{self.hidden_size}, got {p.num_layers} of {p.hidden_size}")


def prefix_config(target_config: ModelConfig, dtype: str) -> ModelConfig:
  """The prefix layer's config: the target's decoder, one layer (the repository's
  ``deepcopy(base_config)`` with ``num_hidden_layers = 1``)."""
  return dataclasses.replace(target_config, num_layers=1, tie_word_embeddings=False, dtype=dtype)


class HydraHead(nnx.Module):
  """``config.num_heads`` sequentially dependent heads (module docstring)."""

  def __init__(self, config: HydraConfig, rngs: nnx.Rngs):
    dtype = jnp.dtype(config.dtype)
    e, v = config.hidden_size, config.vocab_size
    self.config = config
    self.inputs = nnx.List([Dense(rngs, (k + 2) * e, e, (None, "embed"), True, dtype)
                            for k in range(config.num_heads)])
    self.residuals = nnx.List([Dense(rngs, (k + 2) * e, e, (None, "embed"), True, dtype)
                               for k in range(config.num_heads)])
    self.blocks = nnx.List([
        nnx.List([Dense(rngs, e, e, (None, "embed"), True, dtype)
                  for _ in range(config.num_layers - 1)])
        for _ in range(config.num_heads)])
    self.lm_heads = nnx.List([Dense(rngs, e, v, ("embed", "vocab"), True, dtype)
                              for _ in range(config.num_heads)])
    if config.prefix is not None:  # absent otherwise: plain heads' graph is unchanged
      self.prefix = nnx.List([Block(config.prefix, rngs, dtype)])
      self.prefix_norm = Norm(config.prefix, dtype)
      self.inv_freq = nnx.Variable(jnp.asarray(rope_inverse_frequencies(config.prefix)))

  @property
  def has_prefix(self) -> bool:
    return self.config.prefix is not None

  def prefix_pass(self, features: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
    """(the prefix layer's outputs [B, T, E], cache) over T new normed target states [B, T, E]
    at the cache's committed lengths on (causal, positions = slots: entry t is position t)."""
    x = features.astype(jnp.dtype(self.config.dtype))
    x, cache = decoder_pass(self.config.prefix, self.prefix, self.inv_freq[...], x, cache)
    return self.prefix_norm(x), cache

  @property
  def num_heads(self) -> int:
    return self.config.num_heads

  def state(self, k: int, features: jax.Array, path_embeds: jax.Array) -> jax.Array:
    """[..., E] head ``k``'s state from normed ``features`` [..., E] and the path's embeddings
    [..., k + 1, E] (the pending token first)."""
    dtype = jnp.dtype(self.config.dtype)
    x = jnp.concatenate([features[..., None, :], path_embeds], axis=-2).astype(dtype)
    x = x.reshape(x.shape[:-2] + (-1,))
    h = self.residuals[k](x) + jax.nn.silu(self.inputs[k](x))
    for block in self.blocks[k]:
      h = h + jax.nn.silu(block(h))
    return h

  def project(self, k: int, state: jax.Array, ids: jax.Array | None = None) -> jax.Array:
    """float32[..., V] head ``k``'s logits of its ``state`` (``ids``: only those columns)."""
    dense = self.lm_heads[k]
    w, b = dense.kernel[...].astype(jnp.float32), dense.bias[...].astype(jnp.float32)
    if ids is not None:
      w, b = jnp.take(w, ids, axis=1), jnp.take(b, ids)
    return jnp.dot(state.astype(jnp.float32), w) + b

  def target_features(self, target_config) -> tuple[str, ...]:
    del target_config
    return (NORMED,)


def init_hydra(target_config, num_heads: int = 4, num_layers: int = 1, key: int = 0,
               dtype: str = "float32", prefix_layer: bool = False) -> HydraHead:
  """Untrained heads for a target of ``target_config`` (normal(0.02) weights; ``prefix_layer``:
  with Hydra++'s prefix layer, norms at 1)."""
  prefix = prefix_config(target_config, dtype) if prefix_layer else None
  config = HydraConfig(target_config.hidden_size, target_config.vocab_size, num_heads,
                       num_layers, dtype, prefix)
  return HydraHead(config, nnx.Rngs(params=key))


def start_hydra_from_target(head: HydraHead, target) -> HydraHead:
  """The Hydra repository's initialisation, in place: every ``linear`` zero (a block is then its
  residual), the first block's residual the projection onto the state ``h`` (our choice: the
  repository leaves it random; this way head k starts as the target's next-token guess from h,
  as Medusa's does), the projections a copy of the target's LM head, biases zero."""
  e = head.config.hidden_size
  w = target.embed[...].T if target.lm_head is None else target.lm_head[...]
  for k in range(head.num_heads):
    for dense in (head.inputs[k], *head.blocks[k]):
      dense.kernel[...] = jnp.zeros_like(dense.kernel[...])
      dense.bias[...] = jnp.zeros_like(dense.bias[...])
    res = head.residuals[k]
    res.kernel[...] = jnp.zeros_like(res.kernel[...]).at[:e].set(jnp.eye(e, dtype=res.kernel.dtype))
    res.bias[...] = jnp.zeros_like(res.bias[...])
    head.lm_heads[k].kernel[...] = w.astype(head.lm_heads[k].kernel.dtype)
    head.lm_heads[k].bias[...] = jnp.zeros_like(head.lm_heads[k].bias[...])
  if head.has_prefix:
    start_prefix_from_target(head, target)
  return head


def start_prefix_from_target(head: HydraHead, target) -> None:
  """The prefix layer as a copy of the target's last decoder layer with its output projections
  (attention ``o``, MLP ``down``) zero and its norm at 1 (our choice; we found no initialisation
  in the repository's head code): it then starts as ``h / rms(h)``, so the heads start as plain
  Hydra's up to a positive per-position scale (the same greedy guesses), and the copied
  q/k/v/gate/up give the output projections a trained start."""
  layer = head.prefix[0]
  nnx.update(layer, jax.tree.map(lambda x: x.astype(jnp.dtype(head.config.dtype)),
                                 nnx.state(target.layers[-1], nnx.Param)))
  for dense in (layer.attn.o, layer.mlp.down):
    for name in ("kernel", "bias"):
      param = getattr(dense, name, None)
      if param is not None:
        param[...] = jnp.zeros_like(param[...])
  head.prefix_norm.scale[...] = jnp.ones_like(head.prefix_norm.scale[...])


def hydra_layout(config: HydraConfig) -> list:
  """Every tensor of the released layout with our parameter paths."""
  table = []
  for k in range(config.num_heads):
    table += linear(f"hydra_mlp.{k}.0.linear", ("inputs", k), True)
    table += linear(f"hydra_mlp.{k}.0.res_connection", ("residuals", k), True)
    for j in range(1, config.num_layers):
      table += linear(f"hydra_mlp.{k}.{j}.linear", ("blocks", k, j - 1), True)
    table += linear(f"hydra_lm_head.{k}", ("lm_heads", k), True)
  if config.prefix is not None:
    table += llama_layer(config.prefix, PREFIX + "layers.0.", ("prefix", 0))
    table.append(Entry(PREFIX + "norm.weight", COPY, (("prefix_norm", "scale"),)))
  return table


def is_hydra_config(hf: dict) -> bool:
  return "hydra_num_heads" in hf


ARCHS = ("mlp", "prefix-mlp")  # hydra_head_arch values read: plain heads, Hydra++'s


def load_hydra(hf: dict, tensors: dict, source: str, dtype: str | None = None,
               target_config: ModelConfig | None = None) -> HydraHead:
  """Hydra heads from config.json's dict ``hf`` and the file's ``tensors`` (``target_config``:
  the prefix layer's decoder when config.json has no ``prefix_layer_config``)."""
  arch, grounded = hf.get("hydra_head_arch", "mlp"), hf.get("grounded_heads", True)
  if arch not in ARCHS or not grounded:
    raise ValueError(f"{source}: hydra_head_arch={arch!r}, grounded_heads={grounded!r}: only "
                     f"the grounded MLP heads (Hydra proper, {' or '.join(ARCHS)}) are supported")
  k, layers = hf.get("hydra_num_heads"), hf.get("hydra_num_layers", 1)
  projection = tensors.get("hydra_lm_head.0.weight")
  if projection is None:
    raise ValueError(f"{source}: no 'hydra_lm_head.0.weight' in the file: not Hydra heads")
  dtype = dtype or hf.get("torch_dtype") or "float32"
  prefix = None
  if arch == "prefix-mlp":
    if "prefix_layer_config" in hf:
      target_config = from_hf_dict(hf["prefix_layer_config"])
    if target_config is None:
      raise ValueError(f"{source}: a prefix-mlp head needs the base model's config: config.json "
                       f"has no prefix_layer_config, pass load_head(target_config=)")
    prefix = prefix_config(target_config, dtype)
  config = HydraConfig(int(projection.shape[1]), int(projection.shape[0]), k, layers, dtype,
                       prefix)
  what = f"{k} Hydra heads with {layers} block(s) each" + (" and a prefix layer" if prefix
                                                            else "")
  derived = {} if prefix is None else {("inv_freq",): jnp.asarray(rope_inverse_frequencies(prefix))}
  stored = {name: name for name in tensors if not (prefix and name == PREFIX_EMBED)}
  return fill_from_hf(lambda: HydraHead(config, nnx.Rngs(0)), hydra_layout(config), tensors,
                      stored, source, jnp.dtype(config.dtype), missing_note=f"of {what}",
                      unexpected_note=f"not in {what}", derived=derived)


def hydra_files(head: HydraHead, base_model: str = "", target=None) -> tuple[dict, dict]:
  """(config.json's dict, the tensors by name) of ``head`` in the released layout (with a
  prefix layer: ``prefix_layer_config``, and ``target``'s embedding as the repository's unused
  ``prefix_embeding_layer.embed_tokens.weight``, zeros without a target)."""
  c = head.config
  hf = {"hydra_num_heads": c.num_heads, "hydra_num_layers": c.num_layers,
        "hydra_head_arch": "mlp", "grounded_heads": True, "base_model_name_or_path": base_model,
        "hidden_size": c.hidden_size, "vocab_size": c.vocab_size, "torch_dtype": c.dtype}
  tensors = dict(_iter_hf_tensors(head, hydra_layout(c)))
  if c.prefix is not None:
    hf.update(hydra_head_arch="prefix-mlp", prefix_layer_config=to_hf_dict(c.prefix))
    embed = (np.zeros((c.vocab_size, c.hidden_size), np.float32) if target is None
             else np.asarray(target.embed.get_value()))
    tensors[PREFIX_EMBED] = embed.astype(next(iter(tensors.values())).dtype)
  return hf, tensors
