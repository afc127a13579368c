"""Statistical helpers shared by tests.

`chi_square_pvalue` is a Pearson chi-square goodness-of-fit test used to check
that a sampler's empirical token counts follow an expected law. Tests should
assert `p > 1e-6` (a false alarm rate of one in a million per fixed seed) and
include a negative control showing that the same check rejects a wrong law.
"""

from __future__ import annotations

import numpy as np

__all__ = ["chi_square_pvalue", "MIN_EXPECTED"]

MIN_EXPECTED = 5.0  # Usual rule of thumb for the chi-square approximation.


def _chi2_sf(stat: float, df: int) -> float:
    """Upper tail P[X >= stat] for X ~ chi-square(df)."""
    try:
        from scipy.stats import chi2
    except ImportError:  # float32 fallback; fine for p-value floors ~1e-6.
        from jax.scipy.special import gammaincc

        return float(gammaincc(df / 2.0, stat / 2.0))
    return float(chi2.sf(stat, df))


def chi_square_pvalue(observed_counts, expected_probs) -> float:
    """Pearson chi-square goodness-of-fit p-value (upper tail).

    Args:
      observed_counts: int[V] counts of each outcome (e.g. `np.bincount(draws,
        minlength=V)`).
      expected_probs: float[V] expected law; normalised here (non-negative,
        positive sum).

    Returns:
      The p-value. Special cases:
      * 0.0 if any outcome with zero expected probability was observed (that
        outcome is impossible under the law, so the fit is rejected outright);
      * 1.0 if fewer than two bins remain after merging (nothing to test).

    Bins with expected count < 5 are merged, smallest first, into pooled bins
    until each pooled bin reaches 5; a leftover pool still below 5 (made of
    the largest bins) is merged into the last pooled bin. Zero-probability bins (with zero
    observations) are dropped. Degrees of freedom = number of bins - 1.
    """
    obs = np.asarray(observed_counts, dtype=np.float64).ravel()
    p = np.asarray(expected_probs, dtype=np.float64).ravel()
    if obs.shape != p.shape:
        raise ValueError(f"shape mismatch: {obs.shape} vs {p.shape}")
    if np.any(p < 0) or not np.all(np.isfinite(p)) or p.sum() <= 0:
        raise ValueError("expected_probs must be finite, >= 0, with a positive sum")
    if np.any(obs < 0):
        raise ValueError("observed_counts must be >= 0")
    n = obs.sum()
    if n == 0:
        raise ValueError("no observations")
    p = p / p.sum()
    if np.any(obs[p == 0] > 0):
        return 0.0
    obs, expected = obs[p > 0], n * p[p > 0]

    order = np.argsort(expected, kind="stable")  # smallest expected first
    groups_obs, groups_exp = [], []
    acc_obs = acc_exp = 0.0
    for i in order:
        acc_obs += obs[i]
        acc_exp += expected[i]
        if acc_exp >= MIN_EXPECTED:
            groups_obs.append(acc_obs)
            groups_exp.append(acc_exp)
            acc_obs = acc_exp = 0.0
    if acc_exp > 0:  # leftover pool below the threshold
        if groups_exp:
            groups_obs[-1] += acc_obs
            groups_exp[-1] += acc_exp
        else:
            groups_obs.append(acc_obs)
            groups_exp.append(acc_exp)
    if len(groups_exp) < 2:
        return 1.0
    o, e = np.asarray(groups_obs), np.asarray(groups_exp)
    stat = float(np.sum((o - e) ** 2 / e))
    return _chi2_sf(stat, len(e) - 1)
