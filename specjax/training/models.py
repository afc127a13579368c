"""Where a trained model starts: a fresh Llama-family model with zeroed residual outputs, a
shallow model grown deeper without changing its function, or a draft cut from its teacher's
layers."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from specjax.models.config import ModelConfig
from specjax.models.transformer import Transformer, init_model


def model_config(model_cfg: Mapping, vocab_size: int, seq_len: int, eos_id: int = 0) -> ModelConfig:
  """``ModelConfig`` (Llama family) from a config's ``model`` block (``hidden_size``,
  ``num_layers``, ``num_heads``, ``intermediate_size``, ... as ``ModelConfig`` names them)."""
  m = dict(model_cfg)
  m.setdefault("model_type", "llama")
  m.setdefault("max_position_embeddings", max(seq_len, 512))
  return ModelConfig(vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id, **m)


def initial_model(config: ModelConfig, train_cfg) -> Transformer:
  """A fresh model for training: ``init_model`` (normal, std 0.02, key ``train_cfg.seed``), then
  the residual branches' output kernels (attention ``o``, MLP ``down``) zeroed when
  ``zero_init_residual`` (and the untied head when ``zero_init_head``).

  Zeroed branch outputs make a deep model start as embedding -> head (a bigram model) that learns
  as fast as a one-layer model, its layers joining in as their output kernels grow (as in
  modded-nanogpt's recipe). With the default std-0.02 init a 4-layer model learned several times
  slower per step than a 1-layer one in the first ~1000 steps that a CPU budget allows (measured;
  see configs/train_default.py).
  """
  model = init_model(config, jax.random.key(int(train_cfg.get("seed", 0))))
  if train_cfg.get("zero_init_residual", False):
    for layer in model.layers:
      for dense in (layer.attn.o, layer.mlp.down):
        dense.kernel[...] = jnp.zeros_like(dense.kernel[...])
  if train_cfg.get("zero_init_head", False) and model.lm_head is not None:
    model.lm_head[...] = jnp.zeros_like(model.lm_head[...])
  return model


def grow_model(small: Transformer, config: ModelConfig, train_cfg) -> Transformer:
  """``small``'s function in a deeper model of the same width: its embedding, head, final norm and
  layers become the bottom layers of ``initial_model(config, train_cfg)``, whose extra layers have
  zeroed output kernels (attention ``o``, MLP ``down``), so the grown model computes exactly what
  ``small`` did and its new layers start learning from there.

  Training a 1-layer model first and growing it reached a lower validation loss in the same CPU time
  than training the deep model from the start (the shallow model takes several times more steps per
  second and, early on, learns at least as much per step).
  """
  k = small.config.num_layers
  if config.hidden_size != small.config.hidden_size or config.num_layers < k:
    raise ValueError(f"cannot grow a {k}x{small.config.hidden_size} model into "
                     f"{config.num_layers}x{config.hidden_size}")
  big = initial_model(config, train_cfg)
  for i, layer in enumerate(big.layers):
    if i < k:
      nnx.update(layer, nnx.state(small.layers[i], nnx.Param))
    else:
      for dense in (layer.attn.o, layer.mlp.down):
        dense.kernel[...] = jnp.zeros_like(dense.kernel[...])
  big.embed[...] = small.embed[...]
  nnx.update(big.final_norm, nnx.state(small.final_norm, nnx.Param))
  if big.lm_head is not None:
    big.lm_head[...] = small.lm_head[...]
  return big


def draft_from_teacher(teacher: Transformer, layers: Iterable[int],
                       dtype: str = "float32") -> Transformer:
  """A draft made of ``teacher``'s embedding (and tied or untied head), final norm and the
  layers ``layers`` (in that order), in ``dtype``: the teacher's own function when ``layers``
  is all of them, and otherwise a starting point that shares its vocabulary geometry."""
  layers = [int(i) for i in layers]
  n = teacher.config.num_layers
  if not layers or any(not 0 <= i < n for i in layers):
    raise ValueError(f"draft layers {layers} must be a non-empty list of teacher layers 0..{n - 1}")
  config = dataclasses.replace(teacher.config.keep_layers(layers), dtype=dtype)
  draft = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0)))
  source = nnx.merge(*nnx.split(teacher))
  source.layers = nnx.List([teacher.layers[i] for i in layers])
  # Copies (jnp.array copies), never the teacher's own buffers: the training step donates the
  # draft's parameters while it reads the teacher's.
  copy = lambda x: jnp.array(x, jnp.dtype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else None)
  nnx.update(draft, jax.tree.map(copy, nnx.state(source)))
  return draft
