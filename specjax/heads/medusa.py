"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads", arXiv 2401.10774, §2.1.1).

``K`` heads read the target's last hidden state *after* its final norm (``NORMED``, what the
target's LM head reads) at position ``t``, the position whose logits gave token ``t + 1``; head
``k`` (0-based) guesses token ``t + 2 + k``. Each head is ``num_layers`` residual SiLU blocks
``x + SiLU(W x + b)`` followed by a vocabulary projection: its own ``[E, V]`` matrix (the
released Medusa-1 heads) or the target's LM head, shared (``own_lm_head=False``; later Medusa
variants and several engines). The heads never see the tokens they guess before: their laws
depend only on the committed text, which is what makes drafting from them exact to verify.

The released layout (``FasterDecoding/Medusa`` ``medusa_model.py``, ``train_legacy.py``): one
file ``medusa_lm_head.safetensors`` (or ``.pt``) of ``nn.ModuleList`` of ``nn.Sequential``,
keys ``{k}.{j}.linear.weight`` / ``.bias`` for block ``j < num_layers`` of head ``k`` and
``{k}.{num_layers}.weight`` for its projection, and ``config.json`` with ``medusa_num_heads`` /
``medusa_num_layers`` (``specjax.heads.layout`` reads and writes it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.hf_layout import TRANSPOSE, Entry, _iter_hf_tensors, fill_from_hf, linear
from specjax.models.transformer import NORMED, Dense, _param, matmul

MEDUSA_FILE = "medusa_lm_head"  # .safetensors, or .pt (pickled; torch.load(weights_only=True))
_PREFIX = "medusa_head."  # the same keys inside a whole MedusaModel checkpoint


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
  hidden_size: int
  vocab_size: int | None  # None: unknown (heads on the target's LM head, which sets it)
  num_heads: int  # K: head k guesses the token k + 2 positions after the feature's
  num_layers: int = 1  # residual blocks per head
  own_lm_head: bool = True  # False: the target's LM head projects every head
  dtype: str = "float32"

  def __post_init__(self):
    if self.own_lm_head and self.vocab_size is None:
      raise ValueError("Medusa heads with their own projections need vocab_size")
    for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
      value = getattr(self, name)
      if name == "vocab_size" and value is None:
        continue
      if isinstance(value, bool) or not isinstance(value, int) or value < (
          0 if name == "num_layers" else 1):
        raise ValueError(f"Medusa {name} must be an integer >= "
                         f"{0 if name == 'num_layers' else 1}, got {value!r}")


class MedusaHead(nnx.Module):
  """``config.num_heads`` Medusa heads over the target's normed last hidden state."""

  def __init__(self, config: MedusaConfig, rngs: nnx.Rngs):
    dtype = jnp.dtype(config.dtype)
    e, v = config.hidden_size, config.vocab_size
    self.config = config
    self.blocks = nnx.List([
        nnx.List([Dense(rngs, e, e, (None, "embed"), True, dtype)
                  for _ in range(config.num_layers)])
        for _ in range(config.num_heads)])
    self.lm_heads = nnx.List([_param(rngs, (e, v), ("embed", "vocab"), dtype)
                              for _ in range(config.num_heads)]) if config.own_lm_head else None

  @property
  def num_heads(self) -> int:
    return self.config.num_heads

  def hidden(self, features: jax.Array) -> jax.Array:
    """[..., K, E] each head's state before its projection, from normed features [..., E]."""
    outs = []
    for blocks in self.blocks:
      x = features
      for block in blocks:
        x = x + jax.nn.silu(block(x))
      outs.append(x)
    return jnp.stack(outs, axis=-2)

  def logits(self, features: jax.Array, target) -> jax.Array:
    """float32[..., K, V] the heads' logits (head k: token k + 2 after the feature's position)."""
    x = self.hidden(features.astype(jnp.dtype(self.config.dtype)))
    if self.lm_heads is None:
      return target.project(x)
    return jnp.stack([matmul(x[..., k, :].astype(jnp.float32), w[...].astype(jnp.float32))
                      for k, w in enumerate(self.lm_heads)], axis=-2)

  def target_features(self, target_config) -> tuple[str, ...]:
    """The target hidden states the heads read: the final norm's output."""
    del target_config
    return (NORMED,)


def init_medusa(target_config, num_heads: int = 4, num_layers: int = 1, key: int = 0,
                own_lm_head: bool = True, dtype: str = "float32") -> MedusaHead:
  """Untrained heads for a target of ``target_config``: blocks and projections normal(0.02)."""
  config = MedusaConfig(target_config.hidden_size, target_config.vocab_size, num_heads,
                        num_layers, own_lm_head, dtype)
  return MedusaHead(config, nnx.Rngs(params=key))


def start_from_target(head: MedusaHead, target) -> MedusaHead:
  """The Medusa repository's initialisation, in place: every block the identity (W = 0, b = 0,
  so ``x + SiLU(0) = x``) and every own projection a copy of the target's LM head, so head k
  starts as the target's next-token guess (one position behind the token it must guess)."""
  for blocks in head.blocks:
    for block in blocks:
      block.kernel[...] = jnp.zeros_like(block.kernel[...])
      block.bias[...] = jnp.zeros_like(block.bias[...])
  if head.lm_heads is not None:
    w = target.embed[...].T if target.lm_head is None else target.lm_head[...]
    for lm_head in head.lm_heads:
      lm_head[...] = w.astype(lm_head[...].dtype)
  return head


def check_medusa(head: MedusaHead, target) -> None:
  """Raises unless ``head`` can draft for ``target``: same hidden size and vocabulary."""
  c, t = head.config, target.config
  if c.hidden_size != t.hidden_size:
    raise ValueError(f"the Medusa heads' hidden size {c.hidden_size} differs from the target's "
                     f"{t.hidden_size}")
  if c.vocab_size is not None and c.vocab_size != t.vocab_size:
    raise ValueError(f"the Medusa heads' vocabulary of {c.vocab_size} tokens differs from the "
                     f"target's {t.vocab_size}")


def medusa_layout(config: MedusaConfig) -> list[Entry]:
  """Every tensor of the released layout (module docstring) with our parameter paths."""
  table = []
  for k in range(config.num_heads):
    for j in range(config.num_layers):
      table += linear(f"{k}.{j}.linear", ("blocks", k, j), True)
    if config.own_lm_head:
      table.append(Entry(f"{k}.{config.num_layers}.weight", TRANSPOSE, (("lm_heads", k),)))
  return table


def is_medusa_config(hf: dict) -> bool:
  return "medusa_num_heads" in hf


def load_medusa(hf: dict, tensors: dict, source: str, dtype: str | None = None) -> MedusaHead:
  """Medusa heads from config.json's dict ``hf`` and the file's ``tensors`` (HF names, with or
  without the whole model's ``medusa_head.`` prefix); sizes come from the tensors."""
  tensors = {n[len(_PREFIX):] if n.startswith(_PREFIX) else n: t for n, t in tensors.items()}
  k, layers = hf.get("medusa_num_heads"), hf.get("medusa_num_layers", 1)
  for name, value in (("medusa_num_heads", k), ("medusa_num_layers", layers)):
    least = 1 if name == "medusa_num_heads" else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      raise ValueError(f"{source}: config.json's {name} must be an integer >= {least}, got "
                       f"{value!r}")
  block = tensors.get("0.0.linear.weight")
  projection = tensors.get(f"0.{layers}.weight")
  if block is None and projection is None:
    raise ValueError(f"{source}: neither '0.0.linear.weight' nor '0.{layers}.weight' is in the "
                     f"file: not Medusa heads with medusa_num_layers={layers}")
  hidden = int((block if block is not None else projection).shape[-1])
  vocab = int(projection.shape[0]) if projection is not None else hf.get("vocab_size")
  config = MedusaConfig(hidden, vocab, k, layers, projection is not None,
                        dtype or hf.get("torch_dtype") or "float32")
  table = medusa_layout(config)
  return fill_from_hf(lambda: MedusaHead(config, nnx.Rngs(0)), table, tensors,
                      {name: name for name in tensors}, source, jnp.dtype(config.dtype),
                      missing_note=f"of {k} Medusa heads with {layers} block(s) each",
                      unexpected_note=f"not in {k} Medusa heads with {layers} block(s) each")


def medusa_files(head: MedusaHead, base_model: str = "") -> tuple[dict, dict]:
  """(config.json's dict, the tensors by name) of ``head`` in the released layout; the config
  also names the sizes (``hidden_size``, ``vocab_size``), which Medusa's loader ignores."""
  c = head.config
  hf = {"medusa_num_heads": c.num_heads, "medusa_num_layers": c.num_layers,
        "base_model_name_or_path": base_model, "hidden_size": c.hidden_size,
        "torch_dtype": c.dtype}
  if c.vocab_size is not None:
    hf["vocab_size"] = c.vocab_size
  return hf, dict(_iter_hf_tensors(head, medusa_layout(c)))
