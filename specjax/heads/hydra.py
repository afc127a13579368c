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
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.hf_layout import _iter_hf_tensors, fill_from_hf, linear
from specjax.models.transformer import NORMED, Dense

HYDRA_FILE = "hydra_lm_head"  # .safetensors, or .pt (pickled; torch.load(weights_only=True))


@dataclasses.dataclass(frozen=True)
class HydraConfig:
  hidden_size: int
  vocab_size: int
  num_heads: int  # K: head k guesses the token k + 2 after the state's position
  num_layers: int = 1  # residual blocks per head (the first one conditioned on the path)
  dtype: str = "float32"

  def __post_init__(self):
    for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Hydra {name} must be an integer >= 1, got {value!r}")


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
               dtype: str = "float32") -> HydraHead:
  """Untrained heads for a target of ``target_config`` (normal(0.02) weights)."""
  config = HydraConfig(target_config.hidden_size, target_config.vocab_size, num_heads,
                       num_layers, dtype)
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
  return head


def hydra_layout(config: HydraConfig) -> list:
  """Every tensor of the released layout with our parameter paths."""
  table = []
  for k in range(config.num_heads):
    table += linear(f"hydra_mlp.{k}.0.linear", ("inputs", k), True)
    table += linear(f"hydra_mlp.{k}.0.res_connection", ("residuals", k), True)
    for j in range(1, config.num_layers):
      table += linear(f"hydra_mlp.{k}.{j}.linear", ("blocks", k, j - 1), True)
    table += linear(f"hydra_lm_head.{k}", ("lm_heads", k), True)
  return table


def is_hydra_config(hf: dict) -> bool:
  return "hydra_num_heads" in hf


def load_hydra(hf: dict, tensors: dict, source: str, dtype: str | None = None) -> HydraHead:
  """Hydra heads from config.json's dict ``hf`` and the file's ``tensors``."""
  arch, grounded = hf.get("hydra_head_arch", "mlp"), hf.get("grounded_heads", True)
  if arch != "mlp" or not grounded:
    raise ValueError(f"{source}: hydra_head_arch={arch!r}, grounded_heads={grounded!r}: only "
                     f"the grounded MLP heads (Hydra proper) are supported")
  k, layers = hf.get("hydra_num_heads"), hf.get("hydra_num_layers", 1)
  projection = tensors.get("hydra_lm_head.0.weight")
  if projection is None:
    raise ValueError(f"{source}: no 'hydra_lm_head.0.weight' in the file: not Hydra heads")
  config = HydraConfig(int(projection.shape[1]), int(projection.shape[0]), k, layers,
                       dtype or hf.get("torch_dtype") or "float32")
  what = f"{k} Hydra heads with {layers} block(s) each"
  return fill_from_hf(lambda: HydraHead(config, nnx.Rngs(0)), hydra_layout(config), tensors,
                      {name: name for name in tensors}, source, jnp.dtype(config.dtype),
                      missing_note=f"of {what}", unexpected_note=f"not in {what}")


def hydra_files(head: HydraHead, base_model: str = "") -> tuple[dict, dict]:
  """(config.json's dict, the tensors by name) of ``head`` in the released layout."""
  c = head.config
  hf = {"hydra_num_heads": c.num_heads, "hydra_num_layers": c.num_layers,
        "hydra_head_arch": "mlp", "grounded_heads": True, "base_model_name_or_path": base_model,
        "hidden_size": c.hidden_size, "vocab_size": c.vocab_size, "torch_dtype": c.dtype}
  return hf, dict(_iter_hf_tensors(head, hydra_layout(c)))
