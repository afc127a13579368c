"""The cost rule's model (``specjax.proposers.adaptive``): a chain's (or a tree's, level by level)
expected tokens per iteration from per-position acceptance, a batch's expected iterations until
its slowest row is done, and the per-row running acceptance estimates those read (the running
mean that hands over to an EMA, its noise, the shrinking toward the batch's mean, the updates).
Pure functions of arrays; the references are in each docstring."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def expected_tokens(acceptance: jax.Array, gamma: int) -> jax.Array:
  """float32[...]: expected tokens of one iteration of a chain of ``gamma`` drafts whose position
  j is accepted with probability ``acceptance[..., j]`` given the earlier ones, plus the bonus:
  ``1 + sum_{i<gamma} prod_{j<=i} a_j`` (Leviathan et al. 2023, Eq. 1, where all a_j = alpha):
  ``token_moments``' mean."""
  return token_moments(acceptance, gamma)[0]


def token_moments(acceptance: jax.Array, gamma: int) -> tuple[jax.Array, jax.Array]:
  """(mean, variance), float32[...] each, of one iteration's tokens under ``expected_tokens``'s
  model: with survivals ``s_i = prod_{j<=i} a_j``, tokens = 1 + A where A counts the accepted
  drafts, ``E[A] = sum_i s_i`` (Eq. 1) and ``E[A^2] = sum_i (2i + 1) s_i``."""
  mean, variance = menu_moments(acceptance, (gamma,))
  return mean[..., 0], variance[..., 0]


def menu_moments(acceptance: jax.Array, gammas: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """(mean, variance), float32[..., K] each: ``token_moments`` for each of the K ``gammas`` at
  once (running sums of the survivals read at each length: a menu's rule in a few kernels
  rather than a few per entry)."""
  survive = jnp.cumprod(acceptance[..., :max(gammas)], axis=-1)
  weights = 2.0 * jnp.arange(survive.shape[-1]) + 1.0
  start = jnp.zeros(survive.shape[:-1] + (1,), survive.dtype)
  drafts = jnp.concatenate([start, jnp.cumsum(survive, axis=-1)], axis=-1)[..., list(gammas)]
  second = jnp.concatenate([start, jnp.cumsum(weights * survive, axis=-1)],
                           axis=-1)[..., list(gammas)]
  return 1.0 + drafts, jnp.maximum(second - drafts ** 2, 0.0)


# The cost rule's check of its own model (``sj.Adaptive(correct=True)``; ``tally``,
# ``entry_factors``): each entry's modelled accepted drafts are scaled by what its iterations
# accepted over what the model said they would, over a window of ~1 / (1 - TALLY_KEEP)
# iterations; an entry's prior factor is the next shorter entry's, counting as TALLY_PRIOR
# modelled drafts. Per-position estimates price every length as if its iterations started where
# the observed ones did, but where a length's iterations fall in the text is its own
# (experiments/match_runs.py: gamma 3 on the benchmark pair's Python, T = 0, 2.77 tokens an
# iteration where the iid and a Markov model of the matches say 2.94-2.96), and the rule picks
# long entries when its estimates run high. Off by default:
# replayed free of timing noise on the benchmark pair (experiments/adaptive_tune.py under the
# runner's calibrated tables, warmed) it lifted batch-4 Python at T = 0 from 0.935 to 0.977x the
# best fixed gamma and batch-8 code edits from 0.93 to 0.95x, but cost 2-7% at batch 1, where a
# row's tally is as noisy as the bias, and 5% on SmolLM2's batch-4 code edits (docs/benchmarks.md,
# session 46).
TALLY_KEEP = 0.98
TALLY_PRIOR = 4.0


def tally(sums: jax.Array, index: int, accepted: jax.Array, drafts: jax.Array,
          active: jax.Array) -> jax.Array:
  """float32[2, K]: ``sums`` (each entry's accepted drafts lately; what the estimates expected
  of them) after an iteration of menu entry ``index`` (static): discounted by ``TALLY_KEEP``,
  then the active rows' (bool[B]) ``accepted`` drafts (float32[B]) and the ``drafts`` the model
  expected of them (float32[B]) added to the entry's."""
  w = active.astype(jnp.float32)
  return (TALLY_KEEP * sums).at[:, index].add(
      jnp.stack([jnp.sum(w * accepted), jnp.sum(w * drafts)]))


def entry_factors(sums: jax.Array) -> jax.Array:
  """float32[K]: each entry's accepted over modelled drafts (``tally``'s ``sums``), entry k's
  shrunk toward entry k - 1's (1 before the first) by ``TALLY_PRIOR`` modelled drafts: an
  entry not run lately takes the shorter one's."""
  made, modelled = sums
  factors, prior = [], jnp.float32(1.0)
  for k in range(made.shape[-1]):
    prior = (made[k] + TALLY_PRIOR * prior) / (modelled[k] + TALLY_PRIOR)
    factors.append(prior)
  return jnp.stack(factors)


GRID = 32  # points of ``batch_iterations``'s integral (a span of <= 12 standard deviations)


def batch_iterations(remaining: jax.Array, mean: jax.Array, variance: jax.Array,
                     active: jax.Array) -> jax.Array:
  """float32[]: the expected iterations until every active row has emitted its ``remaining``
  tokens (float32[B]) at ``mean`` / ``variance`` tokens an iteration (float32[B]): a batch runs
  until its slowest row is done. Row b needs ``N_b ~ Normal(R_b / mu_b, R_b sigma_b^2 /
  mu_b^3)`` iterations (the renewal central limit theorem; Cox, Renewal Theory, 1962), and
  ``E[max_b N_b]`` for independent rows is ``lo + int_lo^hi (1 - prod_b Phi_b(x)) dx`` (midpoint
  rule over ``GRID`` points; below ``lo`` some row is surely still running, past ``hi`` all are
  done). One row: ``R / mu``, the per-iteration model's own ratio, computed as such (with the
  one row's shrinking, the integral was ~10 small kernels an iteration on XLA:CPU)."""
  centre = remaining / mean
  if remaining.shape[0] == 1:
    return jnp.where(active[0], centre[0], 0.0)
  spread = jnp.sqrt(remaining * variance / mean ** 3)
  lo = jnp.max(jnp.where(active, centre - 6.0 * spread, 0.0))
  hi = jnp.max(jnp.where(active, centre + 6.0 * spread, 0.0))
  x = lo + (hi - lo) * (jnp.arange(GRID) + 0.5) / GRID
  z = (x[:, None] - centre[None, :]) / jnp.maximum(spread, 1e-6)[None, :]
  done = jnp.prod(jnp.where(active[None, :], jax.scipy.special.ndtr(z), 1.0), axis=1)
  return lo + (hi - lo) * jnp.mean(1.0 - done)


def menu_scores(costs: jax.Array, acceptance: jax.Array, seen: jax.Array, active: jax.Array,
                remaining: jax.Array, choices: tuple[int, ...], decay: float,
                factors: jax.Array | None = None) -> jax.Array:
  """float32[K]: each menu entry's modelled tokens per unit of cost for the active rows (bool[B]):
  their ``remaining`` tokens (int32[B]) over ``costs[k]`` (float32[K], target steps) times the
  expected iterations until the slowest is done (``batch_iterations``) at entry k's tokens an
  iteration (``menu_moments`` of ``choices``), the rows' estimates (float32[B, G]) first
  ``shrink``-ed by the observations behind them (``seen``) and each entry's modelled drafts scaled
  by ``factors`` (float32[K], ``entry_factors``) if given. The cost rule's objective
  (``AdaptiveProposer.best``; ``sj.Adaptive``'s call-level skip reads it at a call's start)."""
  acceptance = shrink(acceptance, seen, active, decay)
  left = jnp.where(active, remaining, 0).astype(jnp.float32)
  mean, variance = menu_moments(acceptance, choices)  # [B, K]: every entry at once
  if factors is not None:
    mean, variance = 1.0 + factors * (mean - 1.0), factors ** 2 * variance
  iterations = jax.vmap(batch_iterations, (None, 1, 1, None))(left, mean, variance, active)
  return jnp.sum(left) / (costs * jnp.maximum(iterations, 1e-6))


PRIOR_WEIGHT = 2.0  # the prior counts as this many observations (``observe``)


def kept_weight(seen: jax.Array, count: jax.Array, decay: float) -> jax.Array:
  """The old estimate's share after ``count`` more observations, given ``seen`` before: the
  observation after ``n`` others has weight ``max(decay, 1 / (n + PRIOR_WEIGHT + 1))``, a running
  mean with the prior as ``PRIOR_WEIGHT`` observations until that falls to ``decay``, then an
  EMA (the warm-up of a bias-corrected average): a fresh row leaves an optimistic prior after
  a few misses, a long-running one keeps a window of ~1 / decay observations."""
  start = seen + PRIOR_WEIGHT
  mean_steps = jnp.clip(1.0 / decay - 1.0 - start, 0.0, count)  # observations at 1 / (n + 1)
  return start / (start + mean_steps) * (1.0 - decay) ** (count - mean_steps)


def noise_share(seen: jax.Array, decay: float) -> jax.Array:
  """float32[...]: the sum of the squared weights of the observations behind an estimate after
  ``seen`` of them (``kept_weight``'s schedule: a running mean with the prior as ``PRIOR_WEIGHT``
  observations for the first ``m``, then an EMA of weight ``decay``): the estimate's variance
  is this times one observation's, ``m / (m + PRIOR_WEIGHT)^2`` after the mean's ``m``,
  approaching ``decay / (2 - decay)`` along the EMA."""
  mean_steps = jnp.clip(1.0 / decay - 1.0 - PRIOR_WEIGHT, 0.0, seen)
  fading = (1.0 - decay) ** (2.0 * (seen - mean_steps))
  return (fading * mean_steps / (mean_steps + PRIOR_WEIGHT) ** 2
          + (1.0 - fading) * decay / (2.0 - decay))


def shrink(acceptance: jax.Array, seen: jax.Array, active: jax.Array,
           decay: float) -> jax.Array:
  """float32[B, G]: the active rows' estimates pulled toward the batch's mean at each position,
  by as much of their spread as their own noise explains (empirical Bayes, James & Stein 1961;
  Efron & Morris 1975): row b keeps ``tau^2 / (tau^2 + v_b)`` of its distance from the mean,
  ``v_b = a(1 - a) x noise_share(seen_b)`` (a Bernoulli observation's variance at the mean
  ``a``: exact for T = 0's matches, a bound for T > 0's acceptance probabilities) and ``tau^2``
  the rows' spread beyond that noise (method of moments, floored at 0). The slowest row
  prices a batch (``batch_iterations``), and the least of 4-8 noisy estimates of equal rows
  is low by 1-1.4 standard deviations (~0.1-0.15 at decay 0.1): unshrunk, the rule
  undervalued every draft length at batch 4-8. One row, or rows without observations: as
  they are."""
  if acceptance.shape[0] == 1:
    return acceptance
  w = active[:, None].astype(jnp.float32)
  rows = jnp.sum(w, axis=0)
  mean = jnp.sum(w * acceptance, axis=0) / jnp.maximum(rows, 1.0)
  noise = mean * (1.0 - mean) * noise_share(seen, decay)
  spread = jnp.sum(w * (acceptance - mean) ** 2, axis=0) / jnp.maximum(rows - 1.0, 1.0)
  tau2 = jnp.maximum(spread - jnp.sum(w * noise, axis=0) / jnp.maximum(rows, 1.0), 0.0)
  keep = jnp.where(noise > 0, tau2 / jnp.maximum(tau2 + noise, 1e-12), 1.0)
  shrunk = mean + keep * (acceptance - mean)
  return jnp.where((w > 0) & (rows > 1), shrunk, acceptance)


def observe(acceptance: jax.Array, seen: jax.Array, observed: jax.Array, values: jax.Array,
            decay: float, drifting: jax.Array, prior: float, forget: float,
            drift: str = "prior"):
  """(estimates, seen) after one iteration: a step toward ``values`` where ``observed`` (bool[B,
  G]; ``kept_weight``), a step of ``forget`` where ``drifting`` (bool[B, G]) toward ``prior``
  (``drift="prior"``) or toward the row's first-position estimate after this iteration's
  observations (``drift="first"``)."""
  kept = kept_weight(seen, jnp.ones_like(seen), decay)
  acceptance = jnp.where(observed, kept * acceptance + (1.0 - kept) * values, acceptance)
  target = acceptance[:, :1] if drift == "first" else prior
  acceptance = jnp.where(drifting & ~observed, acceptance + forget * (target - acceptance),
                         acceptance)
  return acceptance, seen + observed


def observe_many(acceptance: jax.Array, seen: jax.Array, count: jax.Array, mean: jax.Array,
                 decay: float):
  """(estimates, seen), float32[B] each: ``count`` (float32[B]) observations of mean ``mean``
  folded into ``acceptance`` as ``count`` steps of ``observe`` toward their mean (the order
  within the batch of observations is not kept)."""
  kept = kept_weight(seen, count, decay)  # 1 where count is 0
  return kept * acceptance + (1.0 - kept) * mean, seen + count
