"""``sj.Adaptive.calibrated``: a cost rule's menu priced by its own loop
(``specjax.decoding.adaptive_calibration``).

1. The fit: a fixed part shared by every call and an iteration of entry k at ``b c_k + o_k``
   (``c_k`` the bare table's price; ``o`` one value for plain decoding, one for drafting),
   recovered exactly from calls of two lengths, also where a call is off the model (least
   squares); one length per entry has nothing to tell the fixed part by.
2. Held: a table pricing one entry at 1 and the rest at ``HOLD`` keeps the rule there at every
   iteration (every entry of the menu, plain decoding included), still greedy-exact.
3. Calibrated: with a clock that charges ``F + iterations x s_k`` a call (the loop's own
   iteration counts; ``s_k`` off the bare table's shape), slowed 10-50% in all repeats of a
   call but one (a busy neighbour: the fastest of a call's times is kept), the table's ``loop``
   is each ``s_k`` in target steps; the costs are traced, so the calibrated method runs the loop
   the calibration compiled, and it stays greedy-exact.
4. Errors, one line each; a fit of no positive iteration cost raises ``CalibrationNoise``.
"""

from __future__ import annotations

import collections
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
# The fake clock's iteration by menu index: table()'s bare prices are 1.0, 1.4, 1.8, 2.2 target
# steps of 1 ms; the loop's are off that shape (two drafts 1.41x one draft where the table says
# 1.29x: a fit pooled on the table's shape misprices them); a call's fixed part
SECONDS = (1.15e-3, 1.74e-3, 2.45e-3, 2.62e-3)
FIXED = 0.04
# The bare autoregressive loop's (what a skipped call runs, timed with ``probe_every``): below
# the menu's plain entry by the skipped draft's upkeep, and a fixed part without its prefill
AUTOREGRESSIVE, FIXED_AUTOREGRESSIVE = 1.05e-3, 0.03


def held(stats) -> tuple[int, int]:
  """(the menu index a calibration call held, -1 for the bare autoregressive loop; its
  iterations), from its stats."""
  counts = np.asarray(stats.choice_counts)
  if not counts.size:
    return -1, int(stats.target_calls) - 1
  return int(np.argmax(counts)), int(counts.sum())


def fake_clock(run):
  """``time_call`` with a clock by hand: ``FIXED + iterations x SECONDS[i]`` for the menu entry
  i the call held (from its histogram), the iterations the loop's own; the bare autoregressive
  loop's at ``FIXED_AUTOREGRESSIVE`` and ``AUTOREGRESSIVE``."""
  stats, _ = run_call(run)
  entry, iterations = held(stats)
  if entry < 0:
    return stats, FIXED_AUTOREGRESSIVE + iterations * AUTOREGRESSIVE
  return stats, FIXED + iterations * SECONDS[entry]


def interfered_clock(repeats: int):
  """``fake_clock`` beside a busy neighbour: each call (an entry at a length) slowed by 10-50%
  in every repeat but one of ``repeats`` (which one differs between calls); interference only
  ever slows a call."""
  made = collections.Counter()

  def clock(run):
    stats, seconds = fake_clock(run)
    call = held(stats)
    clean, made[call] = made[call] == sum(call) % repeats, made[call] + 1
    return stats, seconds * (1.0 if clean else 1.1 + 0.1 * ((made[call] + call[0]) % 5))
  return clock


def falling_clock(run):
  """A clock whose calls take the less time the more iterations they ran: the fit finds no
  positive iteration cost (the lengths' difference drowned in a machine's noise)."""
  stats, _ = run_call(run)
  return stats, 1.0 / held(stats)[1]


run_call = adaptive_calibration.time_call


class FitTest(absltest.TestCase):

  def test_recovers_the_fixed_part_and_each_iteration(self):
    fit = adaptive_calibration.fit_loop_seconds
    bare = {0: 1.0, 1: 1.3, 2: 1.5, 4: 2.1}
    model = {k: 0.02 * c + (0.001 if k == 0 else 0.004) for k, c in bare.items()}
    runs = [(k, n // (1 + k), 0.3 + n // (1 + k) * model[k]) for k in bare for n in (64, 32)]
    fixed, seconds = fit(runs, bare)
    self.assertAlmostEqual(fixed, 0.3, places=9)
    self.assertEqual(sorted(seconds), sorted(bare))
    for k, s in model.items():
      self.assertAlmostEqual(seconds[k], s, places=9, msg=f"entry {k}")
    # One call 10% slow, each in turn: the shared parameters spread it over every entry, where
    # an entry's own two calls (with plain decoding's: a menu of two) take it whole; over the
    # cases the pooled fit's mean squared error is less than half the entries' own fits'.
    pooled, alone = [], []
    for call in runs:
      slow = [(k, n, t * (1.1 if (k, n) == call[:2] else 1.0)) for k, n, t in runs]
      fitted = fit(slow, bare)[1]
      for k in (1, 2, 4):
        pooled.append(fitted[k] / model[k] - 1)
        alone.append(fit([r for r in slow if r[0] in (0, k)], bare)[1][k] / model[k] - 1)
    self.assertLess(np.mean(np.square(pooled)), 0.5 * np.mean(np.square(alone)))
    # three entries: each its own iteration time, off the model or not
    free = {0: 0.01, 1: 0.03, 2: 0.025}
    runs = [(k, n, 0.3 + n * s) for k, s in free.items() for n in (64, 30)]
    for k, s in fit(runs, bare)[1].items():
      self.assertAlmostEqual(s, free[k], places=9, msg=f"entry {k}")
    # without the bare table: every entry its own iteration, off the pooled model
    free = {0: 0.01, 1: 0.03, 2: 0.025, 4: 0.06}
    runs = [(k, n // (1 + k), 0.3 + n // (1 + k) * s) for k, s in free.items() for n in (64, 16)]
    fixed, seconds = fit(runs)
    self.assertAlmostEqual(fixed, 0.3, places=9)
    for k, s in seconds.items():
      self.assertAlmostEqual(s, free[k], places=9, msg=f"entry {k}")
    with self.assertRaisesRegex(ValueError, r"^the calls held at 2 drafts all ran the same "
                                r"number of iterations"):
      fit([(0, 64, 1.0), (0, 32, 0.6), (2, 20, 0.9), (2, 20, 0.8)], bare)


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
    with mock.patch.object(adaptive_calibration, "time_call", interfered_clock(3)):
      calibrated = menu.calibrated(target, GREEDY_PROMPTS, sampling=sj.Sampling(0.0),
                                   max_new_tokens=NEW, repeats=3)
    compiled, before = loop.decode_jit._cache_size(), compiled
    self.assertLessEqual(compiled, before + 2)  # one loop a length (not one an entry)
    unit = menu.costs.target_step_ms / 1e3
    self.assertEqual(sorted(calibrated.costs.loop), list(MENU))
    for k, s in zip(MENU, SECONDS):
      self.assertAlmostEqual(calibrated.costs.loop[k], s / unit, places=6, msg=f"entry {k}")
    self.assertEqual(calibrated.costs.verify, menu.costs.verify)  # the rest of the table kept
    self.assertEqual(calibrated.costs.autoregressive, 0.0)  # no skip: its loop not timed
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
    for shorter, message in (((NEW,), r"^a shorter length = 12 must be below max_new_tokens = "
                              r"12$"), ((0,), r"^a shorter length = 0 must be an int >= 1$")):
      with self.assertRaisesRegex(ValueError, message):
        adaptive_calibration.timed_calls(menu, target, GREEDY_PROMPTS, sampling=greedy,
                                         max_new_tokens=NEW, shorter=shorter)
    with mock.patch.object(adaptive_calibration, "time_call", falling_clock):
      with self.assertRaisesRegex(adaptive_calibration.CalibrationNoise,
                                  r"^calibration timed no positive iteration cost at \{0: -"):
        menu.calibrated(target, GREEDY_PROMPTS, sampling=greedy, max_new_tokens=NEW, repeats=1)


if __name__ == "__main__":
  absltest.main()
