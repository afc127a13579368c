"""``sj.TreeSpeculative(draft, sj.DynamicTree(...))``: EAGLE-2 trees grown per row.

The proposer's trees against a direct Python definition of EAGLE-2's expansion and reranking;
greedy exactness; the law harness (T = 1, top-k, top-p, ragged batch) with a mutation control;
errors. The one-hot rule these trees are verified by is enumerated in ``tests/test_tree_verify.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax.proposers import dynamic_tree

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, tabular
  from tests.test_laws import overconfident_pair, patched
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TAB_CONTEXT, TAB_V, TF_CONFIG,
                                      _seed, greedy_reference, noisy_copy, random_transformer,
                                      tabular_pair, truncate_at_eos)
  from tests.test_tree_speculative import check_tree_stats
except ImportError:  # pragma: no cover
  import lawcheck
  import tabular
  from test_laws import overconfident_pair, patched
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TAB_CONTEXT, TAB_V, TF_CONFIG, _seed,
                                greedy_reference, noisy_copy, random_transformer, tabular_pair,
                                truncate_at_eos)
  from test_tree_speculative import check_tree_stats

S = sj.Sampling


def reference_tree(q_of, context, spec: sj.DynamicTree) -> set:
  """EAGLE-2 by its definition: the token paths of the ``spec.nodes`` most confident candidates.

  ``q_of(tokens) -> float64[V]`` is the draft's law after a context. Level 1: the root's
  ``width`` likeliest children; each level: the ``width`` best candidates of the level are
  expanded with their ``width`` likeliest children; score = the sum of log q along the path."""
  top = lambda probs: [int(t) for t in np.argsort(-probs, kind="stable")[:spec.width]]
  pool = {}  # path -> score
  frontier = [()]
  for level in range(1, spec.depth + 1):
    new = {}
    for path in frontier:
      probs = q_of(tuple(context) + path)
      base = pool.get(path, 0.0)
      for t in top(probs):
        new[path + (t,)] = base + float(np.log(probs[t]))
    pool.update(new)
    frontier = sorted(new, key=lambda p: -new[p])[:spec.width]
  ranked = sorted(pool, key=lambda p: (-pool[p], len(p)))
  return set(ranked[:spec.nodes])


def proposed_paths(candidates, row: int) -> set:
  """The token paths of row ``row``'s proposed nodes, read from its verification mask."""
  trees = candidates.row_trees
  mask = np.asarray(trees.verification_mask[row])
  depths = np.asarray(trees.verification_depths[row])
  tokens = np.asarray(candidates.tokens[row])
  paths = set()
  for i in range(tokens.shape[0]):
    ancestors = [int(j) for j in np.flatnonzero(mask[i + 1, 1:])]  # node indices
    ancestors.sort(key=lambda j: depths[j + 1])
    paths.add(tuple(int(tokens[j]) for j in ancestors))
    assert len(ancestors) == depths[i + 1], (ancestors, depths)
  return paths


def check_children(test, candidates, row: int):
  """The children table and the mask describe one tree: each node is listed once, under the
  node its mask says is its parent, and parents precede children."""
  trees = candidates.row_trees
  children = np.asarray(trees.children[row])
  mask = np.asarray(trees.verification_mask[row])[1:, 1:]
  n = mask.shape[0]
  listed = sorted(int(c) for c in children.ravel() if c >= 0)
  test.assertEqual(listed, list(range(n)))
  for parent_row, kids in enumerate(children):
    for kid in kids[kids >= 0]:
      expected = mask[kid].copy()
      expected[kid] = False
      if parent_row == 0:
        test.assertFalse(expected.any())
      else:
        test.assertLess(parent_row - 1, kid)
        test.assertTrue(mask[kid, parent_row - 1])
        test.assertEqual(int(expected.sum()), int(mask[parent_row - 1].sum()))


class ExpansionTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("d3_w2_n5", sj.DynamicTree(depth=3, width=2, nodes=5)),
      ("d4_w3_n12", sj.DynamicTree(depth=4, width=3, nodes=12)),
      ("d2_w4_n20_whole_pool", sj.DynamicTree(depth=2, width=4, nodes=20)),
  )
  def test_matches_the_definition(self, spec):
    rng = np.random.default_rng(0)  # no ties: Dirichlet laws, no zeros
    v = 6
    probs = rng.dirichlet(np.full(v, 0.5), size=(v + 1,) * 2)
    draft = tabular.TabularLM.from_probs(probs)
    q_of = lambda ctx: probs[tabular.context_key(ctx, 2, v)].astype(np.float64)
    method = sj.TreeSpeculative(draft, spec)
    proposer, params = method.proposer(draft)
    prompts = np.array([[1, 2, 0], [3, 0, 0], [5, 5, 4]], np.int32)
    lengths = np.array([3, 1, 2], np.int32)
    pending = jnp.array([4, 2, 0], jnp.int32)
    state = proposer.prefill(params, jnp.asarray(prompts), jnp.asarray(lengths), 32)
    propose = jax.jit(lambda params, state, pending: proposer.propose(params, state, pending,
                                                                      None, S(1.0)))
    candidates, _ = propose(params, state, pending)
    for row in range(3):
      context = list(prompts[row, :lengths[row]]) + [int(pending[row])]
      self.assertEqual(proposed_paths(candidates, row), reference_tree(q_of, context, spec))
      check_children(self, candidates, row)


class GreedyTest(parameterized.TestCase):

  # One shape (each compiles two loops); ExpansionTest covers the others' structure.
  @parameterized.named_parameters(("d4_w3_n10", sj.DynamicTree(depth=4, width=3, nodes=10)))
  def test_matches_autoregressive(self, spec):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    for draft in (noisy_copy(TF_CONFIG, 1, 0.4), target):
      out = sj.generate(target, GREEDY_PROMPTS, sj.TreeSpeculative(draft, spec),
                        max_new_tokens=GREEDY_NEW)
      np.testing.assert_array_equal(out.tokens, expected)
      check_tree_stats(self, out, spec)
    # draft == target: the argmax path is the most confident, so every iteration accepts depth.
    self.assertEqual(int(out.stats.target_calls), 1 + -(-(GREEDY_NEW - 1) // (spec.depth + 1)))

  def test_eos(self):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    eos = int(expected[0, 3])
    out = sj.generate(target, GREEDY_PROMPTS,
                      sj.TreeSpeculative(noisy_copy(TF_CONFIG, 1, 0.4),
                                         sj.DynamicTree(depth=3, width=2, nodes=6)),
                      max_new_tokens=GREEDY_NEW, eos_token_id=eos)
    np.testing.assert_array_equal(out.tokens, truncate_at_eos(expected, eos))


class LawTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("t1_overconfident_ragged", S(1.0), "overconfident", ((1, 3, 0, 2), (2,)),
       sj.DynamicTree(depth=3, width=2, nodes=5)),
      ("t07_topk3_mixed", S(0.7, top_k=3), "mixed", ((1, 3, 0, 2),),
       sj.DynamicTree(depth=2, width=3, nodes=6)),
      ("t1_topp08_q_subset", S(1.0, top_p=0.8), "q_subset", ((2, 1),),
       sj.DynamicTree(depth=3, width=2, nodes=4)),
  )
  def test_tabular(self, sampling, tables, prompts, spec):
    name = self._testMethodName
    target, draft = (overconfident_pair(_seed(name)) if tables == "overconfident" else
                     tabular_pair(tables, _seed(tables)))
    result = lawcheck.check_law(target, sj.TreeSpeculative(draft, spec), sampling, prompts,
                                spec.max_depth + 3, seed=_seed(name))
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    check_tree_stats(self, result.out, spec)
    self.assertGreater(int(np.asarray(result.out.stats.accepted_length_counts)[2:].sum()), 0)

  def test_mask_without_ancestors_is_rejected(self):
    # The target scores each node with the committed text, the pending token and itself only
    # (its ancestors masked out): a context-3 table then gives deeper nodes the wrong law.
    self.assertGreaterEqual(TAB_CONTEXT, 2)
    target, draft = overconfident_pair(_seed("mask"))
    spec = sj.DynamicTree(depth=3, width=2, nodes=5)
    run = lambda name: lawcheck.check_law(target, sj.TreeSpeculative(draft, spec), S(1.0),
                                          [(1, 3, 0, 2)], spec.max_depth + 3, seed=_seed(name))
    clean = run("clean")
    self.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
    no_ancestors = lambda parents, depth: jnp.broadcast_to(
        jnp.eye(parents.shape[1], dtype=bool), parents.shape + parents.shape[1:])
    with patched(((dynamic_tree, "_ancestor_mask", no_ancestors),)):
      mutant = run("mask")
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())


class ErrorsTest(absltest.TestCase):

  def test_bad_sizes(self):
    with self.assertRaisesRegex(ValueError, r"width must be an integer >= 1, got 0"):
      sj.DynamicTree(depth=2, width=0, nodes=2)
    with self.assertRaisesRegex(ValueError, r"nodes=11 exceeds the 10 candidates that depth=3, "
                                r"width=2 grow"):
      sj.DynamicTree(depth=3, width=2, nodes=11)

  def test_children_rule(self):
    _, draft = tabular_pair("mixed", 0)
    with self.assertRaisesRegex(ValueError, r"a DynamicTree's children are the draft's top-k "
                                r"\(children='top_k'\), got children='sampled'"):
      sj.TreeSpeculative(draft, sj.DynamicTree(depth=2, width=2, nodes=4), "sampled")

  def test_width_beyond_the_vocabulary(self):
    target, draft = tabular_pair("mixed", 0)  # V = 4
    self.assertEqual(TAB_V, 4)
    with self.assertRaisesRegex(ValueError, r"rank-4 candidate, but the vocabulary has only 4"):
      sj.generate(target, [[1]], sj.TreeSpeculative(draft, sj.DynamicTree(depth=2, width=5,
                                                                           nodes=4)),
                  max_new_tokens=2)


if __name__ == "__main__":
  absltest.main()
