"""``sj.SpecTr`` through the real loop: K-SEQ and the naive multi-draft rule on k i.i.d. chains.

Greedy exactness, the law harness (tabular models, T = 1, top-k, top-p, ragged batch), a mutation
control, the single-position K-SEQ algebra (rho* and the residual, with its edge cases) and
errors. The walk's exact law by enumeration is in ``tests/test_tree_verify.py``.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax.verify import spectr

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck
  from tests.test_laws import overconfident_pair, patched
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed,
                                      greedy_reference, noisy_copy, random_transformer,
                                      tabular_pair)
  from tests.test_tree_speculative import check_tree_stats
except ImportError:  # pragma: no cover
  import lawcheck
  from test_laws import overconfident_pair, patched
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed, greedy_reference,
                                noisy_copy, random_transformer, tabular_pair)
  from test_tree_speculative import check_tree_stats

S = sj.Sampling
_rho_star = jax.jit(spectr.rho_star)
_residual = jax.jit(spectr.k_seq_residual)


def single_position_law(p, q, k):
  """(law of the emitted token, acceptance) of K-SEQ at one position, in float64 from the
  library's rho* and residual: hit * min(q, p / rho) / beta + miss * residual."""
  rho = float(_rho_star(jnp.float32(p), jnp.float32(q), k))
  kept = np.minimum(q, p / rho)
  beta = kept.sum()
  hit = 1.0 - (1.0 - beta) ** k
  res = np.asarray(_residual(jnp.float32(p), jnp.float32(q), rho, k), np.float64)
  accepted = hit * kept / beta if beta > 0 else np.zeros_like(p)
  return accepted + (1.0 - hit) * res, hit, rho


class KSeqAlgebraTest(parameterized.TestCase):

  def test_random_pairs(self):
    rng = np.random.default_rng(0)
    for _ in range(20):
      p, q = rng.dirichlet(np.full(8, 0.4), size=2)
      acceptance = []
      for k in (1, 2, 3, 4, 8):
        law, hit, rho = single_position_law(p, q, k)
        np.testing.assert_allclose(law, p, atol=1e-6)
        self.assertBetween(rho, 1.0, k)
        acceptance.append(hit)
      self.assertAlmostEqual(acceptance[0], np.minimum(p, q).sum(), delta=1e-6)  # k = 1: rho = 1
      self.assertTrue(np.all(np.diff(acceptance) >= -1e-6), acceptance)  # more drafts help

  def test_edge_cases(self):
    p = np.array([0.5, 0.3, 0.2, 0.0])
    for k in (1, 2, 5):
      law, hit, rho = single_position_law(p, p.copy(), k)  # p == q: always accepted, rho 1
      self.assertEqual(rho, 1.0)
      self.assertAlmostEqual(hit, 1.0, delta=1e-6)
      np.testing.assert_allclose(law, p, atol=1e-6)
      q = np.array([0.0, 0.0, 0.0, 1.0])  # disjoint supports: beta = 0, the residual is p
      law, hit, rho = single_position_law(p, q, k)
      self.assertEqual(hit, 0.0)
      np.testing.assert_allclose(spectr.k_seq_residual(jnp.float32(p), jnp.float32(q), rho, k), p,
                                 atol=1e-7)
    # q puts no mass where p does (beta > 0 but q = 0 on part of p's support).
    law, _, _ = single_position_law(p, np.array([0.9, 0.0, 0.0, 0.1]), 3)
    np.testing.assert_allclose(law, p, atol=1e-6)


class ExactAcceptanceTest(parameterized.TestCase):
  """``k_seq_acceptance`` / ``naive_acceptance`` (the closed forms experiments/spectr_exact.py
  uses) against the verifier itself: every k-tuple of drafts enumerated with its probability
  prod q(x_i), and for each, the chance that ``chains_core`` accepts one (1 - prod of its tested
  drafts' rejection chances, read from its acceptance ratios with every uniform at 1, so that it
  tests every draft as it would after rejections)."""

  @parameterized.parameters("k_seq", "naive")
  def test_against_the_verifier(self, selection):
    rng = np.random.default_rng(3)
    v = 4
    closed = {"k_seq": jax.jit(spectr.k_seq_acceptance, static_argnums=2),
              "naive": jax.jit(spectr.naive_acceptance, static_argnums=2)}[selection]
    for k in (1, 2, 3):
      table = sj.Tree.chains(num=k, depth=1).chain_table
      core = jax.jit(lambda p, tokens, q: spectr.chains_core(
          jnp.ones((1, k)), p, tokens, q, table, selection)[3])
      for _ in range(4):
        p, q = rng.dirichlet(np.full(v, 0.6), size=2)
        if rng.random() < 0.3:
          q[rng.integers(v)] = 0.0  # a token the draft never proposes
          q /= q.sum()
        p_rows = jnp.float32(np.tile(p, (k + 1, 1)))
        q_rows = jnp.float32(np.tile(q, (k + 1, 1)))
        exact = 0.0
        for drafts in itertools.product(range(v), repeat=k):
          weight = np.prod(q[list(drafts)])
          if weight == 0:
            continue
          ratios = np.asarray(core(p_rows, jnp.int32(drafts), q_rows), np.float64)[0]
          exact += weight * (1.0 - np.prod(1.0 - ratios))
        self.assertAlmostEqual(float(closed(jnp.float32(p), jnp.float32(q), k)), exact,
                               delta=1e-5, msg=f"k {k} p {p} q {q}")
        bound = float(spectr.acceptance_bound(jnp.float32(p), jnp.float32(q), k))
        self.assertLessEqual(exact, bound + 1e-6)


class GreedyTest(parameterized.TestCase):

  # One selection: at T = 0 both walk the target's argmax (the same code path).
  @parameterized.named_parameters(("k_seq", "k_seq"))
  def test_matches_autoregressive(self, selection):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    method = lambda draft: sj.SpecTr(draft, num_drafts=3, gamma=2, selection=selection)
    for draft in (noisy_copy(TF_CONFIG, 1, 0.4), target):
      out = sj.generate(target, GREEDY_PROMPTS, method(draft), max_new_tokens=GREEDY_NEW)
      np.testing.assert_array_equal(out.tokens, expected)
      check_tree_stats(self, out, method(draft).tree)
    # draft == target: every iteration accepts gamma tokens and the bonus.
    self.assertEqual(int(out.stats.target_calls), 1 + -(-(GREEDY_NEW - 1) // 3))


class LawTest(parameterized.TestCase):
  """The law harness through ``sj.generate`` (batch > 1: rows_per_prompt rows per prompt)."""

  @parameterized.named_parameters(
      ("k_seq_t1_overconfident_ragged", "k_seq", 3, 2, S(1.0), "overconfident",
       ((1, 3, 0, 2), (2,))),
      ("k_seq_t07_topk3_mixed", "k_seq", 4, 1, S(0.7, top_k=3), "mixed", ((1, 3, 0, 2),)),
      ("k_seq_t1_topp08_q_subset", "k_seq", 2, 3, S(1.0, top_p=0.8), "q_subset", ((2, 1),)),
      ("naive_t1_overconfident", "naive", 3, 2, S(1.0), "overconfident", ((0, 2),)),
  )
  def test_tabular(self, selection, num_drafts, gamma, sampling, tables, prompts):
    name = self._testMethodName
    target, draft = (overconfident_pair(_seed(name)) if tables == "overconfident" else
                     tabular_pair(tables, _seed(tables)))
    method = sj.SpecTr(draft, num_drafts=num_drafts, gamma=gamma, selection=selection)
    result = lawcheck.check_law(target, method, sampling, prompts, gamma + 3, seed=_seed(name))
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    check_tree_stats(self, result.out, method.tree)
    counts = np.asarray(result.out.stats.accepted_length_counts)
    self.assertGreater(int(counts[-1]), 0)  # whole chains and their bonus are reached

  def test_rho_1_is_rejected(self):
    # rho* ignored (every draft tested at min(1, p/q), the residual taken at rho = 1): the
    # harness rejects it through the real loop; the clean run in the same test passes.
    target, draft = overconfident_pair(_seed("rho_1"))
    method = sj.SpecTr(draft, num_drafts=4, gamma=1)
    run = lambda name: lawcheck.check_law(target, method, S(1.0), [(1, 3, 0, 2)], 4,
                                          seed=_seed(name))
    clean = run("clean")
    self.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
    with patched(((spectr, "rho_star", lambda p, q, k: jnp.float32(1.0)),)):
      mutant = run("rho_1")
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())


class ErrorsTest(absltest.TestCase):

  def test_bad_arguments(self):
    _, draft = tabular_pair("mixed", 0)
    with self.assertRaisesRegex(ValueError, r"num_drafts must be an integer >= 1, got 0"):
      sj.SpecTr(draft, num_drafts=0)
    with self.assertRaisesRegex(ValueError, r"gamma must be an integer >= 1, got 0"):
      sj.SpecTr(draft, gamma=0)
    with self.assertRaisesRegex(ValueError, r"selection must be one of \('k_seq', 'naive'\), "
                                r"got 'kseq'"):
      sj.SpecTr(draft, selection="kseq")
    with self.assertRaisesRegex(ValueError, r"draft must be a specjax model"):
      sj.SpecTr(object())

  def test_checked_before_compiling(self):
    target, draft = tabular_pair("mixed", 0)  # V = 4
    with self.assertRaisesRegex(ValueError, r"rank-4 candidate, but the vocabulary has only 4"):
      sj.generate(target, [[1]], sj.SpecTr(draft, num_drafts=5), max_new_tokens=2)
    other = random_transformer(TF_CONFIG, 0)
    with self.assertRaisesRegex(ValueError, r"draft vocabulary size 16 differs"):
      sj.generate(target, [[1]], sj.SpecTr(other), max_new_tokens=2)

  def test_multi_draft_rules_need_chains(self):
    with self.assertRaisesRegex(ValueError, r"node 0 has 2 children; a multi-draft tree is "
                                r"disjoint chains"):
      sj.Tree.full(depth=2, branching=2).chain_table
    with self.assertRaisesRegex(ValueError, r"chains of depths \[1, 2\]"):
      sj.Tree.from_paths([(0,), (1,), (0, 0)]).chain_table


if __name__ == "__main__":
  absltest.main()
