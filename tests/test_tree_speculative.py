"""``sj.TreeSpeculative`` through the real loop: greedy exactness, the law harness (sampled and
top-k children, with a mutation control), stats, and errors. The verifier's exact law by
enumeration is in ``tests/test_tree_verify.py``."""

from __future__ import annotations

import jax
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax.proposers import draft_tree

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, tabular
  from tests.test_laws import LAW_CONFIG, law_transformer, overconfident_pair, patched
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed,
                                      greedy_reference, noisy_copy, random_transformer,
                                      tabular_pair, truncate_at_eos)
except ImportError:  # pragma: no cover
  import lawcheck
  import tabular
  from test_laws import LAW_CONFIG, law_transformer, overconfident_pair, patched
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed, greedy_reference,
                                noisy_copy, random_transformer, tabular_pair, truncate_at_eos)

try:
  import pytest
  slow = pytest.mark.slow
except ImportError:  # pragma: no cover - plain absltest run
  slow = lambda cls: cls

S = sj.Sampling
MEDUSA_LIKE = sj.Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
RANK_GAPS = sj.Tree.from_paths([(0,), (2,), (0, 1), (2, 3)])
TREES = (("paths", MEDUSA_LIKE), ("full", sj.Tree.full(depth=2, branching=2)),
         ("chains", sj.Tree.chains(num=2, depth=3)))


def check_tree_stats(test, out, tree: sj.Tree):
  s = out.stats
  iters = np.asarray(s.row_target_calls) - 1
  np.testing.assert_array_equal(s.proposed, tree.num_nodes * iters)
  test.assertAlmostEqual(s.nodes_per_call, tree.num_nodes)
  counts = np.asarray(s.accepted_length_counts)
  test.assertEqual(counts.shape, (tree.max_depth + 1,))
  test.assertEqual(int(counts.sum()), int(iters.sum()))
  test.assertEqual(int(np.dot(counts, np.arange(tree.max_depth + 1))), int(np.sum(s.accepted)))
  test.assertEqual(int(s.draft_calls), 1 + (tree.max_depth + 1) * (int(s.target_calls) - 1))
  test.assertTrue(np.isnan(s.expected_alpha))  # alpha is a chain's figure
  np.testing.assert_array_equal(s.generated, out.lengths)


# Not slow: greedy = autoregressive for trees: in the default run (~1 min).
class GreedyTest(parameterized.TestCase):
  """At temperature 0 every tree returns the Autoregressive tokens exactly (ragged batch)."""

  @parameterized.named_parameters(*TREES)
  def test_matches_autoregressive(self, tree):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    for draft in (noisy_copy(TF_CONFIG, 1, 0.4), target):
      out = sj.generate(target, GREEDY_PROMPTS, sj.TreeSpeculative(draft, tree),
                        max_new_tokens=GREEDY_NEW)
      np.testing.assert_array_equal(out.tokens, expected)
      check_tree_stats(self, out, tree)
    # draft == target: every iteration accepts a whole root-to-leaf path of full depth.
    self.assertEqual(int(out.stats.target_calls),
                     1 + -(-(GREEDY_NEW - 1) // (tree.max_depth + 1)))

  def test_eos_and_top_k_children_flag(self):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    eos = int(expected[0, 3])  # ends row 0 at its 4th token at the latest
    out = sj.generate(target, GREEDY_PROMPTS,
                      sj.TreeSpeculative(noisy_copy(TF_CONFIG, 1, 0.4), MEDUSA_LIKE, "top_k"),
                      max_new_tokens=GREEDY_NEW, eos_token_id=eos)
    np.testing.assert_array_equal(out.tokens, truncate_at_eos(expected, eos))


@slow
class LawTest(parameterized.TestCase):
  """The law harness on tabular models (both children rules, warps) and a small transformer."""

  @parameterized.named_parameters(
      ("sampled_t1_overconfident_ragged", "sampled", S(1.0), "overconfident",
       ((1, 3, 0, 2), (2,))),
      ("sampled_t07_topk3_mixed", "sampled", S(0.7, top_k=3), "mixed", ((1, 3, 0, 2),)),
      ("sampled_t1_topp08_q_subset", "sampled", S(1.0, top_p=0.8), "q_subset", ((2, 1),)),
      ("top_k_t15_topp09_overconfident", "top_k", S(1.5, top_p=0.9), "overconfident", ((0,),)),
      # Ranks that skip values: sampled children are still the 1st, 2nd... draws.
      ("sampled_t1_rank_gaps", "sampled", S(1.0), "mixed", ((3, 3),), RANK_GAPS),
  )
  def test_tabular(self, children, sampling, tables, prompts, tree=MEDUSA_LIKE):
    name = self._testMethodName
    target, draft = (overconfident_pair(_seed(name)) if tables == "overconfident" else
                     tabular_pair(tables, _seed(tables)))
    result = lawcheck.check_law(target, sj.TreeSpeculative(draft, tree, children),
                                sampling, prompts, tree.max_depth + 3, seed=_seed(name))
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    check_tree_stats(self, result.out, tree)
    counts = np.asarray(result.out.stats.accepted_length_counts)
    self.assertGreater(int(counts[1:].sum()), 0)  # paths are accepted

  def test_transformer(self):
    # Two sampled children of the root, each one deep: cheap on 2 cores (30k rows), and the
    # without-replacement rule on a transformer's laws.
    target = law_transformer()
    tree = sj.Tree.chains(num=2, depth=1)
    result = lawcheck.check_law(target, sj.TreeSpeculative(noisy_copy(LAW_CONFIG, 1), tree),
                                S(1.0), [(3, 1, 4, 1, 5)], tree.max_depth + 3,
                                seed=_seed("tree_transformer"),
                                exact_law=lawcheck.transformer_law)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    self.assertTrue(np.all(np.asarray(result.out.stats.accepted_length_counts) > 0))

  def test_soft_q_for_top_k_children_is_rejected(self):
    # EAGLE's bias (ALGORITHMS.md §4): top-k children verified against the draft's soft law as if
    # they were sampled. Patched into the real proposer: the harness rejects it.
    target, draft = overconfident_pair(_seed("soft_q"))
    method = sj.TreeSpeculative(draft, MEDUSA_LIKE, "top_k")
    run = lambda name: lawcheck.check_law(target, method, S(1.0), [(1, 3, 0, 2)],
                                          MEDUSA_LIKE.max_depth + 3, seed=_seed(name))
    clean = run("clean")
    self.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
    bug = dict(draft_tree._RULE, top_k="without_replacement")
    with patched(((draft_tree, "_RULE", bug),)):
      mutant = run("soft_q")
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())


class ErrorsTest(absltest.TestCase):

  def test_bad_arguments(self):
    target, draft = tabular_pair("mixed", 0)
    with self.assertRaisesRegex(ValueError, r"tree must be an sj.Tree"):
      sj.TreeSpeculative(draft, [(0,), (1,)])
    with self.assertRaisesRegex(ValueError, r"children must be one of \('sampled', 'top_k', "
                                r"'iid'\), got 'topk'"):
      sj.TreeSpeculative(draft, MEDUSA_LIKE, "topk")
    with self.assertRaisesRegex(ValueError, r"draft must be a specjax model"):
      sj.TreeSpeculative(object(), MEDUSA_LIKE)

  def test_tree_deeper_than_the_context(self):
    target, draft = tabular_pair("mixed", 0)
    short = tabular.TabularLM(draft.logits_table, max_position_embeddings=3)
    with self.assertRaisesRegex(ValueError, r"the tree's depth 3 does not fit the draft model's "
                                r"maximum context 3"):
      sj.generate(target, [[1]], sj.TreeSpeculative(short, MEDUSA_LIKE), max_new_tokens=2)

  def test_rank_beyond_the_vocabulary(self):
    target, draft = tabular_pair("mixed", 0)  # V = 4
    with self.assertRaisesRegex(ValueError, r"rank-4 candidate, but the vocabulary has only 4"):
      sj.generate(target, [[1]], sj.TreeSpeculative(draft, sj.Tree.from_paths([(0,), (4,)])),
                  max_new_tokens=2)

  def test_vocabulary_mismatch(self):
    target, _ = tabular_pair("mixed", 0)
    other = random_transformer(TF_CONFIG, 0)
    with self.assertRaisesRegex(ValueError, r"draft vocabulary size 16 differs from the "
                                r"target's 4"):
      sj.generate(target, [[1]], sj.TreeSpeculative(other, MEDUSA_LIKE), max_new_tokens=2)


if __name__ == "__main__":
  absltest.main()
