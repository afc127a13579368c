"""``sj.Adaptive``'s check of its own model (``adaptive_model.tally`` / ``entry_factors``): each
menu entry's modelled drafts scaled by what its recent iterations accepted over what the
estimates expected of them."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

import specjax as sj
from specjax import metrics
from specjax.decoding import loop
from specjax.proposers import adaptive_model
from specjax.proposers.base import Outcome

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests.test_adaptive import MENU, methods, table
  from tests.test_speculative import TF_CONFIG
except ImportError:  # pragma: no cover
  from test_adaptive import MENU, methods, table
  from test_speculative import TF_CONFIG

KEEP, PRIOR = adaptive_model.TALLY_KEEP, adaptive_model.TALLY_PRIOR


class FactorTest(absltest.TestCase):

  def test_tally_discounts_every_entry_and_adds_to_the_one_run(self):
    sums = jnp.asarray([[0.0, 2.0, 4.0], [0.0, 3.0, 5.0]])  # made; modelled
    active = jnp.asarray([True, False, True])
    got = adaptive_model.tally(sums, 1, jnp.asarray([1.0, 9.0, 2.0]),
                               jnp.asarray([1.5, 9.0, 1.0]), active)
    np.testing.assert_allclose(got[0], [0.0, KEEP * 2.0 + 3.0, KEEP * 4.0], rtol=1e-6)
    np.testing.assert_allclose(got[1], [0.0, KEEP * 3.0 + 2.5, KEEP * 5.0], rtol=1e-6)

  def test_factors_shrink_toward_the_shorter_entry(self):
    """Entry 0 (plain: no drafts) and an entry with no tally take the next shorter entry's
    factor (1 before the first); an entry with a tally its ratio, pulled toward that prior by
    ``TALLY_PRIOR`` modelled drafts."""
    sums = jnp.asarray([[0.0, 0.0, 8.0, 0.0], [0.0, 0.0, 16.0, 0.0]])
    got = np.asarray(adaptive_model.entry_factors(sums))
    two = (8.0 + PRIOR) / (16.0 + PRIOR)
    np.testing.assert_allclose(got, [1.0, 1.0, two, two], rtol=1e-6)
    much = adaptive_model.entry_factors(jnp.asarray([[0.0, 900.0], [0.0, 1000.0]]))
    np.testing.assert_allclose(much, [1.0, (900 + PRIOR) / (1000 + PRIOR)], rtol=1e-6)

  def test_factors_move_the_choice(self):
    """At acceptance 0.8 (a draft step 0.1, passes over 2-4 tokens 1.2-1.4 target steps) three
    drafts model 2.95 / 1.7 = 1.74 tokens a step, two 2.44 / 1.5 = 1.63, one 1.8 / 1.3 = 1.38:
    with factors of 1 the choice is the uncorrected one; with the longest entry's drafts at half
    what the estimates said (1.98 / 1.7 = 1.16) two drafts; with two and three at 0.3, one."""
    target, inner = methods()
    proposer, params = sj.Adaptive(inner["speculative"], choices=MENU,
                                   costs=table((1.0, 1.2, 1.3, 1.4))).proposer(target)
    a, on, left = jnp.full((1, 3), 0.8), jnp.asarray([True]), jnp.asarray([64])
    best = lambda factors: int(proposer.best(params.costs, a, jnp.zeros_like(a), on,
                                             jnp.int32(-1), left, factors))
    self.assertEqual(best(None), 3)
    self.assertEqual(best(jnp.ones(4)), 3)
    self.assertEqual(best(jnp.asarray([1.0, 1.0, 1.0, 0.5])), 2)
    self.assertEqual(best(jnp.asarray([1.0, 1.0, 0.3, 0.3])), 1)


class CommitTest(absltest.TestCase):

  def test_commit_tallies_the_entry_it_ran(self):
    """After 2 drafts at estimates 0.3 (the model: 0.3 + 0.09 drafts a row) of which the rows
    accepted 0 and 1: entry 2's tally holds 1 made against 0.78 modelled; a plain iteration
    then discounts it; ``correct=False`` tallies nothing."""
    target, inner = methods()
    method = sj.Adaptive(inner["speculative"], choices=MENU, costs=table())
    for correct in (True, False):
      proposer, params = dataclasses.replace(method, correct=correct).proposer(target)
      prompt = jnp.asarray([[3, 4, 5], [6, 7, 8]], jnp.int32)
      lengths = jnp.asarray([3, 3], jnp.int32)
      state = proposer.prefill(params, prompt, lengths, 16)
      state = state.replace(acceptance=jnp.full(state.acceptance.shape, 0.3, jnp.float32))
      pending = jnp.asarray([9, 10], jnp.int32)
      keys = jax.random.split(jax.random.key(0), (2, MENU[-1]))
      vocab = TF_CONFIG.vocab_size
      for entry, n in ((proposer.variants[2], (0, 1)), (proposer.variants[0], (0, 0))):
        g = entry.gamma
        candidates, proposed = entry.propose(params, state, pending, keys, sj.Sampling(0.0))
        outcome = Outcome(target_length=lengths, path=jnp.full((2, max(g, 1)), -1, jnp.int32),
                          num_accepted=jnp.asarray(n, jnp.int32), next_token=pending,
                          active=jnp.asarray([True, True]),
                          logits=jnp.zeros((2, 1 + g, vocab), jnp.float32), accept_prob=None,
                          sampling=sj.Sampling(0.0))
        state = entry.commit(params, proposed, candidates, outcome)
        if g:
          want = ([0, 0, 1.0, 0], [0, 0, 0.78, 0]) if correct else ([0] * 4, [0] * 4)
        else:
          want = tuple(np.asarray(w) * KEEP for w in want)
        np.testing.assert_allclose(state.tally[0], want[0], rtol=1e-5, err_msg=f"{correct} {g}")
        np.testing.assert_allclose(state.tally[1], want[1], rtol=1e-5, err_msg=f"{correct} {g}")


class WarmTest(absltest.TestCase):

  @pytest.mark.slow  # ~20 s (a compiled loop); the option is off by default
  def test_warmed_carries_the_tally_in_the_same_compiled_loop(self):
    """``DecodeStats.model_tally`` is where the call's tally ended (its summary too);
    ``warmed`` starts the next call from it (``prior_tally``, traced: no new compilation), and
    a call's prefilled tally is its ``prior_tally``."""
    target, inner = methods()
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]
    cold = sj.Adaptive(inner["speculative"], choices=MENU, costs=table((1.0, 1.1, 1.2, 1.3),
                                                                       0.05), correct=True)
    out = sj.generate(target, prompts, cold, max_new_tokens=24)
    tally = np.asarray(out.stats.model_tally)
    self.assertEqual(tally.shape, (2, len(MENU)))
    self.assertGreater(tally[1].sum(), 0.0, msg=str(tally))  # something was tallied
    self.assertEqual(out.stats.summary()["model_tally"], tally.astype(np.float64).tolist())
    warm = cold.warmed(out.stats)
    np.testing.assert_allclose(warm.prior_tally, tally, rtol=1e-6)
    proposer, params = warm.proposer(target)
    state = proposer.prefill(params, jnp.asarray(prompts[1:]), jnp.asarray([4]), 32)
    np.testing.assert_allclose(state.tally, tally, rtol=1e-6)
    compiled = loop.decode_jit._cache_size()
    again = sj.generate(target, prompts, warm, max_new_tokens=24)
    self.assertEqual(loop.decode_jit._cache_size(), compiled)
    np.testing.assert_array_equal(again.tokens, out.tokens)
    self.assertIsNone(cold.warmed(out.stats.acceptance_estimates).prior_tally)  # a bare array
    shorter = dataclasses.replace(cold, choices=(0, 1, 3))  # nothing tallied: any menu
    self.assertEqual(shorter.proposer(target)[1].tally.shape, (2, 3))
    with self.assertRaisesRegex(ValueError, "prior_tally must be 2 x 3"):  # another menu's
      dataclasses.replace(warm, choices=(0, 1, 3))

  def test_bad_tally(self):
    spec = methods()[1]["speculative"]
    for bad in ([[1.0, 2.0]], [[0.0] * 4, [0.0, 0.0, -1.0, 0.0]], [[0.0] * 4, [float("nan")] * 4],
                "some", [[1.0], [1.0, 2.0]]):
      with self.assertRaisesRegex(ValueError, "prior_tally must be 2 x 4 finite numbers >= 0"):
        sj.Adaptive(spec, choices=MENU, costs=table(), prior_tally=bad)


class TuneTableTest(absltest.TestCase):

  def test_costs_in_reads_a_table_or_a_runners_results(self):
    """``experiments/adaptive_tune.py --costs_in``: a saved table, or a runner's results.json
    (its cost-rule setting's table at T = 0); what is neither fails naming the path."""
    from experiments import adaptive_tune
    hand = table()
    calibrated = dataclasses.replace(hand, loop={0: 1.0, 1: 1.4, 2: 1.8, 3: 2.2})
    settings = [dict(method="speculative", temperature=0.0),
                dict(method="adaptive", rule="cost", temperature=1.0, cost_table=hand.to_dict()),
                dict(method="adaptive", rule="cost", temperature=0.0,
                     cost_table=calibrated.to_dict())]
    with tempfile.TemporaryDirectory() as tmp:
      def write(name, text):
        with open(os.path.join(tmp, name), "w") as f:
          f.write(text)
        return os.path.join(tmp, name)
      saved = os.path.join(tmp, "table.json")
      hand.save(saved)
      self.assertEqual(adaptive_tune.table_from(saved).to_dict(), hand.to_dict())
      path = write("results.json", json.dumps(dict(settings=settings)))
      self.assertEqual(adaptive_tune.table_from(path).to_dict(), calibrated.to_dict())
      self.assertEqual(adaptive_tune.table_from(path, 1.0).to_dict(), hand.to_dict())
      bare = write("bare.json", json.dumps(dict(settings=settings[:1])))
      with self.assertRaisesRegex(ValueError, "bare.json: a results.json without a cost-rule"):
        adaptive_tune.table_from(bare)
      with self.assertRaisesRegex(FileNotFoundError, "missing.json"):
        adaptive_tune.table_from(os.path.join(tmp, "missing.json"))
      with self.assertRaisesRegex(ValueError, "junk.json: not JSON"):
        adaptive_tune.table_from(write("junk.json", "{"))


class MatchRunsTest(absltest.TestCase):

  def test_chain_iterations_and_models_by_hand(self):
    """``experiments/match_runs.py``: over the matches 1 1 0 1 | 0 1, gamma 2 runs iterations
    at 0 (2 drafts and the bonus: 3 tokens), 3 (1, then the miss: 2), 5 (the last: 1 token, the
    text ends), and in the second sequence at 0 (a miss: 1) and 1 (1 token): 8 tokens in 5
    iterations, 4 of whose first drafts matched, 2 starting right after a miss."""
    from experiments import match_runs
    m = [np.asarray([1, 1, 0, 1, 0, 1]), np.asarray([0, 1])]
    got = match_runs.chain_iterations(m, 2)
    np.testing.assert_allclose(got, (8 / 5, 4 / 5, 2 / 5))
    self.assertEqual(match_runs.chain_iterations([np.ones(6, int)], 1), (2.0, 1.0, 0.0))
    self.assertAlmostEqual(metrics.expected_tokens_per_iteration(0.5, 2), 1.75)  # its iid
    self.assertAlmostEqual(match_runs.markov_tokens(0.5, 0.8, 2), 1 + 0.5 + 0.4)
    stay, recover = match_runs.transitions(m)  # pairs: 11 10 01 10 01 | 01
    self.assertAlmostEqual(stay, 1 / 3)
    self.assertAlmostEqual(recover, 1.0)

  def test_shuffled_null(self):
    """The shuffles keep each sequence's matches: all matches or none leave no spread; a long iid
    text's shuffles centre on the iid model; a miss after every four matches, in phase with gamma
    4 (each iteration's bonus token lands on the miss), makes 5 tokens an iteration where the
    shuffles make ~3.4, and out of phase (gamma 3) fewer than they do."""
    from experiments import match_runs
    self.assertEqual(match_runs.shuffled_iterations([np.ones(8, int)], 3, 20), (4.0, 0.0))
    self.assertEqual(match_runs.shuffled_iterations([np.zeros(9, int)], 3, 20), (1.0, 0.0))
    iid = [np.random.default_rng(1).binomial(1, 0.7, 4000)]
    mean, spread = match_runs.shuffled_iterations(iid, 3, 50)
    self.assertAlmostEqual(mean, metrics.expected_tokens_per_iteration(0.7, 3), delta=0.03)
    self.assertLess(spread, 0.03)
    phased = [np.asarray([1, 1, 1, 1, 0] * 20)]
    mean, spread = match_runs.shuffled_iterations(phased, 4, 200)
    self.assertEqual(match_runs.chain_iterations(phased, 4)[0], 5.0)
    self.assertGreater(5.0, mean + 5 * spread)
    real, z = match_runs.shuffle_z(phased, 4, 200)
    self.assertEqual(real, 5.0)
    self.assertAlmostEqual(z, (5.0 - mean) / spread)
    mean, spread = match_runs.shuffled_iterations(phased, 3, 200)
    self.assertLess(match_runs.chain_iterations(phased, 3)[0], mean - 3 * spread)


class GreedyTest(absltest.TestCase):

  @pytest.mark.slow  # ~35 s (two compiled loops); the option is off by default
  def test_both_settings_match_autoregressive_and_the_check_changes_the_run(self):
    """Greedy tokens equal autoregressive decoding's with and without the check, on a menu that
    switches; the check's factors change the choices of the same run (a draft whose longer
    chains accept less than the product model says)."""
    target, inner = methods()
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]
    want = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=40)
    counts = {}
    for correct in (True, False):
      method = sj.Adaptive(inner["speculative"], choices=MENU, costs=table((1.0, 1.1, 1.2, 1.3),
                                                                           0.05), correct=correct)
      out = sj.generate(target, prompts, method, max_new_tokens=40)
      np.testing.assert_array_equal(out.tokens, want.tokens, err_msg=str(correct))
      counts[correct] = np.asarray(out.stats.choice_counts).tolist()
      self.assertGreater(sum(c > 0 for c in counts[correct]), 1, msg=str(counts))
    self.assertNotEqual(counts[True], counts[False])


if __name__ == "__main__":
  absltest.main()
