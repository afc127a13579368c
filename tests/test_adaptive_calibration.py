"""``sj.Adaptive.calibrated``: a cost rule's menu priced by its own loop
(``specjax.decoding.adaptive_calibration``).

1. The fit: a fixed part shared by every call and one iteration time per entry, recovered
   exactly from calls of two lengths; one length per entry has nothing to tell them apart by.
2. Held: a table pricing one entry at 1 and the rest at ``HOLD`` keeps the rule there at every
   iteration (every entry of the menu, plain decoding included), still greedy-exact.
3. Calibrated: with a clock that charges ``F + iterations x s_k`` a call (the loop's own
   iteration counts), the table's ``loop`` is each ``s_k`` in target steps; the costs are traced,
   so the calibrated method runs the loop the calibration compiled, and it stays greedy-exact.
4. Errors, one line each.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
from absl.testing import absltest

import specjax as sj
from specjax.decoding import adaptive_calibration, loop

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests.test_adaptive import MENU, methods, table
  from tests.test_speculative import GREEDY_PROMPTS, TF_CONFIG, greedy_reference
except ImportError:  # pragma: no cover
  from test_adaptive import MENU, methods, table
  from test_speculative import GREEDY_PROMPTS, TF_CONFIG, greedy_reference

NEW = 12
SECONDS = (1e-3, 1.5e-3, 2.25e-3, 2.5e-3)  # the fake clock's iteration, by menu index
FIXED = 0.04  # and its fixed part a call


def fake_clock(run):
  """``time_call`` with a clock by hand: ``FIXED + iterations x SECONDS[i]`` for the menu entry
  i the call held (from its histogram), the iterations the loop's own."""
  stats, _ = run_call(run)
  counts = np.asarray(stats.choice_counts)
  return stats, FIXED + counts.sum() * SECONDS[int(np.argmax(counts))]


run_call = adaptive_calibration.time_call


class FitTest(absltest.TestCase):

  def test_recovers_the_fixed_part_and_each_iteration(self):
    runs = [(k, n, 0.3 + n * s) for k, s in ((0, 0.01), (2, 0.025)) for n in (64, 32, 30)]
    fixed, seconds = adaptive_calibration.fit_iteration_seconds(runs)
    self.assertAlmostEqual(fixed, 0.3, places=9)
    self.assertEqual(sorted(seconds), [0, 2])
    self.assertAlmostEqual(seconds[0], 0.01, places=9)
    self.assertAlmostEqual(seconds[2], 0.025, places=9)
    with self.assertRaisesRegex(ValueError, r"^the calls held at 2 drafts all ran the same "
                                r"number of iterations"):
      adaptive_calibration.fit_iteration_seconds([(0, 64, 1.0), (0, 32, 0.6), (2, 20, 0.9),
                                                  (2, 20, 0.8)])


class CalibratedTest(absltest.TestCase):

  def test_a_held_table_keeps_the_rule_at_its_entry(self):
    target, inner = methods()
    expected = greedy_reference(TF_CONFIG, NEW)
    menu = sj.Adaptive(inner["speculative"], choices=MENU, costs=table())
    for i, k in enumerate(MENU):
      held = adaptive_calibration.held_table(menu.costs, MENU, k)
      out = sj.generate(target, GREEDY_PROMPTS, sj.Adaptive(inner["speculative"], choices=MENU,
                                                           costs=held), max_new_tokens=NEW)
      counts = np.asarray(out.stats.choice_counts)
      self.assertGreater(counts[i], 0, msg=f"held at {k}")
      self.assertEqual(counts.sum(), counts[i], msg=f"held at {k}: {counts.tolist()}")
      np.testing.assert_array_equal(np.asarray(out.tokens), expected)

  def test_each_entry_priced_by_its_loop(self):
    target, inner = methods()
    menu = sj.Adaptive(inner["speculative"], choices=MENU, costs=table(), prior=0.6)
    compiled = loop.decode_jit._cache_size()
    with mock.patch.object(adaptive_calibration, "time_call", fake_clock):
      calibrated = menu.calibrated(target, GREEDY_PROMPTS, sampling=sj.Sampling(0.0),
                                   max_new_tokens=NEW, repeats=2)
    compiled, before = loop.decode_jit._cache_size(), compiled
    self.assertLessEqual(compiled, before + 2)  # one loop a length (not one an entry)
    unit = menu.costs.target_step_ms / 1e3
    self.assertEqual(sorted(calibrated.costs.loop), list(MENU))
    for k, s in zip(MENU, SECONDS):
      self.assertAlmostEqual(calibrated.costs.loop[k], s / unit, places=6, msg=f"entry {k}")
    self.assertEqual(calibrated.costs.verify, menu.costs.verify)  # the rest of the table kept
    self.assertEqual(calibrated.prior, menu.prior)
    out = sj.generate(target, GREEDY_PROMPTS, calibrated, max_new_tokens=NEW)
    self.assertEqual(loop.decode_jit._cache_size(), compiled)  # the costs are traced
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference(TF_CONFIG, NEW))

  def test_errors(self):
    target, inner = methods()
    menu = sj.Adaptive(inner["speculative"], choices=MENU, costs=table())
    greedy = sj.Sampling(0.0)
    for method, kwargs, message in (
        (sj.Adaptive(inner["speculative"], choices=MENU, rule="schedule"), {},
         r"^calibration prices rule 'cost' by its sj.CostTable; got rule 'schedule'"),
        (menu, dict(eos_token_id=2), r"^calibration decodes every row's whole budget"),
        (menu, dict(max_new_tokens=3), r"^max_new_tokens = 3 must be an int >= 4$"),
        (menu, dict(repeats=0), r"^repeats = 0 must be an int >= 1$")):
      with self.assertRaisesRegex(ValueError, message):
        method.calibrated(target, GREEDY_PROMPTS, **{"sampling": greedy, "max_new_tokens": NEW,
                                                     **kwargs})


if __name__ == "__main__":
  absltest.main()
