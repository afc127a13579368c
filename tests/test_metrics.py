"""Tests for the Leviathan et al. 2023 section 3 closed forms in specjax.metrics."""

from __future__ import annotations

import numpy as np
from absl.testing import absltest, parameterized

from specjax import metrics


class ClosedFormTest(parameterized.TestCase):
    @parameterized.parameters(
        (0.6, 2, 1.96),
        (0.7, 3, 2.53),
        (0.8, 2, 2.44),
        (0.8, 5, 3.69),
        (0.9, 2, 2.71),
        (0.9, 10, 6.86),
    )
    def test_leviathan_table1(self, alpha, gamma, speedup):
        # Table 1 lists the c = 0 improvement factor, i.e. the expected tokens per iteration.
        self.assertEqual(round(metrics.expected_speedup(alpha, gamma, 0.0), 2), speedup)
        self.assertEqual(round(metrics.expected_tokens_per_iteration(alpha, gamma), 2), speedup)

    @parameterized.parameters(0.0, 0.3, 0.77, 0.999, 1.0 - 1e-12, 1.0)
    def test_tokens_equal_geometric_sum(self, alpha):
        for gamma in (1, 2, 5, 17):
            expected = sum(alpha**k for k in range(gamma + 1))
            self.assertAlmostEqual(metrics.expected_tokens_per_iteration(alpha, gamma), expected, places=9)

    def test_alpha_one_limit(self):
        self.assertEqual(metrics.expected_tokens_per_iteration(1.0, 4), 5.0)
        self.assertEqual(metrics.expected_speedup(1.0, 4, 0.25), 5.0 / 2.0)
        self.assertEqual(metrics.expected_operations(1.0, 4, 0.25), (4 * 0.25 + 4 + 1) / 5.0)

    def test_alpha_zero(self):
        self.assertEqual(metrics.expected_tokens_per_iteration(0.0, 7), 1.0)
        self.assertAlmostEqual(metrics.expected_speedup(0.0, 3, 0.1), 1.0 / 1.3)

    def test_formulas(self):
        a, g, c = 0.75, 4, 0.05
        tokens = (1 - a ** (g + 1)) / (1 - a)
        self.assertAlmostEqual(metrics.expected_speedup(a, g, c), tokens / (g * c + 1))
        self.assertAlmostEqual(metrics.expected_operations(a, g, c), (1 - a) * (g * c + g + 1) / (1 - a ** (g + 1)))

    def test_numpy_arrays(self):
        alpha = np.array([0.6, 0.8, 1.0])
        out = metrics.expected_speedup(alpha, np.array([2, 5, 3]), 0.0)
        self.assertIsInstance(out, np.ndarray)
        np.testing.assert_allclose(out, [1.96, 3.68928, 4.0], rtol=1e-6)
        self.assertIsInstance(metrics.expected_tokens_per_iteration(np.float32(0.5), np.int64(2)), float)

    @parameterized.parameters(
        (0.6, 0.0), (0.8, 0.05), (0.9, 0.01), (0.5, 0.3), (0.95, 0.1), (0.0, 0.1), (0.3, 1.0), (1.0, 0.0)
    )
    def test_optimal_gamma_brute_force(self, alpha, c):
        speedups = [metrics.expected_speedup(alpha, g, c) for g in range(1, 65)]
        best = int(np.argmax(speedups)) + 1
        got = metrics.optimal_gamma(alpha, c)
        self.assertEqual(got, best)
        self.assertIsInstance(got, int)
        self.assertGreaterEqual(got, 1)

    def test_optimal_gamma_known_values(self):
        self.assertEqual(metrics.optimal_gamma(1.0, 0.0, max_gamma=10), 10)  # speedup g + 1 grows
        self.assertEqual(metrics.optimal_gamma(0.0, 0.5), 1)  # nothing accepted: smallest gamma
        np.testing.assert_array_equal(metrics.optimal_gamma(np.array([0.8, 0.8]), np.array([0.05, 0.5])),
                                      [metrics.optimal_gamma(0.8, 0.05), metrics.optimal_gamma(0.8, 0.5)])


class ValidationTest(parameterized.TestCase):
    @parameterized.parameters(-0.1, 1.5, float("nan"))
    def test_alpha(self, alpha):
        with self.assertRaisesRegex(ValueError, r"alpha must be in \[0, 1\], got"):
            metrics.expected_speedup(alpha, 2, 0.0)
        with self.assertRaisesRegex(ValueError, "alpha"):
            metrics.optimal_gamma(alpha, 0.1)

    @parameterized.parameters(0, -3, 2.5, 2.0, True)
    def test_gamma(self, gamma):
        with self.assertRaisesRegex(ValueError, "gamma must be an integer >= 1, got " + repr(gamma).replace(".", r"\.")):
            metrics.expected_tokens_per_iteration(0.5, gamma)

    @parameterized.parameters(-0.5, float("inf"), float("nan"))
    def test_cost_ratio(self, cost):
        with self.assertRaisesRegex(ValueError, "cost_ratio must be finite and >= 0, got"):
            metrics.expected_speedup(0.5, 2, cost)
        with self.assertRaisesRegex(ValueError, "cost_ratio_ops must be"):
            metrics.expected_operations(0.5, 2, cost)

    @parameterized.parameters(0.0, -1.0, float("nan"), float("inf"))
    def test_verify_cost(self, v):
        with self.assertRaisesRegex(ValueError, "verify_cost must be finite and > 0, got"):
            metrics.expected_speedup(0.5, 2, 0.1, verify_cost=v)

    def test_verify_cost_generalises_thm_3_8(self):
        # v = 1 is Leviathan's formula; a verification pass of v target steps divides by g c + v.
        a, g, c = 0.7, 3, 0.1
        self.assertEqual(metrics.expected_speedup(a, g, c, verify_cost=1.0),
                         metrics.expected_speedup(a, g, c))
        tokens = metrics.expected_tokens_per_iteration(a, g)
        self.assertAlmostEqual(metrics.expected_speedup(a, g, c, verify_cost=1.6),
                               tokens / (g * c + 1.6))

    def test_max_gamma(self):
        with self.assertRaisesRegex(ValueError, "max_gamma"):
            metrics.optimal_gamma(0.5, 0.1, max_gamma=0)
        with self.assertRaisesRegex(ValueError, "max_gamma"):
            metrics.optimal_gamma(0.5, 0.1, max_gamma=[3, 4])

    def test_array_alpha_out_of_range_named(self):
        with self.assertRaisesRegex(ValueError, r"alpha must be in \[0, 1\], got array\(\[0\.5, 2\. \]\)"):
            metrics.expected_tokens_per_iteration(np.array([0.5, 2.0]), 2)


if __name__ == "__main__":
    absltest.main()
