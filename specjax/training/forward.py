"""The training forward pass: a full causal pass with no KV cache, its matmuls in a chosen
operand dtype with float32 accumulation and a gradient of the same form (a custom VJP).

``split`` separates what the optimiser trains from what it leaves alone (buffers, frozen
parameters); ``logits`` merges them back and runs the fast path when the model allows it.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.config import ModelConfig
from specjax.models.kv_cache import init_cache
from specjax.models.transformer import Transformer


def frozen_names(frozen: str | Sequence[str] | None) -> tuple[str, ...]:
  """``train.frozen`` (a comma-separated string or a sequence of names) as a tuple."""
  if isinstance(frozen, str):
    return tuple(f.strip() for f in frozen.split(",") if f.strip())
  return tuple(frozen or ())


def split(model: Transformer, frozen: str | Sequence[str] = ()):
  """(graphdef, params, rest): trainable ``nnx.Param`` state apart from constant buffers and from
  the parameters under the attribute names ``frozen`` (e.g. ``"embed"``), which stay in ``rest``."""
  frozen = frozen_names(frozen)
  if not frozen:
    return nnx.split(model, nnx.Param, ...)
  return nnx.split(model, nnx.All(nnx.Param, *(nnx.Not(nnx.PathContains(f)) for f in frozen)), ...)


def logits(graphdef, params, rest, inputs, compute_dtype=None, head_ids=None) -> jax.Array:
  """float32[B, T, V] logits of a full causal pass (inside jit); float32[B, T, K] for the K
  vocabulary ids ``head_ids`` only. See ``causal_logits`` for ``compute_dtype``."""
  model = nnx.merge(graphdef, params, rest)
  if _fast_path_ok(model.config):
    return causal_logits(model, inputs, compute_dtype, head_ids)
  cache = init_cache(model.config, inputs.shape[0], inputs.shape[1])
  out, _ = model(inputs, cache)
  return out if head_ids is None else jnp.take(out, head_ids, axis=-1)


def _fast_path_ok(config: ModelConfig) -> bool:
  return config.is_llama_family and config.sliding_window is None


def mm(x: jax.Array, w: jax.Array, compute_dtype=None) -> jax.Array:
  """``x @ w`` (contracting x's last axis with w's first) with float32 accumulation and result,
  the operands cast to ``compute_dtype`` (default: ``w``'s dtype).

  bfloat16 operands with a float32 result run on oneDNN's AMX/AVX-512 kernels on recent Intel
  CPUs: 470-600 GFLOP/s against 80-100 in float32 for SmolLM2's [1024, 576] x [576, 1536] on a
  2-core Sapphire Rapids slice, while a bfloat16 *result* stays on the slow path (84 GFLOP/s).
  The gradient (``_mm_low``) keeps that form: bfloat16 operands, float32 accumulation, as in
  mixed-precision training; autodiff's own transpose mixes a float32 cotangent with a bfloat16
  operand and ran slower than float32.
  """
  cd = jnp.dtype(compute_dtype or w.dtype)
  if cd.itemsize < 4:
    return _mm_low(x, w, cd)
  return jnp.dot(x.astype(cd), w.astype(cd), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mm_low(x, w, cd):
  return jnp.dot(x.astype(cd), w.astype(cd), preferred_element_type=jnp.float32)


def _mm_low_fwd(x, w, cd):
  return _mm_low(x, w, cd), (x, w)


def _mm_low_bwd(cd, res, g):
  x, w = res
  g = g.astype(cd)
  dx = jnp.dot(g, w.astype(cd).T, preferred_element_type=jnp.float32)
  dw = jnp.dot(x.reshape(-1, x.shape[-1]).astype(cd).T, g.reshape(-1, g.shape[-1]),
               preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(w.dtype)


_mm_low.defvjp(_mm_low_fwd, _mm_low_bwd)


def _dense(dense, x: jax.Array, compute_dtype=None) -> jax.Array:
  y = mm(x, dense.kernel[...], compute_dtype)
  return y if dense.bias is None else y + dense.bias[...].astype(jnp.float32)


def causal_logits(model: Transformer, inputs: jax.Array, compute_dtype=None,
                  head_ids: jax.Array | None = None) -> jax.Array:
  """The Llama-family ``Transformer`` forward specialised to a full causal pass with no cache.

  Training only: the module's general call builds a cache, scatters keys/values into it and masks
  against cache slots, which costs ~30% of a small model's training step on CPU. This reuses the
  module's own norms, weights and rotary helper and only writes plain causal attention itself;
  ``tests/test_train.py`` checks it against ``specjax.forward``.

  Matmuls take their operands in ``compute_dtype`` (default: each weight's own dtype) and
  accumulate in float32 (``mm``); the residual stream is float32. A bfloat16 model (e.g. the
  distillation teacher loaded in bfloat16) or ``compute_dtype="bfloat16"`` runs ~2x faster on
  CPUs with AMX (SmolLM2-135M, [8, 128] tokens: 1.8 s vs 4.2 s, KL to the float32 logits
  0.0006 nats). ``head_ids`` (int32[K]): logits of those vocabulary ids only, [B, T, K]: the
  head's K rows, not all V (a reduced-vocabulary draft, ALGORITHMS.md §13).
  """
  cd = None if compute_dtype is None else jnp.dtype(compute_dtype)
  x = causal_states(model, inputs, compute_dtype)[-1]
  if head_ids is None and cd is None:
    return model.project(x)  # the model's own head (a reduced-vocabulary view's too)
  head = model.embed[...].T if model.lm_head is None else model.lm_head[...]
  if head_ids is not None:
    head = jnp.take(head, head_ids, axis=1)
  return mm(x, head, cd)


def causal_states(model: Transformer, inputs: jax.Array, compute_dtype=None,
                  num_layers: int | None = None) -> list[jax.Array]:
  """float32 residual streams of ``causal_logits``' pass: the output of each of the first
  ``num_layers`` blocks (default all; ``feature_layers``' numbering), then, after all blocks, the
  final norm's output (``NORMED``), [B, T, E] each. With ``num_layers`` < the model's, the pass
  stops there and the list ends with that block's output."""
  from specjax.models.transformer import _rotate

  cd = None if compute_dtype is None else jnp.dtype(compute_dtype)
  b, t = inputs.shape
  x = jnp.take(model.embed[...], inputs, axis=0).astype(jnp.float32)
  freqs = jnp.arange(t, dtype=jnp.float32)[:, None] * model.inv_freq[...][None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[None, :, None, :]  # [1, T, 1, R]
  cos, sin = jnp.cos(emb), jnp.sin(emb)
  causal = jnp.tril(jnp.ones((t, t), bool))
  states = []
  for layer in model.layers[:num_layers]:
    attn, mlp = layer.attn, layer.mlp
    h = layer.attn_norm(x)
    q = _dense(attn.q, h, cd).reshape(b, t, attn.num_kv_heads, -1, attn.head_dim)
    k = _dense(attn.k, h, cd).reshape(b, t, attn.num_kv_heads, attn.head_dim)
    v = _dense(attn.v, h, cd).reshape(b, t, attn.num_kv_heads, attn.head_dim)
    q, k = attn.normalize_qk(q, k)
    q, k = _rotate(q, cos[..., None, :], sin[..., None, :]), _rotate(k, cos, sin)
    qk_dtype = cd or attn.q.kernel.dtype
    scores = jnp.einsum("btkgd,bskd->bkgts", q.astype(qk_dtype), k.astype(qk_dtype),
                        preferred_element_type=jnp.float32)
    scores = jnp.where(causal, scores * (attn.head_dim ** -0.5), -1e30)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(qk_dtype), v.astype(qk_dtype),
                     preferred_element_type=jnp.float32).reshape(b, t, -1)
    x = x + _dense(attn.o, out, cd)
    h = layer.mlp_norm(x)
    x = x + _dense(mlp.down, mlp.act(_dense(mlp.gate, h, cd)) * _dense(mlp.up, h, cd), cd)
    states.append(x)
  if num_layers is None or num_layers >= len(model.layers):
    states.append(model.final_norm(x))
  return states
