"""A draft model proposing a chain of ``gamma`` tokens, with its own KV cache.

The draft lags the target by design: after an iteration in which all ``gamma`` drafts were
accepted, the last draft ``x_gamma`` was never fed to the draft model (only its successor was
needed). Rather than spending an extra draft pass, the next iteration's first draft step feeds two
tokens ``[x_gamma, pending]`` for rows that are behind and ``[pending, pending]`` (both at the same
position, so the second is a duplicate) for the others, so each iteration costs exactly ``gamma``
draft passes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax import sampling as sampling_lib
from specjax.models.kv_cache import KVCache, init_cache
from specjax.models.transformer import NORMED, Transformer, select_tokens
from specjax.proposers.base import CHAIN, Candidates


@flax.struct.dataclass
class DraftChainState:
  cache: KVCache
  behind: jax.Array  # bool[B] the row's last accepted draft is not in the draft cache yet
  last_draft: jax.Array  # int32[B] that token, when behind


def prefill(draft: Transformer, cache: KVCache, prompt: jax.Array,
            prompt_lengths: jax.Array) -> DraftChainState:
  """Feeds the (right-padded) prompts; the draft then holds exactly the prompt, like the target."""
  _, cache = draft(prompt, cache)
  batch = prompt.shape[0]
  return DraftChainState(cache=cache.with_lengths(prompt_lengths),
                         behind=jnp.zeros((batch,), bool),
                         last_draft=jnp.zeros((batch,), jnp.int32))


def draw(keys: jax.Array, logits: jax.Array, sampling: sampling_lib.Sampling,
         guess: jax.Array | None = None):
  """One token per row, plus the (warped) proposal distribution it was drawn from. Greedy:
  ``guess`` (``run``'s, the same token) where given, so that XLA drops the V-wide logits."""
  if sampling.is_greedy:
    return (sampling_lib.greedy(logits) if guess is None else guess), None
  q = sampling_lib.probabilities(logits, sampling)
  return jax.vmap(sampling_lib.sample_from_probs)(keys, q), q


def run(draft: Transformer, tokens: jax.Array, cache: KVCache, tree_mask=None, depths=None,
        logits_at: int | None = None, greedy: bool = False):
  """The draft's pass over ``tokens`` int32[B, T]: (float32[B, K, V] logits at ``logits_at``
  (all T tokens when None), int32[B, K] their greedy guesses or None, the cache). The guesses
  come when ``greedy`` and the draft has ``greedy_draft`` (a reduced-vocabulary draft: the argmax
  over its kept ids, ``reduced_vocab.kept_argmax``); a caller reading only them leaves the
  V-wide rows unused, and XLA does not build them."""
  reader = getattr(draft, "greedy_draft", None) if greedy else None
  if reader is None:
    logits, cache = draft(tokens, cache, tree_mask, depths, logits_at=logits_at)
    return logits, None, cache
  logits, cache, normed = draft(tokens, cache, tree_mask, depths, logits_at=logits_at,
                                features=(NORMED,))
  normed = normed[:, :, 0] if logits_at is None else select_tokens(normed[:, :, 0], logits_at)
  return logits, reader(normed), cache


def first_step(draft: Transformer, state: DraftChainState, pending: jax.Array,
               greedy: bool = False):
  """(float32[B, V] the draft's logits after ``pending``, int32[B] its greedy guess (``run``) or
  None, its cache holding ``pending``)."""
  behind = state.behind
  first = jnp.stack([jnp.where(behind, state.last_draft, pending), pending], axis=1)
  # A row behind feeds the chain [x_gamma, pending]; any other row feeds pending twice, both at
  # depth 0 and each seeing only itself, so for every row the second token's logits are the ones
  # needed, and the vocabulary projection runs for that token only.
  ones, zeros = jnp.ones_like(behind), jnp.zeros_like(behind)
  tree_mask = jnp.stack([ones, zeros, behind, ones], axis=1).reshape(-1, 2, 2)  # [[1,0],[behind,1]]
  depths = jnp.stack([zeros, behind], axis=1).astype(jnp.int32)
  logits, guess, cache = run(draft, first, state.cache, tree_mask, depths, 1, greedy)
  return logits[:, 0], column0(guess), cache.with_lengths(cache.lengths + 1 + behind)


def column0(guess: jax.Array | None) -> jax.Array | None:
  """``guess[:, 0]`` (int32[B, 1] -> int32[B]), None passed through."""
  return None if guess is None else guess[:, 0]


def propose(draft: Transformer, state: DraftChainState, pending: jax.Array, keys: jax.Array,
            sampling: sampling_lib.Sampling, gamma: int):
  """Proposes ``gamma`` tokens after ``pending`` (the target's last emitted token).

  Args:
    keys: key[B, gamma], one per row and draft position.
  Returns:
    (int32[B, gamma] tokens, float32[B, gamma, V] proposal distributions or None when greedy,
     the draft state after the proposal; ``commit`` must follow).
  """
  greedy = sampling.is_greedy
  logits, guess, cache = first_step(draft, state, pending, greedy)
  token, q = draw(keys[:, 0], logits, sampling, guess)

  def step(carry, key):
    cache, token = carry
    logits, guess, cache = run(draft, token[:, None], cache, greedy=greedy)
    cache = cache.with_lengths(cache.lengths + 1)
    token, q = draw(key, logits[:, 0], sampling, column0(guess))
    return (cache, token), (token, q)

  (cache, _), tokens, q = draw_rest(step, (cache, token), token, q, keys)
  return tokens, q, state.replace(cache=cache)


def propose_confident(draft: Transformer, state: DraftChainState, pending: jax.Array,
                      keys: jax.Array, sampling: sampling_lib.Sampling, threshold: float,
                      active: jax.Array):
  """Drafts like ``propose`` with room for ``G = keys.shape[1]`` tokens, but stops after the
  first draft whose own probability (under the warped law it was drawn from; greedy: the raw
  softmax) falls below ``threshold`` in every active row: the draft-confidence early stop of
  Hugging Face's assisted generation (``assistant_confidence_threshold``) and of AdaEDL / SpecDec++.
  The stop depends on the drafts alone, never on the target, so any chain it leaves is verified
  exactly. Returns (int32[] count in 1..G, int32[B, G] tokens (0 past count), float32[B, G, V]
  their laws (zeros past count, and all zeros when greedy), the draft state as ``propose(...,
  gamma=count)`` leaves it)."""
  batch, room = keys.shape[:2]
  logits, _, cache = first_step(draft, state, pending)
  vocab = logits.shape[-1]
  tokens = jnp.zeros((batch, room), jnp.int32)
  laws = jnp.zeros((batch, room, vocab), jnp.float32)

  def put(i, logits, tokens, laws):
    token, q = draw(keys[:, i], logits, sampling)
    law = jax.nn.softmax(logits.astype(jnp.float32), axis=-1) if q is None else q
    confident = jnp.take_along_axis(law, token[:, None], axis=1)[:, 0] >= threshold
    tokens = tokens.at[:, i].set(token)
    if q is not None:
      laws = laws.at[:, i].set(q)
    return token, tokens, laws, jnp.any(confident & active)

  token, tokens, laws, go = put(0, logits, tokens, laws)

  def cond(carry):
    i, _, _, _, _, go = carry
    return go & (i < room)

  def body(carry):
    i, token, cache, tokens, laws, _ = carry
    logits, cache = draft(token[:, None], cache)
    cache = cache.with_lengths(cache.lengths + 1)
    token, tokens, laws, go = put(i, logits[:, 0], tokens, laws)
    return i + 1, token, cache, tokens, laws, go

  count, _, cache, tokens, laws, _ = jax.lax.while_loop(
      cond, body, (jnp.int32(1), token, cache, tokens, laws, go))
  return count, tokens, laws, state.replace(cache=cache)


def sync(draft: Transformer, state: DraftChainState, text: jax.Array, lengths: jax.Array,
         width: int, score=None, greedy: bool = False):
  """Feeds the draft the committed text it has not seen (``catch_up``): after iterations that
  skipped the draft (an adaptive method's plain-decoding choice) the draft is behind by several
  tokens. A row whose only missing token is its ``last_draft`` (``behind``) is left to
  ``propose``. Returns the state, or (state, the two sums) with ``score``."""
  cache, behind, sums = catch_up(draft, state.cache, state.behind, text, lengths, width, score,
                                 greedy)
  state = state.replace(cache=cache, behind=behind)
  return state if score is None else (state, sums)


def catch_up(draft: Transformer, cache: KVCache, behind: jax.Array, text: jax.Array,
             lengths: jax.Array, width: int, score=None, greedy: bool = False):
  """Feeds the draft's ``cache`` the committed text it has not seen (``text[b, :lengths[b]]``
  is the row's text, the target cache's contents), ``width`` tokens per draft pass, as many
  passes as the furthest-behind row needs (none when no row is); a row ``behind`` (bool[B]: its
  cache lacks one token that its next proposal feeds itself) lags only if it lacks more.

  ``score`` (optional): ``score(logits float32[B, width, V], guesses int32[B, width], cols
  int32[B, width], fed bool[B, width]) -> (float32[B], float32[B])``, called on each pass with
  the draft's logits and greedy guesses (``run``'s when ``greedy``, else the logits' argmax) at
  the text columns ``cols`` it fed (``fed``: real text of a row that was behind) and summed over
  the passes: what the draft would have guessed after each of those tokens, for an adaptive
  method to score against the tokens that came (``specjax.proposers.adaptive``). Returns (the
  cache, ``behind`` cleared for the rows fed, the two sums: zeros without ``score``)."""
  batch = text.shape[0]

  def lagging(cache, behind):
    return cache.lengths + behind < lengths

  def feed(carry):
    cache, behind, sums = carry
    start = cache.lengths
    at = start[:, None] + jnp.arange(width)[None, :]
    cols = jnp.minimum(at, text.shape[1] - 1)
    chunk = jnp.maximum(jnp.take_along_axis(text, cols, axis=1), 0)
    # Slots past a row's text are scratch.
    logits, guesses, fed_cache = run(draft, chunk, cache, greedy=greedy)
    lag = lagging(cache, behind)
    if score is not None:
      fed = lag[:, None] & (at < lengths[:, None])
      guesses = sampling_lib.greedy(logits) if guesses is None else guesses
      sums = jax.tree.map(jnp.add, sums, score(logits, guesses, cols, fed))
    new = jnp.where(lag, jnp.minimum(start + width, lengths), start)
    return fed_cache.with_lengths(new), behind & ~lag, sums

  zeros = (jnp.zeros((batch,), jnp.float32),) * 2
  return jax.lax.while_loop(lambda c: jnp.any(lagging(c[0], c[1])), feed, (cache, behind, zeros))


def draw_rest(step, carry, token: jax.Array, q: jax.Array | None, keys: jax.Array):
  """Drafts 2..gamma of a chain whose first (``token`` int32[B], its law ``q``) is drawn:
  ``step(carry, key[B]) -> (carry, (token, q))`` scanned over ``keys[:, 1:]``. Returns (carry,
  int32[B, gamma] tokens, float32[B, gamma, V] laws or None)."""
  carry, (rest, rest_q) = jax.lax.scan(step, carry, jnp.swapaxes(keys[:, 1:], 0, 1))
  tokens = jnp.concatenate([token[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)
  if q is not None:
    q = jnp.concatenate([q[:, None], jnp.swapaxes(rest_q, 0, 1)], axis=1)
  return carry, tokens, q


def commit(state: DraftChainState, drafts: jax.Array, target_length: jax.Array,
           num_accepted: jax.Array, active: jax.Array) -> DraftChainState:
  """Rolls the draft cache back to the accepted prefix.

  ``target_length``: int32[B] target cache length *before* this iteration (the slot of
  ``pending``). The draft cache holds pending and ``x_1..x_{gamma-1}``, so it keeps
  ``1 + min(n, gamma - 1)`` of them; a row that accepted all ``gamma`` is left behind by one.
  """
  gamma = drafts.shape[1]
  length = target_length + 1 + jnp.minimum(num_accepted, gamma - 1)
  keep = lambda new, old: jnp.where(active, new, old)
  return DraftChainState(
      cache=state.cache.with_lengths(keep(length, target_length - state.behind)),
      behind=keep(num_accepted == gamma, state.behind),
      last_draft=keep(drafts[:, -1], state.last_draft))


class GammaChain:
  """The sizes of a proposer drafting a chain of ``self.gamma`` tokens, one draft pass each."""

  prefill_draft_calls = 1

  @property
  def num_candidates(self) -> int:
    return self.gamma

  @property
  def depth(self) -> int:
    return self.gamma

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.gamma


@dataclasses.dataclass(frozen=True)
class DraftChain(GammaChain):
  """The proposer of ``sj.Speculative``: a draft model's chain of ``gamma`` tokens, sampled with
  the run's ``Sampling`` (q = their warped distributions) or greedy (deterministic, q = None).

  ``graphdef`` is the draft's static graph; its weights come in as ``params`` (``nnx.split``).
  """

  graphdef: Any
  gamma: int

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    draft = nnx.merge(self.graphdef, params)
    cache = init_cache(draft.config, prompt.shape[0], cache_length)
    return prefill(draft, cache, prompt, prompt_lengths)

  def propose(self, params, state, pending, keys, sampling):
    tokens, q, state = propose(nnx.merge(self.graphdef, params), state, pending, keys, sampling,
                               self.gamma)
    return Candidates(tokens=tokens, q=q, kind=CHAIN), state

  def commit(self, params, state, candidates, outcome):
    del params  # a chain's path is its first num_accepted tokens
    return commit(state, candidates.tokens, outcome.target_length, outcome.num_accepted,
                  outcome.active)

  def sync(self, params, state, text, lengths, width: int, score=None, greedy: bool = False):
    """Catches the draft up with the committed text (``sync``), for an adaptive method."""
    return sync(nnx.merge(self.graphdef, params), state, text, lengths, width, score, greedy)

  def propose_confident(self, params, state, pending, keys, sampling, threshold, active):
    """``propose_confident`` with room for ``keys.shape[1]`` drafts."""
    return propose_confident(nnx.merge(self.graphdef, params), state, pending, keys, sampling,
                             threshold, active)
