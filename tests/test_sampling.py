"""Tests for specjax.sampling: HF parity, greedy ties, and sampling laws."""

from __future__ import annotations

import functools
from unittest import mock

from absl.testing import absltest, parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specjax import sampling as S

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
    from tests import stats_util
except ImportError:
    import stats_util

P_FLOOR = 1e-6
N_DRAWS = 50_000


def _tied_logits(seed: int, batch: int, vocab: int) -> np.ndarray:
    """float32[B, V] random logits with many exact ties and some -inf entries."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=(batch, vocab)) * 4) / 2  # steps of 0.5: ties
    x[rng.random((batch, vocab)) < 0.2] = -np.inf
    x[:, 0] = np.where(np.isinf(x).all(-1), 0.0, x[:, 0])  # >= 1 finite per row
    x[0] = 0.0  # all tied: every top-p cut straddles a tie
    x[1, :] = -np.inf  # a single finite token
    x[1, 3] = 1.0
    x[2, 2] = x[2, 5] = np.max(x[2][np.isfinite(x[2])]) + 1.0  # tie at the max
    return x.astype(np.float32)


def _hf_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float):
    """Softmax of HF's temperature -> top-k -> top-p warpers (torch reference)."""
    scores = torch.from_numpy(logits.copy())
    ids = torch.zeros((logits.shape[0], 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    scores = TopPLogitsWarper(top_p)(ids, scores)  # top_p=1 is a no-op on the law
    return torch.softmax(scores, dim=-1).numpy()


_stable_torch_sort = functools.partial(torch.sort, stable=True)

_GRID = dict(
    temperature=[0.5, 1.0, 2.0],
    top_k=[0, 1, 3, 1000],  # 1000 > V
    top_p=[1e-8, 0.3, 0.9, 1.0],  # 1e-8: float32(1 - top_p) == 1
)


class HFParityTest(parameterized.TestCase):

    @parameterized.product(**_GRID)
    def test_matches_hf_small_vocab(self, temperature, top_k, top_p):
        # V <= 16: torch's CPU sort is stable here, so HF is deterministic on
        # ties and must match elementwise.
        logits = _tied_logits(0, batch=24, vocab=16)
        s = S.Sampling(temperature, top_k, top_p)
        ours = np.asarray(S.probabilities(jnp.asarray(logits), s))
        ref = _hf_probs(logits, temperature, top_k, top_p)
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
        self.assertTrue(np.all(ours[np.isneginf(logits)] == 0))

    @parameterized.product(**_GRID)
    def test_matches_hf_large_vocab(self, temperature, top_k, top_p):
        logits = _tied_logits(1, batch=8, vocab=100)
        s = S.Sampling(temperature, top_k, top_p)
        ours = np.asarray(S.probabilities(jnp.asarray(logits), s))
        # Exact against HF with a deterministic (stable) sort.
        with mock.patch.object(torch, "sort", _stable_torch_sort):
            ref_stable = _hf_probs(logits, temperature, top_k, top_p)
        np.testing.assert_allclose(ours, ref_stable, rtol=1e-6, atol=1e-6)
        # Against stock HF (unstable sort): identical up to *which* members of
        # a tie straddling the top-p cut survive. Probability is a function of
        # the logit, so the sorted rows agree, and untied tokens agree exactly.
        ref = _hf_probs(logits, temperature, top_k, top_p)
        np.testing.assert_allclose(
            np.sort(ours, -1), np.sort(ref, -1), rtol=1e-6, atol=1e-6)
        untied = np.array([[np.sum(row == v) == 1 for v in row] for row in logits])
        np.testing.assert_allclose(ours[untied], ref[untied], rtol=1e-6, atol=1e-6)

    def test_top_p_tie_order(self):
        # Four tied tokens, top_p=0.5: cumsum .25 .5 .75 1 -> the first two in
        # ascending (stable) order, i.e. the lowest ids, are removed.
        s = S.Sampling(top_p=0.5)
        probs = S.probabilities(jnp.zeros((4,)), s)
        chex.assert_trees_all_close(probs, jnp.array([0, 0, 0.5, 0.5]))
        # Tiny top_p with a tie at the max keeps the *highest* tied id (HF).
        probs = S.probabilities(jnp.array([1.0, 3.0, 3.0, 2.0]), S.Sampling(top_p=1e-8))
        chex.assert_trees_all_close(probs, jnp.array([0, 0, 1.0, 0]))

    def test_top_k_keeps_ties_and_neg_inf(self):
        logits = jnp.array([2.0, 1.0, 2.0, 1.0, -jnp.inf, 0.0])
        warped = S.warp_logits(logits, S.Sampling(top_k=2))
        chex.assert_trees_all_equal(
            warped, jnp.array([2.0, -jnp.inf, 2.0, -jnp.inf, -jnp.inf, -jnp.inf]))
        warped = S.warp_logits(logits, S.Sampling(top_k=3))  # ties with 3rd kept
        chex.assert_trees_all_equal(
            warped, jnp.array([2.0, 1.0, 2.0, 1.0, -jnp.inf, -jnp.inf]))
        # Fewer finite logits than k: nothing finite is removed.
        logits = jnp.array([-jnp.inf, 1.0, -jnp.inf, 0.0])
        chex.assert_trees_all_equal(S.warp_logits(logits, S.Sampling(top_k=3)), logits)

    def test_batch_dims_and_dtype(self):
        logits = jnp.asarray(_tied_logits(2, batch=6, vocab=16))
        s = S.Sampling(0.7, 5, 0.8)
        flat = S.probabilities(logits, s)
        nested = S.probabilities(logits.reshape(2, 3, 16), s)
        chex.assert_shape(nested, (2, 3, 16))
        chex.assert_type(nested, jnp.float32)
        chex.assert_trees_all_close(nested.reshape(6, 16), flat)
        chex.assert_type(S.warp_logits(logits.astype(jnp.bfloat16), s), jnp.float32)
        tokens = S.sample(jax.random.key(0), logits.reshape(2, 3, 16), s)
        chex.assert_shape(tokens, (2, 3))
        chex.assert_type(tokens, jnp.int32)


class GreedyTest(absltest.TestCase):

    def test_ties_to_lowest_id(self):
        logits = jnp.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
        chex.assert_trees_all_equal(S.greedy(logits), jnp.array([1, 0], jnp.int32))
        greedy = S.Sampling(temperature=0.0, top_k=2, top_p=0.5)
        self.assertTrue(greedy.is_greedy)
        chex.assert_trees_all_equal(S.sample(None, logits, greedy), S.greedy(logits))
        chex.assert_trees_all_equal(S.warp_logits(logits, greedy), logits)

    def test_probabilities_one_hot(self):
        logits = jnp.asarray(_tied_logits(3, batch=5, vocab=16))
        probs = S.probabilities(logits, S.Sampling(temperature=0.0))
        expected = jax.nn.one_hot(jnp.argmax(logits, -1), 16)
        chex.assert_trees_all_equal(probs, expected)
        chex.assert_trees_all_equal(probs[2], jax.nn.one_hot(2, 16))  # tie 2 vs 5


class StatisticalTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.logits = jnp.asarray(
            np.random.default_rng(4).normal(size=16) * 1.5, jnp.float32)
        self.s = S.Sampling(temperature=1.5, top_k=10, top_p=0.8)
        self.probs = np.asarray(S.probabilities(self.logits, self.s), np.float64)
        no_top_p = S.Sampling(temperature=1.5, top_k=10)
        self.probs_no_top_p = np.asarray(S.probabilities(self.logits, no_top_p))
        # Both filters must be active for the test to mean anything.
        self.assertLess(np.sum(self.probs_no_top_p > 0), 16)
        self.assertLess(np.sum(self.probs > 0), np.sum(self.probs_no_top_p > 0))

    def _counts(self, sampling, seed):
        draw = jax.jit(S.sample, static_argnames="sampling")
        logits = jnp.broadcast_to(self.logits, (N_DRAWS, 16))
        tokens = np.asarray(draw(jax.random.key(seed), logits, sampling=sampling))
        return np.bincount(tokens, minlength=16)

    def test_sample_follows_probabilities(self):
        counts = self._counts(self.s, seed=0)
        self.assertEqual(counts[self.probs == 0].sum(), 0)  # removed: never drawn
        self.assertGreater(stats_util.chi_square_pvalue(counts, self.probs), P_FLOOR)

    def test_negative_control_rejects_wrong_law(self):
        # Sampling without top-p while top-p is set: draws hit removed tokens.
        wrong = self._counts(S.Sampling(temperature=1.5, top_k=10), seed=1)
        self.assertLess(stats_util.chi_square_pvalue(wrong, self.probs), P_FLOOR)
        # The converse goes through the statistic itself (no zero-bin shortcut).
        right = self._counts(self.s, seed=2)
        self.assertLess(
            stats_util.chi_square_pvalue(right, self.probs_no_top_p), P_FLOOR)

    def test_sample_from_probs(self):
        probs = np.array([0.3, 0, 0.05, 0.2, 0, 0, 0.01, 0.14, 0, 0.25, 0.002,
                          0, 0.048, 0, 0, 0], np.float32)
        draw = jax.jit(S.sample_from_probs)
        tokens = np.asarray(draw(jax.random.key(5), jnp.broadcast_to(probs, (N_DRAWS, 16))))
        chex.assert_type(tokens, np.int32)
        counts = np.bincount(tokens, minlength=16)
        self.assertEqual(counts[probs == 0].sum(), 0)
        self.assertGreater(stats_util.chi_square_pvalue(counts, probs), P_FLOOR)
        # Negative control: a mildly different law on the same support.
        other = probs.copy()
        other[[0, 3]] = [0.25, 0.25]
        self.assertLess(stats_util.chi_square_pvalue(counts, other), P_FLOOR)

    def test_sample_from_probs_by_blocks(self):
        # V = 37 pads to 7 blocks of 6; block 1 has no mass, block 6 holds one token; tiny
        # unnormalised masses (x 1e-20) so that only ratios matter.
        rng = np.random.default_rng(7)
        probs = rng.gamma(0.3, size=37) * (rng.random(37) < 0.7)
        probs[6:12] = 0.0
        probs[36] = 0.3 * probs.sum()
        probs = (probs * 1e-20).astype(np.float32)
        draw = jax.jit(jax.vmap(S.sample_from_probs, (0, None)))
        keys = jax.random.split(jax.random.key(8), N_DRAWS)
        counts = np.bincount(np.asarray(draw(keys, jnp.asarray(probs))), minlength=37)
        self.assertEqual(counts[probs == 0].sum(), 0)
        self.assertGreater(stats_util.chi_square_pvalue(counts, probs), P_FLOOR)
        # Negative control: the same two draws with every block given equal mass (the bug of
        # drawing the block without its mass) is rejected.
        blocks = np.pad(probs.astype(np.float64), (0, 5)).reshape(7, 6)
        equal = np.where(blocks.sum(1, keepdims=True) > 0,
                         blocks / np.maximum(blocks.sum(1, keepdims=True), 1e-300), 0)
        wrong = np.bincount(np.asarray(draw(keys, jnp.asarray(equal.ravel()[:37], jnp.float32))),
                            minlength=37)
        self.assertLess(stats_util.chi_square_pvalue(wrong, probs), P_FLOOR)


class ChiSquareHelperTest(absltest.TestCase):

    def test_exact_fit_zero_bins_and_merging(self):
        p = np.array([0.5, 0.3, 0.1, 0.05, 0.03, 0.02, 0.0])
        self.assertGreater(stats_util.chi_square_pvalue(p * 1000, p), 0.99)
        counts = (p * 1000).astype(int)
        counts[-1] = 1  # impossible outcome observed
        self.assertEqual(stats_util.chi_square_pvalue(counts, p), 0.0)
        # 20 draws: small bins pooled; still a valid p-value in [0, 1].
        pv = stats_util.chi_square_pvalue([10, 6, 2, 1, 1, 0, 0], p)
        self.assertBetween(pv, 0.0, 1.0)
        self.assertEqual(stats_util.chi_square_pvalue([3, 0], [1.0, 0.0]), 1.0)


class ValidationTest(parameterized.TestCase):

    @parameterized.parameters(
        (dict(temperature=-1.0), r"temperature must be >= 0, got -1\.0"),
        (dict(temperature=float("nan")), r"temperature must be finite, got nan"),
        (dict(temperature=float("inf")), r"temperature must be finite, got inf"),
        (dict(top_k=-1), r"top_k must be >= 0, got -1"),
        (dict(top_k=2.5), r"top_k must be an int, got 2\.5"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0\.0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1\.5"),
        (dict(top_p=float("nan")), r"top_p must be in \(0, 1\], got nan"),
    )
    def test_rejects(self, kwargs, message):
        with self.assertRaisesRegex(ValueError, message):
            S.Sampling(**kwargs)

    def test_hashable_and_normalised(self):
        self.assertEqual(S.Sampling(1, np.int64(3), 1), S.Sampling(1.0, 3, 1.0))
        self.assertEqual(hash(S.Sampling(1, 3, 1)), hash(S.Sampling(1.0, 3, 1.0)))
        self.assertIsInstance(S.Sampling(temperature=1).temperature, float)


class JitTest(absltest.TestCase):

    def test_jit_sample(self):
        logits = jnp.asarray(_tied_logits(6, batch=4, vocab=16))
        s = S.Sampling(0.9, 4, 0.9)
        jitted = jax.jit(S.sample, static_argnames="sampling")
        key = jax.random.key(0)
        chex.assert_trees_all_equal(jitted(key, logits, sampling=s), S.sample(key, logits, s))
        greedy = S.Sampling(temperature=0.0)
        chex.assert_trees_all_equal(jitted(None, logits, sampling=greedy), S.greedy(logits))
        probs = jax.jit(S.probabilities, static_argnames="sampling")(logits, sampling=s)
        chex.assert_trees_all_close(probs, S.probabilities(logits, s))


if __name__ == "__main__":
    absltest.main()
