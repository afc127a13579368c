"""Hydra heads drafting a static token tree or a chain (``sj.Hydra``; Ankner et al. 2024, arXiv
2402.05109; the heads: ``specjax.heads.hydra``).

State and commit are Medusa's (``proposers.medusa``: the target's normed state at the position
that produced ``pending``). Drafting walks the tree level by level: the children of a depth-``d``
node come from head ``d`` on ``[h ; E(pending) ; E(the node's path)]``, so siblings' subtrees
get different laws (Hydra's sequential dependence, what Medusa lacks). ``draft_tree.Growth``
draws them (sampled without replacement from that law and verified by the recursive rule §5,
top-k with the one-hot rule §4, or i.i.d.), all exact; a chain is the one-path tree. One pass of
the heads per level: ``depth`` small passes an iteration, no draft model and no cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.proposers.draft_tree import Growth, StaticTree
from specjax.proposers.medusa import MedusaProposer
from specjax.trees import Tree


@dataclasses.dataclass(frozen=True)
class HydraTree(StaticTree, MedusaProposer):
  """``sj.Hydra(heads, tree=... | gamma=...)`` (a chain: ``Tree.chains(num=1, depth=gamma)``)."""

  head_graphdef: Any
  target_graphdef: Any
  features: tuple
  tree: Tree
  children: str = "sampled"
  typical: Any = None

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.tree.max_depth

  def propose(self, params, state, pending, keys, sampling):
    head_state, target_state = params
    heads = nnx.merge(self.head_graphdef, head_state)
    target = nnx.merge(self.target_graphdef, target_state)
    tree = self.tree
    grow = Growth(tree, pending, self.children, sampling, target.config.vocab_size)
    feature = state.feature[:, 0]  # [B, E]
    for d in range(tree.max_depth):
      parents = grow.parents(d)  # rows over [pending, nodes]
      # each parent's path as rows over [pending, nodes]: pending, then its ancestors and itself
      paths = np.array([[0] + [j + 1 for j in np.flatnonzero(tree.ancestor_mask[r - 1])]
                        if r else [0] for r in parents], np.int32)  # [P, d + 1]
      embeds = target.embed_tokens(grow.tokens[:, paths])  # [B, P, d + 1, E] (Gemma: scaled)
      h = jnp.broadcast_to(feature[:, None], embeds.shape[:2] + feature.shape[-1:])
      logits = heads.project(d, heads.state(d, h, embeds))  # [B, P, V]
      grow.add_children(d, logits, keys[:, d])
    candidates = grow.candidates()
    if self.typical is not None:
      candidates = candidates.replace(q=None, rule="one_hot", typical=self.typical)
    return candidates, state
