"""Medusa heads drafting a chain or a static token tree (``sj.Medusa``; Cai et al. 2024, arXiv
2401.10774; the heads: ``specjax.heads.medusa``).

State: the target's normed hidden state at the position that produced ``pending`` (the last
committed token's: the pending token's own row of the verification pass when nothing was
accepted, else the last accepted candidate's; the prompt's last position after prefill). Head
``k`` on it gives the law of the token ``k + 1`` places after ``pending``, the same law for every
node at depth ``k + 1`` of a tree (the heads do not see the path), so:

* a chain takes one draw per head (``gamma`` <= K heads), verified by the chain rule against
  that head's warped law (ALGORITHMS.md §1-3: the draws are independent of each other, so head
  k's law *is* the conditional law the k-th draft was drawn from);
* a tree (Medusa's Cartesian top-k pruned by a path list, ``sj.Tree.from_paths``) takes its
  depth-``d`` children from head ``d - 1``: ``draft_tree.Growth``'s rules (sampled without
  replacement from the head's law and verified by the recursive rule §5, top-k with the one-hot
  rule §4, or i.i.d.), all exact; ``verify="typical"`` replaces the verifier by Medusa's lossy
  typical acceptance (``specjax.verify.typical``).

No draft model runs: one pass of the K small heads per iteration on a vector the target already
computed (``draft_calls_per_iteration`` = 1, ``prefill_draft_calls`` = 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax.proposers.base import CHAIN, Candidates, Outcome
from specjax.proposers.draft_chain import GammaChain, draw
from specjax.proposers.draft_tree import Growth, StaticTree
from specjax.trees import Tree
from specjax.verify.typical import Typical


@flax.struct.dataclass
class MedusaState:
  feature: jax.Array  # [B, F, E] the target's state at the position that produced ``pending``


def last_feature(outcome: Outcome) -> jax.Array:
  """[B, F, E] the target's states at each row's last committed position of the pass:
  ``pending``'s row (0) when nothing was accepted, else the last accepted node's."""
  o = outcome
  rows = jnp.arange(o.path.shape[0])
  last = o.path[rows, jnp.maximum(o.num_accepted - 1, 0)]
  index = jnp.where(o.num_accepted > 0, 1 + last, 0)
  return o.features[rows, index]


class MedusaProposer:
  """What chains and trees share: params ``(heads' state, target state)``, the features they
  read, prefill, the heads' logits and commit."""

  prefill_draft_calls = 0
  draft_calls_per_iteration = 1

  def logits(self, params, state: MedusaState) -> jax.Array:
    """float32[B, K, V] the heads' logits for the tokens after ``pending``."""
    head_state, target_state = params
    head = nnx.merge(self.head_graphdef, head_state)
    target = nnx.merge(self.target_graphdef, target_state)
    return head.logits(state.feature[:, 0], target)

  def prefill(self, params, prompt, prompt_lengths, cache_length, features):
    del params, prompt, cache_length
    return MedusaState(feature=features[jnp.arange(features.shape[0]), prompt_lengths - 1])

  def commit(self, params, state, candidates, outcome):
    del params, candidates
    feature = jnp.where(outcome.active[:, None, None], last_feature(outcome).astype(
        state.feature.dtype), state.feature)
    return MedusaState(feature=feature)


@dataclasses.dataclass(frozen=True)
class MedusaChain(MedusaProposer, GammaChain):
  """``sj.Medusa(heads, gamma=...)``: draft ``i`` drawn from head ``i``'s law (``GammaChain``'s
  sizes; ``MedusaProposer``'s one heads pass per iteration and none at prefill)."""

  head_graphdef: Any
  target_graphdef: Any
  features: tuple
  gamma: int
  typical: Typical | None = None

  def propose(self, params, state, pending, keys, sampling):
    del pending
    logits = self.logits(params, state)
    drawn = [draw(keys[:, i], logits[:, i], sampling) for i in range(self.gamma)]
    tokens = jnp.stack([t for t, _ in drawn], axis=1)
    q = None if sampling.is_greedy else jnp.stack([q for _, q in drawn], axis=1)
    if self.typical is not None:
      q = None  # the typical rule reads the target's law alone
    return Candidates(tokens=tokens, q=q, kind=CHAIN, typical=self.typical), state


@dataclasses.dataclass(frozen=True)
class MedusaTree(StaticTree, MedusaProposer):
  """``sj.Medusa(heads, tree=...)``: the children of every depth-``d`` node from head ``d``."""

  head_graphdef: Any
  target_graphdef: Any
  features: tuple
  tree: Tree
  children: str = "sampled"
  typical: Typical | None = None

  def propose(self, params, state, pending, keys, sampling):
    logits = self.logits(params, state)
    grow = Growth(self.tree, pending, self.children, sampling, logits.shape[-1])
    for d in range(self.tree.max_depth):
      parents = len(grow.parents(d))
      grow.add_children(d, jnp.broadcast_to(logits[:, d:d + 1], (logits.shape[0], parents,
                                                                logits.shape[-1])), keys[:, d])
    candidates = grow.candidates()
    if self.typical is not None:
      candidates = candidates.replace(q=None, rule="one_hot", typical=self.typical)
    return candidates, state
