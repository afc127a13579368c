"""What a plain iteration of ``sj.Adaptive`` (``specjax.proposers.adaptive``) keeps for scoring
the draft it skipped or the free guess it made: a draft-free proposer's first guesses
(``first_level``), and the target's probability (at T > 0 its law) of each token it drew
(``record_plain``), against which a skipped draft's look scores its guesses."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.proposers.base import Candidates


def first_level(candidates: Candidates) -> jax.Array:
  """int32[B, N]: the guesses a plain iteration's token scores (position 0's acceptance), -1
  elsewhere: a chain's first, a tree's first level (the root's children)."""
  tokens, tree = candidates.tokens, candidates.structure
  if tree is None:
    return tokens[:, :1]
  root = jnp.asarray(tree.children)[..., 0, :]  # [C] (a static tree) or [B, C] (per row)
  root = jnp.broadcast_to(root, (tokens.shape[0], root.shape[-1]))
  first = jnp.any(root[:, :, None] == jnp.arange(tokens.shape[1])[None, None, :], axis=1)
  return jnp.where(first, tokens, -1)


def record_plain(state, position: jax.Array, outcome, keep_law) -> dict:
  """``state``'s (an ``AdaptiveState``) ``plain_p`` with the target's probability of the token
  a plain iteration drew (the new pending token, at text position ``position`` int32[B])
  written for the active rows:
  1 at T = 0 (a mark: the draft's guess is scored by the match), p(x) under the run's law else;
  and at T > 0 where ``keep_law`` (bool[]), that law into ``plain_laws`` (slot: the position
  mod its slots) with the position in ``law_cols``. Returns the three fields, new."""
  sampling = outcome.sampling
  if sampling is None:
    raise ValueError("the adaptive look needs the run's sampling in the Outcome")
  rows = jnp.arange(position.shape[0])
  laws, law_cols = state.plain_laws, state.law_cols
  if sampling.is_greedy:
    p = jnp.ones(position.shape, jnp.float32)
  else:
    law = sampling_lib.probabilities(outcome.logits[:, 0], sampling)
    p = jnp.take_along_axis(law, outcome.next_token[:, None], axis=1)[:, 0]
    slots = law_cols.shape[1]
    if slots and law.shape[-1] == laws.shape[-1]:
      # Inactive rows, and every row unless ``keep_law``, write past the slots: dropped (a
      # masked write, not a ``lax.cond``, whose operand XLA copied in every plain iteration).
      slot = jnp.where(outcome.active & keep_law, position % slots, slots)
      laws = laws.at[rows, slot].set(law, mode="drop")
      law_cols = law_cols.at[rows, slot].set(position, mode="drop")
  cols = jnp.where(outcome.active, position, state.plain_p.shape[1])
  return dict(plain_p=state.plain_p.at[rows, cols].set(p, mode="drop"), plain_laws=laws,
              law_cols=law_cols)
