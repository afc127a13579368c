"""Prompt lookup: guesses copied from earlier in the row's own text (Saxena 2023,
"Prompt Lookup Decoding", github.com/apoorvumang/prompt-lookup-decoding; Hugging Face
``generate(prompt_lookup_num_tokens=...)``; ALGORITHMS.md §10).

For n from ``max_ngram`` down to 1, the last n tokens of the row's text (prompt + emitted tokens +
the pending token) are looked up earlier in that text; the ``num_tokens`` tokens that followed the
most recent occurrence are the guesses. Deterministic, so verified by the one-hot rule (§4): exact
whatever is guessed. Where ours differs from transformers' ``PromptLookupCandidateGenerator``
(transformers 4.x-5.x, ``generation/candidate_generator.py``):

* which occurrence: transformers takes the *earliest* (leftmost) occurrence whose continuation is
  non-empty; we take the *most recent* one (ALGORITHMS.md §10), whose continuation is the row's
  latest copy of that text (the line just edited, the current loop of a repetition);
* text ending: transformers proposes fewer tokens when the continuation reaches the end of the
  text; our shapes are static, so the copy overlaps itself as in LZ77 (guess j is
  ``text[c + j]``, the guesses themselves extending the text): a continuation of ``p < num_tokens``
  tokens repeats with period p, which is exactly what a text that loops with period p does next;
* no match: transformers proposes nothing (a plain step); we guess that the pending token repeats
  (the same overlapping copy with period 1). The target pass has the same static shape anyway;
* transformers also cuts the guesses at an EOS token and before tokens that a logits processor
  forbids; here EOS ends the row in the loop whatever follows it, and there are no processors.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.proposers.base import CHAIN, Candidates
from specjax.proposers.draft_free import DraftFreeChain, TokenHistory


def common_suffix_runs(text: jax.Array, lengths: jax.Array, max_n: int) -> jax.Array:
  """int32[B, L]: for every position c < ``lengths[b]``, how many tokens (up to ``max_n``) the
  text before c, ``text[b, :c]``, shares at its end with the row's whole text
  ``text[b, :lengths[b]]``; 0 at c >= ``lengths[b]``. Run c = n > 0 says: the last n tokens also
  occur at ``[c - n, c)``, followed by ``text[b, c]``. A fixed-size comparison, B x L x ``max_n``,
  no loop over positions (prompt lookup's matches, SuffixDecoding's per-request occurrences)."""
  width = text.shape[1]
  c = jnp.arange(width, dtype=jnp.int32)
  back = jnp.arange(1, max_n + 1, dtype=jnp.int32)  # k: compare text[c - k] with the k-th last
  before = c[:, None] - back[None, :]  # [L, K]
  window = text[:, jnp.maximum(before, 0)]  # [B, L, K]
  suffix = jnp.take_along_axis(text, jnp.maximum(lengths[:, None] - back[None, :], 0), axis=1)
  equal = (window == suffix[:, None, :]) & (before >= 0)[None]
  run = jnp.cumprod(equal.astype(jnp.int32), axis=-1).sum(-1)  # [B, L] common suffix length
  return jnp.where(c[None, :] < lengths[:, None], run, 0)


def lookup(text: jax.Array, lengths: jax.Array, max_ngram: int,
           num_tokens: int) -> tuple[jax.Array, jax.Array]:
  """The prompt-lookup guesses of each row of ``text[b, :lengths[b]]`` (lengths >= 1).

  For every continuation start c < length, the common suffix of ``text[:c]`` and
  ``text[:length]`` up to ``max_ngram`` (``common_suffix_runs``); the longest wins (n from
  ``max_ngram`` down), ties go to the largest c (the most recent occurrence).

  Returns:
    (int32[B, num_tokens] guesses ``text[c + j mod (length - c)]``, int32[B] the matched n, 0
    when nothing matched and the guesses repeat the last token).
  """
  c = jnp.arange(text.shape[1], dtype=jnp.int32)
  run = common_suffix_runs(text, lengths, max_ngram)
  ngram = run.max(axis=1)
  latest = jnp.max(jnp.where(run == ngram[:, None], c[None, :], -1), axis=1)
  start = jnp.where(ngram > 0, latest, lengths - 1)
  period = lengths - start  # >= 1
  j = jnp.arange(num_tokens, dtype=jnp.int32)[None, :]
  guesses = jnp.take_along_axis(text, start[:, None] + j % period[:, None], axis=1)
  return guesses, ngram


@dataclasses.dataclass(frozen=True)
class PromptLookupProposer(DraftFreeChain):
  """The proposer of ``sj.PromptLookup``; its state is the rows' text (``TokenHistory``)."""

  max_ngram: int
  num_tokens: int

  @property
  def num_candidates(self) -> int:
    return self.num_tokens

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    del params
    return TokenHistory.of_prompt(prompt, prompt_lengths, cache_length)

  def propose(self, params, state: TokenHistory, pending, keys, sampling):
    del params, keys, sampling  # deterministic whatever the sampling: q = None (one-hot rule)
    state = state.with_pending(pending)
    guesses, _ = lookup(state.tokens, state.lengths + 1, self.max_ngram, self.num_tokens)
    return Candidates(tokens=guesses, q=None, kind=CHAIN), state

  def commit(self, params, state: TokenHistory, candidates, outcome):
    del params
    return state.commit(candidates.tokens, outcome)
