"""DeepSeek-V3's sequential MTP modules (``specjax.heads.mtp.MTPStack``; arXiv 2412.19437 §2.2)
drafting a chain: ``sj.MTP(stack, gamma=...)`` with ``gamma <= D`` (one module alone chains on
itself through ``EagleChain`` instead).

Module ``k``'s entry ``t`` reads ``h^{k-1}_t`` (module ``k - 1``'s output at ``t``; the target's
feature for k = 1) and token ``x_{t+k}``; its output predicts ``x_{t+k+1}``. With ``x_P`` pending
(``P`` = the target's committed length), draft ``d_k`` is module ``k``'s prediction at entry
``P - 1``: module 1 reads ``(x_P, f_{P-1})``, module 2 ``(d_1, h^1_{P-1})``, and so on.

Invariant between iterations (``c`` = EAGLE's waiting count, the accepted drafts + 1): module 1's
state is EAGLE's (``EagleState``: committed length ``L_1 = P - c``, the ``c`` waiting pairs);
module ``k``'s committed entries are its true ones up to the waiting tokens, ``L_k = L_1 -
(k - 1)`` of them, and ``carry_k`` is its output at its last committed entry ``L_k - 1`` (kept for
``k < gamma``). One pass per module per iteration covers module ``k``'s entries ``L_k .. P - 1``:
``c + k - 1`` columns (static width ``gamma + k``, ragged per row), the ``c`` waiting tokens and
then ``d_1 .. d_{k-1}``, then pads (after every real column, so the causal mask hides them); its
hidden inputs are ``[carry_{k-1} ; module k-1's pass outputs]`` (module ``k - 1``'s pass starts
one entry later, so the columns align). ``d_k`` comes from column ``c + k - 2`` (entry ``P - 1``).
The first ``c`` columns are true entries: they become committed (``L_k + c``), and column
``c - 1`` is the next carry. ``commit`` takes module 1's state from EAGLE's ``commit`` and the
carries of active rows (finished rows keep theirs).

Young rows: while ``L_1 < k - 1`` (a prompt shorter than ``k`` tokens, in its first iterations)
module ``k``'s first ``k - 1 - L_1`` columns would be entries before 0; the row's columns are
shifted left past them (``shift``: its cache stays empty until its first true entry, its carry is
not read until then), so any prompt length works and the drafts stay DeepSeek's modules over
what exists. Prefill: module ``k`` over prompt entries ``t <= length - 1 - k`` (tokens
``prompt[:, k:]``, hidden inputs module ``k - 1``'s prefill outputs). Sampling: ``d_k`` is drawn
from module ``k``'s warped law, the ``q`` the chain rule verifies (lossless; greedy: argmax,
q = None).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specjax.models.kv_cache import init_cache
from specjax.proposers import eagle
from specjax.proposers.base import CHAIN, Candidates
from specjax.proposers.draft_chain import GammaChain, draw


@flax.struct.dataclass
class StackState:
  first: eagle.EagleState  # module 1's cache and the waiting pairs (EAGLE's invariant)
  caches: tuple  # KVCache of modules 2..gamma: module k committed = module 1's - (k - 1)
  carries: jax.Array  # [B, gamma - 1, E] module k's output at its last committed entry
  next_carries: jax.Array  # the same after this iteration's passes (``commit`` keeps them)


def prefill(models: eagle.Models, prompt: jax.Array, prompt_lengths: jax.Array,
            cache_length: int, features: jax.Array, gamma: int) -> StackState:
  """Modules ``1..gamma`` over the prompt: module ``k`` over entries ``t <= length - 1 - k``
  (none for a prompt of ``<= k`` tokens)."""
  modules = models.head.modules
  batch, width = prompt.shape
  rows = jnp.arange(batch)
  first, hidden = eagle.prefill_outputs(models.with_head(modules[0]), prompt, prompt_lengths,
                                        cache_length, features, gamma)
  config = models.head.config
  zeros = jnp.zeros((batch, config.hidden_size), jnp.dtype(config.dtype))
  caches, carries = [], []
  for k in range(2, gamma + 1):  # hidden: module k - 1's outputs, entry t at column t
    # its last committed entry, length - k (unused while module k has no committed entry)
    carries.append(zeros if hidden is None else
                   hidden[rows, jnp.maximum(prompt_lengths - k, 0)].astype(zeros.dtype))
    module = models.with_head(modules[k - 1])
    cache = init_cache(module.head.config, batch, cache_length)
    hidden_k = None
    if width > k:
      hidden_k, cache = module.step(prompt[:, k:], hidden[:, :-1], cache)
    hidden = hidden_k
    caches.append(cache.with_lengths(jnp.maximum(prompt_lengths - k, 0)))
  carries = jnp.stack(carries, axis=1) if carries else zeros[:, None][:, :0]
  return StackState(first=first, caches=tuple(caches), carries=carries, next_carries=carries)


def shift(x: jax.Array, offset: jax.Array) -> jax.Array:
  """``x[b, j + offset[b]]`` along axis 1 (indices clipped to the width): a row's columns moved
  left by its ``offset`` (right when negative)."""
  width = x.shape[1]
  index = jnp.clip(jnp.arange(width)[None, :] + offset[:, None], 0, width - 1)
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def propose(models: eagle.Models, state: StackState, pending: jax.Array, keys: jax.Array,
            sampling, gamma: int):
  """(Candidates: the chain ``d_1..d_gamma`` and their laws, the state with every module's pass
  written; ``commit`` sets the lengths and carries). Columns are "raw": module ``k``'s column
  ``j`` is its entry ``L_k + j`` with ``L_k = L_1 - (k - 1)``; a young row's negative entries
  (``L_k < 0``: a prompt shorter than ``k``) are shifted out of its pass (``shift``)."""
  modules = models.head.modules
  count = state.first.count
  first_length = state.first.cache.lengths  # L_1 = P - count
  rows = jnp.arange(pending.shape[0])
  module = models.with_head(modules[0])
  tokens, raw, cache = eagle.waiting_pass(module, state.first, pending)
  token, q = draw(keys[:, 0], module.logits(raw[rows, count - 1]), sampling)
  drafts, laws, carries, caches = [token], [q], [], []
  for k in range(2, gamma + 1):  # raw: module k - 1's outputs in raw columns
    carries.append(raw[rows, count - 1])  # module k - 1's output at its new last entry
    tokens = jnp.pad(tokens, ((0, 0), (0, 1))).at[rows, count + k - 2].set(token)
    inputs = jnp.concatenate([state.carries[:, k - 2, None].astype(raw.dtype), raw], axis=1)
    offset = jnp.maximum(k - 1 - first_length, 0)  # the row's entries before 0
    module = models.with_head(modules[k - 1])
    out, cache_k = module.step(shift(tokens, offset), shift(inputs, offset), state.caches[k - 2])
    caches.append(cache_k.with_lengths(jnp.maximum(first_length - (k - 1) + count, 0)))
    raw = shift(out, -offset)
    token, q = draw(keys[:, k - 1], module.logits(raw[rows, count + k - 2]), sampling)
    drafts.append(token)
    laws.append(q)
  next_carries = jnp.stack(carries, axis=1).astype(state.carries.dtype) if carries else \
      state.carries
  return chain_candidates(drafts, laws), state.replace(
      first=state.first.replace(cache=cache), caches=tuple(caches), next_carries=next_carries)


def chain_candidates(drafts: list, laws: list) -> Candidates:
  """The chain of drafts (int32[B] each) with their laws (float32[B, V] each, or all None)."""
  q = None if laws[0] is None else jnp.stack(laws, axis=1)
  return Candidates(tokens=jnp.stack(drafts, axis=1), q=q, kind=CHAIN)


def commit(state: StackState, drafts: jax.Array, outcome) -> StackState:
  """Module 1: EAGLE's ``commit``; module k's length is module 1's less ``k - 1``; active rows
  take this iteration's carries."""
  first = eagle.commit(state.first, drafts, outcome)
  lengths = first.cache.lengths
  caches = tuple(cache.with_lengths(jnp.maximum(lengths - k, 0))
                 for k, cache in enumerate(state.caches, 1))
  carries = jnp.where(outcome.active[:, None, None], state.next_carries, state.carries)
  return state.replace(first=first, caches=caches, carries=carries, next_carries=carries)


@dataclasses.dataclass(frozen=True)
class MTPStackChain(GammaChain, eagle.EagleProposer):
  """The proposer of ``sj.MTP(stack, gamma=...)``: ``gamma <= D`` drafts, module ``k`` drafting
  the ``k``-th, one pass of each module per iteration (``gamma`` at prefill too)."""

  head_graphdef: Any
  target_graphdef: Any
  features: tuple  # the target layers module 1 reads
  gamma: int

  @property
  def prefill_draft_calls(self) -> int:
    return self.gamma

  def prefill(self, params, prompt, prompt_lengths, cache_length, features):
    return prefill(self.models(params), prompt, prompt_lengths, cache_length, features,
                   self.gamma)

  def propose(self, params, state, pending, keys, sampling):
    return propose(self.models(params), state, pending, keys, sampling, self.gamma)

  def commit(self, params, state, candidates, outcome):
    del params
    return commit(state, candidates.tokens, outcome)
