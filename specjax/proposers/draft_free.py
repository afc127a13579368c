"""What the draft-free proposers share (prompt lookup, Jacobi; later lookahead, retrieval).

They guess a chain of tokens *deterministically* from what the row has already seen (its own
text, the target's previous pass), with no draft model: no draft calls, and ``q = None``, so the
loop verifies the guesses with the one-hot rule at T > 0 and greedy match at T = 0
(ALGORITHMS.md §4). That rule is exact for *any* guess that is a function of the past, so the
choices below (what to guess without a match, how to pad) only move acceptance, never the law.

``TokenHistory`` keeps each row's text (prompt + emitted tokens) as a static-size buffer inside
the jitted loop, moved by the same per-row lengths as the target cache.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specjax.proposers.base import Outcome


def keep_rows(active: jax.Array, new, old):
  """``new`` where ``active[b]``, ``old`` elsewhere, leaf by leaf (leaves lead with the batch):
  a finished row's state must not change (``Outcome.active``)."""
  def pick(n, o):
    return jnp.where(active.reshape(active.shape + (1,) * (n.ndim - 1)), n, o)
  return jax.tree.map(pick, new, old)


@flax.struct.dataclass
class TokenHistory:
  """Each row's text: ``tokens[b, :lengths[b]]`` = prompt + emitted tokens up to, not including,
  the pending token, i.e. exactly what the target cache holds (``lengths`` = its lengths).

  ``propose`` writes the pending token at ``lengths`` (``with_pending``); ``commit`` appends the
  accepted candidates after it and moves the length past both, for active rows only. The buffer
  has the target cache's length, so nothing a row can emit falls off its end.
  """

  tokens: jax.Array  # int32[B, L] -1 past a row's text
  lengths: jax.Array  # int32[B]

  @classmethod
  def of_prompt(cls, prompt: jax.Array, prompt_lengths: jax.Array,
                capacity: int) -> TokenHistory:
    """The right-padded prompts (int32[B, P], P <= capacity), padding replaced by -1."""
    batch, width = prompt.shape
    cols = jnp.arange(width)[None, :]
    text = jnp.where(cols < prompt_lengths[:, None], prompt.astype(jnp.int32), -1)
    tokens = jnp.full((batch, capacity), -1, jnp.int32).at[:, :width].set(text)
    return cls(tokens=tokens, lengths=prompt_lengths.astype(jnp.int32))

  def with_pending(self, pending: jax.Array) -> TokenHistory:
    """The pending token (int32[B]) written at each row's length; the length does not move (a
    finished row rewrites its own, unchanging, pending token past its text)."""
    rows = jnp.arange(pending.shape[0])
    return self.replace(tokens=self.tokens.at[rows, self.lengths].set(pending, mode="drop"))

  def commit(self, candidates: jax.Array, outcome: Outcome) -> TokenHistory:
    """Appends the accepted chain ``candidates[b, :num_accepted[b]]`` (int32[B, N]) after the
    pending token (written by ``with_pending``); the text grows by ``num_accepted + 1``."""
    batch, num = candidates.shape
    n = outcome.num_accepted
    j = jnp.arange(num)[None, :]
    cols = jnp.where(j < n[:, None], self.lengths[:, None] + 1 + j, self.tokens.shape[1])
    tokens = self.tokens.at[jnp.arange(batch)[:, None], cols].set(candidates, mode="drop")
    return keep_rows(outcome.active, self.replace(tokens=tokens, lengths=self.lengths + n + 1),
                     self)


@dataclasses.dataclass(frozen=True)
class DraftFreeChain:
  """Base of a proposer of ``num_candidates`` deterministic guesses in a chain: no draft model,
  so no draft calls; a chain accepts at most all of its guesses."""

  @property
  def num_candidates(self) -> int:
    raise NotImplementedError

  @property
  def depth(self) -> int:
    return self.num_candidates

  draft_calls_per_iteration = 0
  prefill_draft_calls = 0
