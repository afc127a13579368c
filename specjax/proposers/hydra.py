"""Hydra heads drafting a static token tree or a chain (``sj.Hydra``; Ankner et al. 2024, arXiv
2402.05109; the heads: ``specjax.heads.hydra``).

State and commit are Medusa's (``proposers.medusa``: the target's normed state at the position
that produced ``pending``). Drafting walks the tree level by level: the children of a depth-``d``
node come from head ``d`` on ``[h ; E(pending) ; E(the node's path)]``, so siblings' subtrees
get different laws (Hydra's sequential dependence, what Medusa lacks). ``draft_tree.Growth``
draws them (sampled without replacement from that law and verified by the recursive rule §5,
top-k with the one-hot rule §4, or i.i.d.), all exact; a chain is the one-path tree. One pass of
the heads per level: ``depth`` small passes an iteration, no draft model and no cache.

With Hydra++'s prefix layer (``HydraHead.has_prefix``; the paper's Hydra++, the repository's
``HydraPrefixMLP``) the state is ``PrefixState``: the layer's own KV cache over every committed
position's target state (entry t: position t, committed = the target's) and its output at the
position that produced ``pending``, which the heads read in place of ``h``. Prefill runs it over
the prompt's states; ``commit`` over the ones this iteration made true (``pending``'s and the
accepted path's, ``Outcome.features``, padded to ``depth + 1``; the pads land past the
committed length), keeping the output at the last accepted one. One prefix pass at prefill and
one per iteration, counted as draft calls.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.kv_cache import KVCache, init_cache
from specjax.proposers.base import Outcome
from specjax.proposers.draft_tree import Growth, StaticTree
from specjax.proposers.medusa import MedusaProposer
from specjax.trees import Tree


@flax.struct.dataclass
class PrefixState:
  feature: jax.Array  # [B, 1, E] the prefix layer's output where ``pending`` was produced
  cache: KVCache  # the prefix layer's; committed lengths = the target's


def accepted_features(outcome: Outcome) -> jax.Array:
  """[B, D + 1, F, E] the target's states this iteration committed: ``pending``'s, then the
  accepted path's nodes (rows past ``num_accepted`` are padding: the pending row again)."""
  o = outcome
  rows = jnp.concatenate([jnp.zeros_like(o.path[:, :1]), 1 + jnp.maximum(o.path, 0)], axis=1)
  rows = jnp.where(jnp.arange(rows.shape[1])[None] <= o.num_accepted[:, None], rows, 0)
  return jnp.take_along_axis(o.features, rows[:, :, None, None], axis=1)


@dataclasses.dataclass(frozen=True)
class HydraTree(StaticTree, MedusaProposer):
  """``sj.Hydra(heads, tree=... | gamma=...)`` (a chain: ``Tree.chains(num=1, depth=gamma)``)."""

  head_graphdef: Any
  target_graphdef: Any
  features: tuple
  tree: Tree
  children: str = "sampled"
  typical: Any = None

  prefix: bool = False  # the heads have Hydra++'s prefix layer (static)

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.tree.max_depth + self.prefix

  @property
  def prefill_draft_calls(self) -> int:
    return int(self.prefix)

  def prefill(self, params, prompt, prompt_lengths, cache_length, features):
    if not self.prefix:
      return super().prefill(params, prompt, prompt_lengths, cache_length, features)
    heads = nnx.merge(self.head_graphdef, params[0])
    cache = init_cache(heads.config.prefix, prompt.shape[0], cache_length)
    out, cache = heads.prefix_pass(features[:, :, 0], cache)
    last = out[jnp.arange(out.shape[0]), prompt_lengths - 1]
    return PrefixState(feature=last[:, None], cache=cache.with_lengths(prompt_lengths))

  def commit(self, params, state, candidates, outcome):
    if not self.prefix:
      return super().commit(params, state, candidates, outcome)
    o = outcome
    heads = nnx.merge(self.head_graphdef, params[0])
    # the pass writes at the committed lengths: the target's before this iteration (live rows)
    out, cache = heads.prefix_pass(accepted_features(o)[:, :, 0], state.cache)
    last = out[jnp.arange(out.shape[0]), o.num_accepted][:, None].astype(state.feature.dtype)
    lengths = jnp.where(o.active, cache.lengths + o.num_accepted + 1, cache.lengths)
    return PrefixState(feature=jnp.where(o.active[:, None, None], last, state.feature),
                       cache=cache.with_lengths(lengths))

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
