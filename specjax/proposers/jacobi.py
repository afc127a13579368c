"""Jacobi decoding: the target's own previous pass is the next guess (Santilli et al. 2023,
"Accelerating Transformer Inference for Translation via Parallel Decoding", ACL 2023;
ALGORITHMS.md §8).

A block ``y_1..y_m`` of guesses follows the pending token; the target's one causal pass over
``[pending, y]`` gives ``y'_j = argmax p(. | x, y_<j)`` at every position. The loop accepts the
longest prefix with ``y_j == y'_j`` plus one token; the rest of ``y'`` (past the accepted prefix
and the emitted token) is the fixed-point update: the next iteration's guesses. Greedy, this is
Jacobi iteration on the block (every token is exact; the block converges to the greedy text).
At T > 0 the guesses are the argmax too: a deterministic function of the past, so the one-hot
rule (§4) keeps the law exact.

The first iteration repeats the pending token (no pass to learn from yet). The guesses for the
last ``num_accepted`` block positions, which no pass has reached, repeat the pass's last output.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.proposers.base import CHAIN, Candidates
from specjax.proposers.draft_free import DraftFreeChain, keep_rows


@flax.struct.dataclass
class JacobiState:
  guesses: jax.Array  # int32[B, N] the previous pass's outputs past the accepted prefix
  started: jax.Array  # bool[B] a pass has filled guesses (else the pending token is repeated)


def next_guesses(logits: jax.Array, num_accepted: jax.Array, width: int | None = None) -> jax.Array:
  """int32[B, width] (default N): the argmax of ``logits`` (float32[B, N + 1, V] over [pending,
  guesses]) at positions ``num_accepted + 1 ..``, the last position repeated past the end."""
  outputs = sampling_lib.greedy(logits)  # [B, N + 1]
  num = logits.shape[1] - 1
  j = jnp.arange(num if width is None else width, dtype=jnp.int32)[None, :]
  return jnp.take_along_axis(outputs, jnp.minimum(num_accepted[:, None] + 1 + j, num), axis=1)


@dataclasses.dataclass(frozen=True)
class JacobiProposer(DraftFreeChain):
  """The proposer of ``sj.Jacobi``: ``block`` guesses from the target's previous pass."""

  block: int
  room: int = 0  # guesses kept (>= block; 0: block): an adaptive menu's entries share the state

  @property
  def width(self) -> int:
    return max(self.block, self.room)

  @property
  def num_candidates(self) -> int:
    return self.block

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    del params, prompt_lengths, cache_length
    batch = prompt.shape[0]
    return JacobiState(guesses=jnp.zeros((batch, self.width), jnp.int32),
                       started=jnp.zeros((batch,), bool))

  def propose(self, params, state: JacobiState, pending, keys, sampling):
    del params, keys, sampling  # deterministic whatever the sampling: q = None (one-hot rule)
    tokens = jnp.where(state.started[:, None], state.guesses[:, :self.block], pending[:, None])
    return Candidates(tokens=tokens, q=None, kind=CHAIN), state

  def commit(self, params, state: JacobiState, candidates, outcome):
    del params, candidates
    new = JacobiState(guesses=next_guesses(outcome.logits, outcome.num_accepted, self.width),
                      started=jnp.ones_like(state.started))
    return keep_rows(outcome.active, new, state)
