"""Speculative rejection sampling over probability arrays (one row, no batch dim).

Implements the acceptance rule of speculative sampling:

* Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
  arXiv 2211.17192, Algorithm 1 / section 2.3.
* Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling",
  arXiv 2302.01318 (same rule; that paper calls the draft ``p`` and the target ``q``).

Here, as everywhere in specjax (see ALGORITHMS.md sections 1, 2 and 4), ``p`` is the TARGET's
(warped) next-token distribution and ``q`` is the PROPOSER's.

For draft position i (0-based, i < G) with draft token ``x_i ~ q_i``:
  accept with probability ``min(1, p_i(x_i) / q_i(x_i))``;
  at the first rejection emit a token drawn from ``norm((p_i - q_i)+)`` and stop;
  if all G drafts are accepted emit a bonus token drawn from ``p_G``.
The emitted tokens are then distributed exactly as autoregressive sampling from ``p``.

Every function handles ONE row: ``p: float32[G+1, V]``, ``q: float32[G, V]``,
``draft_tokens: int32[G]``. The decoding loop ``jax.vmap``s them over rows with one key per row, so a
row's randomness does not depend on its batch mates. All shapes are static; everything jits and vmaps.

Design for testability: the decision logic lives in :func:`chain_core` (and
:func:`deterministic_core`, the same core with one-hot q), which takes the acceptance uniforms ``u``
explicitly and returns the *distribution* of the token emitted after the accepted
prefix (instead of a sampled token). The public functions only draw ``u`` and sample from that
distribution, so tests can integrate over the randomness exactly (enumeration, no sampling noise)
while exercising the real decision code.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from specjax.sampling import sample_from_probs

__all__ = [
    "ChainCore",
    "ChainVerdict",
    "acceptance_ratio",
    "chain_core",
    "deterministic_chain",
    "deterministic_core",
    "deterministic_q",
    "rejection_chain",
    "residual",
]

# Residual mass at or below which `residual` falls back to p (ALGORITHMS.md section 1).
#
# Why the smallest normal float32 (~1.2e-38) and not something like V * eps:
#   With r = (p - q)+ and m = sum(r), the rejection branch contributes P(reject) * dist to the emitted
#   law, and P(reject) = sum(q) - sum(min(p, q)) = m + (sum(q) - sum(p)). Using dist = r / m emits
#   min(p, q) + (p - q)+ = p exactly, for ANY m > 0, however small: a tiny residual made only of
#   round-off noise is reached with a correspondingly tiny probability, so it is still correct.
#   Falling back to p instead of r / m changes the law by at most P(reject) <= m (+ the unavoidable
#   sum(q) - sum(p) round-off, present whatever we do). So a larger threshold can only add bias (up
#   to the threshold's own size); the threshold exists only to keep r / m finite. Above the smallest
#   normal number the division is safe: every r_j <= m, so r_j / m <= 1 (no overflow), and a
#   subnormal m (which XLA may flush to zero anyway) is treated as zero.
RESIDUAL_MIN_MASS = float(jnp.finfo(jnp.float32).tiny)


@flax.struct.dataclass
class ChainVerdict:
    """Outcome of verifying one row's chain of G draft tokens."""

    num_accepted: jax.Array  # int32[]   n in 0..G: draft tokens accepted
    next_token: jax.Array  # int32[]   token emitted after them (replacement, or bonus if n == G)
    accept_prob: jax.Array  # float32[G] beta_i = sum_x min(p_i(x), q_i(x)) (exact expected acceptance)


class ChainCore(NamedTuple):
    """Deterministic part of a chain verification, given the acceptance uniforms."""

    num_accepted: jax.Array  # int32[]
    next_dist: jax.Array  # float32[V]  law of the token emitted after the accepted prefix
    accept_ratio: jax.Array  # float32[G] min(1, p_i(x_i)/q_i(x_i)): P(accept x_i | x_i drafted)
    accept_prob: jax.Array  # float32[G] beta_i = sum_x min(p_i(x), q_i(x))


def acceptance_ratio(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    """``min(1, p(x) / q(x))`` elementwise, defined safely when ``q(x) == 0``.

    A token with ``q(x) == 0`` cannot have been drawn from q, so this case has probability zero and
    does not affect the output law; we still define it so that outputs stay finite and a buggy
    proposer cannot make us emit a token the target excludes. We take the limit ``q(x) -> 0+``:
    ratio 1 (accept) if ``p(x) > 0``, and 0 (reject) if ``p(x) == 0``. Consequently a token with
    ``p(x) == 0`` is never accepted, whatever q says.

    Args:
      p_x: float32[...] target probability of the drafted tokens.
      q_x: float32[...] proposer probability of the same tokens.

    Returns:
      float32[...] acceptance probabilities in [0, 1].
    """
    p_x = jnp.asarray(p_x, jnp.float32)
    q_x = jnp.asarray(q_x, jnp.float32)
    safe_q = jnp.where(q_x > 0, q_x, 1.0)
    ratio = jnp.minimum(1.0, p_x / safe_q)
    return jnp.where(q_x > 0, ratio, jnp.where(p_x > 0, 1.0, 0.0)).astype(jnp.float32)


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """Rejection distribution ``norm((p - q)+)``, or ``p`` if that residual is empty.

    The residual is empty (mass <= ``RESIDUAL_MIN_MASS``) exactly when ``p <= q`` everywhere, i.e.
    ``p == q`` for normalized inputs; rejection then has probability zero but can be reached through
    round-off, and drawing from ``p`` is the correct limit. See the comment on
    ``RESIDUAL_MIN_MASS`` for why the threshold is the smallest normal float32.

    Args:
      p: float32[V] target distribution.
      q: float32[V] proposer distribution.

    Returns:
      float32[V] a probability vector; its zeros are exactly the zeros of ``(p - q)+`` (or of p in
      the fallback case), so a draw from it never yields such a token.
    """
    p = jnp.asarray(p, jnp.float32)
    q = jnp.asarray(q, jnp.float32)
    r = jnp.maximum(p - q, 0.0)
    mass = jnp.sum(r)
    nonempty = mass > RESIDUAL_MIN_MASS
    return jnp.where(nonempty, r / jnp.where(nonempty, mass, 1.0), p)


def _check_shapes(p: jax.Array, q: jax.Array | None, draft_tokens: jax.Array) -> tuple[int, int]:
    """Static shape validation (shapes are static under jit/vmap, so this is free)."""
    if draft_tokens.ndim != 1:
        raise ValueError(f"draft_tokens must be int32[G], got shape {draft_tokens.shape}")
    (g,) = draft_tokens.shape
    if p.ndim != 2 or p.shape[0] != g + 1:
        raise ValueError(f"p must be float32[G+1, V] with G={g}, got shape {p.shape}")
    v = p.shape[1]
    if q is not None and q.shape != (g, v):
        raise ValueError(f"q must be float32[G, V] = {(g, v)}, got shape {q.shape}")
    if not jnp.issubdtype(draft_tokens.dtype, jnp.integer):
        raise ValueError(f"draft_tokens must be integers, got dtype {draft_tokens.dtype}")
    return g, v


def chain_core(u: jax.Array, p: jax.Array, q: jax.Array, draft_tokens: jax.Array) -> ChainCore:
    """The decision logic of a chain verification, with the acceptance uniforms given.

    Draft token i is accepted iff ``u[i] < accept_ratio[i]``; for ``u[i] ~ Uniform[0, 1)`` that has
    probability exactly ``accept_ratio[i] = min(1, p_i(x_i)/q_i(x_i))``. The chain stops at the first
    rejection ``n``; the emitted token then follows ``residual(p_n, q_n)``, or ``p_G`` (bonus) if
    ``n == G``.

    Args:
      u: float32[G] acceptance uniforms in [0, 1).
      p: float32[G+1, V] target distributions at the G draft positions plus the bonus position.
      q: float32[G, V] proposer distributions the draft tokens were drawn from.
      draft_tokens: int32[G] the proposed tokens.

    Returns:
      ChainCore(num_accepted int32[], next_dist float32[V], accept_ratio float32[G],
      accept_prob float32[G]).
    """
    p = jnp.asarray(p, jnp.float32)
    q = jnp.asarray(q, jnp.float32)
    draft_tokens = jnp.asarray(draft_tokens)
    g, _ = _check_shapes(p, q, draft_tokens)
    draft_tokens = draft_tokens.astype(jnp.int32)
    u = jnp.asarray(u, jnp.float32)
    if u.shape != (g,):
        raise ValueError(f"u must be float32[G] = {(g,)}, got shape {u.shape}")

    p_draft = p[:g]  # float32[G, V]
    p_x = jnp.take_along_axis(p_draft, draft_tokens[:, None], axis=1)[:, 0]  # float32[G]
    q_x = jnp.take_along_axis(q, draft_tokens[:, None], axis=1)[:, 0]  # float32[G]
    ratio = acceptance_ratio(p_x, q_x)  # float32[G]
    accepted = (u < ratio).astype(jnp.int32)  # int32[G]
    num_accepted = jnp.sum(jnp.cumprod(accepted)).astype(jnp.int32)  # int32[]

    # Only the row where the chain stopped is needed: O(V) instead of O(G V).
    if g > 0:
        stop = jnp.minimum(num_accepted, g - 1)
        rejected_dist = residual(p[stop], q[stop])  # float32[V]
        next_dist = jnp.where(num_accepted < g, rejected_dist, p[g])
    else:
        next_dist = p[0]
    accept_prob = jnp.sum(jnp.minimum(p_draft, q), axis=-1)  # float32[G]
    return ChainCore(num_accepted, next_dist, ratio, accept_prob)


def _sample_chain(key: jax.Array, g: int, core_fn: Callable[[jax.Array], ChainCore]) -> ChainVerdict:
    """Draws the randomness of one chain verification and feeds it to a core."""
    key_accept, key_draw = jax.random.split(key)
    u = jax.random.uniform(key_accept, (g,), jnp.float32)  # [0, 1): one uniform per position
    core = core_fn(u)
    next_token = sample_from_probs(key_draw, core.next_dist)  # zeros are never drawn
    return ChainVerdict(num_accepted=core.num_accepted, next_token=next_token, accept_prob=core.accept_prob)


def rejection_chain(key: jax.Array, p: jax.Array, q: jax.Array, draft_tokens: jax.Array) -> ChainVerdict:
    """Verify G sampled draft tokens by speculative rejection sampling (Leviathan Alg. 1).

    Args:
      key: PRNG key for this row.
      p: float32[G+1, V] target distributions: p[i] at draft position i, p[G] for the bonus token.
      q: float32[G, V] proposer distributions the draft tokens were SAMPLED from.
      draft_tokens: int32[G] draft tokens, ``draft_tokens[i] ~ q[i]``.

    Returns:
      ChainVerdict. Emitted tokens = ``draft_tokens[:num_accepted]`` then ``next_token``; they are
      distributed exactly as sampling from p. Tokens with ``q(x) == 0`` are handled as described in
      :func:`acceptance_ratio` (accepted iff ``p(x) > 0``).
    """
    p = jnp.asarray(p, jnp.float32)
    q = jnp.asarray(q, jnp.float32)
    draft_tokens = jnp.asarray(draft_tokens)
    g, _ = _check_shapes(p, q, draft_tokens)
    return _sample_chain(key, g, lambda u: chain_core(u, p, q, draft_tokens))


def deterministic_q(draft_tokens: jax.Array, vocab_size: int) -> jax.Array:
    """The proposal distribution of tokens chosen without sampling: ``one_hot(x)``, float32[G, V]."""
    return jax.nn.one_hot(draft_tokens, vocab_size, dtype=jnp.float32)


def deterministic_core(u: jax.Array, p: jax.Array, draft_tokens: jax.Array) -> ChainCore:
    """:func:`chain_core` for deterministic proposals: q = one_hot(draft_tokens).

    Args:
      u: float32[G] acceptance uniforms in [0, 1).
      p: float32[G+1, V] target distributions.
      draft_tokens: int32[G] proposed tokens.
    """
    p = jnp.asarray(p, jnp.float32)
    draft_tokens = jnp.asarray(draft_tokens)
    _, v = _check_shapes(p, None, draft_tokens)
    return chain_core(u, p, deterministic_q(draft_tokens, v), draft_tokens)


def deterministic_chain(key: jax.Array, p: jax.Array, draft_tokens: jax.Array) -> ChainVerdict:
    """Verify G draft tokens that were chosen WITHOUT sampling (ALGORITHMS.md section 4).

    For n-grams, prompt lookup, lookahead / Jacobi guesses, top-k tree children: the proposal law
    is ``q = one_hot(x)``, so x is accepted with probability ``p(x)`` and on rejection the token is
    drawn from ``norm(p with p(x) set to 0)``. This is the same mechanism as
    :func:`rejection_chain` with one-hot q. It deliberately takes no q: verifying a deterministically
    chosen token against a soft draft distribution biases the output.

    Args:
      key: PRNG key for this row.
      p: float32[G+1, V] target distributions (p[G] for the bonus token).
      draft_tokens: int32[G] proposed tokens.

    Returns:
      ChainVerdict; ``accept_prob[i] = p_i(x_i)``.
    """
    p = jnp.asarray(p, jnp.float32)
    draft_tokens = jnp.asarray(draft_tokens)
    g, _ = _check_shapes(p, None, draft_tokens)
    return _sample_chain(key, g, lambda u: deterministic_core(u, p, draft_tokens))
