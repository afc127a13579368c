"""End-to-end tests of ``sj.Speculative`` (draft chain + rejection sampling) through the real loop.

1. Exact law with tabular toy models (``tests/tabular.py``): the joint law of the first
   ``max(3, gamma + 2)`` generated tokens (every draft position, the bonus and the next
   iteration), enumerated from the warped target table, vs a pure-Python oracle that composes
   speculative iterations through the real verifier core (``verify.chain_core``, randomness
   integrated exactly; ``tests/test_verify.Enumerator``), within 1e-6, for gamma 1/2/4,
   temperatures 0.7/1/1.5, top-k, top-p, and the edge cases q == p, disjoint supports,
   q(x) = 0 < p(x). The Monte Carlo law of the real loop (tabular and transformer models, mutation
   controls) is in ``tests/test_laws.py``, through the law harness ``tests/lawcheck.py``.
2. Greedy exactness: Speculative == Autoregressive == cache-free greedy, token for token (ragged
   batches, random draft and draft == target, gamma 1/3/5, EOS, budget, GPT-2 learned positions).
3. Batch invariance and determinism; 4. no recompilation; 5. DecodeStats; 6. errors.

Loop compilations dominate the runtime (each distinct gamma / sampling / batch shape / model
structure compiles the whole loop once), so the cases below share static configurations wherever
they can: cases that differ only in table or weight VALUES reuse one compilation.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from flax import nnx

import specjax as sj
from specjax import sampling as sampling_lib
from specjax import verify
from specjax.decoding import loop
from specjax.models.kv_cache import init_cache

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import tabular
  from tests.test_verify import Enumerator, make_pair, max_law_diff, real_sampled_core
except ImportError:  # pragma: no cover
  import tabular
  from test_verify import Enumerator, make_pair, max_law_diff, real_sampled_core

try:
  import pytest
  slow = pytest.mark.slow
except ImportError:  # pragma: no cover - plain absltest run
  slow = lambda cls: cls

EXACT_TOL = 1e-6
S = sj.Sampling

# ----------------------------------------------------------------------------- tabular models

TAB_V, TAB_CONTEXT = 4, 3  # vocabulary, context length (V + 1 = 5 states per context slot)
MIXED = ("random", "p_topk", "q_subset", "disjoint", "close")


def random_probs(seed: int, kinds) -> tuple[np.ndarray, np.ndarray]:
  """(p, q) probability tables [V + 1] * context + [V]; each context gets a pair of one kind."""
  rng = np.random.default_rng(seed)
  shape = (TAB_V + 1,) * TAB_CONTEXT
  p = np.zeros(shape + (TAB_V,), np.float32)
  q = np.zeros_like(p)
  for idx in np.ndindex(shape):
    p[idx], q[idx] = make_pair(rng, TAB_V, kinds[rng.integers(len(kinds))])
  return p, q


@functools.lru_cache(maxsize=None)
def tabular_pair(tables: str, seed: int):
  """(target, draft) TabularLMs. ``tables``: mixed | q_subset | disjoint | equal (draft IS target)."""
  kinds = {"mixed": MIXED, "equal": MIXED, "q_subset": ("q_subset",),
           "disjoint": ("disjoint",)}[tables]
  p, q = random_probs(seed, kinds)
  target = tabular.TabularLM.from_probs(p)
  return target, (target if tables == "equal" else tabular.TabularLM.from_probs(q))


def law_dict(law: np.ndarray) -> dict:
  return {seq: float(law[seq]) for seq in itertools.product(range(law.shape[0]), repeat=law.ndim)}


# (name, gamma, sampling, tables, prompt). Cases sharing (gamma, sampling) share one compilation.
TABULAR_CASES = (
    ("g1_t1_mixed", 1, S(1.0), "mixed", (2,)),
    ("g1_t1_equal", 1, S(1.0), "equal", (1, 3, 0, 2)),
    ("g2_t07_topk_mixed", 2, S(0.7, top_k=2), "mixed", (1, 3, 0, 2)),
    ("g2_t07_topk_q_zero_where_p_positive", 2, S(0.7, top_k=2), "q_subset", (2,)),
    ("g4_t15_topp_mixed", 4, S(1.5, top_p=0.8), "mixed", (0, 2)),
    ("g4_t15_topp_disjoint", 4, S(1.5, top_p=0.8), "disjoint", (3,)),
    ("g4_t15_topp_equal", 4, S(1.5, top_p=0.8), "equal", (2, 2)),
)
ORACLE_ONLY_CASES = (  # cheap: no loop compilation
    ("g2_t1_topk3_topp09_mixed", 2, S(1.0, top_k=3, top_p=0.9), "mixed", (3, 1)),
    ("g1_t07_disjoint", 1, S(0.7), "disjoint", (0,)),
    ("g4_t1_q_zero_where_p_positive", 4, S(1.0), "q_subset", (1, 2, 3)),
)


def _seed(name: str) -> int:
  return sum(map(ord, name)) * 7919 % 2**31


class TabularModelTest(parameterized.TestCase):
  """The tabular model itself: contexts through the cache, trees, START padding."""

  def test_contexts_through_cache_and_tree_mask(self):
    target, _ = tabular_pair("mixed", 0)
    table = target.logits_table
    start = TAB_V
    cache = init_cache(target.config, 1, 12)
    call = jax.jit(lambda tokens, cache, tree_mask=None: target(tokens, cache, tree_mask))
    logits, cache = call(jnp.array([[1, 2]]), cache)
    np.testing.assert_array_equal(logits[0, 0], table[start, start, 1])
    np.testing.assert_array_equal(logits[0, 1], table[start, 1, 2])
    cache = cache.with_lengths(jnp.array([2]))
    # Tree over new tokens [0, 3, 1]: node 1 and node 2 are both children of node 0.
    tree = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
    logits, cache = call(jnp.array([[0, 3, 1]]), cache, jnp.asarray(tree))
    np.testing.assert_array_equal(logits[0, 0], table[1, 2, 0])
    np.testing.assert_array_equal(logits[0, 1], table[2, 0, 3])
    np.testing.assert_array_equal(logits[0, 2], table[2, 0, 1])
    np.testing.assert_array_equal(cache.k[0][0, 0, :5, 0], [1, 2, 0, 3, 1])  # written at slots

  def test_exact_law_is_a_distribution(self):
    target, _ = tabular_pair("mixed", 0)
    law = tabular.exact_law(target, (2,), 3, S(0.7, top_k=2))
    self.assertAlmostEqual(law.sum(), 1.0, delta=1e-6)
    self.assertGreater((law == 0).sum(), 0)  # top-k removes tokens: the law has zeros


def oracle_tokens(gamma: int) -> int:
  """Tokens whose law the oracle checks: the bonus (position gamma + 1) and the next iteration."""
  return max(3, gamma + 2)


class OracleLawTest(parameterized.TestCase):
  """A pure-Python oracle of the speculative chain (the real verifier core, every random choice
  integrated exactly, iterations composed) over the warped tables: the law of the first
  ``oracle_tokens(gamma)`` tokens equals the warped target's within 1e-6."""

  @parameterized.named_parameters(*TABULAR_CASES, *ORACLE_ONLY_CASES)
  def test_oracle_law(self, gamma, sampling, tables, prompt):
    target, draft = tabular_pair(tables, _seed(tables))
    pair = tabular.TablePair(target, draft, sampling)  # the draft is warped with the same Sampling
    tokens = oracle_tokens(gamma)
    law = Enumerator(pair, gamma, real_sampled_core).law(tokens, tuple(prompt))
    expected = law_dict(tabular.exact_law(target, prompt, tokens, sampling))
    self.assertAlmostEqual(sum(law.values()), 1.0, delta=EXACT_TOL)
    self.assertLess(max_law_diff(law, expected), EXACT_TOL)


def check_stats(test: absltest.TestCase, out, gamma: int):
  """Invariants of DecodeStats that hold for every run."""
  s = out.stats
  calls = np.asarray(s.row_target_calls)
  iters = calls - 1  # the prefill is a target call but not an iteration
  proposed, accepted = np.asarray(s.proposed), np.asarray(s.accepted)
  np.testing.assert_array_equal(proposed, gamma * iters)
  test.assertTrue(np.all((accepted >= 0) & (accepted <= proposed)))
  per_pos = np.asarray(s.accepted_per_position)
  test.assertEqual(per_pos.shape, (gamma,))
  test.assertEqual(int(per_pos.sum()), int(accepted.sum()))
  test.assertTrue(np.all(np.diff(per_pos) <= 0), msg=f"accepted_per_position {per_pos}")
  np.testing.assert_array_equal(s.proposed_per_position, iters.sum())
  # The accepted-length histogram: one count per row-iteration, and it adds up to the accepted.
  counts = np.asarray(s.accepted_length_counts)
  test.assertEqual(counts.shape, (gamma + 1,))
  test.assertEqual(int(counts.sum()), int(iters.sum()))
  test.assertEqual(int(np.dot(counts, np.arange(gamma + 1))), int(accepted.sum()))
  np.testing.assert_array_equal(per_pos, counts[::-1].cumsum()[::-1][1:])  # n >= i + 1
  test.assertEqual(int(s.target_calls), int(calls.max()))
  test.assertEqual(int(s.draft_calls), 1 + gamma * (int(s.target_calls) - 1))
  np.testing.assert_array_equal(s.generated, out.lengths)
  # Each iteration emits n + 1 tokens before budget/EOS truncation.
  test.assertTrue(np.all(np.asarray(out.lengths) <= 1 + iters + accepted))
  # Verified positions: between one and gamma per iteration, and at least the accepted ones + 1.
  count = int(s.alpha_count)
  test.assertBetween(count, int(iters.sum()), int(proposed.sum()))
  test.assertGreaterEqual(count, int(accepted.sum()))
  if count:
    test.assertBetween(s.expected_alpha, 0.0, 1.0)
  test.assertAlmostEqual(s.tokens_per_target_call, out.lengths.sum() / calls.sum(), places=6)


# ----------------------------------------------------------------------------- transformers

TF_V = 16
TF_CONFIG = sj.ModelConfig(model_type="llama", vocab_size=TF_V, hidden_size=32, num_layers=2,
                           num_heads=4, num_kv_heads=2, intermediate_size=64,
                           max_position_embeddings=64)
GPT2_CONFIG = sj.ModelConfig(model_type="gpt2", vocab_size=TF_V, hidden_size=32, num_layers=2,
                             num_heads=4, intermediate_size=64, max_position_embeddings=24)
HEAD_SCALE = 12.0  # std-0.02 heads give near-uniform laws; this gives entropy ~2 nats of 2.77
DRAFT_NOISE = 0.7  # noisy copy of the target: acceptance ~0.5-0.6 at temperature 1


def _map_params(model, fn):
  state = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree_util.tree_map_with_path(
      lambda path, x: fn(jax.tree_util.keystr(path), x), state))
  return model


@functools.lru_cache(maxsize=None)
def random_transformer(config: sj.ModelConfig, seed: int):
  model = sj.init_model(config, jax.random.key(seed))
  return _map_params(model, lambda name, x: x * HEAD_SCALE if "lm_head" in name else x)


@functools.lru_cache(maxsize=None)
def noisy_copy(config: sj.ModelConfig, seed: int, noise: float = DRAFT_NOISE):
  """The target (seed 0) with Gaussian noise of ``noise`` x each matrix's std added."""
  leaves = jax.tree.leaves(nnx.state(random_transformer(config, 0), nnx.Param))
  keys = iter(jax.random.split(jax.random.key(seed), len(leaves)))
  source = iter(leaves)

  def perturb(name, x):
    y = next(source)
    k = next(keys)
    return y + noise * jnp.std(y) * jax.random.normal(k, y.shape) if y.ndim == 2 else y

  return _map_params(sj.init_model(config, jax.random.key(seed)), perturb)


# ----------------------------------------------------------------------------- greedy

GREEDY_PROMPTS = ([3, 1, 4, 1, 5, 9, 2, 6], [2, 7], [1, 8, 2, 8, 1])
GREEDY_NEW = 12  # 11 tokens after the prefill: not a multiple of gamma + 1 for gamma in 1, 3, 5


def forward_greedy(model, prompts, max_new_tokens: int) -> np.ndarray:
  """Greedy tokens from full cache-free ``sj.forward`` passes over one fixed-width array."""
  lengths = [len(p) for p in prompts]
  tokens = np.zeros((len(prompts), max(lengths) + max_new_tokens), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  out = np.zeros((len(prompts), max_new_tokens), np.int32)
  for step in range(max_new_tokens):
    logits = np.asarray(sj.forward(model, tokens))
    for i, n in enumerate(lengths):
      out[i, step] = tokens[i, n + step] = int(np.argmax(logits[i, n + step - 1]))
  return out


def truncate_at_eos(tokens: np.ndarray, eos: int) -> np.ndarray:
  out = np.full_like(tokens, -1)
  for i, row in enumerate(tokens):
    hits = np.flatnonzero(row == eos)
    n = hits[0] + 1 if hits.size else row.size
    out[i, :n] = row[:n]
  return out


@functools.lru_cache(maxsize=None)
def greedy_reference(config: sj.ModelConfig, max_new_tokens: int) -> np.ndarray:
  return forward_greedy(random_transformer(config, 0), GREEDY_PROMPTS, max_new_tokens)


# Not slow: greedy = autoregressive for chains: in the default run (~1 min).
class GreedyExactnessTest(parameterized.TestCase):

  @parameterized.parameters(1, 3, 5)
  def test_matches_autoregressive(self, gamma):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    ar = sj.generate(target, GREEDY_PROMPTS, sj.Autoregressive(), max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(ar.tokens, expected)  # the reference itself is right
    # (a) an unrelated random draft (same structure: shares the compilation with (b)).
    out = sj.generate(target, GREEDY_PROMPTS, sj.Speculative(random_transformer(TF_CONFIG, 7),
                                                             gamma), max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(out.tokens, expected)
    np.testing.assert_array_equal(out.lengths, GREEDY_NEW)
    self.assertLess(out.stats.acceptance_rate, 0.5)
    check_stats(self, out, gamma)
    # (b) draft == target: everything is accepted, gamma + 1 tokens per target call; the tokens
    # accepted past the budget are discarded.
    out = sj.generate(target, GREEDY_PROMPTS, sj.Speculative(target, gamma),
                      max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(out.tokens, expected)
    np.testing.assert_array_equal(out.lengths, GREEDY_NEW)
    np.testing.assert_array_equal(out.stats.accepted, out.stats.proposed)
    self.assertEqual(out.stats.acceptance_rate, 1.0)
    self.assertEqual(out.stats.expected_alpha, 1.0)
    self.assertEqual(int(out.stats.target_calls), 1 + math.ceil((GREEDY_NEW - 1) / (gamma + 1)))
    check_stats(self, out, gamma)

  def test_eos(self):
    target, gamma = random_transformer(TF_CONFIG, 0), 3
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    # An EOS id that some rows emit (not first) and some never do.
    def ends_some_rows(t):
      has = np.any(expected == t, axis=1)
      return 0 < has.sum() < len(expected) and np.all(np.argmax(expected[has] == t, axis=1) >= 1)
    eos = next(t for t in range(TF_V) if ends_some_rows(t))
    # What Autoregressive(eos_token_id=eos) returns (tests/test_generate.py checks that; not run
    # here to save a loop compilation): the greedy tokens cut after the first EOS.
    expected = truncate_at_eos(expected, eos)
    for draft in (random_transformer(TF_CONFIG, 7), target):
      out = sj.generate(target, GREEDY_PROMPTS, sj.Speculative(draft, gamma),
                        max_new_tokens=GREEDY_NEW, eos_token_id=eos)
      np.testing.assert_array_equal(out.tokens, expected)  # nothing after EOS
      np.testing.assert_array_equal(out.lengths, (expected >= 0).sum(1))
      self.assertLess(int(out.lengths.min()), GREEDY_NEW)
      check_stats(self, out, gamma)

  def test_gpt2_learned_positions(self):
    # Longest prompt 8 + 16 new tokens = the 24 learned positions exactly: the scratch tokens of
    # the last iterations sit at positions past the table (never emitted).
    target, gamma, max_new = random_transformer(GPT2_CONFIG, 0), 5, 16
    expected = greedy_reference(GPT2_CONFIG, max_new)
    for draft in (random_transformer(GPT2_CONFIG, 7), target):
      out = sj.generate(target, GREEDY_PROMPTS, sj.Speculative(draft, gamma),
                        max_new_tokens=max_new)
      np.testing.assert_array_equal(out.tokens, expected)
      check_stats(self, out, gamma)
    self.assertEqual(out.stats.acceptance_rate, 1.0)


# ----------------------------------------------------------------------------- batch, compile, stats

SMALL_GAMMA, SMALL_NEW = 3, 12
SMALL_PROMPTS = ([3, 1, 4, 1, 5], [2, 7], [9, 9, 8, 1, 0, 4, 4, 2, 3], [6])


def small_run(prompts, seed, draft=None, sampling=S(1.0)):
  target = random_transformer(TF_CONFIG, 0)
  draft = noisy_copy(TF_CONFIG, 1) if draft is None else draft
  return sj.generate(target, prompts, sj.Speculative(draft, SMALL_GAMMA), sampling=sampling,
                     max_new_tokens=SMALL_NEW, key=jax.random.key(seed))


@slow
class BatchCompileStatsTest(parameterized.TestCase):

  def test_same_key_same_tokens_and_batch_mates_do_not_matter(self):
    a = np.asarray(small_run(SMALL_PROMPTS, 1).tokens)
    np.testing.assert_array_equal(small_run(SMALL_PROMPTS, 1).tokens, a)  # deterministic
    b = np.asarray(small_run(SMALL_PROMPTS, 2).tokens)
    self.assertFalse(np.array_equal(a, b))  # the key matters
    mates = [SMALL_PROMPTS[0], [5] * 16, [1, 1], [0, 4, 2]]  # same batch size and padded width
    c = np.asarray(small_run(mates, 1).tokens)
    np.testing.assert_array_equal(c[0], a[0])
    # Row b draws with fold_in(key, b): the same prompt in every row gives different rows, and a
    # prompt's tokens are those of its row index, whatever the batch mates.
    same = np.asarray(small_run([SMALL_PROMPTS[1]] * 4, 1).tokens)
    np.testing.assert_array_equal(same[1], a[1])
    self.assertFalse(np.array_equal(same[0], same[1]))
    self.assertFalse(np.array_equal(same[2], same[3]))

  def test_row_keys_do_not_depend_on_batch_size(self):
    a = np.asarray(small_run(SMALL_PROMPTS, 1).tokens)
    two = np.asarray(small_run(SMALL_PROMPTS[:2], 1).tokens)  # another batch size: compiles
    np.testing.assert_array_equal(two, a[:2])

  def test_no_recompilation(self):
    small_run(SMALL_PROMPTS, 1).tokens.block_until_ready()
    compiled = loop.decode_jit._cache_size()
    small_run([[1, 2, 3], [4] * 16, [5], [0, 0]], 5).tokens.block_until_ready()  # new key, prompts
    small_run(SMALL_PROMPTS, 6, draft=noisy_copy(TF_CONFIG, 2)).tokens.block_until_ready()
    small_run(SMALL_PROMPTS, 7, draft=random_transformer(TF_CONFIG, 0)).tokens.block_until_ready()
    self.assertEqual(loop.decode_jit._cache_size(), compiled)

  def test_stats(self):
    out = small_run(SMALL_PROMPTS, 3)
    check_stats(self, out, SMALL_GAMMA)
    np.testing.assert_array_equal(out.lengths, SMALL_NEW)
    self.assertBetween(out.stats.acceptance_rate, 0.1, 0.9)
    self.assertGreater(int(out.stats.target_calls), 1 + math.ceil((SMALL_NEW - 1) / 4))
    # draft == target at temperature 1: q == p up to float round-off, so everything is accepted.
    target = random_transformer(TF_CONFIG, 0)
    out = small_run(SMALL_PROMPTS, 3, draft=target)
    check_stats(self, out, SMALL_GAMMA)
    self.assertEqual(out.stats.acceptance_rate, 1.0)
    self.assertAlmostEqual(out.stats.expected_alpha, 1.0, delta=1e-5)
    np.testing.assert_array_equal(out.stats.accepted_per_position, out.stats.proposed_per_position)
    summary = out.stats.summary()
    self.assertEqual(summary["accepted"], summary["proposed"])
    np.testing.assert_allclose(summary["acceptance_by_position"], 1.0)


# ----------------------------------------------------------------------------- errors


class ErrorsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.target, self.draft = tabular_pair("mixed", 0)

  def test_vocabulary_mismatch(self):
    p = np.full((TAB_V + 2,) * 1 + (TAB_V + 1,), 1.0 / (TAB_V + 1))
    other = tabular.TabularLM.from_probs(p)
    with self.assertRaisesRegex(ValueError, r"draft vocabulary size 5 differs from the "
                                r"target's 4.*different tokenizers are not supported yet"):
      sj.generate(self.target, [[1, 2]], sj.Speculative(other, 2), max_new_tokens=3)

  @parameterized.parameters(0, -1, 2.0, True, "3", None)
  def test_bad_gamma(self, gamma):
    with self.assertRaisesRegex(ValueError, r"gamma must be an integer >= 1, got"):
      sj.Speculative(self.draft, gamma)

  def test_draft_not_a_model(self):
    with self.assertRaisesRegex(ValueError, r"draft must be a specjax model"):
      sj.Speculative(object(), 2)

  def test_draft_context_too_short(self):
    short = tabular.TabularLM(self.draft.logits_table, max_position_embeddings=8)
    with self.assertRaisesRegex(ValueError, r"prompt length 5 \+ max_new_tokens 4 = 9 exceeds "
                                r"the draft model's maximum context 8"):
      sj.generate(self.target, [[1, 2, 3, 0, 1], [2]], sj.Speculative(short, 2), max_new_tokens=4,
                  sampling=S(1.0), key=jax.random.key(0))

  def test_key_missing_when_sampling(self):
    with self.assertRaisesRegex(ValueError, r"temperature 1\.0 needs a PRNG key"):
      sj.generate(self.target, [[1, 2]], sj.Speculative(self.draft, 2), sampling=S(1.0),
                  max_new_tokens=3)


if __name__ == "__main__":
  absltest.main()
