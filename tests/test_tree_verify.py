"""Exact law of the tree verifier (specjax/verify/tree.py) by enumeration, and its negative controls.

As in ``tests/test_verify.py``, all randomness is integrated while the real decision code runs:

* every assignment of tokens to the tree's nodes is enumerated with its proposal probability
  (children of a node sampled from the draft law at that node: one after the other without
  replacement, or i.i.d., or the draft's top-k for the deterministic one-hot rule);
* the acceptance uniforms: every pattern of "accept" (u = 0) / "reject" (u just below 1) over the
  ``[depth, children]`` tests is run through the real ``tree_core``; the core reports which
  children it tested and with which acceptance probability, so each pattern's weight is the
  product over tested children, and patterns that differ only in untested entries are counted
  once;
* the token after the accepted path is integrated over the law the core returns.

Iterations are composed over contexts (the last K tokens) exactly like ``test_verify``'s
``Enumerator``, and the law of the first ``depth + 2`` tokens (the bonus after a full path and the
next iteration) must equal the target's within 1e-6.
"""

from __future__ import annotations

import collections
import functools
import itertools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax.verify import spectr
from specjax.verify import tree as tree_verify

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests.test_verify import EXACT_TOL, CONTROL_MARGIN, U_ACCEPT, U_REJECT, Enumerator, ToyLM
  from tests.test_verify import max_law_diff
except ImportError:  # pragma: no cover
  from test_verify import EXACT_TOL, CONTROL_MARGIN, U_ACCEPT, U_REJECT, Enumerator, ToyLM
  from test_verify import max_law_diff

SMALL = sj.Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0)])
FULL = sj.Tree.full(depth=2, branching=2)
DEEP = sj.Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0)])
CHAINS_3X2 = sj.Tree.chains(num=3, depth=2)  # SpecTr's i.i.d. drafts: k' = 1, 2, 3 all occur
CHAINS_2X3 = sj.Tree.chains(num=2, depth=3)
CHAINS_4X1 = sj.Tree.chains(num=4, depth=1)


def top_k(q: np.ndarray, k: int) -> list[int]:
  return [int(x) for x in np.argsort(-q, kind="stable")[:k]]


def proposal_weight(rule: str, q: np.ndarray, siblings: tuple, x: int, rank: int) -> float:
  """P(the child of rank ``rank`` gets token x | its earlier siblings' tokens) for a parent whose
  draft law is q."""
  if rule == "one_hot":
    return 1.0 if x == top_k(q, rank + 1)[rank] else 0.0
  if rule == "with_replacement":
    return float(q[x])
  rest = q.astype(np.float64).copy()
  rest[list(siblings)] = 0.0
  if rest.sum() <= 0:  # support exhausted: the proposer's pick is arbitrary and never tested
    return 1.0 if x == min(set(range(len(q))) - set(siblings)) else 0.0
  return float(rest[x] / rest.sum())


@functools.lru_cache(maxsize=None)
def _batched_core(children_key, rule, has_q):
  children = np.asarray(children_key, np.int32)
  fn = lambda u, p, t, q: tree_verify.tree_core(u, p, t, q if has_q else None, children, rule)
  return jax.jit(jax.vmap(fn))


class TreeEnumerator(Enumerator):
  """Exact law of the tokens emitted by tree verification iterations (``core_rule`` decides how
  the verifier treats the children; ``propose_rule`` how they were proposed)."""

  def __init__(self, lm: ToyLM, tree: sj.Tree, propose_rule: str, core_rule: str | None = None):
    super().__init__(lm, gamma=tree.max_depth, core_fn=None)
    self.tree, self.propose_rule = tree, propose_rule
    self.core_rule = core_rule or propose_rule

  def _path_tokens(self, tokens, node):
    if node < 0:
      return ()
    return self._path_tokens(tokens, self.tree.parents[node]) + (tokens[node],)

  def _assignments(self, ctx):
    """(tokens, weight) for every assignment of tokens to the nodes, weight > 0 only."""
    tree, v = self.tree, self.lm.v
    out = []
    for tokens in itertools.product(range(v), repeat=tree.num_nodes):
      w = 1.0
      for i, parent in enumerate(tree.parents):
        q = self.lm.draft(ctx + self._path_tokens(tokens, parent))
        siblings = tuple(tokens[j] for j in range(i) if tree.parents[j] == parent)
        w *= proposal_weight(self.propose_rule, q, siblings, tokens[i], tree.ranks[i])
        if w == 0.0:
          break
      if w > 0.0:
        out.append((tokens, w))
    return out

  def iteration(self, ctx: tuple) -> dict:
    tree = self.tree
    depth, width = tree.max_depth, tree.children.shape[1]
    patterns = list(itertools.product((U_ACCEPT, U_REJECT), repeat=depth * width))
    us, ps, qs, ts, meta = [], [], [], [], []
    for tokens, w in self._assignments(ctx):
      ctxs = [ctx] + [ctx + self._path_tokens(tokens, i) for i in range(tree.num_nodes)]
      p = np.stack([self.lm.target(c) for c in ctxs])
      q = np.stack([self.lm.draft(c) for c in ctxs])
      for pattern in patterns:
        us.append(np.reshape(pattern, (depth, width)))
        ps.append(p)
        qs.append(q)
        ts.append(tokens)
        meta.append((tokens, w, pattern))
    core = _batched_core(tuple(map(tuple, tree.children)), self.core_rule,
                         self.core_rule != "one_hot")
    out = core(jnp.asarray(np.array(us, np.float32)), jnp.asarray(np.array(ps)),
               jnp.asarray(np.array(ts, np.int32)), jnp.asarray(np.array(qs)))
    path, n = np.asarray(out.path), np.asarray(out.num_accepted)
    next_dist = np.asarray(out.next_dist, np.float64)
    ratios, tested = np.asarray(out.ratios, np.float64), np.asarray(out.tested)
    us = np.array(us)
    law = collections.defaultdict(float)
    for j, (tokens, w, _) in enumerate(meta):
      if np.any(us[j][~tested[j]] != U_ACCEPT):  # count each outcome once
        continue
      accept = us[j][tested[j]] == U_ACCEPT
      r = ratios[j][tested[j]]
      weight = w * np.prod(np.where(accept, r, 1.0 - r))
      if weight <= 0.0:
        continue
      emitted = tuple(tokens[i] for i in path[j, :n[j]])
      for y in np.flatnonzero(next_dist[j] > 0):
        law[emitted + (int(y),)] += weight * next_dist[j, y]
    return law


class TreeLawTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("wor_small_v4", "without_replacement", SMALL, 4, 1),
      ("wor_full_v3", "without_replacement", FULL, 3, 2),
      ("wor_deep_v3", "without_replacement", DEEP, 3, 1),
      ("wr_small_v4", "with_replacement", SMALL, 4, 1),
      ("one_hot_small_v4", "one_hot", SMALL, 4, 1),
      ("one_hot_deep_v4", "one_hot", DEEP, 4, 1),
  )
  def test_law(self, rule, tree, v, k):
    lm = ToyLM(seed=17 * v + k, v=v, k=k)  # every KINDS edge case: equal, disjoint, q = 0, ...
    t = tree.max_depth + 2
    law = TreeEnumerator(lm, tree, rule).law(t)
    self.assertAlmostEqual(sum(law.values()), 1.0, delta=EXACT_TOL)
    self.assertLess(max_law_diff(law, lm.exact_law(t)), EXACT_TOL)

  @parameterized.named_parameters(
      # EAGLE's bias (ALGORITHMS.md §4-5): top-k children verified against the soft draft law.
      ("soft_q_for_top_k_children", "one_hot", "without_replacement"),
      ("soft_q_for_top_k_children_iid", "one_hot", "with_replacement"),
      # Children drawn without replacement but verified as if i.i.d. (q not updated).
      ("without_replacement_verified_as_iid", "without_replacement", "with_replacement"),
  )
  def test_negative_controls(self, propose_rule, core_rule):
    self._assert_control_rejected(propose_rule, core_rule, SMALL)

  @parameterized.named_parameters(
      ("k_seq_3x2_v3", "k_seq", CHAINS_3X2, 3, 1),
      ("k_seq_2x3_v3", "k_seq", CHAINS_2X3, 3, 1),
      ("k_seq_4x1_v4", "k_seq", CHAINS_4X1, 4, 2),
      ("naive_3x2_v3", "naive_multi_draft", CHAINS_3X2, 3, 1),
      ("naive_4x1_v4", "naive_multi_draft", CHAINS_4X1, 4, 2),
      ("unmerged_iid_3x2_v3", "with_replacement", CHAINS_3X2, 3, 1),
  )
  def test_multi_draft_law(self, core_rule, tree, v, k):
    """k i.i.d. chains (drawn with replacement at every node) through SpecTr's K-SEQ, the naive
    rule on merged survivors, and the plain tree rule on the unmerged chains."""
    lm = ToyLM(seed=29 * v + k, v=v, k=k)  # equal, disjoint, q = 0 where p > 0, ... contexts
    t = tree.max_depth + 2
    law = TreeEnumerator(lm, tree, "with_replacement", core_rule).law(t)
    self.assertAlmostEqual(sum(law.values()), 1.0, delta=EXACT_TOL)
    self.assertLess(max_law_diff(law, lm.exact_law(t)), EXACT_TOL)

  @parameterized.named_parameters(
      # rho* ignored: every draft tested at the single-draft ratio min(1, p/q), residual at rho 1.
      ("k_seq_with_rho_1", "rho_star", lambda f, k_all: lambda p, q, k: jnp.float32(1.0)),
      # The residual computed for all k chains instead of the k' survivors of the prefix. (rho*
      # for all k chains is no control: any rho >= rho*(k') keeps the law, at lower acceptance.)
      ("k_seq_residual_for_all_chains", "k_seq_residual",
       lambda f, k_all: lambda p, q, rho, k: f(p, q, rho, k_all)),
  )
  def test_multi_draft_controls(self, name, make_broken):
    tree = sj.Tree.chains(num=2, depth=2)  # V = 4: residuals with >= 2 tokens occur
    broken = make_broken(getattr(spectr, name), tree.chain_table.shape[0])
    lm = ToyLM(seed=5, v=4, k=1, kinds=("random", "p_topk", "q_subset"))
    t = tree.max_depth + 2
    _batched_core.cache_clear()
    try:
      with mock.patch.object(spectr, name, broken):
        bad = TreeEnumerator(lm, tree, "with_replacement", "k_seq").law(t)
    finally:
      _batched_core.cache_clear()
    self.assertGreater(max_law_diff(bad, lm.exact_law(t)), CONTROL_MARGIN)

  def test_naive_without_residual_update_is_rejected(self):
    tree = CHAINS_4X1
    lm = ToyLM(seed=5, v=4, k=1, kinds=("random", "p_topk", "q_subset"))
    t = tree.max_depth + 2
    _batched_core.cache_clear()
    try:  # every rejected draft leaves r = p: the next test and the final draw use the wrong law
      with mock.patch.object(spectr, "residual", lambda r, q: r):
        bad = TreeEnumerator(lm, tree, "with_replacement", "naive_multi_draft").law(t)
    finally:
      _batched_core.cache_clear()
    self.assertGreater(max_law_diff(bad, lm.exact_law(t)), CONTROL_MARGIN)

  def _assert_control_rejected(self, propose_rule, core_rule, tree):
    lm = ToyLM(seed=3, v=4, k=1, kinds=("random", "p_topk", "q_subset", "disjoint"))
    t = tree.max_depth + 2
    good = TreeEnumerator(lm, tree, propose_rule).law(t)
    bad = TreeEnumerator(lm, tree, propose_rule, core_rule).law(t)
    self.assertLess(max_law_diff(good, lm.exact_law(t)), EXACT_TOL)
    self.assertGreater(max_law_diff(bad, lm.exact_law(t)), CONTROL_MARGIN)


class RuleTest(parameterized.TestCase):

  def test_greedy_walk(self):
    # SMALL: nodes (0,), (1,), (0,0), (0,1), (1,0) = 0..4. Argmax: root 7, after node 1 -> 5,
    # after node 4 -> 2. Tokens: node 1 = 7, node 4 = 5: the walk takes 1 then 4, then emits 2.
    tokens = jnp.array([3, 7, 1, 9, 5])
    argmax = jnp.array([7, 0, 5, 0, 0, 2])
    out = jax.jit(tree_verify.greedy_tree, static_argnums=(2, 3))(
        argmax, tokens, _hashable(SMALL.children), SMALL.max_depth)
    np.testing.assert_array_equal(out.path, [1, 4])
    self.assertEqual(int(out.num_accepted), 2)
    self.assertEqual(int(out.next_token), 2)
    argmax = jnp.array([4, 0, 0, 0, 0, 0])  # no child of the root matches: emit 4
    out = tree_verify.greedy_tree(argmax, tokens, SMALL.children, SMALL.max_depth)
    np.testing.assert_array_equal(out.path, [-1, -1])
    self.assertEqual(int(out.next_token), 4)

  def test_exhausted_support_is_skipped(self):
    # The root's q has one token; its second child (a forced pick from q = 0) is never tested.
    p = jnp.full((SMALL.num_nodes + 1, 4), 0.25)
    q = jnp.tile(jnp.array([0.0, 1.0, 0.0, 0.0]), (SMALL.num_nodes + 1, 1))
    tokens = jnp.array([1, 0, 1, 1, 1])
    u = jnp.full((2, 2), U_REJECT)
    core = tree_verify.tree_core(u, p, tokens, q, SMALL.children, "without_replacement")
    np.testing.assert_array_equal(core.tested[0], [True, False])
    np.testing.assert_allclose(core.next_dist, [1 / 3, 0, 1 / 3, 1 / 3], atol=1e-6)

  def test_bad_rule(self):
    with self.assertRaisesRegex(ValueError, r"unknown tree rule 'topk'"):
      tree_verify.tree_core(jnp.zeros((2, 2)), jnp.ones((6, 4)), jnp.zeros(5, jnp.int32), None,
                            SMALL.children, "topk")
    with self.assertRaisesRegex(ValueError, r"rule 'one_hot' takes no q"):
      tree_verify.tree_core(jnp.zeros((2, 2)), jnp.ones((6, 4)), jnp.zeros(5, jnp.int32),
                            jnp.ones((6, 4)), SMALL.children, "one_hot")


def _hashable(children):
  return tuple(map(tuple, np.asarray(children).tolist()))


if __name__ == "__main__":
  absltest.main()
