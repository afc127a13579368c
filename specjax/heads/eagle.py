"""The EAGLE-1/2 draft head (Li et al. 2024, "EAGLE", arXiv 2401.15077; EAGLE-2, arXiv
2406.16858): a feature-level autoregressive model that drafts on the target's own features.

At position ``t`` the head reads ``[embedding of token t+1 ; target feature at t]`` (the feature
being the target's final-norm output, ``NORMED``), mixes them with a linear ``fc`` (2E -> E) and
one decoder layer whose input norm is left out (the EAGLE repository's ``LlamaDecoderLayer`` of
index 0), and outputs its guess of the target's feature at ``t + 1``; the target's own LM head
(frozen, shared, never copied) turns that guess into draft logits, and the guess is the next
step's feature. Entry ``t`` of the head's KV cache sits at position ``t``, as in the repository
(``input_ids[:, 1:]`` against the features of positions ``0..``).

The head reuses the target's building blocks (``Dense``, ``Block``, ``attention_layout``,
``rotary``): its pass over cache and tree mask is the target's. ``embed`` holds an embedding only
when a file carried one (``layout.load_head``): drafting always embeds with the target's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.config import ModelConfig, rope_inverse_frequencies
from specjax.models.kv_cache import KVCache
from specjax.models.transformer import NORMED, Block, Dense, attention_layout, rotary


class EagleHead(nnx.Module):
  """``config``: the head's decoder (the target's sizes, ``num_layers`` head layers, Llama
  family); layer 0 has no input norm, later ones have (as in the repository)."""

  FIRST_INPUT_NORM = False  # ``MTPHead``: True (DeepSeek's MTP block is a full decoder layer)

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, fc_bias: bool = True):
    if not config.is_llama_family:
      raise ValueError(f"EAGLE heads are Llama-family decoder layers, got model_type "
                       f"{config.model_type!r}")
    dtype = jnp.dtype(config.dtype)
    e = config.hidden_size
    self.config = config
    self.fc = Dense(rngs, 2 * e, e, (None, "embed"), fc_bias, dtype)
    self.layers = nnx.List([Block(config, rngs, dtype, input_norm=i > 0 or self.FIRST_INPUT_NORM)
                            for i in range(config.num_layers)])
    self.inv_freq = nnx.Variable(jnp.asarray(rope_inverse_frequencies(config)))  # not a Param
    self.embed = nnx.data(None)  # nnx.Param [V, E] when a checkpoint carried the target embedding

  def __call__(self, embeds: jax.Array, features: jax.Array, cache: KVCache,
               tree_mask=None, depths=None) -> tuple[jax.Array, KVCache]:
    """Predicted features [B, T, E] of T new (token embedding [B, T, E], feature [B, T, E])
    pairs, written into ``cache`` like ``Transformer.__call__`` writes tokens (same masks)."""
    x = self.fc(self.fc_input(embeds, features.astype(embeds.dtype)))
    return decoder_pass(self.config, self.layers, self.inv_freq[...], x, cache, tree_mask, depths)

  def fc_input(self, embeds: jax.Array, features: jax.Array) -> jax.Array:
    """[..., 2E] what ``fc`` mixes: ``[embedding ; feature]`` (``MTPHead`` normalises both)."""
    return jnp.concatenate([embeds, features], axis=-1)

  # What every head offers the proposer and the trainer (``Eagle3Head`` too):

  def target_features(self, target_config: ModelConfig) -> tuple[int | str, ...]:
    """The target hidden states the head reads: the final norm's output."""
    del target_config
    return (NORMED,)

  def from_target(self, features: jax.Array) -> jax.Array:
    """[..., E] the head's feature input from the target's [..., F, E] states (F = 1 here)."""
    return features[..., 0, :]

  def draft_logits(self, hidden: jax.Array, target) -> jax.Array:
    """float32[..., V] draft logits of the head's predicted features: the target's LM head."""
    return target.project(hidden)


def decoder_pass(config: ModelConfig, layers, inv_freq: jax.Array, x: jax.Array, cache: KVCache,
                 tree_mask=None, depths=None) -> tuple[jax.Array, KVCache]:
  """``layers`` (Llama-family ``Block``s) over T new inputs ``x`` [B, T, E] after the cache's
  committed entries, written into ``cache`` like ``Transformer.__call__`` writes tokens (same
  masks and positions): what every head with its own decoder layers and KV cache runs (EAGLE's,
  Hydra++'s prefix layer)."""
  positions, masks, write = attention_layout(config, x.shape[:2], cache, tree_mask, depths)
  (mask,) = masks.values()  # a Llama-family head: one layer kind
  rope = rotary(inv_freq, positions, x.dtype)
  new_k, new_v = [], []
  for i, layer in enumerate(layers):
    x, k, v = layer(x, rope, cache.k[i], cache.v[i], write, mask)
    new_k.append(k)
    new_v.append(v)
  return x, cache.replace(k=tuple(new_k), v=tuple(new_v))


def head_config(target_config: ModelConfig, num_layers: int = 1) -> ModelConfig:
  """The config of a head for a target with ``target_config``: its sizes, ``num_layers`` layers."""
  return dataclasses.replace(target_config, num_layers=num_layers, tie_word_embeddings=False)


def init_head(target_config: ModelConfig, key: jax.Array | int = 0, num_layers: int = 1,
              fc_bias: bool = True) -> EagleHead:
  """An untrained head (normal std 0.02 weights, norms at 1) for a target of ``target_config``."""
  return EagleHead(head_config(target_config, num_layers), nnx.Rngs(params=key), fc_bias)
