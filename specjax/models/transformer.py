"""Decoder-only transformers in Flax NNX: the Llama family (Llama 2/3, Mistral, Qwen2) and GPT-2.

One forward serves every decoding method: it takes ``T >= 1`` new tokens per row, writes their
keys/values at the row's scratch slots ``[length, length + T)`` of a static-shape ``KVCache``, and
lets new token ``i`` attend to the row's committed slots plus the new tokens ``j`` with
``tree_mask[i, j]``. A causal ``tree_mask`` is a chain (plain decoding, speculative verification);
an ancestor mask is a token tree; block masks give lookahead windows. Token ``i`` sits at position
``length + depths[i]``.

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

from specjax.models.config import ModelConfig, rope_inverse_frequencies
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
  """RMSNorm (Llama family) or LayerNorm (GPT-2), computed in float32 like Hugging Face."""

  def __init__(self, config: ModelConfig, dtype):
    self.rms = config.is_llama_family
    self.eps = config.norm_eps
    self.scale = _param(None, (config.hidden_size,), ("embed",), dtype, init="ones")
    self.bias = None if self.rms else _param(None, (config.hidden_size,), ("embed",), dtype, "zeros")

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    x = x.astype(jnp.float32)
    if self.rms:
      x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
      return self.scale[...] * x.astype(dtype)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    x = (x - mean) * jax.lax.rsqrt(var + self.eps)
    return (x * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(dtype)


class Dense(nnx.Module):
  """``x @ kernel + bias`` with a ``[in, out]`` kernel."""

  def __init__(self, rngs, d_in: int, d_out: int, axes, bias: bool, dtype):
    self.kernel = _param(rngs, (d_in, d_out), axes, dtype)
    self.bias = _param(None, (d_out,), axes[1:], dtype, "zeros") if bias else None

  def __call__(self, x: jax.Array) -> jax.Array:
    y = x @ self.kernel[...]
    return y if self.bias is None else y + self.bias[...]


def _activation(name: str):
  if name == "silu":
    return jax.nn.silu
  if name == "gelu":
    return lambda x: jax.nn.gelu(x, approximate=False)
  return lambda x: jax.nn.gelu(x, approximate=True)  # gelu_new / gelu_pytorch_tanh


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotary embedding, Hugging Face's ``rotate_half`` convention. x: [B, T, heads, D]."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return (x * cos + rotated * sin).astype(x.dtype)


# With 2 to this many query rows per kv head (T new tokens x query groups), attention over the
# cache is written as broadcast-multiply-reduce instead of a batched matmul: one fused pass over
# the cache, where XLA:CPU would otherwise run B * kv_heads tiny matmuls (measured inside a jitted
# decoding loop: up to 1.4x faster per step at batch 8 with 3 query groups). A single query row is
# a matrix-vector product, which XLA does best as a dot (broadcast-reduce measured 2.5-5x slower
# per step there). Both forms are the same sum; longer queries (prefill) use einsum.
_SMALL_QUERY = 16


def _contract(a: jax.Array, b: jax.Array, spec: str, small: bool) -> jax.Array:
  if not small:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
  if spec == "btkgd,bksd->bkgts":  # scores: sum over head_dim
    prod = jnp.transpose(a, (0, 2, 3, 1, 4))[:, :, :, :, None, :] * b[:, :, None, None, :, :]
    return jnp.sum(prod.astype(jnp.float32), axis=-1)
  # "bkgts,bksd->btkgd": weighted sum of values over slots
  prod = a[..., None].astype(b.dtype) * b[:, :, None, None, :, :]  # [B, K, G, T, S, D]
  return jnp.transpose(jnp.sum(prod, axis=-2), (0, 3, 1, 2, 4))


class Attention(nnx.Module):
  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, dtype):
    c = config
    self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
    self.q = Dense(rngs, c.hidden_size, c.num_heads * c.head_dim, ("embed", "heads"),
                   c.attention_bias, dtype)
    self.k = Dense(rngs, c.hidden_size, c.num_kv_heads * c.head_dim, ("embed", "kv_heads"),
                   c.attention_bias, dtype)
    self.v = Dense(rngs, c.hidden_size, c.num_kv_heads * c.head_dim, ("embed", "kv_heads"),
                   c.attention_bias, dtype)
    self.o = Dense(rngs, c.num_heads * c.head_dim, c.hidden_size, ("heads", "embed"),
                   c.attention_out_bias, dtype)

  def __call__(self, x, rope, layer_k, layer_v, cache_mask, new_mask):
    """Attention of T new tokens over the committed cache entries and over each other.

    x: [B, T, E]; layer_k/v: [B, KVH, S, D] this layer's cache (read only); cache_mask:
    bool[B, T, S]; new_mask: bool[B, T, T]. Returns (out [B, T, E], new keys and values
    [B, T, KVH, D]); the caller writes those into the cache once for all layers, which keeps the
    cache update a single in-place scatter per forward.
    """
    b, t, _ = x.shape
    q = self.q(x).reshape(b, t, self.num_heads, self.head_dim)
    k = self.k(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    if rope is not None:
      cos, sin = rope
      q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    groups = self.num_heads // self.num_kv_heads
    q = q.reshape(b, t, self.num_kv_heads, groups, self.head_dim)
    small = 1 < t * groups <= _SMALL_QUERY
    scores = jnp.concatenate([
        _contract(q, layer_k.astype(k.dtype), "btkgd,bksd->bkgts", small),
        jnp.einsum("btkgd,bjkd->bkgtj", q, k, preferred_element_type=jnp.float32)], axis=-1)
    scores = scores * (self.head_dim ** -0.5)
    mask = jnp.concatenate([cache_mask, new_mask], axis=-1)  # [B, T, S + T]
    scores = jnp.where(mask[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    s = layer_k.shape[2]
    out = (_contract(probs[..., :s], layer_v.astype(v.dtype), "bkgts,bksd->btkgd", small) +
           jnp.einsum("bkgtj,bjkd->btkgd", probs[..., s:], v))
    return self.o(out.reshape(b, t, -1)), k, v


class MLP(nnx.Module):
  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, dtype):
    c = config
    self.act = _activation(c.hidden_act)
    self.gated = c.is_llama_family
    if self.gated:
      self.gate = Dense(rngs, c.hidden_size, c.intermediate_size, ("embed", "mlp"), c.mlp_bias, dtype)
    self.up = Dense(rngs, c.hidden_size, c.intermediate_size, ("embed", "mlp"), c.mlp_bias, dtype)
    self.down = Dense(rngs, c.intermediate_size, c.hidden_size, ("mlp", "embed"), c.mlp_bias, dtype)

  def __call__(self, x):
    h = self.act(self.gate(x)) * self.up(x) if self.gated else self.act(self.up(x))
    return self.down(h)


class Block(nnx.Module):
  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, dtype):
    self.attn_norm = Norm(config, dtype)
    self.attn = Attention(config, rngs, dtype)
    self.mlp_norm = Norm(config, dtype)
    self.mlp = MLP(config, rngs, dtype)

  def __call__(self, x, rope, layer_k, layer_v, cache_mask, new_mask):
    h, k, v = self.attn(self.attn_norm(x), rope, layer_k, layer_v, cache_mask, new_mask)
    x = x + h
    return x + self.mlp(self.mlp_norm(x)), k, v


def causal_mask(t: int) -> np.ndarray:
  """bool[T, T] lower-triangular: the tree mask of a chain."""
  return np.tril(np.ones((t, t), dtype=bool))


class Transformer(nnx.Module):
  """A causal language model. ``config`` is static; all arrays are ``nnx.Param``."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    c = config
    dtype = jnp.dtype(c.dtype)
    self.config = c
    self.embed = _param(rngs, (c.vocab_size, c.hidden_size), ("vocab", "embed"), dtype)
    self.pos_embed = (None if c.is_llama_family else
                      _param(rngs, (c.max_position_embeddings, c.hidden_size), (None, "embed"), dtype))
    self.layers = nnx.List([Block(c, rngs, dtype) for _ in range(c.num_layers)])
    self.final_norm = Norm(c, dtype)
    self.lm_head = (None if c.tie_word_embeddings else
                    _param(rngs, (c.hidden_size, c.vocab_size), ("embed", "vocab"), dtype))
    if c.is_llama_family:
      self.inv_freq = nnx.Variable(jnp.asarray(rope_inverse_frequencies(c)))  # not a Param
    else:
      self.inv_freq = None

  def __call__(
      self,
      tokens: jax.Array,
      cache: KVCache,
      tree_mask: jax.Array | np.ndarray | None = None,
      depths: jax.Array | np.ndarray | None = None,
  ) -> tuple[jax.Array, KVCache]:
    """Scores ``T`` new tokens per row against the cache.

    Args:
      tokens: int32[B, T] new tokens.
      cache: committed keys/values; row b's new tokens are written at slots
        ``[lengths[b], lengths[b] + T)`` (``lengths`` itself is left for the caller to commit).
      tree_mask: bool[T, T] or bool[B, T, T]; ``tree_mask[i, j]``: new token i sees new token j
        (must include i itself). Default: causal (a chain).
      depths: int32[T] or int32[B, T]; token i is at position ``lengths + depths[i]``.
        Default: ``arange(T)``.

    Returns:
      (float32[B, T, V] logits, cache with the new entries written).
    """
    c = self.config
    b, t = tokens.shape
    s = cache.max_length
    if tree_mask is None:
      tree_mask = causal_mask(t)
    if depths is None:
      depths = np.arange(t, dtype=np.int32)
    tree_mask = jnp.broadcast_to(jnp.asarray(tree_mask, bool), (b, t, t))
    depths = jnp.broadcast_to(jnp.asarray(depths, jnp.int32), (b, t))
    lengths = cache.lengths
    positions = lengths[:, None] + depths  # [B, T]

    # New token i sees the row's committed slots and the new tokens j with tree_mask[i, j].
    slots = jnp.arange(s, dtype=jnp.int32)[None, :]  # [1, S]; slot s holds position s
    cache_mask = jnp.broadcast_to((slots < lengths[:, None])[:, None, :], (b, t, s))
    new_mask = tree_mask
    if c.sliding_window is not None:
      horizon = positions[:, :, None] - c.sliding_window  # keys must be at a position > horizon
      cache_mask &= slots[:, None, :] > horizon
      new_mask &= positions[:, None, :] > horizon

    x = jnp.take(self.embed[...], tokens, axis=0)
    if c.is_llama_family:
      freqs = positions[..., None].astype(jnp.float32) * self.inv_freq[...][None, None, :]
      emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, D]
      rope = (jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype))
    else:
      rope = None
      # Scratch tokens past the budget may sit beyond the table; they are never emitted.
      x = x + jnp.take(self.pos_embed[...], positions, axis=0, mode="clip")

    new_k, new_v = [], []
    for i, layer in enumerate(self.layers):
      x, k, v = layer(x, rope, cache.k[i], cache.v[i], cache_mask, new_mask)
      new_k.append(k)
      new_v.append(v)
    # The barrier orders the cache write after every layer's cache read, so XLA updates the cache
    # in place instead of copying it (measured: 2 full copies per step without it).
    x, new_k, new_v = jax.lax.optimization_barrier((x, new_k, new_v))
    x = self.final_norm(x)
    head = self.embed[...].T if self.lm_head is None else self.lm_head[...]
    logits = jnp.dot(x, head, preferred_element_type=jnp.float32)
    # One scatter per forward: the new entries go to the rows' scratch slots [length, length + T).
    write_slots = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B, T]
    rows = jnp.arange(b)[:, None]
    write = lambda bufs, news: tuple(buf.at[rows, :, write_slots].set(
        new.astype(buf.dtype), mode="drop") for buf, new in zip(bufs, news))  # [B, T, KVH, D]
    return logits, cache.replace(k=write(cache.k, new_k), v=write(cache.v, new_v))


def check_model(model, role: str = "model") -> None:
  """Raises unless ``model`` is a causal LM the decoding loop can drive.

  Anything that quacks like ``Transformer`` works: an ``nnx.Module`` with a ``ModelConfig`` in
  ``.config`` and ``__call__(tokens, cache, tree_mask=None, depths=None) -> (logits, cache)``
  (the tests drive the real loop with tabular toy models this way).
  """
  if not (isinstance(model, nnx.Module) and isinstance(getattr(model, "config", None), ModelConfig)):
    raise ValueError(f"{role} must be a specjax model (sj.load_model / sj.init_model), got "
                     f"{type(model).__name__}")


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
