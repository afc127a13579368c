"""The runner's method "adaptive" (``sj.Adaptive``, issue 30): one setting per rule on the tiny
random pair, the histogram of choices and the cost tables in results.json, the greedy check, the
report's rows and histogram section, the draft-free and self-draft tables, and its config
errors."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import tempfile

from unittest import mock

from absl.testing import absltest, parameterized
import pytest

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests.test_adaptive_calibration import (AUTOREGRESSIVE, GREEDY_PROMPTS, MENU, SECONDS,
                                               fake_clock, falling_clock, interfered_clock,
                                               methods, table)
except ImportError:  # pragma: no cover
  from test_adaptive_calibration import (AUTOREGRESSIVE, GREEDY_PROMPTS, MENU, SECONDS,
                                         fake_clock, falling_clock,
                                         interfered_clock, methods, table)

REPO = pathlib.Path(__file__).resolve().parents[1]


def _tiny(arg: str):
  spec = importlib.util.spec_from_file_location("cfg_tiny", REPO / "configs" / "tiny.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


class CalibrationNoiseTest(absltest.TestCase):
  """A calibration whose calls tell no positive iteration cost (a clock by hand whose calls are
  the faster the longer: a machine too noisy for the run's lengths) leaves the setting priced by
  the bare table, and says so in its row and the report, instead of ending the run."""

  @pytest.mark.slow  # ~18 s: a runner with a clock by hand
  def test_priced_by_the_bare_table(self):
    from experiments import run
    from specjax.decoding import adaptive_calibration
    with tempfile.TemporaryDirectory() as tmp:
      config = _tiny("methods=adaptive,adaptive_rules=cost,adaptive_choices=0/1,temperature=0,"
                     "repeats=1,n=8,batch=2,num_prompts=2,plots=false,progress=false")
      config.output_dir, config.adaptive_calibration = tmp, 3  # the runner's default
      with mock.patch.object(adaptive_calibration, "time_call", falling_clock):
        run.run_experiment(config)
      saved = json.loads(pathlib.Path(tmp, "results.json").read_text())
      md = pathlib.Path(tmp, "report.md").read_text()
    row, = [e for e in saved["settings"] if e["method"] == "adaptive"]
    self.assertTrue(row["calibration_error"].startswith(
        "calibration timed no positive iteration cost at {0: -"), row["calibration_error"])
    self.assertFalse(row["cost_table"].get("loop"))
    self.assertGreater(sum(row["choice_counts"]), 0)  # and the setting ran
    self.assertIn("priced by the bare table (calibration timed no positive", md)


class CalibrationSpreadTest(absltest.TestCase):
  """experiments/calibration_spread.py: one series of calibration calls cut into groups of
  rounds, each priced as one calibration would (a clock by hand on which each call runs clean in
  one round of six and 10-50% slow in the others)."""

  def test_groups(self):
    import specjax as sj
    from experiments import calibration_spread
    from specjax.decoding import adaptive_calibration
    target, inner = methods()
    menu = sj.Adaptive(inner["speculative"], choices=MENU, costs=table())
    with mock.patch.object(adaptive_calibration, "time_call", interfered_clock(6)):
      calls = adaptive_calibration.timed_calls(menu, target, GREEDY_PROMPTS,
                                               sampling=sj.Sampling(0.0), max_new_tokens=12,
                                               repeats=6)
    self.assertLen(calls, 6 * len(MENU) * 2)
    self.assertEqual(sorted({c.repeat for c in calls}), list(range(6)))
    whole, = calibration_spread.spread(menu, calls, 6)  # every call's clean round: exact
    for k, s in zip(MENU, SECONDS):
      self.assertAlmostEqual(whole[k], s / SECONDS[0], places=6, msg=f"entry {k}")
    singles = calibration_spread.spread(menu, calls, 1)
    self.assertNotEmpty(singles)
    self.assertLessEqual(len(singles), 6)
    self.assertGreater(max(abs(r[k] / whole[k] - 1) for r in singles for k in MENU), 0.01)


class AdaptiveRunTest(absltest.TestCase):
  """One greedy run: autoregressive, a chain at gamma 2 and adaptive (all three rules and the
  runner's "checked", menu 0..2) on the tiny random target and draft, the cost rule's table
  calibrated by its own loop under a clock by hand (``tests.test_adaptive_calibration.
  fake_clock``), once: "checked" is priced by the same calibration."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    from experiments import run
    from specjax.decoding import adaptive_calibration
    cls.tmp = tempfile.TemporaryDirectory()
    config = _tiny("methods=autoregressive/speculative/adaptive,gammas=2,adaptive_choices=0/1/2,"
                   "adaptive_rules=cost/schedule/confidence/checked,temperature=0,repeats=1,n=8,"
                   "batch=2,num_prompts=2,plots=false,progress=false,"
                   "adaptive_prior=0.95")  # optimistic: the cost rules draft (checked: tallies)
    config.output_dir = cls.tmp.name
    config.adaptive_calibration = 1
    cls.timed = []  # the calibration's calls: one calibration for the two cost-priced rules
    clock = lambda run: cls.timed.append(run) or fake_clock(run)
    with mock.patch.object(adaptive_calibration, "time_call", clock):
      cls.results = run.run_experiment(config)
    cls.saved = json.loads(pathlib.Path(cls.tmp.name, "results.json").read_text())
    cls.md = pathlib.Path(cls.tmp.name, "report.md").read_text()

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def rows(self, results=None):
    return [e for e in (results or self.results)["settings"] if e["method"] == "adaptive"]

  def test_rows_carry_the_histogram_and_the_table(self):
    from specjax import costs
    saved = self.rows(self.saved)
    self.assertEqual([e["rule"] for e in saved], ["cost", "schedule", "confidence", "checked"])
    self.assertEqual([e["choices"] for e in saved], [[0, 1, 2], [0, 1, 2], [1, 2], [0, 1, 2]])
    table = self.saved["cost"]["table"]  # the chain pair's measurement, every width the menu needs
    self.assertEqual(sorted(table["iteration"]), ["1", "2"])
    self.assertTrue({"1", "2", "3"} <= set(table["verify"]))
    # the cost rule's: the run's table priced by its loop (SECONDS a held entry's iteration)
    unit = table["target_step_ms"] / 1e3
    # and the bare autoregressive loop's (AUTOREGRESSIVE: what its skipped calls pay)
    self.assertEqual(saved[0]["cost_table"], dict(table, loop={
        str(k): saved[0]["cost_table"]["loop"][str(k)] for k in (0, 1, 2)},
        autoregressive=saved[0]["cost_table"]["autoregressive"]))
    for k, s in zip((0, 1, 2), SECONDS):
      self.assertAlmostEqual(saved[0]["cost_table"]["loop"][str(k)], s / unit, places=6)
    self.assertAlmostEqual(saved[0]["cost_table"]["autoregressive"], AUTOREGRESSIVE / unit,
                           places=6)
    self.assertGreater(saved[0]["calibration_s"], 0)
    for e in saved:
      self.assertEqual(e["gamma"], 2)  # the largest choice
      self.assertEqual(e["base"], "speculative")
      self.assertLen(e["choice_counts"], len(e["choices"]))
      self.assertEqual(sum(e["choice_counts"]), e["iterations"])
      if e["rule"] in ("schedule", "confidence"):
        self.assertEqual(e["cost_table"], table)
        self.assertNotIn("calibration_s", e)
      self.assertEqual(e["greedy_match"], 1.0)
      model = costs.CostTable.from_dict(e["cost_table"])
      cost = sum(n * model.entry_cost(k) for k, n in zip(e["choices"], e["choice_counts"]))
      self.assertAlmostEqual(e["modelled_speedup"],
                             e["new_tokens_per_row"] / (cost / e["calls"]), places=6)
      self.assertAlmostEqual(e["speedup"], e["measured_over_modelled"] * e["modelled_speedup"],
                             places=6)
    for e in self.saved["settings"]:
      if e["method"] != "adaptive":
        self.assertNotIn("choice_counts", e)  # fixed methods: an empty histogram, not shown
    # the cost rule's timed calls started from its warm-up's estimates (adaptive_warm)
    prior = saved[0]["prior"]
    self.assertLen(prior, 2)
    self.assertTrue(all(0.0 <= p <= 1.0 for p in prior), msg=str(prior))
    self.assertNotIn("prior", saved[1])  # the schedule and the confidence rule need none
    self.assertNotIn("prior_tally", saved[0])

  def test_checked_rule(self):
    """Rule "checked" (``sj.Adaptive(rule="cost", correct=True)``): priced by the cost rule's
    calibration (timed once), warmed with its estimates and the check's tally, greedy = AR."""
    cost, checked = (e for e in self.rows(self.saved) if e["rule"] in ("cost", "checked"))
    # one calibration: 3 entries and the bare autoregressive loop at 2 lengths, 1 round ...
    self.assertLen(self.timed, 4 * 2)
    self.assertEqual(checked["cost_table"], cost["cost_table"])  # ... priced both
    self.assertEqual(checked["calibration_from"], "adaptive cost g=2 T=0")
    self.assertEqual(checked["calibration_s"], 0.0)
    self.assertEqual(checked["greedy_match"], 1.0)
    made, modelled = checked["prior_tally"]  # the warm-up's tally: the check ran
    self.assertLen(made, 3)
    self.assertGreater(sum(modelled), 0.0)
    self.assertLen(checked["prior"], 2)
    self.assertIn("- adaptive checked (speculative 0..2) T=0: ", self.md)
    self.assertRegex(self.md, r"target steps, a skipped call's [0-9.]+, timed by adaptive cost "
                     r"g=2 T=0\); ")

  def test_report(self):
    from experiments import report
    text = report.format_table(self.results)
    for label in ("adaptive cost (speculative 0..2)", "adaptive schedule (speculative 0..2)",
                  "adaptive confidence (speculative 1..2)"):
      self.assertIn(label, text)
      self.assertIn(label, self.md)
    self.assertIn("adaptive choices (share of iterations per draft length):", text)
    self.assertIn("## Adaptive choices", self.md)
    e = self.rows()[0]
    shares = ", ".join(f"{k}: {n / sum(e['choice_counts']):.2f}"
                       for k, n in zip(e["choices"], e["choice_counts"]))
    self.assertIn(f"- adaptive cost (speculative 0..2) T=0: {shares} ({e['iterations']} "
                  f"iterations; prior from the warm-up "
                  f"{' '.join(f'{p:.2f}' for p in e['prior'])} over "
                  f"{' '.join(f'{n:.0f}' for n in e['prior_evidence'])} observations; "
                  f"priced by its loop ("
                  f"{' '.join(f'{k}: {v:.2f}' for k, v in e['cost_table']['loop'].items())} "
                  f"target steps, a skipped call's {e['cost_table']['autoregressive']:.2f}, "
                  f"{e['calibration_s']:.0f} s); the warm-up's call cost "
                  f"{e['probe_cost']:.3f}x a skipped call's", self.md)
    self.assertGreater(e["prior_evidence"][0], 0)  # the warm-up's observations, carried
    self.assertIn("speculative == autoregressive: yes, token for token",
                  report.format_samples(self.results))
    reloaded = report.load_results(str(pathlib.Path(self.tmp.name, "results.json")))
    self.assertIn("adaptive cost (speculative 0..2)", report.format_table(reloaded))


class AdaptiveCostsTest(parameterized.TestCase):
  """Each base's table holds every pass its menu needs, and the entry builds ``sj.Adaptive``
  with it (measured on the tiny random target, no decoding)."""

  @parameterized.parameters(("prompt_lookup", "draft_free"), ("jacobi", "draft_free"),
                            ("self_speculative", "self_speculative"))
  def test_table_per_base(self, base, where):
    import specjax as sj
    from experiments import methods, random_models, run, runconfig
    from experiments.timing import measure_run_costs
    target, _ = random_models.random_pair(seed=0)
    config = _tiny(f"methods=adaptive,adaptive_method={base},adaptive_choices=0/1/3,"
                   f"adaptive_rules=cost/schedule,skip=1,temperature=0,batch=2")
    runconfig.validate(config)
    settings = run.make_settings(config)
    cost = measure_run_costs(config, {"target": target}, settings, [8, 10], 2)
    table = sj.CostTable.from_dict(methods.adaptive_table(cost, base))
    self.assertEqual(table.to_dict(), cost[where]["table"])
    for k in (0, 1, 3):
      self.assertGreater(table.chain_cost(k), 0)  # every choice costed (a missing pass raises)
    self.assertEqual(table.draft_step == 0.0, where == "draft_free")
    for s in settings:
      method = methods.METHODS["adaptive"].build(config, dict(s, cost_table=table.to_dict()),
                                                 {"target": target})
      self.assertIsInstance(method, sj.Adaptive)
      self.assertEqual((method.rule, method.choices, method.gamma), (s["rule"], (0, 1, 3), 3))


  @parameterized.parameters(("speculative",), ("prompt_lookup",))
  def test_sampled_settings_decide_by_a_sampled_table(self, base):
    """At T > 0 the cost rule's table is its base's passes timed again at the run's sampling
    (``timing.sampled_tables``); at T = 0 the run's greedy one; other rules get no extra
    measurement."""
    import specjax as sj
    from experiments import methods, random_models, run, runconfig
    from experiments.timing import measure_run_costs
    target, draft = random_models.random_pair(seed=0)
    config = _tiny(f"methods=adaptive,adaptive_method={base},adaptive_choices=0/1/3,"
                   f"adaptive_rules=cost/schedule,batch=2,top_k=4")
    config.temperatures = (0.0, 0.5)
    runconfig.validate(config)
    settings = run.make_settings(config)
    cost = measure_run_costs(config, {"target": target, "draft": draft}, settings, [8, 10], 2)
    self.assertEqual(sorted(cost["sampled"]), ["0.5"])
    self.assertEqual(sorted(cost["sampled"]["0.5"]), [base])
    hot = sj.CostTable.from_dict(methods.adaptive_table(cost, base, 0.5))
    self.assertEqual(hot.sampling, sj.Sampling(temperature=0.5, top_k=4))
    for k in (0, 1, 3):
      self.assertGreater(hot.chain_cost(k), 0)
    cold = sj.CostTable.from_dict(methods.adaptive_table(cost, base, 0.0))
    self.assertEqual(cold.sampling, sj.Sampling(temperature=0.0))
    self.assertEqual(methods.adaptive_table(cost, base, 1.0), methods.adaptive_table(cost, base))
    config.adaptive_rules = ("schedule",)
    settings = run.make_settings(config)
    cost = measure_run_costs(config, {"target": target, "draft": draft}, settings, [8, 10], 2)
    self.assertNotIn("sampled", cost)

  @pytest.mark.slow  # ~31 s: a runner at T = 0 and 1
  def test_each_temperature_runs_with_its_own_table(self):
    """A run at T = 0 and T = 1: the T = 1 setting decides by the table timed at T = 1 (the
    runner builds its method apart; reusing the T = 0 one made ``generate`` warn that the
    table's sampling is not the run's)."""
    import warnings
    from experiments import run
    config = _tiny("methods=adaptive,adaptive_rules=cost,adaptive_choices=0/1/2,repeats=1,n=4,"
                   "batch=2,num_prompts=2,plots=false,progress=false")
    config.temperatures = (0.0, 1.0)
    with tempfile.TemporaryDirectory() as tmp:
      config.output_dir = tmp
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run.run_experiment(config)
    self.assertEqual([str(w.message) for w in caught if "cost table" in str(w.message)], [])
    tables = {e["temperature"]: e["cost_table"]["sampling"]["temperature"]
              for e in results["settings"] if e["method"] == "adaptive"}
    self.assertEqual(tables, {0.0: 0.0, 1.0: 1.0})


class AdaptiveConfigTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("bad_rule", "adaptive_rules=cost/greedy", "unknown rule 'greedy'"),
      ("rule_twice", "adaptive_rules=cost/cost", "adaptive_rules lists a rule twice"),
      ("confidence_without_a_draft", "adaptive_method=prompt_lookup",
       "adaptive rule 'confidence' stops a draft model by its own probabilities; adaptive_method "
       "'prompt_lookup' has none"),
      ("bad_base", "adaptive_method=lookahead", "adaptive_method must be one of"),
      ("bad_tree_spec", "adaptive_method=tree,adaptive_tree=full:3,adaptive_rules=cost",
       "tree spec 'full:3': expected KIND:AxB with sizes >= 1"),
      ("tree_too_shallow", "adaptive_method=tree,adaptive_tree=full:3x2,adaptive_rules=cost",
       "adaptive_choices [0, 1, 2, 3, 4, 6] go deeper than adaptive_tree 'full:3x2' (3 levels)"),
      ("tree_confidence", "adaptive_method=tree,adaptive_choices=1/2",
       "adaptive_method 'tree' has none"),
      ("decreasing_choices", "adaptive_choices=0/3/2", "increasing without repeats, got [0, 3, 2]"),
      ("negative_choice", "adaptive_choices=-1/2", "integers >= 0 (0: plain decoding), got [-1, 2]"),
      ("no_draft_length", "adaptive_choices=0", "a draft length >= 1, got [0]"),
      ("bad_decay", "adaptive_decay=0", "adaptive_decay must be a number in (0, 1], got 0.0"),
      ("bad_threshold", "adaptive_threshold=1.5", "adaptive_threshold must be a number in [0, 1]"),
      ("bad_drift", "adaptive_drift=last",
       "adaptive_drift must be one of first, prior, got 'last'"))
  def test_error(self, arg, message):
    from experiments import runconfig
    config = _tiny(f"methods=autoregressive/adaptive,{arg}")
    with self.assertRaisesRegex(runconfig.ConfigError, re.escape(message)):
      runconfig.validate(config)

  def test_draft_roles(self):
    from experiments import resolve
    self.assertTrue(resolve.needs_draft(_tiny("methods=adaptive")))
    self.assertFalse(resolve.needs_draft(_tiny("methods=adaptive,adaptive_method=jacobi,"
                                               "adaptive_rules=cost")))


if __name__ == "__main__":
  absltest.main()
