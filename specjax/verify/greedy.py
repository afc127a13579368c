"""Greedy (temperature 0) verification of a draft chain (ALGORITHMS.md section 3).

At temperature 0 the target law is one-hot at ``argmax p_i`` (ties to the lowest id), so speculative
verification reduces to matching: accept draft tokens while they equal the target argmax, emit the
target argmax at the first mismatch, or the bonus ``argmax p_G`` if all G match. The emitted tokens
equal plain greedy decoding token for token (Leviathan et al. 2023, arXiv 2211.17192; Chen et al.
2023, arXiv 2302.01318).

One row, no batch dim; jit/vmap compatible. No randomness, so no key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.verify.rejection import ChainVerdict

__all__ = ["greedy_chain"]


def greedy_chain(target_argmax: jax.Array, draft_tokens: jax.Array) -> ChainVerdict:
    """Verify G draft tokens against the target's argmax tokens.

    Args:
      target_argmax: int32[G+1] target argmax at each draft position plus the bonus position.
      draft_tokens: int32[G] proposed tokens.

    Returns:
      ChainVerdict with ``accept_prob[i] = 1.0`` where ``draft_tokens[i] == target_argmax[i]``,
      else ``0.0`` (the exact acceptance probability of each draft token under greedy).
    """
    target_argmax = jnp.asarray(target_argmax)
    draft_tokens = jnp.asarray(draft_tokens)
    if draft_tokens.ndim != 1:
        raise ValueError(f"draft_tokens must be int32[G], got shape {draft_tokens.shape}")
    (g,) = draft_tokens.shape
    if target_argmax.shape != (g + 1,):
        raise ValueError(f"target_argmax must be int32[G+1] = {(g + 1,)}, got shape {target_argmax.shape}")
    target_argmax = target_argmax.astype(jnp.int32)
    match = draft_tokens.astype(jnp.int32) == target_argmax[:g]  # bool[G]
    num_accepted = jnp.sum(jnp.cumprod(match.astype(jnp.int32))).astype(jnp.int32)  # int32[]
    return ChainVerdict(
        num_accepted=num_accepted,
        next_token=target_argmax[num_accepted],
        accept_prob=match.astype(jnp.float32),
    )
