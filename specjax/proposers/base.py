"""The proposer protocol: what the one decoding loop needs from any way of guessing tokens.

DESIGN.md §1 and §6. A proposer is a frozen, hashable dataclass (static under ``jit``: its
hyper-parameters and any model's graph definition) whose traced inputs travel separately as
``params`` (e.g. a draft model's weights) and whose per-row state is a pytree. Per iteration the
loop calls

  ``propose(params, state, pending, keys, sampling) -> (Candidates, state)``
      guesses that follow ``pending`` (the last emitted token, not yet in the target cache);
  ``commit(params, state, candidates, outcome) -> state``
      after verification (``Outcome``): the row kept ``pending`` and the ``num_accepted``
      candidates ``path[:num_accepted]`` (node indices from the root down; for a chain
      ``0..n-1``); the target's logits over ``[pending, candidates]`` come along for proposers
      that learn from the target's pass (Jacobi, lookahead);

after ``prefill(params, prompt, prompt_lengths, cache_length) -> state`` once. The loop has no
method-specific branches: it scores ``[pending, candidates]`` in one target forward and picks the
verifier from the candidates' shape and the sampling (``specjax.decoding.loop``). Adding a method
means one proposer (here), one method dataclass (``specjax.decoding.methods``) and its tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib

CHAIN = "chain"  # candidate i's parent is candidate i - 1 (the first's is ``pending``)
TREE = "tree"  # candidates form the static ``Candidates.tree`` below ``pending``


@flax.struct.dataclass
class Outcome:
  """What one iteration's verification decided, per row, for the proposer's ``commit``."""

  target_length: jax.Array  # int32[B] target cache length before the iteration (pending's slot)
  path: jax.Array  # int32[B, D] accepted candidates from the root down, -1 after
  num_accepted: jax.Array  # int32[B]
  next_token: jax.Array  # int32[B] the token emitted after the path (the next pending token)
  active: jax.Array  # bool[B] rows that were still generating (finished rows must not change)
  logits: jax.Array  # float32[B, N + 1, V] the target's raw logits over [pending, candidates]


@flax.struct.dataclass
class RowTrees:
  """The per-row structure of one iteration's token trees (a dynamic tree: sizes static, parents
  per row), with the same fields as a static ``sj.Tree`` offers the loop and the verifiers."""

  children: jax.Array  # int32[B, N + 1, C] row 0: the root's children, row i + 1: node i's
  verification_mask: jax.Array  # bool[B, N + 1, N + 1] over [pending, nodes]
  verification_depths: jax.Array  # int32[B, N + 1] over [pending, nodes]
  max_depth: int = flax.struct.field(pytree_node=False, default=0)


@flax.struct.dataclass
class Candidates:
  """What a proposer hands the loop for one iteration.

  ``tokens[b, i]`` is the i-th guess of row b. For a chain, ``q[b, i]`` is the distribution guess
  i was *sampled* from (already warped with the run's ``Sampling``); ``None`` means the guesses
  were chosen deterministically (argmax, n-grams, ...), which the loop verifies with the one-hot
  rule (ALGORITHMS.md §4), never against a soft q. For a tree, ``q[b, 0]`` is the draft law the
  root's children were drawn from and ``q[b, i + 1]`` node i's children's, and ``rule`` says how
  (``specjax.verify.tree.RULES``). A tree is either static (``tree``, an ``sj.Tree``) or per
  row (``row_trees``, a ``RowTrees``).
  """

  tokens: jax.Array  # int32[B, N]
  q: jax.Array | None  # float32[B, N, V] (chain) / [B, N + 1, V] (tree), or None
  kind: str = flax.struct.field(pytree_node=False, default=CHAIN)
  tree: Any = flax.struct.field(pytree_node=False, default=None)  # sj.Tree for kind TREE
  rule: str = flax.struct.field(pytree_node=False, default="")  # tree children's rule
  row_trees: RowTrees | None = None  # for kind TREE when the structure differs per row

  @property
  def structure(self):
    """The tree's structure (an ``sj.Tree`` or ``RowTrees``), None for a chain."""
    return self.tree if self.row_trees is None else self.row_trees


class Proposer(Protocol):
  """Static description of a way to guess; see the module docstring."""

  num_candidates: int  # N: candidates per iteration (static)
  depth: int  # D: the most candidates one iteration can accept (chain: N; tree: its depth)
  draft_calls_per_iteration: int  # draft forward passes per iteration (for DecodeStats)
  prefill_draft_calls: int  # draft forward passes of ``prefill``

  def prefill(self, params: Any, prompt: jax.Array, prompt_lengths: jax.Array,
              cache_length: int) -> Any: ...

  def propose(self, params: Any, state: Any, pending: jax.Array, keys: jax.Array,
              sampling: sampling_lib.Sampling) -> tuple[Candidates, Any]: ...

  def commit(self, params: Any, state: Any, candidates: Candidates, outcome: Outcome) -> Any: ...


@dataclasses.dataclass(frozen=True)
class NoProposer:
  """Proposes nothing: the loop then emits one token per target pass (autoregressive decoding)."""

  num_candidates: int = 0
  depth: int = 0
  draft_calls_per_iteration: int = 0
  prefill_draft_calls: int = 0

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    del params, prompt, prompt_lengths, cache_length
    return None

  def propose(self, params, state, pending, keys, sampling):
    del params, keys, sampling
    return Candidates(tokens=jnp.zeros((pending.shape[0], 0), jnp.int32), q=None), state

  def commit(self, params, state, candidates, outcome):
    del params, candidates, outcome
    return state
