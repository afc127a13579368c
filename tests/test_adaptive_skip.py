"""``sj.Adaptive``'s call-level skip (``probe_every``): a call whose warmed estimates price plain
decoding best runs without the draft (``sj.generate`` runs ``Autoregressive``'s loop and marks
``DecodeStats.draft_skipped``), every ``probe_every``-th such call probes with the rule, and
``warmed`` counts the skips. Lossless by construction (a skipped call is plain decoding, a probe
the rule; the decision reads earlier calls only): greedy tokens equal ``Autoregressive``'s in
every call of a cycle. The decision at a hand-priced break-even, the runner's cycle, and the
errors."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import tempfile
import types
from unittest import mock

import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests.test_adaptive import FLAT, MENU, PROHIBITIVE, methods, table
  from tests.test_adaptive_calibration import AUTOREGRESSIVE, fake_clock
  from tests.test_run_adaptive import _tiny
  from tests.test_speculative import GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, greedy_reference
except ImportError:  # pragma: no cover
  from test_adaptive import FLAT, MENU, PROHIBITIVE, methods, table
  from test_adaptive_calibration import AUTOREGRESSIVE, fake_clock
  from test_run_adaptive import _tiny
  from test_speculative import GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, greedy_reference


class CycleTest(absltest.TestCase):

  def test_skips_where_plain_decoding_is_best_and_probes_every_nth_call(self):
    """Drafts priced out (``PROHIBITIVE``), ``probe_every=3``: the cold call runs the rule (no
    evidence yet), then two calls skip the draft (no draft pass, no menu), the third probes and
    restarts the count; every call's tokens are plain decoding's; the skips keep the
    estimates."""
    target, inner = methods()
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    method = sj.Adaptive(inner["speculative"], choices=MENU, costs=PROHIBITIVE, probe_every=3)
    seen = []
    for _ in range(7):
      out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW)
      np.testing.assert_array_equal(np.asarray(out.tokens), expected)
      skipped = out.stats.draft_skipped
      seen.append((skipped, method.skipped_calls))
      if skipped:
        self.assertEqual(int(out.stats.draft_calls), 0)  # no prefill, no looks
        self.assertEqual(np.asarray(out.stats.choice_counts).shape, (0,))
      else:
        self.assertEqual(int(np.sum(out.stats.choice_counts)), int(out.stats.target_calls) - 1)
      warmed = method.warmed(out.stats)
      if skipped:
        self.assertEqual((warmed.prior, warmed.prior_evidence),
                         (method.prior, method.prior_evidence))
      method = warmed
    self.assertEqual(seen, [(False, 0), (True, 0), (True, 1), (False, 2), (True, 0), (True, 1),
                            (False, 2)])

  def test_no_skip_where_drafting_pays_or_when_off(self):
    target, inner = methods()
    for costs, probe_every, note in ((FLAT, 3, "free drafts"), (PROHIBITIVE, 0, "off")):
      method = sj.Adaptive(inner["speculative"], choices=MENU, costs=costs,
                           probe_every=probe_every)
      out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW)
      warm = method.warmed(out.stats)
      self.assertGreater(warm.prior_evidence[0], 0.0, msg=note)
      self.assertFalse(warm.skips_draft(len(GREEDY_PROMPTS), GREEDY_NEW), msg=note)
      again = sj.generate(target, GREEDY_PROMPTS, warm, max_new_tokens=GREEDY_NEW)
      self.assertFalse(again.stats.draft_skipped, msg=note)

  def test_decision_at_a_break_even_by_hand(self):
    """One row at acceptance 0.3 under ``table()`` (passes over 1-4 tokens 1.0-1.9 target
    steps, a draft step 0.1): plain decoding 1 token a step, one draft 1.3 / 1.4 = 0.929, two
    1.39 / 1.8, three 1.417 / 2.2: plain ahead by the factor 1.077, so a margin of 0.07
    skips and 0.08 does not; no evidence behind the estimates: no skip; nor in the call that
    probes (``skipped_calls`` = ``probe_every`` - 1)."""
    _, inner = methods()
    menu = lambda **kw: sj.Adaptive(inner["speculative"], choices=MENU, costs=table(),
                                    probe_every=4, **{"prior": 0.3, "prior_evidence": 10.0,
                                                      **kw})
    self.assertTrue(menu(margin=0.07).skips_draft(1, 65))
    self.assertFalse(menu(margin=0.08).skips_draft(1, 65))
    self.assertFalse(menu(prior_evidence=0.0).skips_draft(1, 65))
    self.assertFalse(menu(skipped_calls=3).skips_draft(1, 65))  # the probe
    self.assertTrue(menu(skipped_calls=2).skips_draft(1, 65))
    self.assertFalse(menu(prior=0.9).skips_draft(1, 65))  # drafting pays: 3.44 / 2.2 = 1.56

  def test_the_estimates_price_plain_decoding_by_the_menu(self):
    """The decision from the estimates prices plain decoding at the menu's own plain entry,
    not at the bare loop's separate fit (``autoregressive``, here 0.5): the same break-even as
    above, a margin of 0.07 skips and 0.08 does not."""
    _, inner = methods()
    bare = dataclasses.replace(table(), autoregressive=0.5)
    menu = lambda **kw: sj.Adaptive(inner["speculative"], choices=MENU, costs=bare,
                                    probe_every=4, prior=0.3, prior_evidence=10.0, **kw)
    self.assertTrue(menu(margin=0.07).skips_draft(1, 65))
    self.assertFalse(menu(margin=0.08).skips_draft(1, 65))

  def test_the_last_rule_calls_cost(self):
    """``warmed`` prices the call that ran the rule by the table: 10 plain iterations (1.0) and
    5 of one draft (1.4 = a draft step and a 2-token pass) against the 20 iterations after the
    first token of its longest row at a skipped call's 0.8: ``probe_cost`` 17 / 16 = 1.0625.
    At ``probe_margin`` 0.06 the next call skips although its estimates price drafting ahead
    (acceptance 0.9); not at 0.07 (nor at the default 0.05 beside a cost of 1.04), in the probe,
    or without evidence; a probe that paid (cost below a skipped call's) leaves it to the
    estimates."""
    _, inner = methods()
    bare = dataclasses.replace(table(), autoregressive=0.8)
    method = sj.Adaptive(inner["speculative"], choices=MENU, costs=bare, probe_every=4,
                         probe_margin=0.06)
    stats = types.SimpleNamespace(acceptance_estimates=[0.9] * 3, acceptance_evidence=[8, 2, 0],
                                  model_tally=None, choice_counts=[10, 5, 0, 0],
                                  generated=[21, 18], draft_skipped=False)
    warm = method.warmed(stats)
    self.assertAlmostEqual(warm.probe_cost, 17 / 16, places=12)
    self.assertTrue(warm.skips_draft(2, 21))
    self.assertFalse(dataclasses.replace(warm, probe_cost=0.0).skips_draft(2, 21))  # 0.9 pays
    self.assertFalse(dataclasses.replace(warm, probe_margin=0.07).skips_draft(2, 21))
    default = sj.Adaptive(inner["speculative"], choices=MENU, costs=bare, probe_every=4)
    self.assertEqual(default.probe_margin, 0.05)
    self.assertFalse(dataclasses.replace(warm, probe_cost=1.04, probe_margin=0.05)
                     .skips_draft(2, 21))
    self.assertTrue(default.warmed(stats).skips_draft(2, 21))  # 1.0625 > 1.05
    self.assertFalse(dataclasses.replace(warm, skipped_calls=3).skips_draft(2, 21))
    self.assertFalse(dataclasses.replace(warm, prior_evidence=0.0).skips_draft(2, 21))
    skipped = warm.warmed(types.SimpleNamespace(draft_skipped=True))
    self.assertEqual((skipped.probe_cost, skipped.skipped_calls), (warm.probe_cost, 1))
    one_draft = types.SimpleNamespace(**{**vars(stats), "choice_counts": [0, 10, 0, 0]})
    paid = warm.warmed(one_draft)  # 10 x 1.4 / 16
    self.assertAlmostEqual(paid.probe_cost, 14 / 16, places=12)
    self.assertFalse(paid.skips_draft(2, 21))
    for rule in ("schedule", "confidence"):  # no table to price by
      other = sj.Adaptive(inner["speculative"], choices=MENU, rule=rule)
      self.assertEqual(other.warmed(stats).probe_cost, 0.0)

  def test_a_real_calls_cost_carried(self):
    """A real call's stats: ``probe_cost`` is its histogram priced by the table over its
    longest row's plain iterations at ``skipped_step``; the next call, skipped on it, decodes
    the greedy tokens of plain decoding."""
    target, inner = methods()
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    costs = dataclasses.replace(FLAT, autoregressive=0.5)
    method = sj.Adaptive(inner["speculative"], choices=MENU, costs=costs, probe_every=3)
    out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW)
    counts = np.asarray(out.stats.choice_counts)
    plain = int(np.max(np.asarray(out.stats.generated))) - 1
    warm = method.warmed(out.stats)
    self.assertAlmostEqual(warm.probe_cost, counts.sum() * 1.0 / (plain * 0.5), places=6)
    self.assertGreater(warm.probe_cost, 1.0)
    again = sj.generate(target, GREEDY_PROMPTS, warm, max_new_tokens=GREEDY_NEW)
    self.assertTrue(again.stats.draft_skipped)
    np.testing.assert_array_equal(np.asarray(again.tokens), expected)

  def test_calibration_times_the_held_loops_not_skips(self):
    """``calibrated`` on a method that would skip prices the menu by its loops (each entry
    held there), not by plain decoding's."""
    target, inner = methods()
    method = sj.Adaptive(inner["speculative"], choices=MENU, costs=PROHIBITIVE, probe_every=3,
                         prior=0.0, prior_evidence=50.0)
    self.assertTrue(method.skips_draft(len(GREEDY_PROMPTS), 8))
    calls = []

    def clock(run):  # the calibration's timer, by hand (its fit needs no real clock)
      out = run()
      calls.append(out.stats.draft_skipped)
      return fake_clock(lambda: out)

    from specjax.decoding import adaptive_calibration
    with mock.patch.object(adaptive_calibration, "time_call", clock):
      priced = method.calibrated(target, GREEDY_PROMPTS, sampling=sj.Sampling(0.0),
                                 max_new_tokens=8, repeats=1)
    self.assertTrue(calls)
    self.assertFalse(any(calls))
    self.assertEqual(sorted(priced.costs.loop), list(MENU))
    unit = PROHIBITIVE.target_step_ms / 1e3  # and what its skipped calls run, the bare loop
    self.assertAlmostEqual(priced.costs.autoregressive, AUTOREGRESSIVE / unit, places=6)
    self.assertEqual(priced.probe_every, 3)


class RunnerTest(absltest.TestCase):

  def test_a_skipping_setting_is_timed_as_its_cycle(self):
    """The runner's cost rule with ``adaptive_probe_every=3``, its decision made to skip
    wherever the estimates have evidence: each timed call is a cycle of two plain calls and a
    probe (counted in the row and the report); greedy tokens still plain decoding's."""
    from experiments import run
    from specjax.decoding.adaptive_method import Adaptive

    def skips(self, batch, max_new_tokens):
      return 0 < self.probe_every and self.skipped_calls + 1 < self.probe_every and any(
          self.prior_evidence)

    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(Adaptive, "skips_draft", skips):
      config = _tiny("methods=autoregressive/adaptive,adaptive_choices=0/1/2,"
                     "adaptive_rules=cost/schedule,temperature=0,repeats=2,n=8,batch=2,"
                     "num_prompts=4,plots=false,progress=false")
      config.output_dir, config.adaptive_calibration = tmp, 0
      config.adaptive_probe_every = 3
      run.run_experiment(config)
      saved = json.loads(pathlib.Path(tmp, "results.json").read_text())
      md = pathlib.Path(tmp, "report.md").read_text()
    rows = {e.get("rule") or e["method"]: e for e in saved["settings"]}
    self.assertEqual(rows["cost"]["draft_skips"], [2 * 2 * 2, 3 * 2 * 2])  # repeats x batches
    self.assertNotIn("draft_skips", rows["schedule"])  # a rule without the skip
    self.assertEqual(rows["cost"]["outputs_sha256"], rows["autoregressive"]["outputs_sha256"])
    self.assertIn("draft skipped in 8 of 12 timed calls", md)
    self.assertGreater(sum(rows["cost"]["choice_counts"]), 0)  # the probes' iterations


class ErrorTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("negative", dict(probe_every=-1), "probe_every must be an integer >= 0, got -1"),
      ("fraction", dict(probe_every=2.5), "probe_every must be an integer >= 0, got 2.5"),
      ("bool", dict(probe_every=True), "probe_every must be an integer >= 0, got True"),
      ("one", dict(probe_every=1), "probe_every=1 would probe at every call"),
      ("count", dict(probe_every=3, skipped_calls=-2),
       "skipped_calls must be an integer >= 0 (calls skipped in a row), got -2"),
      ("schedule", dict(probe_every=3, rule="schedule"), "got rule 'schedule'"),
      ("no_plain", dict(probe_every=3, choices=(1, 2)), "choices (1, 2)"),
      ("probe_cost", dict(probe_every=3, probe_cost=-1.0),
       "probe_cost must be a finite number >= 0 (a cost ratio), got -1.0"),
      ("probe_cost_nan", dict(probe_every=3, probe_cost=float("nan")),
       "probe_cost must be a finite number >= 0 (a cost ratio), got nan"),
      ("probe_margin", dict(probe_every=3, probe_margin=1.5),
       "probe_margin must be a number in [0, 1], got 1.5"))
  def test_errors(self, kwargs, message):
    _, inner = methods()
    kwargs = {"choices": MENU, "costs": table(), **kwargs}
    with self.assertRaisesRegex(ValueError, re.escape(message)):
      sj.Adaptive(inner["speculative"], **kwargs)

  def test_draft_free_methods_have_nothing_to_skip(self):
    _, inner = methods()
    with self.assertRaisesRegex(ValueError, "a method with a draft model, got .* PromptLookup"):
      sj.Adaptive(inner["prompt_lookup"], choices=MENU, costs=table(), probe_every=3)
    sj.Adaptive(inner["prompt_lookup"], choices=MENU, costs=table())  # off: fine

  def test_runner_config(self):
    from experiments import runconfig
    for value, message in ((1, "adaptive_probe_every=1 would probe at every call"),
                           (-1, "adaptive_probe_every")):
      config = _tiny("methods=autoregressive/adaptive")
      config.adaptive_probe_every = value
      with self.assertRaisesRegex(runconfig.ConfigError, re.escape(message)):
        runconfig.validate(config)


if __name__ == "__main__":
  absltest.main()
