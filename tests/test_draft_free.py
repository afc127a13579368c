"""The draft-free proposers: ``sj.PromptLookup`` (ALGORITHMS.md §10) and ``sj.Jacobi`` (§8).

1. ``lookup`` (the prompt-lookup search) equals a brute-force Python search (for n from
   max_ngram down, the most recent earlier occurrence, LZ77-style overlapping copy at the text's
   end, no match -> the last token repeated) on random ragged histories and on hand-made corners;
   ``TokenHistory`` (the per-row text) follows ragged acceptance and leaves finished rows alone.
2. Greedy exactness: both methods return the cache-free greedy tokens (= ``sj.Autoregressive``'s,
   tests/test_speculative.py) on a ragged batch with per-row EOS, through a small random
   transformer whose greedy text loops (so prompt lookup is really accepted: asserted).
3. Sampling: the law harness (tests/lawcheck.py) at T = 1 and with top-p for each method on a
   tabular target (ragged batch of ~20k rows per prompt); the same guesses verified against a soft
   q instead of the one-hot rule (§4) are rejected by the same harness.
4. Bad hyper-parameters: one-line ValueErrors before anything compiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax.decoding import loop
from specjax.proposers.base import Outcome
from specjax.proposers.draft_free import TokenHistory
from specjax.proposers.jacobi import next_guesses
from specjax.proposers.prompt_lookup import lookup

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, tabular
  from tests.test_laws import patched
  from tests.test_proposers import _soft_q_for_the_guesses
  from tests.test_speculative import (TF_CONFIG, _seed, forward_greedy, random_transformer, slow,
                                      tabular_pair, truncate_at_eos)
except ImportError:  # pragma: no cover
  import lawcheck
  import tabular
  from test_laws import patched
  from test_proposers import _soft_q_for_the_guesses
  from test_speculative import (TF_CONFIG, _seed, forward_greedy, random_transformer, slow,
                                tabular_pair, truncate_at_eos)

S = sj.Sampling

# ----------------------------------------------------------------------------- 1. the search


def brute_force_lookup(text, max_ngram: int, num_tokens: int) -> tuple[list[int], int]:
  """ALGORITHMS.md §10, literally: n from max_ngram down; occurrences from the most recent."""
  length = len(text)
  for n in range(max_ngram, 0, -1):
    for start in range(length - n - 1, -1, -1):  # something must follow the occurrence
      if text[start:start + n] == text[length - n:]:
        follow = text[start + n:]
        return [follow[j % len(follow)] for j in range(num_tokens)], n
  return [text[-1]] * num_tokens, 0


LOOKUP = jax.jit(lookup, static_argnums=(2, 3))  # as in the loop; one dispatch, not one per op


def run_lookup(rows, max_ngram: int, num_tokens: int, width: int = 24):
  text = np.full((len(rows), width), -1, np.int32)
  for b, row in enumerate(rows):
    text[b, :len(row)] = row
  guesses, ngram = LOOKUP(jnp.asarray(text), jnp.asarray([len(r) for r in rows], jnp.int32),
                          max_ngram, num_tokens)
  return np.asarray(guesses).tolist(), np.asarray(ngram).tolist()


class PiecesTest(parameterized.TestCase):

  @parameterized.parameters((1, 1), (2, 3), (4, 6))
  def test_matches_brute_force(self, max_ngram, num_tokens):
    rng = np.random.default_rng(max_ngram)
    # Small vocabularies (many matches, long n-grams) and a large one (few or none).
    rows = [rng.integers(0, v, rng.integers(1, 41)).tolist() for v in (2, 3, 5, 50) * 16]
    guesses, ngram = run_lookup(rows, max_ngram, num_tokens, width=48)
    for b, row in enumerate(rows):
      expected = brute_force_lookup(row, max_ngram, num_tokens)
      self.assertEqual((guesses[b], ngram[b]), expected, msg=f"text {row}")
    self.assertGreater(ngram.count(0), 0)  # some rows have no match ...
    self.assertGreater(sum(n == max_ngram for n in ngram), 0)  # ... some the longest one

  def test_corners(self):
    rows = [
        [7, 1, 8, 9, 7, 1, 4, 5, 7, 1],  # [7, 1] twice: the most recent (transformers: earliest)
        [3, 4, 5, 0, 9, 5, 3, 4, 5],  # n = 3 beats a more recent n = 1
        [1, 2, 3, 3],  # the occurrence just before the end: period 1
        [1, 2, 1, 2],  # continuation [1, 2] copied over itself
        [4, 0, 1, 2, 3],  # no match: the last token repeated
        [6],  # one token: nothing earlier
    ]
    guesses, ngram = run_lookup(rows, 3, 4)
    self.assertEqual(guesses, [[4, 5, 7, 1], [0, 9, 5, 3], [3, 3, 3, 3], [1, 2, 1, 2],
                               [3, 3, 3, 3], [6, 6, 6, 6]])
    self.assertEqual(ngram, [2, 3, 1, 2, 0, 0])
    self.assertEqual(run_lookup(rows[1:2], 1, 4)[0], [[3, 4, 5, 3]])  # max_ngram 1: latest 5

  def test_token_history_ragged_and_finished_rows(self):
    @jax.jit
    def iteration(prompt, prompt_lengths, pending, candidates, num_accepted, active):
      history = TokenHistory.of_prompt(prompt, prompt_lengths, capacity=8).with_pending(pending)
      outcome = Outcome(target_length=history.lengths, path=jnp.zeros((3, 2), jnp.int32),
                        num_accepted=num_accepted, next_token=jnp.zeros(3, jnp.int32),
                        active=active, logits=jnp.zeros((3, 3, 16)))
      return history.commit(candidates, outcome)

    history = iteration(jnp.array([[5, 6, 7], [8, 0, 0], [9, 9, 0]]), jnp.array([3, 1, 2]),
                        jnp.array([1, 2, 3]), jnp.array([[10, 11], [12, 13], [14, 15]]),
                        jnp.array([2, 0, 1]), jnp.array([True, True, False]))
    np.testing.assert_array_equal(history.lengths, [6, 2, 2])
    text = [row[:n].tolist() for row, n in zip(np.asarray(history.tokens), history.lengths)]
    self.assertEqual(text, [[5, 6, 7, 1, 10, 11], [8, 2], [9, 9]])  # a finished row keeps its text

  def test_jacobi_next_guesses(self):
    # The pass's argmax over [pending, g_1..g_3] is [a, b, c, d]: past n accepted guesses and the
    # emitted token the next guesses start at position n + 1; the last output fills the rest.
    outputs = np.array([[4, 5, 6, 7]] * 4)
    logits = jax.nn.one_hot(outputs, 8)
    guesses = jax.jit(next_guesses)(logits, jnp.array([0, 1, 2, 3]))
    np.testing.assert_array_equal(guesses, [[5, 6, 7], [6, 7, 7], [7, 7, 7], [7, 7, 7]])


# ----------------------------------------------------------------------------- 2. greedy

LOOP_TARGET_SEED = 8  # a random transformer whose greedy text loops with periods 1-6
# Rows 0 and 1 repeat their prompts, and their greedy text goes on copying them (row 1's then
# repeats one token); rows 2-4 do not repeat themselves (their greedy text then loops). Ragged.
GREEDY_PROMPTS = ([4, 5, 12, 14, 9, 12, 14, 9, 12], [15, 9, 2, 3, 6, 0, 15, 9, 2, 3, 6, 0, 15],
                  [2, 7], [3, 1, 4, 5, 9], [6, 0, 11, 13, 5])
GREEDY_EOS = 8  # ends rows 0 and 3, at different points; never reached by rows 1, 2 and 4
GREEDY_NEW = 23
METHODS = (("prompt_lookup", sj.PromptLookup(max_ngram=3, num_tokens=4)),
           ("jacobi", sj.Jacobi(block=3)))


def greedy_run(test: absltest.TestCase, method):
  """``method`` at T = 0 on ``GREEDY_PROMPTS``: asserts the tokens equal the cache-free greedy
  ones (ragged, per-row EOS) and that the stats add up; returns (stats, tokens per target call by
  row, a message naming them). Shared with the other draft-free methods' tests."""
  target = random_transformer(TF_CONFIG, LOOP_TARGET_SEED)
  expected = truncate_at_eos(forward_greedy(target, GREEDY_PROMPTS, GREEDY_NEW), GREEDY_EOS)
  lengths = (expected >= 0).sum(1)
  test.assertTrue(np.all(lengths[[0, 3]] < GREEDY_NEW) and lengths[0] != lengths[3] and
                  np.all(lengths[[1, 2, 4]] == GREEDY_NEW), msg=f"lengths {lengths}")
  out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW,
                    eos_token_id=GREEDY_EOS)
  np.testing.assert_array_equal(out.tokens, expected)
  np.testing.assert_array_equal(out.lengths, lengths)
  s = out.stats
  test.assertEqual(int(s.draft_calls), 0)
  test.assertEqual(int(np.sum(s.accepted_length_counts)),
                   int(np.sum(s.row_target_calls)) - len(GREEDY_PROMPTS))
  per_call = np.asarray(out.lengths) / np.asarray(s.row_target_calls)
  return s, per_call, f"tokens per target call by row {per_call}"


@slow
class GreedyTest(parameterized.TestCase):

  @parameterized.named_parameters(*METHODS)
  def test_greedy_equals_autoregressive(self, method):
    s, per_call, msg = greedy_run(self, method)
    self.assertGreater(s.acceptance_rate, 0.0)
    self.assertGreater(s.tokens_per_target_call, 1.0)
    # Copying and repeating are what these guesses catch: row 1 (its prompt, then one token).
    self.assertGreater(per_call[1], 1.5, msg=msg)
    if method.name == "prompt_lookup":  # ... and every row's loop, with any period
      self.assertTrue(per_call[0] > 2.0 and per_call[1] > 3.0, msg=msg)
      self.assertTrue(np.all(per_call[[1, 2, 4]] > 1.5), msg=msg)
      self.assertGreater(s.tokens_per_target_call, 1.8)


# ----------------------------------------------------------------------------- 3. laws

LAW_PROMPTS = ((1, 3, 0, 2, 1, 3), (2,))  # one repeats itself, one is a single token
# (name, method, sampling)
LAW_CASES = (
    ("prompt_lookup_t1", sj.PromptLookup(max_ngram=2, num_tokens=2), S(1.0)),
    ("prompt_lookup_t15_topp", sj.PromptLookup(max_ngram=3, num_tokens=3), S(1.5, top_p=0.8)),
    ("jacobi_t1", sj.Jacobi(block=2), S(1.0)),
    ("jacobi_t07_topp", sj.Jacobi(block=3), S(0.7, top_p=0.9)),
)


def law_run(method, sampling, name: str) -> lawcheck.LawCheck:
  target, _ = tabular_pair("mixed", _seed("draft_free"))
  return lawcheck.check_law(target, method, sampling, LAW_PROMPTS, method.gamma + 3,
                            seed=_seed(name))


@slow
class LawTest(parameterized.TestCase):

  @parameterized.named_parameters(*LAW_CASES)
  def test_law(self, method, sampling):
    result = law_run(method, sampling, self._testMethodName)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    self.assertBetween(result.out.stats.acceptance_rate, 0.05, 0.95)  # the rule really decides

  def test_soft_q_control(self):
    method, sampling = LAW_CASES[0][1:]
    with patched(((loop, "_verify", _soft_q_for_the_guesses),)):
      mutant = law_run(method, sampling, "soft_q")
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())


# ----------------------------------------------------------------------------- 4. errors


class ErrorsTest(parameterized.TestCase):

  @parameterized.parameters(0, -1, 2.0, True, "3", None)
  def test_bad_counts(self, value):
    with self.assertRaisesRegex(ValueError, r"^max_ngram must be an integer >= 1 \(the longest "
                                r"n-gram looked up\), got"):
      sj.PromptLookup(max_ngram=value)
    with self.assertRaisesRegex(ValueError, r"^num_tokens must be an integer >= 1 .*, got"):
      sj.PromptLookup(num_tokens=value)
    with self.assertRaisesRegex(ValueError, r"^block must be an integer >= 1 .*, got"):
      sj.Jacobi(block=value)

  def test_guesses_beyond_the_context(self):
    table = tabular_pair("mixed", 0)[0].logits_table
    short = tabular.TabularLM(table, max_position_embeddings=8)
    compiled = loop.decode_jit._cache_size()
    for method, field in ((sj.PromptLookup(num_tokens=8), "num_tokens"),
                          (sj.Jacobi(block=9), "block")):
      with self.assertRaisesRegex(ValueError, rf"^{field} {method.gamma}: {method.gamma} guesses "
                                  r"\+ the pending token do not fit the target model's maximum "
                                  r"context 8$"):
        sj.generate(short, [[1, 2]], method, max_new_tokens=2)
    sj.PromptLookup(num_tokens=7).validate(short, 2, 2, "prompt length")  # 7 + 1 fit
    self.assertEqual(loop.decode_jit._cache_size(), compiled)  # refused before compiling


if __name__ == "__main__":
  absltest.main()
