"""Losslessness of the whole loop, through the law harness (``tests/lawcheck.py``).

1. Tabular models (V = 4, the exact law from the table): the first ``n >= gamma + 3`` tokens (the
   prefill's token, every draft position and the bonus of the first iteration, and the second
   iteration even after a fully accepted first one) through ``sj.generate`` for ``Speculative``
   with gamma 1/2/3/4, temperatures 0.7/1/1.5, top-k, top-p, the edge tables (q == p, q = 0 where
   p > 0, disjoint supports), ragged prompts, and ``Autoregressive``.
2. Small random transformers (V = 6, the exact law from the Hugging Face torch model with
   transformers' warpers): the same statistic, one prompt and ragged prompts, top-k/top-p.
3. Mutation controls: each patches the real code with a known bug; the same harness rejects it at
   p < 1e-12 while the clean code passes at p > 1e-3 in the same run.
4. Rollback coverage: a partially right draft (acceptance asserted in 0.3-0.8) makes every number
   of accepted drafts 0..gamma occur (asserted from the stats' histogram); greedy tokens equal
   ``Autoregressive``'s, and the sampled law holds with that same draft.
"""

from __future__ import annotations

import contextlib
import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax import sampling as sampling_lib
from specjax import verify
from specjax.decoding import loop
from specjax.proposers import draft_chain
from specjax.verify import rejection

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, tabular
  from tests.test_speculative import (DRAFT_NOISE, TAB_V, _seed, check_stats, forward_greedy,
                                      noisy_copy, random_transformer, tabular_pair)
except ImportError:  # pragma: no cover
  import lawcheck
  import tabular
  from test_speculative import (DRAFT_NOISE, TAB_V, _seed, check_stats, forward_greedy,
                                noisy_copy, random_transformer, tabular_pair)

try:
  import pytest
  slow = pytest.mark.slow
except ImportError:  # pragma: no cover - plain absltest run
  slow = lambda cls: cls

S = sj.Sampling


@functools.lru_cache(maxsize=None)
def overconfident_pair(seed: int):
  """(target, draft) tabular models; the draft's law is ``0.8 norm(p^2) + 0.2 q`` for the mixed
  tables' (p, q): an over-confident draft. It puts more mass than p on the target's favourite
  tokens, so accepted drafts have ratios p/q below 1 (every position's acceptance uniform
  matters), and acceptance is high (~0.75), so whole chains and the bonus token are common."""
  target, other = tabular_pair("mixed", seed)
  p = tabular.warped_table(target, S(1.0))
  q = tabular.warped_table(other, S(1.0))
  sharp = p * p / np.sum(p * p, axis=-1, keepdims=True)
  return target, tabular.TabularLM.from_probs(0.8 * sharp + 0.2 * q)


# ----------------------------------------------------------------------------- 1. tabular

# (name, method gamma (0 = Autoregressive), sampling, tables, prompts, n_tokens)
TABULAR_CASES = (
    ("ar_t1", 0, S(1.0), "mixed", ((2,),), 3),
    ("ar_t07_topk", 0, S(0.7, top_k=2), "mixed", ((1, 3, 0, 2),), 3),
    ("g1_t1_mixed", 1, S(1.0), "mixed", ((2,),), 4),
    ("g1_t1_equal", 1, S(1.0), "equal", ((1, 3, 0, 2),), 4),
    ("g2_t07_topk_mixed", 2, S(0.7, top_k=2), "mixed", ((1, 3, 0, 2),), 5),
    ("g2_t07_topk_q_zero_where_p_positive", 2, S(0.7, top_k=2), "q_subset", ((2,),), 5),
    ("g3_t1_overconfident_ragged", 3, S(1.0), "overconfident", ((1, 3, 0, 2), (3,)), 6),
    ("g4_t15_topp_mixed", 4, S(1.5, top_p=0.8), "mixed", ((0, 2),), 7),
    ("g4_t15_topp_disjoint", 4, S(1.5, top_p=0.8), "disjoint", ((3,),), 7),
    ("g4_t15_topp_equal", 4, S(1.5, top_p=0.8), "equal", ((2, 2),), 7),
    ("g4_t1_overconfident", 4, S(1.0), "overconfident", ((0, 1, 2),), 7),
)


def tabular_models(tables: str, name: str):
  if tables == "overconfident":
    return overconfident_pair(_seed(name))
  return tabular_pair(tables, _seed(tables))


def make_method(gamma: int, draft):
  return sj.Autoregressive() if gamma == 0 else sj.Speculative(draft, gamma)


# Not slow: the law through the real loop on tabular pairs: in the default run (~1 min).
class TabularLawTest(parameterized.TestCase):
  """The harness on tabular models: exact law from the table."""

  @parameterized.named_parameters(*TABULAR_CASES)
  def test_law(self, gamma, sampling, tables, prompts, n_tokens):
    name = self._testMethodName
    target, draft = tabular_models(tables, name)
    result = lawcheck.check_law(target, make_method(gamma, draft), sampling, prompts, n_tokens,
                                seed=_seed(name))
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    if gamma == 0:
      return
    check_stats(self, result.out, gamma)
    s = result.out.stats
    if tables == "equal":  # q == p: every draft is accepted
      self.assertEqual(s.acceptance_rate, 1.0)
    elif tables == "disjoint":  # the draft only proposes tokens the target excludes
      self.assertEqual(int(np.sum(s.accepted)), 0)
    else:
      self.assertBetween(s.acceptance_rate, 0.05 if tables != "q_subset" else 1e-3, 0.95)
      counts = np.asarray(s.accepted_length_counts)
      self.assertTrue(np.all(counts > 0), msg=f"accepted-length counts {counts}")

  def test_too_few_tokens_is_refused(self):
    target, draft = tabular_pair("mixed", 0)
    with self.assertRaisesRegex(ValueError, r"n_tokens 5 < gamma \+ 3 = 6"):
      lawcheck.check_law(target, sj.Speculative(draft, 3), S(1.0), [(1,)], 5, seed=0)
    with self.assertRaisesRegex(ValueError, r"rows_per_prompt 100 < \d+ rows needed"):
      lawcheck.check_law(target, sj.Speculative(draft, 1), S(1.0), [(1,)], 4, seed=0,
                         rows_per_prompt=100)


class HarnessTest(parameterized.TestCase):
  """The harness's own pieces: sample size, tables, the exact transformer law."""

  def test_required_rows_has_the_stated_power(self):
    from scipy import stats
    v, n = 4, 6
    rows = lawcheck.required_rows(v, n)
    self.assertEqual(rows, 24_672)  # the figure quoted in lawcheck's docstring
    m, df = 2 * n - 1, v * v - 1
    crit = stats.chi2.isf(lawcheck.P_FLOOR / m, df)
    power = lambda r: stats.ncx2.sf(crit, df, 4 * r * lawcheck.TV_DETECT ** 2)
    self.assertGreaterEqual(power(rows), lawcheck.POWER)
    self.assertLess(power(rows - 100), lawcheck.POWER)

  def test_table_pvalues_see_a_pair_but_not_a_marginal_error(self):
    # Two tokens, independent uniform marginals; the sample copies token 0 into token 1: every
    # marginal is right, only the pair is wrong, and the pair's table catches it.
    rng = np.random.default_rng(0)
    law = np.full((4, 4), 1 / 16)
    first = rng.integers(0, 4, 20_000)
    pvalues = lawcheck.table_pvalues(np.stack([first, first], 1), law)
    self.assertGreater(min(pvalues[(0,)], pvalues[(1,)]), 1e-3)
    self.assertLess(pvalues[(0, 1)], 1e-12)
    self.assertLess(lawcheck.combined_pvalue(list(pvalues.values())), 1e-12)

  def test_transformer_law_matches_sj_forward(self):
    model = law_transformer()
    law = lawcheck.transformer_law(model, PROMPT_A, 3, S(1.0))
    self.assertAlmostEqual(law.sum(), 1.0, delta=1e-9)
    # Independent paths agree: HF torch + warpers vs specjax's forward + probabilities.
    seq = (2, 5)
    logits = sj.forward(model, np.array([PROMPT_A + seq]))[0, len(PROMPT_A) - 1:]
    probs = np.asarray(sampling_lib.probabilities(logits, S(1.0)), np.float64)
    expected = probs[0, seq[0]] * probs[1, seq[1]] * probs[2]
    np.testing.assert_allclose(law[seq], expected, rtol=1e-5)
    warped = lawcheck.transformer_law(model, PROMPT_A, 2, S(0.8, top_k=3, top_p=0.9))
    self.assertGreater(int(np.sum(warped == 0)), 0)  # the warpers removed tokens


# ----------------------------------------------------------------------------- 2. transformers

LAW_V = 6
LAW_CONFIG = sj.ModelConfig(model_type="llama", vocab_size=LAW_V, hidden_size=32, num_layers=2,
                            num_heads=4, num_kv_heads=2, intermediate_size=64,
                            max_position_embeddings=64)
PROMPT_A, PROMPT_B = (3, 1, 4, 1, 5), (2, 0)


def law_transformer():
  return random_transformer(LAW_CONFIG, 0)  # lm_head scaled by HEAD_SCALE: a peaked law


def noisy_law_draft():
  return noisy_copy(LAW_CONFIG, 1)  # the target with noise on its matrices


ROLLBACK_NOISE = 0.4  # a closer noisy copy: greedy acceptance ~0.64, sampled ~0.45 at gamma 4

# (name, gamma, sampling, prompts, draft noise)
TRANSFORMER_CASES = (
    ("ar_t1", 0, S(1.0), (PROMPT_A,), None),
    ("g2_t08_topk4_ragged", 2, S(0.8, top_k=4), (PROMPT_A, PROMPT_B), DRAFT_NOISE),
    ("g4_t1_topp09_rollback_draft", 4, S(1.0, top_p=0.9), (PROMPT_B,), ROLLBACK_NOISE),
)


@slow
class TransformerLawTest(parameterized.TestCase):
  """The harness on small random transformers: exact law from the HF torch model."""

  def test_models_are_interesting(self):
    target, draft = law_transformer(), noisy_law_draft()
    law = lawcheck.transformer_law(target, PROMPT_A, 2, S(1.0))
    p1 = law.sum(1)
    self.assertBetween(-np.sum(p1 * np.log(p1)), 0.8, 0.95 * np.log(LAW_V))  # peaked, not one-hot
    p2 = law / p1[:, None]  # the second token's law depends on the first
    self.assertGreater(0.5 * np.abs(p2[:, None] - p2[None]).sum(-1).mean(), 0.2)
    q1 = np.asarray(jax.nn.softmax(sj.forward(draft, np.array([PROMPT_A]))[0, -1]))
    self.assertBetween(np.minimum(p1, q1).sum(), 0.3, 0.9)  # partial acceptance

  @parameterized.named_parameters(*TRANSFORMER_CASES)
  def test_law(self, gamma, sampling, prompts, noise):
    target = law_transformer()
    method = make_method(gamma, noise and noisy_copy(LAW_CONFIG, 1, noise))
    result = lawcheck.check_law(target, method, sampling, prompts, n_tokens=gamma + 3,
                                seed=_seed(self._testMethodName),
                                exact_law=lawcheck.transformer_law)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    if gamma:
      check_stats(self, result.out, gamma)
      self.assertBetween(result.out.stats.acceptance_rate, 0.05, 0.95)
      counts = np.asarray(result.out.stats.accepted_length_counts)
      self.assertTrue(np.all(counts > 0), msg=f"accepted-length counts {counts}")
    if noise == ROLLBACK_NOISE:  # the rollback draft's sampled acceptance: see RollbackCoverageTest
      self.assertBetween(result.out.stats.acceptance_rate, 0.3, 0.8)
    if len(prompts) > 1:  # the test has power: each prompt's sample is far from the other's law
      law_b = lawcheck.transformer_law(target, prompts[1], result.tokens[0].shape[1], sampling)
      wrong = lawcheck.table_pvalues(result.tokens[0], law_b)
      self.assertLess(lawcheck.combined_pvalue(list(wrong.values())), lawcheck.MUTANT_CEILING)


# ----------------------------------------------------------------------------- 3. mutations

MUT_GAMMA, MUT_TOKENS, MUT_PROMPT = 3, 6, (1, 3, 0, 2)
SELF_DRAFT_TOKENS, SELF_DRAFT_ROWS = 3 * (MUT_GAMMA + 1) + 1, 2048  # >= 3 whole iterations
MUT_SAMPLING = S(1.0)


def _bonus_from_previous_position(u, p, q, x):
  """Bug: after all gamma drafts are accepted, the bonus is drawn from p[gamma - 1]."""
  core = _REAL_CHAIN_CORE(u, p, q, x)
  g = x.shape[0]
  return core._replace(next_dist=jnp.where(core.num_accepted == g, p[g - 1], core.next_dist))


def _unnormalised_residual(p, q):
  """Bug: the residual ``(p - q)+`` is not divided by its mass."""
  r = jnp.maximum(p - q, 0.0)
  return jnp.where(jnp.sum(r) > rejection.RESIDUAL_MIN_MASS, r, p)


def _inverse_cdf_draw(key, probs):
  """A sampler that takes its input to be a law (inverse CDF): exact for normalised input; the
  mass an unnormalised vector lacks lands on the last token."""
  u = jax.random.uniform(key, probs.shape[:-1] + (1,))
  index = jnp.sum(jnp.cumsum(probs, axis=-1) <= u, axis=-1)
  return jnp.minimum(index, probs.shape[-1] - 1).astype(jnp.int32)


def _p_offset_by_one(key, p, q, x):
  """Bug: draft i is tested against the target law one position later (p[i + 1])."""
  return _REAL_REJECTION_CHAIN(key, jnp.concatenate([p[1:], p[-1:]]), q, x)


def _uniform_reused(key, g, core_fn):
  """Bug: one acceptance uniform for every draft position (u_i = u_0)."""
  key_accept, key_draw = jax.random.split(key)
  core = core_fn(jnp.full((g,), jax.random.uniform(key_accept, (), jnp.float32)))
  return verify.ChainVerdict(num_accepted=core.num_accepted,
                             next_token=sampling_lib.sample_from_probs(key_draw, core.next_dist),
                             accept_prob=core.accept_prob)


def _accept_every_draft(key, p, q, x):
  """Bug: every draft is accepted (no test at all), then a bonus from p[gamma]."""
  del q
  g = x.shape[0]
  return verify.ChainVerdict(num_accepted=jnp.int32(g),
                             next_token=sampling_lib.sample_from_probs(key, p[g]),
                             accept_prob=jnp.ones((g,), jnp.float32))


def _target_commit(offset: int):
  """Bug: the target cache keeps ``n + 1 + offset`` new slots instead of ``n + 1``."""
  def committed_lengths(length, num_accepted, active):
    return jnp.where(active, length + num_accepted + 1 + offset, length)
  return committed_lengths


def _draft_rollback(offset: int):
  """Bug: the draft cache is rolled back to ``offset`` slots past the accepted prefix."""
  def commit(state, drafts, target_length, num_accepted, active):
    state = _REAL_DRAFT_COMMIT(state, drafts, target_length, num_accepted, active)
    return state.replace(cache=state.cache.with_lengths(state.cache.lengths + offset * active))
  return commit


_REAL_CHAIN_CORE = rejection.chain_core
_REAL_REJECTION_CHAIN = verify.rejection_chain
_REAL_DRAFT_COMMIT = draft_chain.commit

# (name, patches as (module, attribute, replacement))
LAW_MUTANTS = (
    ("bonus_from_previous_position", ((rejection, "chain_core", _bonus_from_previous_position),)),
    ("residual_not_renormalised", ((rejection, "residual", _unnormalised_residual),
                                   (rejection, "sample_from_probs", _inverse_cdf_draw))),
    ("p_and_q_offset_by_one", ((verify, "rejection_chain", _p_offset_by_one),)),
    ("acceptance_uniform_reused", ((rejection, "_sample_chain", _uniform_reused),)),
    ("accept_every_draft", ((verify, "rejection_chain", _accept_every_draft),)),
    ("target_commit_n_not_n_plus_1", ((loop, "committed_lengths", _target_commit(-1)),)),
    ("target_commit_n_plus_2", ((loop, "committed_lengths", _target_commit(+1)),)),
)
DRAFT_CACHE_MUTANTS = (
    ("draft_rolled_back_one_too_far", -1),
    ("draft_rolled_back_one_too_short", +1),
)


@contextlib.contextmanager
def patched(patches):
  """The patches applied, with the loop's compiled traces dropped on entry and exit (so that the
  mutant is traced, and no later test reuses it)."""
  loop.decode_jit.clear_cache()
  try:
    with contextlib.ExitStack() as stack:
      for module, name, value in patches:
        stack.enter_context(mock.patch.object(module, name, value))
      yield
  finally:
    loop.decode_jit.clear_cache()


def _mutation_run(seed_name: str) -> lawcheck.LawCheck:
  target, draft = overconfident_pair(_seed("mutations"))
  return lawcheck.check_law(target, sj.Speculative(draft, MUT_GAMMA), MUT_SAMPLING, [MUT_PROMPT],
                            MUT_TOKENS, seed=_seed(seed_name))


def _self_draft_run(seed_name: str) -> sj.GenerateOutput:
  """The draft IS the target; enough tokens for several whole iterations (every draft accepted)."""
  target, _ = overconfident_pair(_seed("mutations"))
  return sj.generate(target, [list(MUT_PROMPT)] * SELF_DRAFT_ROWS,
                     sj.Speculative(target, MUT_GAMMA), sampling=MUT_SAMPLING,
                     max_new_tokens=SELF_DRAFT_TOKENS, key=jax.random.key(_seed(seed_name)))


@functools.lru_cache(maxsize=None)
def _clean() -> lawcheck.LawCheck:
  return _mutation_run("clean")


@slow
class MutationControlTest(parameterized.TestCase):
  """Each known bug, patched into the real code, is rejected by the harness that passes the
  clean code in the same run (same models, prompt, gamma 3, 5 tokens, 24k rows)."""

  def _assert_clean_passes(self, result):
    self.assertGreater(result.pvalue, lawcheck.CLEAN_FLOOR, msg=result.summary())

  @parameterized.named_parameters(*LAW_MUTANTS)
  def test_law_mutant_is_rejected(self, patches):
    self._assert_clean_passes(_clean())
    with patched(patches):
      mutant = _mutation_run(self._testMethodName)
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())

  def test_unnormalised_residual_is_harmless_with_specjax_sampler(self):
    # Why the control above pairs two patches: every specjax draw renormalises its input, so
    # the unnormalised residual alone keeps the law, and the inverse-CDF draw alone is exact.
    for patches in (((rejection, "residual", _unnormalised_residual),),
                    ((rejection, "sample_from_probs", _inverse_cdf_draw),)):
      with patched(patches):
        result = _mutation_run(self._testMethodName)
      self._assert_clean_passes(result)

  @parameterized.named_parameters(*DRAFT_CACHE_MUTANTS)
  def test_draft_cache_mutant_is_rejected_by_self_draft(self, offset):
    # A wrong draft rollback feeds the draft another context: its q changes, which the law
    # survives (any q is lossless: asserted below) but acceptance does not. With draft == target
    # every draft must be accepted; the mutant's rejections give p < 1e-12.
    clean = _self_draft_run("clean")
    self.assertEqual(clean.stats.acceptance_rate, 1.0)
    self.assertEqual(lawcheck.self_draft_pvalue(clean), 1.0)
    self._assert_clean_passes(_clean())
    with patched(((draft_chain, "commit", _draft_rollback(offset)),)):
      mutant = _self_draft_run(self._testMethodName)
      law = _mutation_run(self._testMethodName)
    self.assertLess(lawcheck.self_draft_pvalue(mutant), lawcheck.MUTANT_CEILING)
    self.assertLess(mutant.stats.acceptance_rate, 0.99)
    self.assertGreater(law.pvalue, lawcheck.P_FLOOR, msg=law.summary())  # still lossless


# ----------------------------------------------------------------------------- 4. rollback


@functools.lru_cache(maxsize=None)
def partial_tabular_draft(seed: int = 3, keep: float = 0.6):
  """A tabular draft whose table equals the target's in a random ``keep`` share of contexts and
  is an unrelated table elsewhere: greedy acceptance in between, all accepted lengths occur."""
  target, other = tabular_pair("mixed", 11)
  rng = np.random.default_rng(seed)
  table = np.array(target.logits_table)
  same = rng.random(table.shape[:-1]) < keep
  table[~same] = other.logits_table[~same]
  return target, tabular.TabularLM(table)


def tabular_greedy(target: tabular.TabularLM, prompts, max_new: int) -> np.ndarray:
  probs = tabular.warped_table(target, S(1.0))
  out = np.zeros((len(prompts), max_new), np.int32)
  for i, prompt in enumerate(prompts):
    ctx = tuple(prompt)
    for j in range(max_new):
      out[i, j] = int(np.argmax(probs[tabular.context_key(ctx, target.context, TAB_V)]))
      ctx += (int(out[i, j]),)
  return out


ROLLBACK_GAMMA = 4


@slow
class RollbackCoverageTest(parameterized.TestCase):
  """A partially right draft: every accepted length 0..gamma occurs, greedy == Autoregressive,
  and the sampled law holds with the same draft."""

  def _assert_every_length(self, out, gamma):
    counts = np.asarray(out.stats.accepted_length_counts)
    self.assertEqual(counts.shape, (gamma + 1,))
    self.assertTrue(np.all(counts > 0), msg=f"accepted-length counts {counts}")
    self.assertBetween(out.stats.acceptance_rate, 0.3, 0.8)

  def _assert_greedy_exact(self, target, draft, prompts, expected):
    """Autoregressive and Speculative(draft) both return ``expected``; every length occurs."""
    max_new = expected.shape[1]
    ar = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=max_new)
    np.testing.assert_array_equal(ar.tokens, expected)
    out = sj.generate(target, prompts, sj.Speculative(draft, ROLLBACK_GAMMA),
                      max_new_tokens=max_new)
    np.testing.assert_array_equal(out.tokens, expected)
    self._assert_every_length(out, ROLLBACK_GAMMA)
    check_stats(self, out, ROLLBACK_GAMMA)

  def test_tabular_greedy_and_sampled(self):
    target, draft = partial_tabular_draft()
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, TAB_V, rng.integers(1, 6))) for _ in range(64)]
    self._assert_greedy_exact(target, draft, prompts, tabular_greedy(target, prompts, 24))
    result = lawcheck.check_law(target, sj.Speculative(draft, ROLLBACK_GAMMA), S(1.0),
                                [(1, 2)], ROLLBACK_GAMMA + 3, seed=_seed("tabular_rollback"))
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    self._assert_every_length(result.out, ROLLBACK_GAMMA)

  def test_transformer_greedy(self):
    # The sampled law with this draft: TransformerLawTest.test_law_g4_t1_topp09_rollback_draft.
    target, draft = law_transformer(), noisy_copy(LAW_CONFIG, 1, ROLLBACK_NOISE)
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(0, LAW_V, rng.integers(2, 9))) for _ in range(64)]
    self._assert_greedy_exact(target, draft, prompts, forward_greedy(target, prompts, 20))


if __name__ == "__main__":
  absltest.main()
