"""Verification of a token tree: several candidates per position (ALGORITHMS.md §5, §7).

SpecInfer (Miao et al. 2024, arXiv 2305.09781, Algorithm 2, "multi-step speculative sampling")
and Sequoia (Chen et al. 2024, arXiv 2402.12374, sampling without replacement). Walk down from the
root (the pending token) with ``r = p(root)``; at a node, test its children in rank order:

  accept child ``x_i`` with probability ``min(1, r(x_i) / q_i(x_i))``; if accepted, move to it
  (``r = p(child)``) and repeat there; if rejected, ``r = norm((r - q_i)+)``;

if no child is accepted (or the node is a leaf) emit a draw from ``r`` and stop. ``q_i`` depends on
how the children were proposed (``rule``):

* ``"without_replacement"``: sampled one after the other from the parent's draft law ``q`` with
  earlier siblings removed: ``q_1 = q``, ``q_{i+1} = norm(q_i with q_i(x_i) = 0)`` (Sequoia);
* ``"with_replacement"``: sampled i.i.d. from ``q``: every ``q_i = q`` (SpecInfer's multi-draft);
* ``"one_hot"``: chosen deterministically (top-k): ``q_i = one_hot(x_i)`` (rule 4 repeatedly), so
  ``x_i`` is accepted with probability ``r(x_i)`` and a rejection removes it from ``r``;
* ``"k_seq"`` / ``"naive_multi_draft"``: the tree is ``k`` i.i.d. chains (SpecTr's drafts),
  walked with the survivors of equal prefixes merged: ``specjax.verify.spectr``.

Every rule emits tokens distributed exactly as the target (checked by enumeration in
``tests/test_tree_verify.py``); verifying top-k children against a *soft* q does not (the
negative control there). A child whose ``q_i(x_i) == 0`` was never drawn (the draft's support was
exhausted before it) and is skipped. At temperature 0, ``greedy_tree`` follows the target's argmax.

One row, no batch dim; ``jax.vmap`` over rows. The tree's structure (``children``: int[N + 1, C],
row 0 = the root's children, row i + 1 = node i's, by rank, -1 padded) is static numpy for a
static tree, or an array of the row's own (a dynamic tree; not for the multi-draft rules).
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specjax.sampling import sample_from_probs
from specjax.trees import chain_table
from specjax.verify import spectr
from specjax.verify.rejection import acceptance_ratio, residual

# Multi-draft rules for k i.i.d. chains (sj.Tree.chains), walked with merged survivors (spectr.py).
MULTI_DRAFT_RULES = {"k_seq": "k_seq", "naive_multi_draft": "naive"}
RULES = ("without_replacement", "with_replacement", "one_hot") + tuple(MULTI_DRAFT_RULES)


@flax.struct.dataclass
class TreeVerdict:
  """Outcome of verifying one row's tree."""

  path: jax.Array  # int32[D] accepted nodes from the root down, -1 after the last
  num_accepted: jax.Array  # int32[] accepted nodes (path length)
  next_token: jax.Array  # int32[] the token emitted after the path


class TreeCore(NamedTuple):
  """The deterministic part of a tree verification, given the acceptance uniforms."""

  path: jax.Array  # int32[D]
  num_accepted: jax.Array  # int32[]
  next_dist: jax.Array  # float32[V] law of the token emitted after the path
  ratios: jax.Array  # float32[D, C] acceptance probability of each tested child
  tested: jax.Array  # bool[D, C] which children were tested


def _without(q: jax.Array, x: jax.Array) -> jax.Array:
  """``norm(q with q(x) = 0)``; all zeros once the support is exhausted."""
  q = q.at[x].set(0.0)
  mass = jnp.sum(q)
  return jnp.where(mass > 0, q / jnp.where(mass > 0, mass, 1.0), 0.0)


def tree_core(u: jax.Array, p: jax.Array, tokens: jax.Array, q: jax.Array | None,
              children: np.ndarray, rule: str) -> TreeCore:
  """The decision logic of a tree verification, with the uniforms ``u`` given.

  Args:
    u: float32[D, C] acceptance uniforms in [0, 1): ``u[s, i]`` decides the i-th child tested at
      depth step s (child i is accepted iff ``u[s, i] < ratio``).
    p: float32[N + 1, V] target laws: row 0 at the root, row i + 1 after node i.
    tokens: int32[N] the nodes' tokens.
    q: float32[N + 1, V] the draft law each node's children were sampled from (row 0: the
      root's), or None for ``rule="one_hot"``.
    children: int[N + 1, C] children table (see the module docstring).
    rule: one of ``RULES``.
  """
  if rule not in RULES:
    raise ValueError(f"unknown tree rule {rule!r}; expected one of {RULES}")
  if (q is None) != (rule == "one_hot"):
    raise ValueError(f"rule {rule!r} {'takes no' if rule == 'one_hot' else 'needs a'} q")
  if rule in MULTI_DRAFT_RULES:
    return TreeCore(*spectr.chains_core(u, p, tokens, q, chain_table(np.asarray(children)),
                                        MULTI_DRAFT_RULES[rule]))
  depth_steps, width = u.shape
  table = jnp.asarray(children, jnp.int32)
  node = jnp.int32(0)  # row index in [0, N]: 0 = the root
  r = p[0]
  stopped = jnp.bool_(False)
  path, ratios, tested = [], [], []
  for step in range(depth_steps):
    kids = table[node]
    q_cur = None if q is None else q[node]
    chosen = jnp.int32(-1)
    step_ratios, step_tested = [], []
    for i in range(width):
      child = kids[i]
      x = tokens[jnp.maximum(child, 0)]
      if rule == "one_hot":
        q_x = jnp.float32(1.0)
        q_vec = jax.nn.one_hot(x, p.shape[-1], dtype=jnp.float32)
      else:
        q_x = q_cur[x]
        q_vec = q_cur
      test = (child >= 0) & (chosen < 0) & ~stopped & (q_x > 0)
      ratio = acceptance_ratio(r[x], q_x)
      accept = test & (u[step, i] < ratio)
      reject = test & ~accept
      chosen = jnp.where(accept, child, chosen)
      r = jnp.where(reject, residual(r, q_vec), r)
      if rule == "without_replacement":
        q_cur = jnp.where(reject, _without(q_cur, x), q_cur)
      step_ratios.append(ratio)
      step_tested.append(test)
    moved = chosen >= 0
    path.append(jnp.where(moved, chosen, -1))
    stopped = stopped | ~moved
    node = jnp.where(moved, chosen + 1, node)
    r = jnp.where(moved, p[node], r)
    ratios.append(jnp.stack(step_ratios))
    tested.append(jnp.stack(step_tested))
  path = jnp.stack(path).astype(jnp.int32)
  return TreeCore(path=path, num_accepted=jnp.sum(path >= 0).astype(jnp.int32), next_dist=r,
                  ratios=jnp.stack(ratios), tested=jnp.stack(tested))


def sampled_tree(key: jax.Array, p: jax.Array, tokens: jax.Array, q: jax.Array | None,
                 children: np.ndarray, depth: int, rule: str) -> TreeVerdict:
  """Verifies one row's tree by the recursive rule (module docstring); ``depth`` = the tree's."""
  key_accept, key_draw = jax.random.split(key)
  width = children.shape[1]
  u = jax.random.uniform(key_accept, (depth, width), jnp.float32)
  core = tree_core(u, p, tokens, q, children, rule)
  return TreeVerdict(path=core.path, num_accepted=core.num_accepted,
                     next_token=sample_from_probs(key_draw, core.next_dist))


def greedy_tree(target_argmax: jax.Array, tokens: jax.Array, children: np.ndarray,
                depth: int) -> TreeVerdict:
  """Temperature 0: follow the child whose token is the target's argmax while there is one.

  Args:
    target_argmax: int32[N + 1] the target's argmax at the root (0) and after each node (i + 1).
    tokens: int32[N]; children: static int[N + 1, C]; depth: the tree's depth.
  Emits the greedy tokens exactly: the path's tokens are the argmax chain, then the argmax after.
  """
  table = jnp.asarray(children, jnp.int32)
  node = jnp.int32(0)
  stopped = jnp.bool_(False)
  path = []
  for _ in range(depth):
    kids = table[node]
    match = (kids >= 0) & (tokens[jnp.maximum(kids, 0)] == target_argmax[node]) & ~stopped
    chosen = jnp.where(match.any(), kids[jnp.argmax(match)], -1)
    moved = chosen >= 0
    path.append(chosen)
    stopped = stopped | ~moved
    node = jnp.where(moved, chosen + 1, node)
  path = jnp.stack(path).astype(jnp.int32)
  return TreeVerdict(path=path, num_accepted=jnp.sum(path >= 0).astype(jnp.int32),
                     next_token=target_argmax[node])
