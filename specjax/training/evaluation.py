"""How good a model is, and how close a draft is to its target: validation cross-entropy, greedy
agreement (the fraction of positions where both argmaxes match: greedy acceptance's proxy) and
mean KL(target || draft), each by full causal passes over fixed windows."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.models.transformer import Transformer
from specjax.training.forward import logits as _logits
from specjax.training.forward import split
from specjax.training.losses import kl_divergence


@functools.partial(jax.jit, static_argnums=(0,))
def _eval_batch(graphdef, params, rest, batch):
  logits = _logits(graphdef, params, rest, batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).sum()


def evaluate(model: Transformer, windows: np.ndarray, batch_size: int = 16) -> float:
  """Mean next-token cross-entropy (nats/token) of ``model`` over ``windows`` int[N, T + 1]."""
  graphdef, params, rest = split(model)
  total, count = 0.0, 0
  for i in range(0, len(windows), batch_size):
    batch = jnp.asarray(windows[i:i + batch_size])
    total += float(_eval_batch(graphdef, params, rest, batch))
    count += batch.shape[0] * (batch.shape[1] - 1)
  return total / count


_jit_logits = jax.jit(_logits, static_argnums=0)


def _full_logits(model: Transformer, batch) -> jax.Array:
  """float32[B, T, V]: a full causal pass, jitted (``forward.logits``; ``forward``'s result)."""
  return _jit_logits(*split(model), jnp.asarray(batch, jnp.int32))


def greedy_agreement(target: Transformer, draft: Transformer, tokens,
                     batch_size: int = 16) -> float:
  """Fraction of positions where ``argmax draft == argmax target`` on ``tokens`` int[N, T] (each
  model sees the same prefix: a full causal pass of each)."""
  tokens = np.asarray(tokens)
  agree, count = 0, 0
  for i in range(0, len(tokens), batch_size):
    batch = tokens[i:i + batch_size]
    t = np.asarray(jnp.argmax(_full_logits(target, batch), axis=-1))
    d = np.asarray(jnp.argmax(_full_logits(draft, batch), axis=-1))
    agree += int((t == d).sum())
    count += t.size
  return agree / count


def mean_kl(target: Transformer, draft: Transformer, tokens, batch_size: int = 16) -> float:
  """Mean over positions of KL(target || draft) in nats on ``tokens`` int[N, T]."""
  tokens = np.asarray(tokens)
  total, count = 0.0, 0
  for i in range(0, len(tokens), batch_size):
    batch = tokens[i:i + batch_size]
    total += float(kl_divergence(_full_logits(target, batch), _full_logits(draft, batch))
                   ) * batch.size
    count += batch.size
  return total / count
