"""The proposer protocol (``specjax/proposers/base.py``): a new way of guessing plugs into the one
loop with no change to it.

``RepeatPending`` is a test-only proposer, defined here and nowhere in ``specjax``: it guesses
that the last emitted token repeats ``num`` times (a deterministic guess, so ``q = None``). Through
the unchanged loop it must give the ``Autoregressive`` tokens at temperature 0 and, verified by
the one-hot rule (ALGORITHMS.md §4), the target's law at temperature 1 (the law harness); verifying
the same guesses against a soft q instead must be rejected.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import specjax as sj
from specjax.decoding import loop
from specjax.proposers.base import Candidates

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck
  from tests.test_laws import overconfident_pair, patched
  from tests.test_speculative import tabular_pair
except ImportError:  # pragma: no cover
  import lawcheck
  from test_laws import overconfident_pair, patched
  from test_speculative import tabular_pair

S = sj.Sampling
NUM = 2


@dataclasses.dataclass(frozen=True)
class RepeatPendingProposer:
  num_candidates: int

  @property
  def depth(self) -> int:
    return self.num_candidates

  draft_calls_per_iteration = 0
  prefill_draft_calls = 0

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    return None

  def propose(self, params, state, pending, keys, sampling):
    tokens = jnp.repeat(pending[:, None], self.num_candidates, axis=1)
    return Candidates(tokens=tokens, q=None), state

  def commit(self, params, state, candidates, outcome):
    return state


@dataclasses.dataclass(frozen=True)
class RepeatPending:
  """A method: one proposer, a ``validate`` and a ``proposer(target)``; nothing in the loop changes."""

  num: int
  name = "repeat_pending"

  @property
  def gamma(self) -> int:  # guesses per iteration: the law harness checks gamma + 3 tokens
    return self.num

  def validate(self, target, width, max_new_tokens, what):
    del target, width, max_new_tokens, what

  def proposer(self, target):
    del target
    return RepeatPendingProposer(self.num), None


def _soft_q_for_the_guesses(keys, logits, candidates, sampling):
  """Bug: deterministic guesses verified against a soft (uniform) q instead of one-hot."""
  v = logits.shape[-1]
  soft = jnp.full(candidates.tokens.shape + (v,), 1.0 / v, jnp.float32)
  return _REAL_VERIFY(keys, logits, candidates.replace(q=soft), sampling)


_REAL_VERIFY = loop._verify


class ProposerProtocolTest(absltest.TestCase):

  def test_greedy_equals_autoregressive(self):
    target, _ = tabular_pair("mixed", 0)
    prompts = [[1, 2, 3], [0], [2, 2, 1, 3, 0]]
    ar = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=10)
    out = sj.generate(target, prompts, RepeatPending(NUM), max_new_tokens=10)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    s = out.stats
    self.assertEqual(int(s.draft_calls), 0)
    self.assertEqual(int(np.sum(s.accepted_length_counts)), int(np.sum(s.row_target_calls)) - 3)

  def test_sampled_law_and_soft_q_control(self):
    target, _ = overconfident_pair(5)
    run = lambda name: lawcheck.check_law(target, RepeatPending(NUM), S(1.0), [(1, 1, 2)],
                                          NUM + 3, seed=sum(map(ord, name)))
    clean = run("clean")
    self.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
    self.assertBetween(clean.out.stats.acceptance_rate, 0.05, 0.95)  # the rule really decides
    with patched(((loop, "_verify", _soft_q_for_the_guesses),)):
      mutant = run("soft_q")
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())

  def test_autoregressive_stats(self):
    target, _ = tabular_pair("mixed", 0)
    out = sj.generate(target, [[1, 2], [3]], sj.Autoregressive(), max_new_tokens=5)
    s = out.stats
    self.assertEqual(s.accepted_length_counts.shape, (1,))
    self.assertEqual(int(s.accepted_length_counts[0]), 2 * 4)  # 4 iterations after the prefill
    self.assertEqual(int(s.draft_calls), 0)
    self.assertEqual(s.tokens_per_target_call, 1.0)

  def test_unknown_method(self):
    target, _ = tabular_pair("mixed", 0)
    with self.assertRaisesRegex(ValueError, r"unknown decoding method 'fast'"):
      sj.generate(target, [[1]], "fast", max_new_tokens=2)


if __name__ == "__main__":
  absltest.main()
