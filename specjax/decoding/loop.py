"""The one decoding loop: prefill, then ``jax.lax.while_loop`` over propose -> verify -> commit.

Everything runs inside one ``jit``; rows advance independently (ragged acceptance is expressed with
per-row lengths and masks, never with data-dependent shapes) and a finished row stops changing.

Randomness: row ``b`` uses ``fold_in(key, b)``; iteration ``t`` of that row uses
``fold_in(row_key, t)`` (``t = 0`` is the first token, drawn from the prefill). A row's tokens
therefore depend only on its prompt, its index in the batch and the key, never on its batch mates.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax import sampling as sampling_lib
from specjax import verify
from specjax.decoding.stats import DecodeStats
from specjax.models.kv_cache import KVCache, init_cache
from specjax.proposers import draft_chain


@flax.struct.dataclass
class LoopState:
  target_cache: KVCache
  proposer: draft_chain.DraftChainState | None
  pending: jax.Array  # int32[B] last emitted token, not yet in the target cache
  out: jax.Array  # int32[B, max_new_tokens + gamma + 1] emitted tokens, -1 elsewhere
  done: jax.Array  # bool[B]
  step: jax.Array  # int32[]
  stats: DecodeStats


def _row_keys(key: jax.Array, batch: int) -> jax.Array:
  return jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(batch))


def _step_keys(row_keys: jax.Array, step: jax.Array, num: int) -> jax.Array:
  """key[B, num]: the keys of one iteration of each row."""
  step_keys = jax.vmap(jax.random.fold_in, (0, None))(row_keys, step)
  return jax.vmap(lambda k: jax.random.split(k, num))(step_keys)


def _draw_one(keys: jax.Array, logits: jax.Array, sampling) -> jax.Array:
  if sampling.is_greedy:
    return sampling_lib.greedy(logits)
  return jax.vmap(sampling_lib.sample_from_probs)(keys, sampling_lib.probabilities(logits, sampling))


def _verify(keys, logits, drafts, q, sampling):
  """Applies the exact verification rule to every row (``verify`` module, one row at a time)."""
  if sampling.is_greedy:
    return jax.vmap(verify.greedy_chain)(sampling_lib.greedy(logits), drafts)
  p = sampling_lib.probabilities(logits, sampling)
  return jax.vmap(verify.rejection_chain)(keys, p, q, drafts)


def _emit(state: LoopState, emitted: jax.Array, num_emitted: jax.Array, eos_ids, max_new: int):
  """Appends ``emitted[b, :num_emitted[b]]`` to each active row, cut at EOS and at the budget.

  Returns (out, generated, done).
  """
  batch, width = emitted.shape
  generated = state.stats.generated
  j = jnp.arange(width)[None, :]
  if eos_ids:
    is_eos = jnp.isin(emitted, jnp.asarray(eos_ids, jnp.int32)) & (j < num_emitted[:, None])
    first_eos = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1), width)
  else:
    first_eos = jnp.full((batch,), width)
  count = jnp.minimum(jnp.minimum(num_emitted, first_eos + 1), max_new - generated)
  count = jnp.where(state.done, 0, count)
  cols = jnp.where(j < count[:, None], generated[:, None] + j, state.out.shape[1])  # drop the rest
  out = state.out.at[jnp.arange(batch)[:, None], cols].set(emitted, mode="drop")
  generated = generated + count
  done = state.done | (first_eos < count) | (generated >= max_new)
  return out, generated, done


def committed_lengths(length: jax.Array, num_accepted: jax.Array, active: jax.Array) -> jax.Array:
  """int32[B] target cache lengths after an iteration: ``pending`` and the ``n`` accepted drafts
  join the context (``n + 1`` slots); the rejected drafts' slots are left past the length, which
  is the whole rollback. Finished rows keep their length."""
  return jnp.where(active, length + num_accepted + 1, length)


def decode(target_graphdef, target_state, draft_graphdef, draft_state, prompt, prompt_lengths,
           key, *, gamma: int, sampling: sampling_lib.Sampling, max_new_tokens: int,
           eos_ids: tuple[int, ...], cache_length: int):
  """Generates for a batch of right-padded prompts. Pure; jit it with the keyword args static.

  Args:
    prompt: int32[B, P] right-padded prompts; prompt_lengths: int32[B] (>= 1).
    gamma: draft tokens per iteration (0 = autoregressive, no draft).
  Returns:
    (int32[B, max_new_tokens] tokens, -1 past each row's length; int32[B] lengths; DecodeStats)
  """
  target = nnx.merge(target_graphdef, target_state)
  draft = None if draft_graphdef is None else nnx.merge(draft_graphdef, draft_state)
  batch = prompt.shape[0]
  rows = jnp.arange(batch)
  row_keys = _row_keys(key, batch)

  # Prefill: the whole prompt goes into the cache; the first token comes from its last logits.
  cache = init_cache(target.config, batch, cache_length)
  logits, cache = target(prompt, cache)
  cache = cache.with_lengths(prompt_lengths)
  first = _draw_one(_step_keys(row_keys, 0, 1)[:, 0], logits[rows, prompt_lengths - 1], sampling)
  proposer = None
  stats = DecodeStats.zeros(batch, gamma).replace(
      target_calls=jnp.int32(1), row_target_calls=jnp.ones((batch,), jnp.int32))
  if draft is not None:
    proposer = draft_chain.prefill(draft, init_cache(draft.config, batch, cache_length), prompt,
                                   prompt_lengths)
    stats = stats.replace(draft_calls=jnp.int32(1))
  state = LoopState(target_cache=cache, proposer=proposer, pending=first,
                    out=jnp.full((batch, max_new_tokens + gamma + 1), -1, jnp.int32),
                    done=jnp.zeros((batch,), bool), step=jnp.int32(1), stats=stats)
  out, generated, done = _emit(state, first[:, None], jnp.ones((batch,), jnp.int32), eos_ids,
                               max_new_tokens)
  state = state.replace(out=out, done=done, stats=stats.replace(generated=generated))

  def body(state: LoopState) -> LoopState:
    keys = _step_keys(row_keys, state.step, gamma + 1)
    active = ~state.done
    if draft is None:
      drafts = jnp.zeros((batch, 0), jnp.int32)
      proposer = None
    else:
      drafts, q, proposer = draft_chain.propose(draft, state.proposer, state.pending, keys[:, 1:],
                                                sampling, gamma)
    tokens = jnp.concatenate([state.pending[:, None], drafts], axis=1)
    logits, cache = target(tokens, state.target_cache)
    if draft is None:
      n = jnp.zeros((batch,), jnp.int32)
      nxt = _draw_one(keys[:, 0], logits[:, 0], sampling)
    else:
      verdict = _verify(keys[:, 0], logits, drafts, q, sampling)
      n, nxt = verdict.num_accepted, verdict.next_token
    j = jnp.arange(gamma + 1)[None, :]
    padded = jnp.concatenate([drafts, jnp.zeros((batch, 1), jnp.int32)], axis=1)
    emitted = jnp.where(j < n[:, None], padded, jnp.where(j == n[:, None], nxt[:, None], -1))
    out, generated, done = _emit(state, emitted, n + 1, eos_ids, max_new_tokens)

    length = state.target_cache.lengths
    cache = cache.with_lengths(committed_lengths(length, n, active))
    s = state.stats
    stats = s.replace(target_calls=s.target_calls + 1, generated=generated,
                      row_target_calls=s.row_target_calls + active)
    if draft is not None:
      proposer = draft_chain.commit(proposer, drafts, length, n, active)
      pos = jnp.arange(gamma)[None, :]
      verified = (pos <= n[:, None]) & active[:, None]  # positions whose test actually ran
      accepted = (pos < n[:, None]) & active[:, None]
      stats = stats.replace(
          draft_calls=s.draft_calls + gamma,
          proposed=s.proposed + gamma * active,
          accepted=s.accepted + jnp.where(active, n, 0),
          proposed_per_position=s.proposed_per_position + active.sum(),
          accepted_per_position=s.accepted_per_position + accepted.sum(0),
          accepted_length_counts=s.accepted_length_counts + jnp.sum(
              (n[:, None] == jnp.arange(gamma + 1)[None, :]) & active[:, None], axis=0),
          alpha_sum=s.alpha_sum + jnp.sum(jnp.where(verified, verdict.accept_prob, 0.0)),
          alpha_count=s.alpha_count + verified.sum())
    return LoopState(target_cache=cache, proposer=proposer,
                     pending=jnp.where(active, nxt, state.pending), out=out, done=done,
                     step=state.step + 1, stats=stats)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return state.out[:, :max_new_tokens], state.stats.generated, state.stats


decode_jit = jax.jit(decode, static_argnums=(0, 2), static_argnames=(
    "gamma", "sampling", "max_new_tokens", "eos_ids", "cache_length"))
