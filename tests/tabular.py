"""Tabular toy language models that drive the REAL decoding loop, and their exact laws.

``TabularLM`` is a next-token log-probability table conditioned on the last ``context`` tokens. It
satisfies the model protocol of ``specjax.models.transformer.check_model`` (an ``nnx.Module`` with a
real ``ModelConfig`` in ``.config`` and ``__call__(tokens, cache, tree_mask=None, depths=None)``),
so ``sj.generate`` runs it through the same jitted loop, KV-cache bookkeeping (lengths, scratch
slots, rollback) and verifiers as a transformer. Its output law over a few tokens can then be
computed exactly by enumeration (``exact_law``).

Conventions:

* The table is ``float32[(V + 1),] * context + [V]``: index ``V`` on a context axis is the START
  state "no token there" (contexts shorter than ``context`` are left-padded with it). This is the
  convention of ``tests/test_verify.ToyLM`` (``ToyLM.key``), so its enumerators apply unchanged.
* Entries are log-probabilities; zero-probability tokens are ``-inf`` (``sampling.probabilities``
  maps them to exact zeros at any temperature / top-k / top-p).
* The "KV cache" stores token ids, exactly, as floats in ``cache.k[0][b, 0, slot, 0]``. New token
  ``i`` sees the committed slots ``< lengths[b]`` followed by the new tokens ``j`` with
  ``tree_mask[i, j]`` (in order), so chains, trees and windows all get the context they should.
  ``depths`` (positions) are ignored: the model is position-free.
"""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import sampling as sampling_lib
from specjax.models.config import ModelConfig
from specjax.models.transformer import select_tokens

__all__ = ["TabularLM", "TablePair", "context_key", "exact_law", "log_table", "warped_table"]


def log_table(probs) -> np.ndarray:
  """float32 log-probabilities, ``-inf`` where the probability is 0."""
  probs = np.asarray(probs, np.float64)
  with np.errstate(divide="ignore"):
    return np.log(probs).astype(np.float32)


def context_key(ctx, context: int, vocab: int) -> tuple:
  """The table index of the last ``context`` tokens of ``ctx``, left-padded with START (= V)."""
  if context == 0:
    return ()
  padded = (vocab,) * context + tuple(int(t) for t in ctx)
  return padded[-context:]


class TabularLM(nnx.Module):
  """Next-token table over the last ``context`` tokens; see the module docstring."""

  def __init__(self, logits_table, max_position_embeddings: int = 64):
    table = np.asarray(logits_table, np.float32)
    v = table.shape[-1]
    context = table.ndim - 1
    if table.shape != (v + 1,) * context + (v,):
      raise ValueError(f"table must be float32[V + 1] * context + [V], got shape {table.shape}")
    if not np.all(np.isfinite(table).any(-1)):
      raise ValueError("every context needs at least one finite logit")
    self.config = ModelConfig(
        model_type="llama", vocab_size=v, hidden_size=2, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=2, intermediate_size=1,
        max_position_embeddings=max_position_embeddings, dtype="float32")
    self.context = context
    self.table = nnx.Param(jnp.asarray(table.reshape(-1, v)))  # [(V + 1) ** context, V]

  @classmethod
  def from_probs(cls, probs, max_position_embeddings: int = 64) -> "TabularLM":
    return cls(log_table(probs), max_position_embeddings)

  @property
  def logits_table(self) -> np.ndarray:
    v = self.config.vocab_size
    return np.asarray(self.table[...]).reshape((v + 1,) * self.context + (v,))

  def __call__(self, tokens, cache, tree_mask=None, depths=None, logits_at=None):
    del depths  # position-free
    b, t = tokens.shape
    k, v = self.context, self.config.vocab_size
    tokens = jnp.asarray(tokens, jnp.int32)
    if tree_mask is None:
      tree_mask = np.tril(np.ones((t, t), bool))
    mask = jnp.broadcast_to(jnp.asarray(tree_mask, bool), (b, t, t))  # [B, T(query), T(key)]
    lengths = cache.lengths
    layer0 = cache.k[0]  # [B, kv_heads=1, S, head_dim]
    committed = layer0[:, 0, :, 0]  # float32[B, S]; slots < lengths are committed tokens
    slots = lengths[:, None] + jnp.arange(t)[None, :]
    rows = jnp.arange(b)[:, None]
    new_k = (layer0.at[rows, 0, slots, 0].set(tokens.astype(layer0.dtype), mode="drop"),
             *cache.k[1:])

    # rank[b, i, j]: how many visible new tokens j' >= j query i sees; the m-th last visible new
    # token is the j with mask & rank == m.
    rank = jnp.cumsum(mask[..., ::-1].astype(jnp.int32), axis=-1)[..., ::-1]
    count = mask.sum(-1)  # [B, T] visible new tokens per query
    index = jnp.zeros((b, t), jnp.int32)
    for m in range(k, 0, -1):  # oldest context token first
      from_new = jnp.sum(jnp.where(mask & (rank == m), tokens[:, None, :], 0), axis=-1)
      slot = lengths[:, None] - (m - count)  # committed slot when m > count
      from_cache = jnp.take_along_axis(committed, jnp.clip(slot, 0, committed.shape[1] - 1), 1)
      from_cache = jnp.where(slot >= 0, from_cache.astype(jnp.int32), v)  # START before slot 0
      index = index * (v + 1) + jnp.where(m <= count, from_new, from_cache)
    logits = jnp.take(self.table[...], index, axis=0)  # float32[B, T, V]
    if logits_at is not None:
      logits = select_tokens(logits, logits_at)
    return logits, cache.replace(k=new_k)


def warped_table(model: TabularLM, sampling: sampling_lib.Sampling) -> np.ndarray:
  """float64 table of the warped next-token law ``sampling.probabilities(logits)`` per context."""
  return np.asarray(sampling_lib.probabilities(jnp.asarray(model.logits_table), sampling),
                    np.float64)


def exact_law(model: TabularLM, prompt, n_tokens: int, sampling: sampling_lib.Sampling):
  """Exact joint law of the first ``n_tokens`` generated after ``prompt``: float64[V] * n.

  Autoregressive sampling from the warped target ``sampling.probabilities(table[context])``,
  enumerated (V ** n_tokens sequences).
  """
  probs = warped_table(model, sampling)
  k, v = model.context, model.config.vocab_size
  prompt = tuple(int(t) for t in prompt)
  law = np.zeros((v,) * n_tokens, np.float64)
  for seq in itertools.product(range(v), repeat=n_tokens):
    prob = 1.0
    for i, tok in enumerate(seq):
      prob *= probs[context_key(prompt + seq[:i], k, v)][tok]
      if prob == 0.0:
        break
    law[seq] = prob
  return law


class TablePair:
  """Warped target and draft probability tables with ``tests/test_verify.ToyLM``'s interface
  (``v``, ``k``, ``key``, ``target``, ``draft``), so that its ``Enumerator`` (the verifier core
  integrated exactly) can compose speculative iterations over them."""

  def __init__(self, target: TabularLM, draft: TabularLM, sampling: sampling_lib.Sampling):
    if target.context != draft.context or target.config.vocab_size != draft.config.vocab_size:
      raise ValueError("target and draft tables must have the same context and vocabulary")
    self.v, self.k = target.config.vocab_size, target.context
    self.p = warped_table(target, sampling).astype(np.float32)
    self.q = warped_table(draft, sampling).astype(np.float32)

  def key(self, ctx) -> tuple:
    return context_key(ctx, self.k, self.v)

  def target(self, ctx) -> np.ndarray:
    return self.p[self.key(ctx)]

  def draft(self, ctx) -> np.ndarray:
    return self.q[self.key(ctx)]
