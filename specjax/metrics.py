"""Decoding metrics and the closed forms of Leviathan et al. 2023 (arXiv 2211.17192, section 3).

With ``alpha`` the expected acceptance rate (E[beta], beta = sum_x min(p(x), q(x))), ``gamma`` draft
tokens per iteration and ``c`` the cost of one draft step relative to one target step:

* expected tokens per iteration  ``(1 - alpha^(gamma+1)) / (1 - alpha)``            (Eq. 1)
* expected wall-time speedup     ``(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))`` (Thm 3.8;
  optionally with a verification pass costing ``v`` target steps instead of 1)
* expected arithmetic operations ``(1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))``
                                                                                    (Thm 3.11)
* optimal gamma = the integer maximising the speedup.

These accept Python floats/ints or numpy arrays (broadcast together) and return a Python float for
scalar inputs, else a numpy float64 array. Invalid inputs raise ``ValueError`` naming the value.
"""

from __future__ import annotations

import numpy as np


def _as_alpha(alpha) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64)
    if not np.all((a >= 0.0) & (a <= 1.0)):  # also rejects NaN
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return a


def _as_gamma(gamma, name: str = "gamma") -> np.ndarray:
    g = np.asarray(gamma)
    if g.dtype == np.bool_ or not np.issubdtype(g.dtype, np.integer):
        raise ValueError(f"{name} must be an integer >= 1, got {gamma!r}")
    if not np.all(g >= 1):
        raise ValueError(f"{name} must be an integer >= 1, got {gamma!r}")
    return g.astype(np.int64)


def _as_cost(cost, name: str, positive: bool = False) -> np.ndarray:
    c = np.asarray(cost, dtype=np.float64)
    if not np.all(np.isfinite(c) & ((c > 0.0) if positive else (c >= 0.0))):
        raise ValueError(f"{name} must be finite and {'>' if positive else '>='} 0, got {cost!r}")
    return c


def _out(x: np.ndarray):
    x = np.asarray(x, dtype=np.float64)
    return float(x) if x.ndim == 0 else x


def _tokens(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    """(1 - a^(g+1)) / (1 - a) = sum_{k=0}^{g} a^k, with limit g + 1 at a == 1.

    Computed as -expm1((g+1) log a) / (1 - a): both factors are accurate to a few ulps even as
    a -> 1 (1 - a is exact there), so there is no cancellation; a == 0 gives exactly 1.
    """
    a, g = np.broadcast_arrays(a, g)
    with np.errstate(divide="ignore", invalid="ignore"):
        num = -np.expm1((g + 1) * np.log(a))
        val = num / (1.0 - a)
    return np.where(a == 1.0, (g + 1).astype(np.float64), val)


def expected_tokens_per_iteration(alpha, gamma):
    """Expected tokens emitted per iteration: ``(1 - alpha^(gamma+1)) / (1 - alpha)``.

    Args:
      alpha: acceptance rate in [0, 1] (float or array).
      gamma: draft tokens per iteration, integer >= 1 (int or integer array).

    Returns:
      float (or float64 array); equals ``gamma + 1`` at ``alpha == 1``.
    """
    return _out(_tokens(_as_alpha(alpha), _as_gamma(gamma)))


def expected_speedup(alpha, gamma, cost_ratio, verify_cost=1.0):
    """Expected wall-time improvement factor ``(1 - a^(g+1)) / ((1 - a)(g c + v))``.

    Args:
      alpha: acceptance rate in [0, 1].
      gamma: draft tokens per iteration, integer >= 1.
      cost_ratio: c = time of one draft step / time of one target step, >= 0.
      verify_cost: v = time of the target's pass over gamma + 1 tokens / time of one target step,
        > 0. Leviathan's Thm 3.8 assumes v = 1 (a memory-bound target); on a CPU, or at large
        batch, the wider pass costs more, and the measured v makes the estimate a cost model.
    """
    a, g, c = _as_alpha(alpha), _as_gamma(gamma), _as_cost(cost_ratio, "cost_ratio")
    v = _as_cost(verify_cost, "verify_cost", positive=True)
    return _out(_tokens(a, g) / (g * c + v))


def expected_operations(alpha, gamma, cost_ratio_ops):
    """Expected factor of arithmetic operations ``(1 - a)(g c_hat + g + 1) / (1 - a^(g+1))``.

    Args:
      alpha: acceptance rate in [0, 1].
      gamma: draft tokens per iteration, integer >= 1.
      cost_ratio_ops: c_hat = operations of one draft step / operations of one target step, >= 0.
    """
    a, g, c = _as_alpha(alpha), _as_gamma(gamma), _as_cost(cost_ratio_ops, "cost_ratio_ops")
    return _out((g * c + g + 1.0) / _tokens(a, g))


def optimal_gamma(alpha, cost_ratio, max_gamma: int = 64):
    """The integer ``gamma`` in ``1..max_gamma`` maximising :func:`expected_speedup`.

    Ties go to the smallest gamma. Returns an int for scalar inputs, else an int64 array.
    """
    a, c = _as_alpha(alpha), _as_cost(cost_ratio, "cost_ratio")
    if np.ndim(max_gamma) != 0:
        raise ValueError(f"max_gamma must be a scalar integer >= 1, got {max_gamma!r}")
    m = int(_as_gamma(max_gamma, "max_gamma"))
    gammas = np.arange(1, m + 1, dtype=np.int64)
    a, c = np.broadcast_arrays(a, c)
    speedup = _tokens(a[..., None], gammas) / (gammas * c[..., None] + 1.0)  # [..., m]
    best = np.argmax(speedup, axis=-1) + 1
    return int(best) if best.ndim == 0 else best.astype(np.int64)


# The loop's measured counterpart of these closed forms lives with the loop; re-exported here.
from specjax.decoding.stats import DecodeStats  # noqa: E402,F401  pylint: disable=wrong-import-position
