"""Verification of ``k`` i.i.d. draft chains: SpecTr's K-SEQ and the naive multi-draft rule.

SpecTr (Sun et al. 2023, arXiv 2310.15141, §4 "K-SEQ", ALGORITHMS.md §6). ``k`` candidate tokens
``X_1..X_k`` drawn i.i.d. from ``q`` at one position; with ``beta(rho) = sum_x min(q(x), p(x)/rho)``
choose the smallest ``rho*`` in ``[1, k]`` with ``1 - (1 - beta)^k <= rho * beta`` (bisection, in
float32 inside ``jit``); test ``X_1, X_2, ...`` in turn, accepting ``X_i`` with probability
``min(1, p(X_i) / (rho* q(X_i)))``; the first accepted is emitted; if none is, draw from the residual

  ``p_res(x) = [p(x) - min(q(x), p(x)/rho*) (1 - (1 - beta)^k) / beta] / (1 - beta)^k``

(non-negative exactly when ``rho >= rho*``). The emitted token is distributed as ``p`` and is
accepted with probability ``1 - (1 - beta(rho*))^k``, within ``1 - (1 - 1/k)^k`` of the optimal
transport plan's. ``k = 1`` gives ``rho* = 1``: ordinary rejection sampling.

Sequence level: ``k`` chains of ``L`` drafts sampled independently (the tree ``sj.Tree.chains``)
are walked from the root; at depth ``d`` the chains whose first ``d`` tokens equal the accepted
prefix (the *survivors*, ``k'`` of them) hold i.i.d. draws from ``q(.|prefix)``, so K-SEQ runs with
``k'`` (rho* recomputed for it); a chain that disagrees drops out; after ``L`` accepted tokens the
target's law at the leaf gives the bonus. ``"naive"`` is SpecInfer's rule with replacement
(ALGORITHMS.md §5, ``r <- norm((r - q)+)`` after each rejection) on the same survivors, so the two
selections can be compared on equal drafts. Both emit exactly the target's law (enumeration:
``tests/test_tree_verify.py``).

One row, no batch dim; the loop reaches these through ``specjax.verify.tree.tree_core`` with the
tree rules ``"k_seq"`` / ``"naive_multi_draft"``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.verify.rejection import RESIDUAL_MIN_MASS, acceptance_ratio, residual

SELECTIONS = ("k_seq", "naive")
BISECTION_STEPS = 30  # [1, k] halved 30 times: rho* within k * 1e-9, below float32's resolution


def _beta(p: jax.Array, q: jax.Array, rho: jax.Array) -> jax.Array:
  return jnp.sum(jnp.minimum(q, p / rho))


def _miss(beta: jax.Array, k: jax.Array) -> jax.Array:
  """``(1 - beta)^k``: the probability that none of k i.i.d. drafts is accepted."""
  return jnp.power(jnp.clip(1.0 - beta, 0.0, 1.0), k)


def rho_star(p: jax.Array, q: jax.Array, k: jax.Array | int) -> jax.Array:
  """The smallest ``rho`` in ``[1, k]`` with ``1 - (1 - beta(rho))^k <= rho beta(rho)``.

  The gap ``rho beta(rho) - 1 + (1 - beta(rho))^k = sum_x min(rho q, p) - 1 + (1 - beta)^k`` grows
  with rho (both terms do), is >= 0 at ``rho = k`` (Bernoulli's inequality) and <= 0 at 1 for
  k >= 2, so bisection finds it; the upper end is returned, where the residual is non-negative.

  Args:
    p, q: float32[V] target and draft laws; k: the number of i.i.d. drafts (>= 1, may be traced).
  """
  k = jnp.asarray(k, jnp.float32)
  gap = lambda rho: jnp.sum(jnp.minimum(rho * q, p)) - 1.0 + _miss(_beta(p, q, rho), k)

  def halve(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    above = gap(mid) >= 0
    return jnp.where(above, lo, mid), jnp.where(above, mid, hi)

  _, hi = jax.lax.fori_loop(0, BISECTION_STEPS, halve, (jnp.float32(1.0), k))
  return jnp.where(gap(jnp.float32(1.0)) >= 0, jnp.float32(1.0), hi)


def k_seq_residual(p: jax.Array, q: jax.Array, rho: jax.Array, k: jax.Array | int) -> jax.Array:
  """float32[V]: the law to draw from when none of the k drafts is accepted (module docstring).

  Its unnormalised mass is ``(1 - beta)^k``, so normalising by the sum divides by exactly that;
  when that mass vanishes (p == q: every draft is accepted) rejection has probability zero and,
  as in ``rejection.residual``, ``p`` is the limit. With ``beta = 0`` (disjoint supports) nothing
  is accepted and the residual is ``p``.
  """
  k = jnp.asarray(k, jnp.float32)
  kept = jnp.minimum(q, p / rho)
  beta = jnp.sum(kept)
  hit = 1.0 - _miss(beta, k)
  scale = jnp.where(beta > 0, hit / jnp.where(beta > 0, beta, 1.0), k)  # -> k as beta -> 0
  r = jnp.maximum(p - kept * scale, 0.0)
  mass = jnp.sum(r)
  nonempty = mass > RESIDUAL_MIN_MASS
  return jnp.where(nonempty, r / jnp.where(nonempty, mass, 1.0), p)


def k_seq_acceptance(p: jax.Array, q: jax.Array, k: jax.Array | int) -> jax.Array:
  """float32[]: the probability that K-SEQ accepts one of ``k`` i.i.d. drafts from ``q`` when the
  target's law is ``p``, ``1 - (1 - beta(rho*))^k``: exact, no sampling (to compare selections on
  real laws without Monte Carlo noise, ``experiments/spectr_exact.py``)."""
  return 1.0 - _miss(_beta(p, q, rho_star(p, q, k)), jnp.asarray(k, jnp.float32))


def naive_acceptance(p: jax.Array, q: jax.Array, k: int) -> jax.Array:
  """float32[]: the same for the naive rule (SpecInfer's, with replacement, ALGORITHMS.md §5).
  Draft i is tested against ``r_i`` (``r_1 = p``) and accepted with probability
  ``beta_i = sum_x min(r_i(x), q(x))``; a rejection moves r to ``norm((r_i - q)+)`` whichever
  token was rejected, so the misses multiply: ``1 - prod_i (1 - beta_i)``."""
  r, miss = jnp.asarray(p, jnp.float32), jnp.float32(1.0)
  for _ in range(int(k)):
    miss = miss * (1.0 - jnp.clip(jnp.sum(jnp.minimum(r, q)), 0.0, 1.0))
    r = residual(r, q)
  return 1.0 - miss


def acceptance_bound(p: jax.Array, q: jax.Array, k: jax.Array | int) -> jax.Array:
  """float32[]: ``sum_x min(p(x), 1 - (1 - q(x))^k)``, the most any rule can accept from ``k``
  i.i.d. drafts while emitting ``p`` (token x can only be accepted when it was drafted, which
  happens with probability ``1 - (1 - q(x))^k``): the optimal transport plan's value is at most
  this, and K-SEQ reaches at least ``1 - (1 - 1/k)^k`` of the optimum."""
  return jnp.sum(jnp.minimum(p, 1.0 - jnp.power(1.0 - q, jnp.asarray(k, jnp.float32))))


def chains_core(u: jax.Array, p: jax.Array, tokens: jax.Array, q: jax.Array,
                chain_table: np.ndarray, selection: str):
  """The decision logic over ``k`` i.i.d. chains, with the acceptance uniforms given.

  Args:
    u: float32[L, k]: ``u[d, i]`` decides chain i's test at depth d (accept iff ``u < ratio``).
    p: float32[N + 1, V] target laws (row 0 at the root, row ``n + 1`` after node n).
    tokens: int32[N]; q: float32[N + 1, V] the draft law each node's children were drawn from.
    chain_table: static int[k, L] (``specjax.trees.chain_table``).
    selection: ``"k_seq"`` or ``"naive"``.
  Returns:
    the fields of ``specjax.verify.tree.TreeCore``: (int32[L] path = the nodes of the first
    surviving chain, -1 after the last accepted; int32[] its length; float32[V] the law of the
    token after it; float32[L, k] acceptance probabilities; bool[L, k] which chains were tested).
  """
  if selection not in SELECTIONS:
    raise ValueError(f"unknown multi-draft selection {selection!r}; expected one of {SELECTIONS}")
  k, depth = np.asarray(chain_table).shape
  alive = jnp.ones((k,), bool)
  row = jnp.int32(0)  # p/q row at the end of the accepted prefix (0 = the root)
  stopped = jnp.bool_(False)
  next_dist = p[0]
  path, ratios, tested = [], [], []
  for d in range(depth):
    nodes = jnp.asarray(chain_table[:, d])
    x = tokens[nodes]  # [k] the chains' tokens at this depth
    p_d, q_d = p[row], q[row]  # every survivor's context is the accepted prefix
    live = alive & ~stopped
    k_live = jnp.maximum(jnp.sum(live), 1)
    rho = rho_star(p_d, q_d, k_live) if selection == "k_seq" else None
    r = p_d
    chosen = jnp.int32(-1)
    step_ratios, step_tested = [], []
    for i in range(k):
      test = live[i] & (chosen < 0)
      if selection == "k_seq":
        ratio = acceptance_ratio(p_d[x[i]], rho * q_d[x[i]])
      else:
        ratio = acceptance_ratio(r[x[i]], q_d[x[i]])
      accept = test & (u[d, i] < ratio)
      if selection == "naive":
        r = jnp.where(test & ~accept, residual(r, q_d), r)
      chosen = jnp.where(accept, i, chosen)
      step_ratios.append(ratio)
      step_tested.append(test)
    moved = chosen >= 0
    rejected = r if selection == "naive" else k_seq_residual(p_d, q_d, rho, k_live)
    next_dist = jnp.where(~stopped & ~moved, rejected, next_dist)
    winner = jnp.maximum(chosen, 0)
    path.append(jnp.where(moved, nodes[winner], -1))
    alive = alive & (x == x[winner])
    row = jnp.where(moved, nodes[winner] + 1, row)
    stopped = stopped | ~moved
    ratios.append(jnp.stack(step_ratios))
    tested.append(jnp.stack(step_tested))
  next_dist = jnp.where(stopped, next_dist, p[row])
  path = jnp.stack(path).astype(jnp.int32)
  return (path, jnp.sum(path >= 0).astype(jnp.int32), next_dist, jnp.stack(ratios),
          jnp.stack(tested))
