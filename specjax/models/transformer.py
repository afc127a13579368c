"""Decoder-only transformers in Flax NNX: the Llama family (Llama 2/3, Mistral, Qwen2, Qwen3,
Phi-3), Gemma 2/3 (text) and GPT-2.

One forward serves every decoding method: it takes ``T >= 1`` new tokens per row, writes their
keys/values at the row's scratch slots ``[length, length + T)`` of a static-shape ``KVCache``, and
lets new token ``i`` attend to the row's committed slots plus the new tokens ``j`` with
``tree_mask[i, j]``. A causal ``tree_mask`` is a chain (plain decoding, speculative verification);
an ancestor mask is a token tree; block masks give lookahead windows. Token ``i`` sits at position
``length + depths[i]``.

Layers of one model may differ in what they see: a sliding-window (local) layer only the keys
within ``sliding_window`` positions, a full (global) one all of them (Gemma's ``layer_types``;
Mistral's model-wide window makes every layer local). ``attention_layout`` builds one mask per
kind for a pass, over the full-length cache (no ring buffer: old keys stay and are masked).

Parameters keep Hugging Face's layout (projection kernels stored ``[in, out]``) and carry logical
axis names (``embed``, ``heads``, ``kv_heads``, ``mlp``, ``vocab``) so that tensor-parallel
sharding only needs rules mapping those names to mesh axes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.config import SLIDING_ATTENTION, ModelConfig, rope_inverse_frequencies
from specjax.models.kv_cache import KVCache, init_cache

_MASKED = -1e30  # finite, so that a fully masked (padding) row gives a uniform softmax, not NaN


def _param(rngs: nnx.Rngs | None, shape, axes, dtype, init: str = "normal") -> nnx.Param:
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros" or rngs is None:
    value = jnp.zeros(shape, dtype)
  else:
    value = (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class Norm(nnx.Module):
  """RMSNorm (Llama family, Gemma) or LayerNorm (GPT-2), computed in float32 like Hugging Face.

  ``axis``: the logical axis normalised, ``"embed"`` (hidden states) or ``"head_dim"`` (Qwen3's
  and Gemma 3's per-head query/key norms, whose weight has head_dim entries shared by every
  head). Gemma's RMSNorm scales by ``1 + scale`` in float32 before rounding (``Gemma3RMSNorm``;
  Llama rounds first, then scales), so its stored scale starts at 0."""

  def __init__(self, config: ModelConfig, dtype, axis: str = "embed"):
    size = config.head_dim if axis == "head_dim" else config.hidden_size
    self.rms = config.llama_like
    self.eps = config.norm_eps
    self.offset = config.norm_offset
    self.scale = _param(None, (size,), (axis,), dtype, init="zeros" if self.offset else "ones")
    self.bias = None if self.rms else _param(None, (size,), (axis,), dtype, "zeros")

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    x = x.astype(jnp.float32)
    if self.rms:
      x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
      if self.offset:
        return (x * (self.offset + self.scale[...].astype(jnp.float32))).astype(dtype)
      return self.scale[...] * x.astype(dtype)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    x = (x - mean) * jax.lax.rsqrt(var + self.eps)
    return (x * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(dtype)


def select_tokens(x: jax.Array, at: int | tuple[int, ...] | jax.Array) -> jax.Array:
  """``x[B, T, ...]`` at ``Transformer.__call__``'s ``logits_at``: [B, K, ...]."""
  if isinstance(at, jax.Array):  # per-row int32[B] / int32[B, K] (a prefill's last token)
    at = at.reshape(x.shape[0], -1)
    return jnp.take_along_axis(x, at.reshape(at.shape + (1,) * (x.ndim - 2)), axis=1)
  return x[:, np.asarray(at, np.int32).reshape(-1)]


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """``x @ kernel`` (``[..., in] x [in, out]``), as every ``Dense`` computes it.

  Low-precision (bfloat16/float16) weights multiply with float32 accumulation, the result rounded
  to ``x``'s dtype, as GPU/TPU matrix units and PyTorch's CPU kernels do. On XLA:CPU this form is
  also what reaches the fast bfloat16 kernels: with a bfloat16 *result* the product takes a slow
  path (90 products of SmolLM2's [576, 1536] shape on 2 cores: 5.5-6.8x slower at 2-16 rows,
  3.6x at 96). One row is slow either way on XLA:CPU, where float32 weights win (``python -m
  experiments.dot_shapes --dtypes=float32,bfloat16``, docs/benchmarks.md).
  """
  if kernel.dtype.itemsize < 4:
    return jnp.dot(x, kernel, preferred_element_type=jnp.float32).astype(x.dtype)
  return x @ kernel


class Dense(nnx.Module):
  """``x @ kernel + bias`` with a ``[in, out]`` kernel (``matmul``)."""

  def __init__(self, rngs, d_in: int, d_out: int, axes, bias: bool, dtype):
    self.kernel = _param(rngs, (d_in, d_out), axes, dtype)
    self.bias = _param(None, (d_out,), axes[1:], dtype, "zeros") if bias else None

  def __call__(self, x: jax.Array) -> jax.Array:
    y = matmul(x, self.kernel[...])
    return y if self.bias is None else y + self.bias[...]


def _activation(name: str):
  if name == "silu":
    return jax.nn.silu
  if name == "gelu":
    return lambda x: jax.nn.gelu(x, approximate=False)
  return lambda x: jax.nn.gelu(x, approximate=True)  # gelu_new / gelu_pytorch_tanh


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
  """``cap * tanh(x / cap)`` (Gemma 2's attention-score and final-logit soft-capping, which
  bounds them within (-cap, cap)); ``x`` itself when ``cap`` is None."""
  return x if cap is None else cap * jnp.tanh(x / cap)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotary embedding, Hugging Face's ``rotate_half`` convention. x: [B, T, heads, D].

  cos/sin [..., R] with R < D (Phi-3's ``partial_rotary_factor``) rotate the first R dims of
  each head and pass the rest through, as transformers' ``apply_rotary_pos_emb`` does."""
  r = cos.shape[-1]
  if r < x.shape[-1]:
    return jnp.concatenate([_rotate(x[..., :r], cos, sin), x[..., r:]], axis=-1)
  half = r // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return (x * cos + rotated * sin).astype(x.dtype)


# On CPU, attention over the cache for up to this many new tokens runs one dot per token: a
# decoding step or a verification pass is then a few matrix-vector products (or G-row products
# with G query heads per kv head), which XLA:CPU runs far faster than one batched [T, D] x [D, S]
# matmul or a broadcast-multiply-reduce (measured in a jitted decoding loop, default target at
# batch 4: 1.4-1.6x faster than broadcast-reduce for 2-5 new tokens, which was itself faster than
# the batched matmul). Accelerators, where reading the cache is the cost, get one contraction
# that reads it once; so do long queries (prefill) everywhere. All forms are the same sum.
_PER_TOKEN_MAX = 16


def _per_token(t: int) -> bool:
  return t <= _PER_TOKEN_MAX and jax.default_backend() == "cpu"


def _scores(q: jax.Array, k: jax.Array) -> jax.Array:
  """q: [B, T, KVH, G, D], k: [B, KVH, S, D] -> float32[B, KVH, G, T, S].

  Per token, each product keeps its unit token axis: XLA:CPU then orders it [B, KVH, S, G], while
  the squeezed ``bkgd,bksd->bkgs`` took a path ~2-3x slower at larger batches (SmolLM2 decoding
  steps on 2 cores, interleaved A/B: 0.84x the time at batch 128, 0.85x for a 2-token pass at
  batch 8, 0.94-0.97x at batch 1-32)."""
  product = lambda q: jnp.einsum("btkgd,bksd->bkgts", q, k).astype(jnp.float32)
  if not _per_token(q.shape[1]):
    return product(q)
  return jnp.concatenate([product(q[:, i:i + 1]) for i in range(q.shape[1])], axis=3)


def _weighted_values(probs: jax.Array, v: jax.Array) -> jax.Array:
  """probs: [B, KVH, G, T, S], v: [B, KVH, S, D] -> [B, T, KVH, G, D]."""
  if not _per_token(probs.shape[3]):
    return jnp.einsum("bkgts,bksd->btkgd", probs, v)
  return jnp.stack([jnp.einsum("bkgs,bksd->bkgd", probs[:, :, :, i], v)
                    for i in range(probs.shape[3])], axis=1)


class Attention(nnx.Module):
  """``d_in``: the width of the input (default the hidden size; an EAGLE-3 layer attends over
  [embedding ; hidden], twice that)."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, dtype, d_in: int | None = None):
    c = config
    d_in = c.hidden_size if d_in is None else d_in
    self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
    self.q = Dense(rngs, d_in, c.num_heads * c.head_dim, ("embed", "heads"), c.attention_bias,
                   dtype)
    self.k = Dense(rngs, d_in, c.num_kv_heads * c.head_dim, ("embed", "kv_heads"),
                   c.attention_bias, dtype)
    self.v = Dense(rngs, d_in, c.num_kv_heads * c.head_dim, ("embed", "kv_heads"),
                   c.attention_bias, dtype)
    self.o = Dense(rngs, c.num_heads * c.head_dim, c.hidden_size, ("heads", "embed"),
                   c.attention_out_bias, dtype)
    self.q_norm = Norm(c, dtype, "head_dim") if c.qk_norm else None
    self.k_norm = Norm(c, dtype, "head_dim") if c.qk_norm else None
    self.scale = c.attention_scale
    self.softcap = c.attn_logit_softcapping

  def normalize_qk(self, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Qwen3's and Gemma 3's per-head RMSNorm of queries and keys ([..., head_dim] each), applied
    before the rotary embedding; identity for families without it. The training forward calls it
    too."""
    if self.q_norm is None:
      return q, k
    return self.q_norm(q), self.k_norm(k)

  def __call__(self, x, rope, layer_k, layer_v, write, mask):
    """Attention of T new tokens over the cache, after writing their keys/values into it.

    x: [B, T, E]; layer_k/v: [B, KVH, S, D] this layer's cache; write: stores [B, T, KVH, D] at
    the rows' scratch slots; mask: bool[B, T, S], which slots each new token sees. Returns
    (out [B, T, E], updated layer_k, layer_v). Writing before reading lets XLA update the cache
    in place: read-then-write forced two full copies of every layer's buffer per step (measured
    3.5x slower attention steps on CPU at batch 8).
    """
    b, t, _ = x.shape
    q = self.q(x).reshape(b, t, self.num_heads, self.head_dim)
    k = self.k(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    q, k = self.normalize_qk(q, k)
    if rope is not None:
      cos, sin = rope
      q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    layer_k, layer_v = write(layer_k, k), write(layer_v, v)
    groups = self.num_heads // self.num_kv_heads
    q = q.reshape(b, t, self.num_kv_heads, groups, self.head_dim)
    # Scores in the model's dtype, as Hugging Face computes them (XLA:CPU also has no bf16 x bf16
    # -> f32 batched dot); scaled, soft-capped (Gemma 2), then masked as HF does; softmax in
    # float32.
    scores = softcap(_scores(q, layer_k.astype(q.dtype)) * self.scale, self.softcap)
    scores = jnp.where(mask[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = _weighted_values(probs, layer_v.astype(x.dtype))
    return self.o(out.reshape(b, t, -1)), layer_k, layer_v


class MLP(nnx.Module):
  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, dtype):
    c = config
    self.act = _activation(c.hidden_act)
    self.gated = c.llama_like
    if self.gated:
      self.gate = Dense(rngs, c.hidden_size, c.intermediate_size, ("embed", "mlp"), c.mlp_bias, dtype)
    self.up = Dense(rngs, c.hidden_size, c.intermediate_size, ("embed", "mlp"), c.mlp_bias, dtype)
    self.down = Dense(rngs, c.intermediate_size, c.hidden_size, ("mlp", "embed"), c.mlp_bias, dtype)

  def __call__(self, x):
    h = self.act(self.gate(x)) * self.up(x) if self.gated else self.act(self.up(x))
    return self.down(h)


class Block(nnx.Module):
  """A decoder layer; ``input_norm=False`` leaves out the norm before attention (the first layer
  of an EAGLE head, whose input is already the fc of normalised-scale features). With
  ``config.sandwich_norms`` (Gemma 2/3) the attention and MLP outputs are normalised too before
  each residual add (HF's ``post_attention_layernorm`` / ``post_feedforward_layernorm``; there
  ``pre_feedforward_layernorm`` is our ``mlp_norm``)."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, dtype, input_norm: bool = True):
    sandwich = config.sandwich_norms
    self.attn_norm = Norm(config, dtype) if input_norm else None
    self.attn = Attention(config, rngs, dtype)
    self.post_attn_norm = Norm(config, dtype) if sandwich else None
    self.mlp_norm = Norm(config, dtype)
    self.mlp = MLP(config, rngs, dtype)
    self.post_mlp_norm = Norm(config, dtype) if sandwich else None

  def __call__(self, x, rope, layer_k, layer_v, write, mask):
    normed = x if self.attn_norm is None else self.attn_norm(x)
    h, layer_k, layer_v = self.attn(normed, rope, layer_k, layer_v, write, mask)
    x = x + _maybe(self.post_attn_norm, h)
    return x + _maybe(self.post_mlp_norm, self.mlp(self.mlp_norm(x))), layer_k, layer_v


def _maybe(norm: Norm | None, x: jax.Array) -> jax.Array:
  return x if norm is None else norm(x)


def causal_mask(t: int) -> np.ndarray:
  """bool[T, T] lower-triangular: the tree mask of a chain."""
  return np.tril(np.ones((t, t), dtype=bool))


# Logical axes of the hidden states a forward returns for ``features`` ([B, T, F, E]).
FEATURE_AXES = ("batch", "length", None, "embed")
# The feature named by this string is the final norm's output (the LM head's input): what
# EAGLE-1/2 heads read and predict (``outputs[0]`` of the EAGLE repository's base ``model``).
NORMED = "normed"


def feature_layers(features: tuple[int | str, ...], num_layers: int) -> tuple[int | str, ...]:
  """Normalised ``features``: index ``i`` is the residual stream *after* block ``i`` (0-based),
  negative ones count from the end, so ``-1`` is the last block's output *before* the final norm
  (EAGLE-3's top layer); ``NORMED`` is that state after the final norm (EAGLE-1/2, Li et al.
  2024, arXiv 2401.15077 §3, whose head output goes to the LM head unnormed)."""
  out = []
  for i in features:
    if i == NORMED:
      out.append(NORMED)
      continue
    if (isinstance(i, bool) or not isinstance(i, (int, np.integer))
        or not -num_layers <= i < num_layers):
      raise ValueError(f"feature layer {i!r} is not a layer of the {num_layers}-layer model "
                       f"(indices {-num_layers}..{num_layers - 1}, -1: the last before the final "
                       f"norm; {NORMED!r}: after it)")
    out.append(int(i) % num_layers)
  return tuple(out)


def rotary(inv_freq: jax.Array, positions: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [B, T, 1, R] of the rotary embedding at int32[B, T] ``positions`` (R: twice
  ``inv_freq``'s length, the rotated dims of a head)."""
  freqs = positions[..., None].astype(jnp.float32) * inv_freq[None, None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, R]
  return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def attention_layout(c: ModelConfig, shape: tuple[int, int], cache: KVCache, tree_mask, depths):
  """What every layer of a pass over ``shape = (B, T)`` new tokens shares (``Transformer``'s
  arguments): int32[B, T] positions, ``masks`` {layer kind: bool[B, T, S] the slots each new
  token sees} for each kind of ``c.layer_kinds``, and ``write``, which stores [B, T, KVH, D] keys
  or values at the rows' scratch slots. Each mask is built once per pass, whatever the number of
  layers of its kind."""
  b, t = shape
  s = cache.max_length
  if tree_mask is None:
    tree_mask = causal_mask(t)
  if depths is None:
    depths = np.arange(t, dtype=np.int32)
  tree_mask = jnp.broadcast_to(jnp.asarray(tree_mask, bool), (b, t, t))
  depths = jnp.broadcast_to(jnp.asarray(depths, jnp.int32), (b, t))
  lengths = cache.lengths
  positions = lengths[:, None] + depths  # [B, T]

  # New token j is written at slot lengths + j (scratch slots past the cache end are dropped:
  # callers size the cache so that live rows never get there). New token i sees the row's
  # committed slots and the new tokens j with tree_mask[i, j].
  slots = jnp.arange(s, dtype=jnp.int32)[None, :]  # [1, S]; a committed slot s holds position s
  offset = slots - lengths[:, None]  # [B, S]: which new token a scratch slot holds
  is_new = (offset >= 0) & (offset < t)
  new_index = jnp.broadcast_to(jnp.clip(offset, 0, t - 1)[:, None, :], (b, t, s))

  def mask(window: int | None) -> jax.Array:
    committed = jnp.broadcast_to((offset < 0)[:, None, :], (b, t, s))
    new_mask = tree_mask
    if window is not None:
      # A key is within the window of a query at position p when its position is > p - window
      # (transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window). A tree node's
      # position is its depth, so siblings' windows agree.
      horizon = positions[:, :, None] - window
      committed &= slots[:, None, :] > horizon
      new_mask &= positions[:, None, :] > horizon
    sees_new = jnp.take_along_axis(new_mask, new_index, axis=2)
    return committed | (sees_new & is_new[:, None, :])  # [B, T, S]

  masks = {kind: mask(c.window_of(kind)) for kind in dict.fromkeys(c.layer_kinds)}
  # A one-token write carries a second update aimed past the end (so dropped), which keeps it a
  # scatter. As a dynamic-update-slice XLA fused it into the attention reads as well (at batch 1,
  # where they bitcast the buffer) and copied every layer's buffer four times per decoding step
  # (tests/test_models.py: CacheInPlaceTest).
  dummy = 1 if t == 1 else 0
  j = jnp.arange(t + dummy, dtype=jnp.int32)[None, :]
  write_slots = jnp.where(j < t, lengths[:, None] + j, s)  # [B, T + dummy]
  rows = jnp.arange(b)[:, None]
  write = lambda buf, new: buf.at[rows, :, write_slots].set(
      jnp.pad(new, ((0, 0), (0, dummy), (0, 0), (0, 0))).astype(buf.dtype), mode="drop")
  return positions, masks, write


class Transformer(nnx.Module):
  """A causal language model. ``config`` is static; all arrays are ``nnx.Param``."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    c = config
    dtype = jnp.dtype(c.dtype)
    self.config = c
    self.embed = _param(rngs, (c.vocab_size, c.hidden_size), ("vocab", "embed"), dtype)
    self.pos_embed = (None if c.llama_like else
                      _param(rngs, (c.max_position_embeddings, c.hidden_size), (None, "embed"), dtype))
    self.layers = nnx.List([Block(c, rngs, dtype) for _ in range(c.num_layers)])
    self.final_norm = Norm(c, dtype)
    self.lm_head = (None if c.tie_word_embeddings else
                    _param(rngs, (c.hidden_size, c.vocab_size), ("embed", "vocab"), dtype))
    # Rotary frequencies (not Params): global layers', and Gemma 3's sliding layers' own base.
    self.inv_freq = (nnx.Variable(jnp.asarray(rope_inverse_frequencies(c))) if c.llama_like
                     else None)
    self.local_inv_freq = (None if c.rope_local_theta is None else nnx.Variable(
        jnp.asarray(rope_inverse_frequencies(c, SLIDING_ATTENTION))))

  def __call__(
      self,
      tokens: jax.Array,
      cache: KVCache,
      tree_mask: jax.Array | np.ndarray | None = None,
      depths: jax.Array | np.ndarray | None = None,
      logits_at: int | tuple[int, ...] | jax.Array | None = None,
      features: tuple[int | str, ...] = (),
  ) -> tuple[jax.Array, KVCache] | tuple[jax.Array, KVCache, jax.Array]:
    """Scores ``T`` new tokens per row against the cache.

    Args:
      tokens: int32[B, T] new tokens.
      cache: committed keys/values; row b's new tokens are written at slots
        ``[lengths[b], lengths[b] + T)`` (``lengths`` itself is left for the caller to commit).
        New tokens that would land past the cache's end are dropped: neither stored nor seen by
        the others (their own logits are then wrong), so size the cache for every row whose
        output is used; ``sj.generate`` does.
      tree_mask: bool[T, T] or bool[B, T, T]; ``tree_mask[i, j]``: new token i sees new token j
        (must include i itself). Default: causal (a chain).
      depths: int32[T] or int32[B, T]; token i is at position ``lengths + depths[i]``.
        Default: ``arange(T)``.
      logits_at: static index (or tuple of indices) of the new tokens whose logits are wanted,
        or int32[B] / int32[B, K] per row (``select_tokens``); the vocabulary projection (the
        largest matmul of a small model) then runs for those tokens only.
      features: static layer indices (``feature_layers``) whose hidden states are wanted too;
        empty (the default): nothing extra is computed or returned.

    Returns:
      (float32[B, T, V] logits, or float32[B, K, V] for ``logits_at``'s K tokens; the cache
      with the new entries written), and with ``features`` a third item: [B, T, F, E] the
      hidden states of all T new tokens at those layers (``FEATURE_AXES``), in the model dtype.
    """
    c = self.config
    positions, masks, write = attention_layout(c, tokens.shape, cache, tree_mask, depths)
    x = self.embed_tokens(tokens)
    if self.inv_freq is None:
      # Scratch tokens past the budget may sit beyond the table; they are never emitted.
      x = x + jnp.take(self.pos_embed[...], positions, axis=0, mode="clip")
      ropes = dict.fromkeys(masks)
    else:
      ropes = {kind: rotary(self.rotary_frequencies(kind), positions, x.dtype) for kind in masks}

    new_k, new_v, hidden = [], [], []
    wanted = feature_layers(features, len(self.layers))
    for i, (layer, kind) in enumerate(zip(self.layers, c.layer_kinds)):
      x, k, v = layer(x, ropes[kind], cache.k[i], cache.v[i], write, masks[kind])
      new_k.append(k)
      new_v.append(v)
      hidden.append(x)
    cache = cache.replace(k=tuple(new_k), v=tuple(new_v))
    normed = self.final_norm(x) if NORMED in wanted else None
    if logits_at is not None:
      logits = self.project(self.final_norm(select_tokens(x, logits_at)))
    else:
      logits = self.project(self.final_norm(x) if normed is None else normed)
    if not wanted:
      return logits, cache
    return logits, cache, jnp.stack([normed if i == NORMED else hidden[i] for i in wanted], axis=2)

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    """[..., E] input embeddings of int ``tokens``: rows of ``embed``, times sqrt(hidden) for
    Gemma, that factor rounded to the embedding dtype first as HF does (bfloat16: 55.5 for
    sqrt(3072) = 55.43)."""
    x = jnp.take(self.embed[...], tokens, axis=0)
    scale = self.config.embed_scale
    return x if scale is None else x * jnp.asarray(scale, x.dtype)

  def rotary_frequencies(self, kind: str) -> jax.Array:
    """The rotary inverse frequencies of layers of ``kind``."""
    local = kind == SLIDING_ATTENTION and self.local_inv_freq is not None
    return (self.local_inv_freq if local else self.inv_freq)[...]

  def project(self, x: jax.Array) -> jax.Array:
    """float32[..., V] logits of final-norm features ``x``: the vocabulary projection (tied to the
    embedding or not), soft-capped where the config says (Gemma 2); ``specjax.models.
    reduced_vocab`` overrides it."""
    head = self.embed[...].T if self.lm_head is None else self.lm_head[...]
    return softcap(jnp.dot(x, head, preferred_element_type=jnp.float32),
                   self.config.final_logit_softcapping)


def check_model(model, role: str = "model") -> None:
  """Raises unless ``model`` is a causal LM the decoding loop can drive.

  Anything that quacks like ``Transformer`` works: an ``nnx.Module`` with a ``ModelConfig`` in
  ``.config`` and ``__call__(tokens, cache, tree_mask=None, depths=None, logits_at=None)``
  returning ``(logits, cache)`` (the tests drive the real loop with tabular toy models this way).
  """
  if not (isinstance(model, nnx.Module) and isinstance(getattr(model, "config", None), ModelConfig)):
    raise ValueError(f"{role} must be a specjax model (sj.load_model / sj.init_model), got "
                     f"{type(model).__name__}")


def check_context(model, role: str, width: int, max_new_tokens: int,
                  what: str = "prompt length") -> None:
  """Raises unless ``width`` prompt tokens + ``max_new_tokens`` fit the model's context."""
  limit = model.config.max_position_embeddings
  if width + max_new_tokens > limit:
    raise ValueError(f"{what} {width} + max_new_tokens {max_new_tokens} = "
                     f"{width + max_new_tokens} exceeds the {role} model's maximum "
                     f"context {limit}")


def init_model(config: ModelConfig, key: jax.Array | int = 0) -> Transformer:
  """A ``Transformer`` with random weights (normal, std 0.02; norms at 1, biases at 0)."""
  return Transformer(config, nnx.Rngs(params=key))


def forward(model: Transformer, tokens) -> jax.Array:
  """Full causal pass with no cache: int[B, T] -> float32[B, T, V] logits (tests, exact laws)."""
  tokens = jnp.asarray(tokens, jnp.int32)
  if tokens.ndim != 2:
    raise ValueError(f"tokens must be [batch, length], got shape {tokens.shape}")
  config = model.config
  _check_token_ids(tokens, config.vocab_size)
  if tokens.shape[1] > config.max_position_embeddings:
    raise ValueError(f"sequence length {tokens.shape[1]} exceeds the model's maximum context "
                     f"{config.max_position_embeddings}")
  graphdef, state = nnx.split(model)
  return _forward_jit(graphdef, state, tokens)


@functools.partial(jax.jit, static_argnums=0)
def _forward_jit(graphdef, state, tokens):
  model = nnx.merge(graphdef, state)
  cache = init_cache(model.config, tokens.shape[0], tokens.shape[1])
  logits, _ = model(tokens, cache)
  return logits


def _check_token_ids(tokens, vocab_size: int) -> None:
  arr = np.asarray(tokens)
  if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
    bad = arr[(arr < 0) | (arr >= vocab_size)][0]
    raise ValueError(f"token id {int(bad)} is outside the vocabulary [0, {vocab_size})")
