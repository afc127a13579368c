"""Retrieval: candidates from a token datastore, found by the row's longest matching suffix (REST,
He et al. 2024, "REST: Retrieval-Based Speculative Decoding", arXiv 2311.08252; SuffixDecoding,
Oliaro et al. 2024, arXiv 2411.04975). The datastore (``specjax.retrieval.Datastore``) is a
corpus of token ids with a suffix array, built offline; here is what runs inside the loop.

Per row and iteration, with static shapes and no host round trip:

1. **Longest match** (``match_ranges``): for every m = 1..``max_suffix`` the suffix-array range
   ``[lo, hi)`` of the corpus positions where the row's last m tokens (the pending token
   included) occur, by two binary searches (lower and upper bound) of ``ceil(log2(n + 1))``
   fixed steps, all m at once; the longest m with ``hi > lo`` wins (REST's "exact match from the
   longest suffix down").
2. **Continuations** (``continuations``): at most ``samples`` occurrences of that range, evenly
   spaced through it (the range is sorted by what follows the match, so an even stride is a
   stratified sample: a continuation that follows a fraction f of the occurrences gets about
   ``f x samples`` of them), each followed for ``num_tokens`` tokens, cut at the end of its
   document.
3. **Trie by frequency** (``frequency_trie``): every distinct prefix of those continuations
   counts the continuations that start with it; the ``nodes`` most frequent prefixes are the
   tree (REST's top-frequency selection from its trie), at most ``branches`` children per node
   (the most frequent ones). Ties go to the shallower prefix, then to the lexicographically
   smaller one (suffix-array order), so a prefix always ranks above its extensions and the kept
   set is a tree.
4. **Per-request source** (SuffixDecoding; ``per_request=True``): the row's own text (prompt +
   output so far) is a second corpus. Its longest earlier occurrence of the last m tokens
   (``own_continuations``, the comparison prompt lookup makes) gives the continuations of the
   ``samples`` most recent occurrences, and step 3 makes their trie. Each row then takes the
   tree of the higher score (the sum of its nodes' estimated probabilities), as SuffixDecoding
   picks between its per-request and global suffix trees; ``max_spec_factor`` caps a tree's
   depth at that factor times its match length. Without a datastore, the row's text is the only
   source (a token tree of prompt-lookup continuations, counted by frequency).

The tree reaches the loop as a per-row ``RowTrees`` (like lookahead's); slots the trie leaves
empty (few or no occurrences) are dead nodes, scored but in no children list. The candidates are
a function of the row's text and the datastore, chosen without sampling, so the loop verifies them
with the one-hot rule at T > 0 (ALGORITHMS.md §4-5: exact for any such tree) and by the greedy walk
at T = 0 (the greedy tokens). No match only costs acceptance: the tree is empty, the pass emits
one token.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from specjax.proposers.base import TREE, Candidates
from specjax.proposers.draft_free import TokenHistory
from specjax.proposers.dynamic_tree import row_trees
from specjax.proposers.prompt_lookup import common_suffix_runs

# ----------------------------------------------------------------------------- the lookup


def match_ranges(corpus: jax.Array, suffixes: jax.Array, text: jax.Array, lengths: jax.Array,
                 max_suffix: int) -> tuple[jax.Array, jax.Array]:
  """Where the last m tokens of each row's text occur in the corpus, for m = 1..``max_suffix``.

  Args:
    corpus: int32[n] documents, each followed by a separator (a value >= the vocabulary size).
    suffixes: int32[n] the corpus positions sorted by the suffix starting there (lexicographic).
    text: int32[B, W] each row's text ``text[b, :lengths[b]]`` (lengths >= 1).
  Returns:
    (int32[B, M] lo, int32[B, M] hi): column m - 1 is the range of ``suffixes`` whose suffix
    starts with the row's last m tokens (empty, lo == hi, when m exceeds the text's length).
  """
  n = suffixes.shape[0]
  batch, width = text.shape
  m = max_suffix
  k = np.arange(m)
  # The last M tokens, right-aligned; pattern i = the last i + 1 of them (a pattern longer than
  # the text reads clipped positions, and its range is emptied at the end: ``fits``).
  tail = jnp.take_along_axis(text, jnp.clip(lengths[:, None] - m + k[None, :], 0, width - 1),
                             axis=1)
  pattern = tail[:, np.clip(m - 1 - k[:, None] + k[None, :], 0, m - 1)]  # [B, M, M]
  used = k[None, :] <= k[:, None]  # [M, M]: pattern i has i + 1 tokens

  def compare(index):
    """sign(suffix at sa[index] - pattern) over the pattern's length (0: it starts with it)."""
    start = suffixes[jnp.clip(index, 0, n - 1)]  # [B, M]
    window = corpus[jnp.minimum(start[..., None] + k, n - 1)]  # [B, M, M]
    differ = (window != pattern) & used
    first = jnp.argmax(differ, axis=-1)[..., None]
    below = (jnp.take_along_axis(window, first, -1) < jnp.take_along_axis(pattern, first, -1))
    return jnp.where(differ.any(-1), jnp.where(below[..., 0], -1, 1), 0)

  def step(_, bounds):  # one step of both binary searches (lower and upper bound)
    out = []
    for lo, hi, strict in ((bounds[0], bounds[1], False), (bounds[2], bounds[3], True)):
      mid = (lo + hi) // 2
      sign = compare(mid)
      right = (sign <= 0) if strict else (sign < 0)
      live = lo < hi
      out += [jnp.where(live & right, mid + 1, lo), jnp.where(live & ~right, mid, hi)]
    return tuple(out)

  zeros = jnp.zeros((batch, m), jnp.int32)
  full = jnp.full((batch, m), n, jnp.int32)
  steps = max(1, math.ceil(math.log2(n + 1)))
  lower, _, upper, _ = jax.lax.fori_loop(0, steps, step, (zeros, full, zeros, full))
  fits = (k[None, :] + 1) <= lengths[:, None]
  return lower, jnp.where(fits, upper, lower)


def continuations(corpus: jax.Array, suffixes: jax.Array, lo: jax.Array, hi: jax.Array,
                  match: jax.Array, samples: int, depth: int,
                  vocab_size: int) -> tuple[jax.Array, jax.Array]:
  """The tokens after ``samples`` occurrences spread evenly through ``suffixes[lo:hi]``.

  Occurrence i is entry ``lo + i`` when the range holds at most ``samples`` entries, else entry
  ``lo + floor(i (hi - lo) / samples)``; its continuation starts ``match`` tokens after the
  entry's position.

  Returns:
    (int32[B, S, D] tokens, bool[B, S, D] valid: the occurrence exists and its document has not
    ended by that depth).
  """
  n = suffixes.shape[0]
  count = hi - lo
  i = jnp.arange(samples, dtype=jnp.int32)[None, :]
  quotient, remainder = (count // samples)[:, None], (count % samples)[:, None]
  offset = jnp.where(count[:, None] <= samples, i, i * quotient + (i * remainder) // samples)
  start = suffixes[jnp.clip(lo[:, None] + offset, 0, n - 1)] + match[:, None]  # [B, S]
  tokens = corpus[jnp.minimum(start[..., None] + jnp.arange(depth), n - 1)]
  valid = jnp.cumprod(tokens < vocab_size, axis=-1).astype(bool) & (i < count[:, None])[..., None]
  return tokens, valid


def longest_match(corpus: jax.Array, suffixes: jax.Array, text: jax.Array, lengths: jax.Array,
                  max_suffix: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(int32[B] m, lo, hi): the longest m <= ``max_suffix`` whose last-m-token range is not
  empty and that range (m = 0 and an empty range when not even the last token occurs)."""
  lo, hi = match_ranges(corpus, suffixes, text, lengths, max_suffix)
  found = hi > lo
  best = jnp.max(jnp.where(found, jnp.arange(1, max_suffix + 1), 0), axis=1)
  col = jnp.maximum(best - 1, 0)[:, None]
  lo, hi = jnp.take_along_axis(lo, col, 1)[:, 0], jnp.take_along_axis(hi, col, 1)[:, 0]
  return best, lo, jnp.where(best > 0, hi, lo)


def own_continuations(text: jax.Array, lengths: jax.Array, max_suffix: int, samples: int,
                      depth: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """SuffixDecoding's per-request source: the row's own text (prompt + output so far) as a second
  corpus. The longest m <= ``max_suffix`` such that the text's last m tokens occur earlier in it,
  and the continuations of the ``samples`` most recent such occurrences, cut at the text's end.

  Returns:
    (int32[B] m (0: not even the last token occurs earlier), int32[B, S, D] tokens, bool[B, S, D]
    valid), most recent occurrence first.
  """
  batch, width = text.shape
  run = common_suffix_runs(text, lengths, max_suffix)  # [B, L]
  match = run.max(axis=1)
  c = jnp.arange(width, dtype=jnp.int32)
  occurs = (run == match[:, None]) & (match[:, None] > 0)
  starts, _ = jax.lax.top_k(jnp.where(occurs, c[None, :], -1), min(samples, width))
  if samples > width:
    starts = jnp.pad(starts, ((0, 0), (0, samples - width)), constant_values=-1)
  position = starts[..., None] + jnp.arange(depth, dtype=jnp.int32)  # [B, S, D]
  valid = (starts[..., None] >= 0) & (position < lengths[:, None, None])
  tokens = jnp.take_along_axis(text, jnp.clip(position, 0, width - 1).reshape(batch, -1),
                               axis=1).reshape(position.shape)
  return match, jnp.where(valid, tokens, 0), valid


# ----------------------------------------------------------------------------- the trie


def frequency_trie(tokens: jax.Array, valid: jax.Array, nodes: int,
                   branches: int) -> tuple[jax.Array, ...]:
  """The ``nodes`` most frequent prefixes of the continuations ``tokens`` (int32[B, S, D], where
  ``valid``), at most ``branches`` children per node (module docstring, step 3).

  A prefix is named by its first continuation ``s`` and its last depth ``d``; its count is the
  number of continuations that start with it. Order: count desc, then depth asc, then ``s`` asc
  (continuations come in suffix-array order: lexicographic). A prefix is eligible when it and its
  ancestors each rank below ``branches`` among their siblings; the ``nodes`` first eligible ones
  are kept, in that order (so parents precede children).

  Returns:
    (int32[B, N] node tokens, int32[B, N] parent node (-1: the root), int32[B, N] rank among its
    siblings (``branches`` for a dead node), int32[B, N] depth (1 = the root's children),
    bool[B, N] live, int32[B, N] the count of each node's prefix (0 for a dead node)).
  """
  batch, num, depth = tokens.shape
  size = num * depth
  agree = (tokens[:, :, None, :] == tokens[:, None, :, :]) & valid[:, :, None, :] \
      & valid[:, None, :, :]
  same = jnp.cumprod(agree, axis=-1).astype(bool)  # [B, S, S', D] equal prefixes up to depth d
  count = same.sum(2)  # [B, S, D]
  canon = jnp.argmax(same, axis=2).astype(jnp.int32)  # [B, S, D] the first continuation sharing it
  s, d = np.arange(num)[:, None], np.arange(depth)[None, :]
  distinct = valid & (canon == s)
  key = jnp.where(distinct, count * size + (depth - 1 - d) * num + (num - 1 - s), -1)
  key = key.reshape(batch, size)  # node (s, d) -> s * D + d
  d_flat = np.tile(np.arange(depth), num)
  parent = jnp.where(d_flat > 0, canon[:, np.repeat(np.arange(num), depth), np.maximum(
      d_flat - 1, 0)] * depth + d_flat - 1, -1)  # [B, K] the parent prefix (-1: the root)
  rank = jnp.sum((parent[:, None, :] == parent[:, :, None]) & (key[:, None, :] > key[:, :, None]),
                 axis=2)  # [B, K] a distinct prefix's rank among its siblings
  ok = (rank < branches).reshape(batch, num, depth)
  # (s, d)'s ancestors are (canon[s, e], e) for e < d: eligible iff all of them and itself are ok.
  ok_along = jnp.take_along_axis(ok, canon, axis=1)  # [B, S, D]: ok[canon[s, e], e]
  eligible = jnp.cumprod(ok_along, axis=-1).astype(bool).reshape(batch, size)
  best, chosen = jax.lax.top_k(jnp.where(eligible, key, -1), nodes)
  live = best >= 0
  rows = jnp.arange(batch)[:, None]
  position = jnp.full((batch, size), -1, jnp.int32).at[rows, chosen].set(
      jnp.where(live, jnp.arange(nodes, dtype=jnp.int32), -1))
  parent_prefix = jnp.take_along_axis(parent, chosen, 1)  # a kept node's parent is kept
  parent_node = jnp.where(live & (parent_prefix >= 0), jnp.take_along_axis(
      position, jnp.maximum(parent_prefix, 0), 1), -1)
  node_tokens = jnp.where(live, jnp.take_along_axis(tokens.reshape(batch, size), chosen, 1), 0)
  node_rank = jnp.where(live, jnp.take_along_axis(rank, chosen, 1), branches)
  node_depth = jnp.where(live, jnp.asarray(d_flat)[chosen] + 1, 1)
  node_count = jnp.where(live, best // size, 0)
  return node_tokens, parent_node, node_rank, node_depth.astype(jnp.int32), live, node_count


# ----------------------------------------------------------------------------- the proposer


@dataclasses.dataclass(frozen=True)
class RetrievalProposer:
  """The proposer of ``sj.Retrieval``: a tree of ``nodes`` tokens, ``num_tokens`` deep, from the
  datastore passed as params ``(corpus, suffixes)`` (traced device arrays; ``None``: no
  datastore) and, with ``per_request``, from the row's own text (SuffixDecoding's per-request
  tree); its state is the rows' text (``TokenHistory``).

  With both sources each row gets the tree of the higher score, the sum of its nodes' estimated
  probabilities (a node's count over the continuations counted; the sum is the expected number of
  accepted tokens, were the continuations' frequencies the target's law), ties to the row's own
  text: SuffixDecoding's rule (Oliaro et al. 2024, §4; ArcticInference's
  ``SuffixDecodingCache.speculate``).
  ``max_spec_factor`` caps a tree's depth at ``floor(factor x match length)`` (SuffixDecoding's
  ``max_spec_factor``): a short match, weak evidence, gets a shallow tree and so a low score.
  """

  num_tokens: int
  nodes: int
  branches: int
  max_suffix: int
  samples: int
  vocab_size: int
  per_request: bool = False
  max_spec_factor: float | None = None

  draft_calls_per_iteration = 0
  prefill_draft_calls = 0

  @property
  def num_candidates(self) -> int:
    return self.nodes

  @property
  def depth(self) -> int:
    return self.num_tokens

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    del params
    return TokenHistory.of_prompt(prompt, prompt_lengths, cache_length)

  def _trie(self, match, follow, valid):
    """(trie arrays, float32[B] score) of one source's continuations."""
    if self.max_spec_factor is not None:
      room = jnp.floor(match * self.max_spec_factor + 1e-6).astype(jnp.int32)
      valid &= jnp.arange(self.num_tokens)[None, None, :] < room[:, None, None]
    tokens, parents, ranks, depths, _, counts = frequency_trie(follow, valid, self.nodes,
                                                               self.branches)
    score = counts.sum(axis=1) / jnp.maximum(valid[:, :, 0].sum(axis=1), 1)
    return (match, tokens, parents, ranks, depths, counts), score

  def tree(self, params, text: jax.Array, lengths: jax.Array):
    """The candidates for the texts ``text[b, :lengths[b]]``, with what they came from: (
    Candidates, int32[B] the matched suffix length, int32[B, N] each node's count: how many of
    the sampled continuations start with its path, 0 for a dead slot)."""
    sources = []
    if params is not None:
      corpus, suffixes = params
      match, lo, hi = longest_match(corpus, suffixes, text, lengths, self.max_suffix)
      follow, valid = continuations(corpus, suffixes, lo, hi, match, self.samples,
                                    self.num_tokens, self.vocab_size)
      sources.append(self._trie(match, follow, valid))
    if self.per_request:
      sources.append(self._trie(*own_continuations(text, lengths, self.max_suffix, self.samples,
                                                   self.num_tokens)))
    if not sources:
      raise ValueError("retrieval needs a datastore or per_request=True")
    chosen, score = sources[0]
    for other, other_score in sources[1:]:  # ties go to the later source: the row's own text
      take = other_score >= score
      chosen = jax.tree.map(lambda a, b: jnp.where(take.reshape((-1,) + (1,) * (a.ndim - 1)),
                                                   b, a), chosen, other)
      score = jnp.maximum(score, other_score)
    match, tokens, parents, ranks, depths, counts = chosen
    trees = row_trees(parents, ranks, depths, self.branches, self.num_tokens)
    candidates = Candidates(tokens=tokens, q=None, kind=TREE, rule="one_hot", row_trees=trees)
    return candidates, match, counts

  def propose(self, params, state: TokenHistory, pending, keys, sampling):
    del keys, sampling  # deterministic whatever the sampling: one-hot rule
    state = state.with_pending(pending)
    candidates, _, _ = self.tree(params, state.tokens, state.lengths + 1)
    return candidates, state

  def commit(self, params, state: TokenHistory, candidates, outcome):
    del params
    accepted = jnp.take_along_axis(candidates.tokens, jnp.maximum(outcome.path, 0), axis=1)
    return state.commit(accepted, outcome)
