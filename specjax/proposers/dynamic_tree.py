"""A draft model growing a token tree per row, by confidence (EAGLE-2, Li et al. 2024, arXiv
2406.16858, §4 "context-aware dynamic draft tree"; ``sj.DynamicTree``).

Expansion, one draft forward per level ``l = 1..depth``: the nodes expanded so far (the root, i.e.
the pending token, and ``width`` nodes per earlier level) are fed under their ancestor mask and the
vocabulary is projected for the nodes expanded now; each gets its ``width`` most likely children,
scored by the draft's cumulative log-probability along the path (the value EAGLE-2 ranks by).
Those children (``width`` at level 1, ``width^2`` below) join the candidate pool, and the
``width`` best of them are the next level's expanded nodes. Reranking: the ``nodes`` best of the
whole pool are verified (ties to the shallower node; a child scores no higher than its parent, so
every kept node's parent is kept and the result is a tree), ordered by depth so parents precede
children. A last forward writes their keys/values into the draft's scratch slots for
``compact_path``, as for static trees.

Everything has static shapes (the pool layout is fixed; only the parents differ per row), so the
loop sees ``Candidates.row_trees``. The tree is a deterministic function of the draft, so it is
verified with the one-hot rule at T > 0 (exact) and by the greedy walk at T = 0 (token-exact).
Draft cost: ``depth + 1`` forwards per iteration, like ``DraftTree``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import sampling as sampling_lib
from specjax.proposers import draft_tree
from specjax.proposers.base import TREE, Candidates, RowTrees
from specjax.trees import DynamicTree


def pool_layout(spec: DynamicTree):
  """Static numpy description of the candidate pool and the expanded slots.

  Pool entry order: level 1's ``width`` children of the root, then per level ``l >= 2`` the
  ``width`` children of each of the ``width`` expanded nodes of level ``l - 1``. Expanded slot 0
  is the root; slot ``1 + (l - 1) width + i`` is the i-th expanded node of level ``l``.

  Returns (pool level int[P], pool rank int[P], pool parent slot int[P], slot level int[E]).
  """
  w, d = spec.width, spec.depth
  level, rank, parent = [1] * w, list(range(w)), [0] * w
  for lvl in range(2, d + 1):
    for i in range(w):
      level += [lvl] * w
      rank += list(range(w))
      parent += [1 + (lvl - 2) * w + i] * w
  slot_level = [0] + [lvl for lvl in range(1, d) for _ in range(w)]
  return (np.asarray(level, np.int32), np.asarray(rank, np.int32), np.asarray(parent, np.int32),
          np.asarray(slot_level, np.int32))


def _ancestor_mask(parents: jax.Array, depth: int) -> jax.Array:
  """bool[B, N, N] from int32[B, N] parents (-1 = root; a tree at most ``depth`` deep):
  ``[b, i, j]`` iff node j is node i or one of its ancestors (pointer jumping, depth steps)."""
  b, n = parents.shape
  nodes = jnp.arange(n)
  mask = jnp.broadcast_to(nodes[None, :, None] == nodes[None, None, :], (b, n, n))
  cur = jnp.broadcast_to(nodes[None, :], (b, n))
  for _ in range(depth - 1):
    cur = jnp.where(cur >= 0, jnp.take_along_axis(parents, jnp.maximum(cur, 0), axis=1), -1)
    mask = mask | ((cur[:, :, None] == nodes[None, None, :]) & (cur[:, :, None] >= 0))
  return mask


def row_trees(parents: jax.Array, ranks: jax.Array, depths: jax.Array, width: int,
              max_depth: int) -> RowTrees:
  """``RowTrees`` of per-row trees given as int32[B, N] parents (-1: the root), ranks among
  siblings (>= ``width``: the node is in no children list, a dead slot) and depths (>= 1):
  the children table, the verification mask over [pending, nodes] and the depths."""
  batch, n = parents.shape
  children = jnp.full((batch, n + 1, width), -1, jnp.int32).at[
      jnp.arange(batch)[:, None], parents + 1, ranks].set(
          jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n)), mode="drop")
  mask = jnp.ones((batch, n + 1, n + 1), bool).at[:, 1:, 1:].set(
      _ancestor_mask(parents, max_depth))
  mask = mask.at[:, 0, 1:].set(False)
  verification_depths = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), depths], axis=1)
  return RowTrees(children=children, verification_mask=mask,
                  verification_depths=verification_depths, max_depth=max_depth)


def grow(spec: DynamicTree, pending: jax.Array, sampling, score) -> tuple[jax.Array, RowTrees]:
  """The expansion and reranking of the module docstring, per row: (int32[B, nodes] tokens,
  their ``RowTrees``). ``score(known, expand, slot_tokens, slot_mask, slot_parent)`` returns the
  draft logits [B, |expand|, V] of the expanded slots ``expand`` (static) given the first
  ``known`` slots' int32[B, S] tokens, bool[B, S, S] ancestor mask and int32[B, S] parent slots
  (slot 0: the root, the pending token)."""
  w, d, n = spec.width, spec.depth, spec.nodes
  batch = pending.shape[0]
  pool_level, pool_rank, pool_parent, slot_level = pool_layout(spec)
  num_slots = len(slot_level)
  slot_tokens = jnp.zeros((batch, num_slots), jnp.int32).at[:, 0].set(pending)
  slot_pool = jnp.full((batch, num_slots), -1, jnp.int32)  # each expanded slot's pool entry
  eye = jnp.eye(num_slots, dtype=bool)
  slot_mask = jnp.broadcast_to(eye[:1], (batch, num_slots, num_slots))  # rows filled per level
  slot_parent = jnp.zeros((batch, num_slots), jnp.int32)
  pool_tokens, pool_scores = [], []
  for lvl in range(1, d + 1):
    known = 1 + (lvl - 1) * w  # slots fed now: the root and the expanded nodes so far
    expand = (0,) if lvl == 1 else tuple(range(known - w, known))
    logits = score(known, expand, slot_tokens, slot_mask, slot_parent)  # [B, |expand|, V]
    probs = (jax.nn.softmax(logits, axis=-1) if sampling.is_greedy else
             sampling_lib.probabilities(logits, sampling))
    top_logp, top_tokens = jax.lax.top_k(jnp.log(probs), w)  # [B, |expand|, w]
    if lvl == 1:
      base = jnp.zeros((batch, 1), jnp.float32)
    else:
      scores_so_far = jnp.concatenate(pool_scores, axis=1)
      base = jnp.take_along_axis(scores_so_far, slot_pool[:, known - w:known], axis=1)
    scores = (base[:, :, None] + top_logp).reshape(batch, -1)  # this level's pool entries
    tokens = top_tokens.reshape(batch, -1).astype(jnp.int32)
    offset = sum(s.shape[1] for s in pool_scores)
    pool_tokens.append(tokens)
    pool_scores.append(scores)
    if lvl < d:  # the width most confident of this level are expanded next
      best = jax.lax.top_k(scores, w)[1].astype(jnp.int32)  # [B, w]
      new = np.arange(known, known + w)
      slot_tokens = slot_tokens.at[:, new].set(jnp.take_along_axis(tokens, best, axis=1))
      slot_pool = slot_pool.at[:, new].set(offset + best)
      parent_slots = jnp.asarray(pool_parent)[offset + best]  # [B, w]
      slot_parent = slot_parent.at[:, new].set(parent_slots)
      parent_rows = jnp.take_along_axis(slot_mask, parent_slots[:, :, None], axis=1)
      slot_mask = slot_mask.at[:, new].set(parent_rows | eye[new][None])
  pool_tokens = jnp.concatenate(pool_tokens, axis=1)  # [B, P]
  pool_scores = jnp.concatenate(pool_scores, axis=1)

  # Rerank: the n best by (score desc, level asc); then parents first (by level).
  size = pool_tokens.shape[1]
  index = jnp.broadcast_to(jnp.arange(size, dtype=jnp.int32), (batch, size))
  level = jnp.broadcast_to(jnp.asarray(pool_level), (batch, size))
  _, _, order = jax.lax.sort((-pool_scores, level, index), dimension=1, num_keys=2)
  chosen = order[:, :n]
  _, chosen = jax.lax.sort((jnp.take_along_axis(level, chosen, axis=1), chosen), dimension=1,
                           num_keys=1)  # stable: by level, parents precede children
  rows = jnp.arange(batch)[:, None]
  position = jnp.full((batch, size), -1, jnp.int32).at[rows, chosen].set(
      jnp.arange(n, dtype=jnp.int32)[None, :])
  parent_pool = jnp.take_along_axis(slot_pool, jnp.asarray(pool_parent)[chosen], axis=1)
  parents = jnp.where(parent_pool >= 0,
                      jnp.take_along_axis(position, jnp.maximum(parent_pool, 0), axis=1), -1)
  node_tokens = jnp.take_along_axis(pool_tokens, chosen, axis=1)
  node_depths = jnp.asarray(pool_level)[chosen]
  return node_tokens, row_trees(parents, jnp.asarray(pool_rank)[chosen], node_depths, w,
                                spec.max_depth)


class DynamicSizes:
  """The sizes of a proposer of the dynamic tree ``self.spec``."""

  @property
  def num_candidates(self) -> int:
    return self.spec.nodes

  @property
  def depth(self) -> int:
    return self.spec.max_depth


@dataclasses.dataclass(frozen=True)
class DraftDynamicTree(DynamicSizes, draft_tree.SkippableDraft):
  """The proposer of ``sj.TreeSpeculative(draft, sj.DynamicTree(...))``."""

  graphdef: Any
  spec: DynamicTree
  children = "top_k"  # not a field: a dynamic tree's children are always the draft's top-k

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.spec.depth + 1

  @property
  def first_level_ranks(self) -> tuple[int, ...]:
    """The ranks of the most root children verified, ``min(width, nodes)`` (the reranking can
    drop a first-level node for a likelier grandchild)."""
    return tuple(range(min(self.spec.width, self.spec.nodes)))

  prefill_draft_calls = 1

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    return draft_tree.prefill(nnx.merge(self.graphdef, params), prompt, prompt_lengths,
                              cache_length)

  def propose(self, params, state, pending, keys, sampling):
    del keys  # the tree is deterministic
    draft = nnx.merge(self.graphdef, params)
    slot_level = pool_layout(self.spec)[3]

    def score(known, expand, slot_tokens, slot_mask, slot_parent):
      del slot_parent  # the draft reads the tokens themselves
      logits, _ = draft(slot_tokens[:, :known], state.cache, slot_mask[:, :known, :known],
                        slot_level[:known], logits_at=expand)  # [B, |expand|, V]
      return logits

    node_tokens, trees = grow(self.spec, pending, sampling, score)
    # Every node's entry into the draft's scratch slots, for compact_path after verification.
    _, cache = draft(jnp.concatenate([pending[:, None], node_tokens], axis=1), state.cache,
                     trees.verification_mask, trees.verification_depths, logits_at=0)
    candidates = Candidates(tokens=node_tokens, q=None, kind=TREE, rule="one_hot",
                            row_trees=trees)
    return candidates, state.replace(cache=cache)

  def commit(self, params, state, candidates, outcome):
    del params, candidates
    return draft_tree.commit(state, outcome)
