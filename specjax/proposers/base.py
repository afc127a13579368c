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
      ``0..n-1``); the target's logits over ``[pending, candidates, extras]`` come along for
      proposers that learn from the target's pass (Jacobi, lookahead);

after ``prefill(params, prompt, prompt_lengths, cache_length) -> state`` once. The loop has no
method-specific branches: it scores ``[pending, candidates]`` in one target forward and picks the
verifier from the candidates' shape and the sampling (``specjax.decoding.loop``). Adding a method
means one proposer (here), one method dataclass (``specjax.decoding.methods``) and its tests.

A proposer may declare ``features`` (static: a tuple of target layer indices,
``specjax.models.transformer.feature_layers``; absent means none): the target's forwards then
also return its hidden states there, handed to ``prefill(..., features=)`` for the prompt
([B, P, F, E]) and to ``commit`` in ``Outcome.features`` for every verification pass (EAGLE
heads draft from them, Li et al. 2024, arXiv 2401.15077). Proposers without them cost nothing.

A proposer may also have tokens scored in that same forward that are never accepted
(``Candidates.extra``, a ``ScoredExtra``: lookahead decoding's window); it then declares their
number ``num_extra`` (static; absent means 0) so that the caches have room for them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

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
  # float32[B, 1 + N + M, V] the target's raw logits over [pending, candidates, extras]: row 0
  # the pending token's, rows 1..N the candidates' (as without extras), rows N + 1.. the M
  # ``Candidates.extra`` tokens' (M = 0 without extras).
  logits: jax.Array
  # [B, 1 + N + M, F, E] the target's hidden states over the same tokens at the proposer's
  # ``features`` layers (``specjax.models.transformer.feature_layers``); None when it asks for none.
  features: jax.Array | None = None
  # float32[B, N] chains: the verifier's exact acceptance probability of each candidate given the
  # accepted prefix (greedy: the match; sampled: sum_x min(p, q); deterministic: p(x)), valid at
  # positions <= num_accepted; None for trees.
  accept_prob: jax.Array | None = None
  # The run's ``sj.Sampling`` (static): the law the target's tokens were drawn from, for a
  # proposer that scores the emitted tokens (``sj.Adaptive``); None where a caller has none.
  sampling: sampling_lib.Sampling | None = flax.struct.field(pytree_node=False, default=None)


@flax.struct.dataclass
class RowTrees:
  """The per-row structure of one iteration's token trees (a dynamic tree: sizes static, parents
  per row), with the same fields as a static ``sj.Tree`` offers the loop and the verifiers."""

  children: jax.Array  # int32[B, N + 1, C] row 0: the root's children, row i + 1: node i's
  verification_mask: jax.Array  # bool[B, N + 1, N + 1] over [pending, nodes]
  verification_depths: jax.Array  # int32[B, N + 1] over [pending, nodes]
  max_depth: int = flax.struct.field(pytree_node=False, default=0)


@flax.struct.dataclass
class ScoredExtra:
  """Tokens the target scores in the candidates' pass that are never accepted: the lookahead
  branch of lookahead decoding (Fu et al. 2024, arXiv 2402.02057), whose logits are its window's
  next Jacobi step. Scoring them in the same forward is what makes the window free of extra
  target calls (one pass over ``[pending, candidates, extras]``).

  Extra ``i`` sits at position ``length + depths[i]`` (the pending token's is ``length``) and sees
  the committed prefix, the pending token iff ``mask[i][0]`` and extra ``j`` iff
  ``mask[i][1 + j]``. Candidates never see extras and extras never see candidates, so the
  candidates' logits, the verdict and the committed cache entries are those of the pass without
  extras; the extras' entries land past the candidates' scratch slots, beyond any committed
  length (scratch, overwritten by the next pass). Mask and depths are static (hashable tuples).
  """

  tokens: jax.Array  # int32[B, M]
  mask: tuple[tuple[bool, ...], ...] = flax.struct.field(pytree_node=False)  # [M][M + 1]
  depths: tuple[int, ...] = flax.struct.field(pytree_node=False)  # [M] >= 1


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
  extra: ScoredExtra | None = None  # scored after the candidates, never accepted
  # Medusa's typical acceptance (``specjax.verify.typical.Typical``): when set, the loop verifies
  # by it at T > 0 instead of an exact rule (LOSSY, opt-in); None for every exact method.
  typical: Any = flax.struct.field(pytree_node=False, default=None)

  @property
  def structure(self):
    """The tree's structure (an ``sj.Tree`` or ``RowTrees``), None for a chain."""
    return self.tree if self.row_trees is None else self.row_trees

  def pass_layout(self):
    """(tree_mask, depths) of the target pass over ``[pending, candidates, extras]`` (the
    ``Transformer`` arguments): ``(None, None)`` for a plain chain (the causal default), the
    tree's verification mask and depths for a tree, and with extras the block mask that keeps
    candidates and extras apart (``ScoredExtra``). Static numpy unless the tree is per row."""
    tree, extra = self.structure, self.extra
    if extra is None:
      return (None, None) if tree is None else (tree.verification_mask, tree.verification_depths)
    n = self.tokens.shape[1]
    if tree is None:  # a chain: causal over [pending, candidates]
      head_mask, head_depths = np.tril(np.ones((n + 1, n + 1), bool)), np.arange(n + 1)
    else:
      head_mask, head_depths = tree.verification_mask, tree.verification_depths
    xp = np if isinstance(head_mask, np.ndarray) else jnp
    lead = head_mask.shape[:-2]  # () static, (B,) per row
    sees = np.asarray(extra.mask, bool).reshape(-1, 1 + extra.tokens.shape[1])  # [M, M + 1]
    m = sees.shape[0]
    bottom = np.concatenate([sees[:, :1], np.zeros((m, n), bool), sees[:, 1:]], axis=1)
    mask = xp.concatenate([
        xp.concatenate([head_mask, xp.zeros(lead + (n + 1, m), bool)], axis=-1),
        xp.broadcast_to(bottom, lead + bottom.shape)], axis=-2)
    depths = xp.concatenate([xp.asarray(head_depths, np.int32),
                             xp.broadcast_to(np.asarray(extra.depths, np.int32), lead + (m,))],
                            axis=-1)
    return mask, depths


class Proposer(Protocol):
  """Static description of a way to guess; see the module docstring."""

  num_candidates: int  # N: candidates per iteration (static)
  # num_extra: int, optional  # M: tokens scored per iteration but never accepted (ScoredExtra)
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


def menu(proposer) -> tuple | None:
  """An adaptive proposer's menu (``specjax.proposers.adaptive``): the proposers, one per static
  pass shape, among which its ``choose(params, state, pending, keys, sampling, active,
  remaining, after=None) -> (int32[] index, state)`` picks before each iteration
  (``remaining``: each row's tokens left to its budget; ``after``: static, the entry whose
  iteration came just before, None at the start; ``keys``: the largest entry's draft keys
  where ``draws_in_choose``, else None); they share its state, whose ``estimates(state)``
  (float32[G]) the call's stats report. Where ``between_iterations`` is set, ``choose`` may
  return ``len(menu)`` instead: the loop then runs ``between(params, state, pending, sampling,
  active, remaining) -> (index, state)`` (the adaptive rule's look) until it returns an entry.
  None for a proposer of one shape."""
  return getattr(proposer, "variants", None)


def features(proposer) -> tuple[int, ...]:
  """The target layers whose hidden states ``proposer`` reads (``()`` unless it declares
  ``features``)."""
  return tuple(getattr(proposer, "features", ()))


def num_extra(proposer) -> int:
  """M: the tokens ``proposer`` has scored per iteration besides its candidates (0 unless it
  declares ``num_extra``): the target cache needs room for ``1 + N + M`` scratch slots."""
  return int(getattr(proposer, "num_extra", 0))
