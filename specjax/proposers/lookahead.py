"""Lookahead decoding: an n-gram pool filled by Jacobi iteration on a 2-D window, scored in the
target's verification pass (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference
Using Lookahead Decoding", arXiv 2402.02057; hao-ai-lab/LookaheadDecoding, ``lade/decoding.py``;
ALGORITHMS.md §9).

Each row keeps a window of ``N - 1`` levels x ``W`` columns; level ``l``, column ``j`` stands for
the token at position ``length + l + j`` (level 0, column 0 is the pending token). The target
scores the window in the candidates' pass (``Candidates.extra``, ``lookahead_mask``): token
``(l, j)`` sees the prefix, level 0 up to column ``j`` and column ``j`` of levels ``1..l`` -- a
contiguous text -- so its argmax is one Jacobi step for position ``length + l + j + 1``. Per pass:

* the top level's argmax ``new[j]`` closes, per column, the n-gram ``(level0[j], level1[j], ...,
  new[j])`` (N consecutive positions), which joins the row's pool keyed by its first token (the
  reference's ``update_token_map``), as do the n-grams that the committed text gains (its
  ``POOL_FROM_PROMPT`` mode, which also seeds the pool with the prompt's n-grams);
* the window moves one position: level ``l`` <- level ``l + 1``, top <- ``new`` (the reference's
  ``ALWAYS_FWD_ONE``, whatever was accepted); no n-grams are collected for the first ``N - 2``
  passes, while levels ``1..N-2`` still hold the initial tokens (the reference's warm-up);
* the candidates are the pool entries keyed by the pending token, ``G`` chains of ``N - 1``
  tokens, most recent first (``NGramPool``).

Deviations from the reference, all for static shapes or acceptance, none for the law:

* initial window: the reference copies random prompt tokens (``set_token = copy_from``); we take
  prompt tokens at fixed pseudo-random positions (a multiplicative hash of the window cell, modulo
  the row's prompt length), a function of the row's own prompt, so no key is needed. The window
  is full from the start (the reference grows it level by level during warm-up);
* candidates sharing a prefix are merged into a trie (per-row ``RowTrees``), so the greedy walk
  finds the longest matching entry, as the reference's verification does (a static
  ``sj.Tree.chains`` would follow the first entry with the right first token only). A chain
  slot without a pool entry holds the level-0 row of the window (Jacobi decoding's guess for the
  next positions); a slot equal to an earlier one up to some depth adds no node there (its
  duplicate nodes are dead leaves behind their twins);
* the pool is a ring of n-grams per row, not a dictionary (``NGramPool``).

Exactness: every candidate is a function of the row's past (pool, window and text were fixed by
earlier passes) chosen without sampling, so the loop verifies it with the one-hot rule at T > 0
(ALGORITHMS.md §4-5; exact for *any* such guesses) and by the greedy walk at T = 0 (the greedy
tokens). Within a trie a node's children have distinct tokens, and under the one-hot rule a node
moves to child ``x`` with probability ``p(x)`` whatever the order, so no filler or order can lower
acceptance: a dead duplicate is tested only after its twin was rejected (``r(x) = 0``) or never.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.proposers.base import TREE, Candidates, RowTrees, ScoredExtra
from specjax.proposers.draft_free import TokenHistory, keep_rows

# ----------------------------------------------------------------------------- the window's mask


@functools.lru_cache(maxsize=None)
def window_cells(window: int, ngram: int) -> tuple[tuple[int, int], ...]:
  """The window's cells ``(level, column)`` in the order they are scored as extras: level 0
  columns ``1..W-1`` (column 0 is the pending token), then each level ``1..N-2`` left to right."""
  return tuple((level, col) for level in range(ngram - 1) for col in range(window)
               if (level, col) != (0, 0))


@functools.lru_cache(maxsize=None)
def lookahead_mask(window: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
  """(bool[M, M + 1], int32[M]) for the ``M = (N - 1) W - 1`` window cells (``window_cells``):
  the mask over ``[pending, extras]`` and the depths (position - pending token's).

  Cell ``(l, j)`` sees level 0 up to column ``j`` (column 0 = the pending token) and column ``j``
  of levels ``1..l`` (itself included): ALGORITHMS.md §9 and the reference's
  ``j_make_causal_mask_multilevel``; it sits at depth ``l + j``.
  """
  cells = window_cells(window, ngram)
  index = {cell: 1 + i for i, cell in enumerate(cells)}
  index[(0, 0)] = 0
  mask = np.zeros((len(cells), len(cells) + 1), bool)
  for row, (level, col) in enumerate(cells):
    mask[row, [index[(0, c)] for c in range(col + 1)]] = True
    mask[row, [index[(lv, col)] for lv in range(1, level + 1)]] = True
  depths = np.asarray([level + col for level, col in cells], np.int32).reshape(-1)
  return mask, depths


# ----------------------------------------------------------------------------- the n-gram pool


@flax.struct.dataclass
class NGramPool:
  """Each row's n-grams, keyed by their first token, at most ``G`` per key, oldest evicted.

  A ring of ``R`` n-grams per row searched by comparison, rather than a table keyed by token id:
  a dense ``[B, V, G, N - 1]`` table costs ``V G (N - 1)`` int32 per row (12 MB at V = 49152,
  G = 15, N = 5, mostly empty: a few hundred keys occur in a generation), while the ring costs
  ``R N`` (80 KB at R = 4096) whatever the vocabulary, and both of its operations are dense
  comparisons with static shapes (no per-n-gram loop, no hash collisions). Lookup: the ``G``
  most recent entries whose key is the pending token. Insert (``insert``): an n-gram already in
  the ring moves to the front (the reference's LRU refresh). So the entries of a key are the
  ``G`` most recently inserted distinct n-grams with that key -- the reference's
  dict-of-lists exactly -- among the last ``R`` insertions (older ones are forgotten, which
  bounds memory; the reference's dictionary only grows).
  """

  grams: jax.Array  # int32[B, R, N] (key first); -1 = empty slot
  stamps: jax.Array  # int32[B, R] insertion number of each slot's n-gram; -1 = empty
  count: jax.Array  # int32[B] n-grams inserted so far (the next one's stamp)

  @classmethod
  def empty(cls, batch: int, capacity: int, ngram: int) -> NGramPool:
    return cls(grams=jnp.full((batch, capacity, ngram), -1, jnp.int32),
               stamps=jnp.full((batch, capacity), -1, jnp.int32),
               count=jnp.zeros((batch,), jnp.int32))

  def insert(self, grams: jax.Array, valid: jax.Array, fresh: bool = False) -> NGramPool:
    """Inserts ``grams[b, k]`` (int32[B, K, N]) where ``valid[b, k]``, in order ``k = 0..K-1``.

    As one at a time: a repeated n-gram keeps only its last insertion (later copies in the same
    call and equal entries of the ring are dropped), the kept ones take the next ``R`` ring
    slots (only the last ``R`` of them if there are more), overwriting the oldest.
    ``fresh``: the ring is known to be empty (the prompt's seeding), skip comparing with it.
    """
    capacity = self.grams.shape[1]
    k = grams.shape[1]
    same = _equal(grams[:, :, None, :], grams[:, None, :, :])  # [B, K, K]
    later = jnp.arange(k)[None, :] > jnp.arange(k)[:, None]
    kept = valid & ~jnp.any(same & later[None] & valid[:, None, :], axis=2)
    grams_ring, stamps = self.grams, self.stamps
    if not fresh:  # the ring's copies of the inserted n-grams are superseded
      stale = jnp.any(_equal(grams_ring[:, :, None, :], grams[:, None, :, :]) & kept[:, None, :],
                      axis=2)  # [B, R]
      grams_ring = jnp.where(stale[..., None], -1, grams_ring)
      stamps = jnp.where(stale, -1, stamps)
    rank = jnp.cumsum(kept, axis=1) - 1
    total = rank[:, -1] + 1
    write = kept & (rank >= total[:, None] - capacity)
    stamp = self.count[:, None] + rank
    slot = jnp.where(write, stamp % capacity, capacity)  # out of range: dropped
    rows = jnp.arange(grams.shape[0])[:, None]
    return NGramPool(grams=grams_ring.at[rows, slot].set(grams, mode="drop"),
                     stamps=stamps.at[rows, slot].set(stamp, mode="drop"),
                     count=self.count + total)

  def lookup(self, keys: jax.Array, num: int) -> tuple[jax.Array, jax.Array]:
    """The ``num`` most recent entries keyed by ``keys`` (int32[B]): (int32[B, num, N - 1] their
    continuations, bool[B, num] found; slots not found hold -1)."""
    score = jnp.where((self.grams[..., 0] == keys[:, None]) & (self.stamps >= 0), self.stamps, -1)
    best, slot = jax.lax.top_k(score, num)  # stamps are distinct: most recent first
    found = best >= 0
    follow = jnp.take_along_axis(self.grams[..., 1:], slot[..., None], axis=1)
    return jnp.where(found[..., None], follow, -1), found


def _equal(a: jax.Array, b: jax.Array) -> jax.Array:
  """``all(a == b)`` over the last (n-gram) axis, one token at a time (no [..., N] temporary)."""
  out = a[..., 0] == b[..., 0]
  for i in range(1, a.shape[-1]):
    out = out & (a[..., i] == b[..., i])
  return out


def sliding_ngrams(text: jax.Array, starts: jax.Array, ngram: int) -> jax.Array:
  """int32[B, K, N]: ``text[b, starts[b, k] + i]`` for ``i < N`` (``starts`` int32[B, K],
  clipped into the text; the caller masks what falls outside)."""
  cols = jnp.clip(starts[..., None] + jnp.arange(ngram), 0, text.shape[1] - 1)
  return jnp.take_along_axis(text, cols.reshape(cols.shape[0], -1), axis=1).reshape(cols.shape)


# ----------------------------------------------------------------------------- the candidates' trie


def chain_trie(chains: jax.Array) -> RowTrees:
  """The per-row trie of ``G`` chains (int32[B, G, D]) as nodes ``g * D + d`` (chain-major, so
  parents precede children): node ``(g, d)`` hangs below ``(c, d - 1)`` with ``c`` the first chain
  equal to chain ``g`` up to depth ``d - 1``. A node equal to an earlier chain's up to its own
  depth is a dead leaf (a later sibling of its twin, with the twin's token)."""
  batch, num, depth = chains.shape
  prefix = jnp.cumprod(chains[:, :, None, :] == chains[:, None, :, :], axis=-1).astype(bool)
  canon = jnp.argmax(prefix, axis=2).astype(jnp.int32)  # [B, G, D] first equal chain
  g, d = np.divmod(np.arange(num * depth), depth)  # static node -> (chain, depth)
  parents = jnp.where(d > 0, canon[:, g, np.maximum(d - 1, 0)] * depth + d - 1, -1)  # [B, ND]
  same = parents[:, :, None] == parents[:, None, :]
  rank = jnp.sum(same & (np.arange(num * depth)[None, :] < np.arange(num * depth)[:, None]),
                 axis=2)
  rows = jnp.arange(batch)[:, None]
  children = jnp.full((batch, num * depth + 1, num), -1, jnp.int32).at[
      rows, parents + 1, rank].set(jnp.broadcast_to(jnp.arange(num * depth, dtype=jnp.int32),
                                                    parents.shape))
  # Node (h, e) is an ancestor of (g, d) iff e < d and h = canon[g, e]; every node sees itself.
  ancestor = ((d[None, None, :] < d[None, :, None])
              & (canon[:, g[:, None], d[None, :]] == g[None, None, :])) | np.eye(num * depth,
                                                                                  dtype=bool)
  mask = jnp.ones((batch, num * depth + 1, num * depth + 1), bool).at[:, 1:, 1:].set(ancestor)
  mask = mask.at[:, 0, 1:].set(False)
  depths = np.concatenate([[0], d + 1]).astype(np.int32)
  return RowTrees(children=children, verification_mask=mask,
                  verification_depths=jnp.broadcast_to(depths, (batch, depths.size)),
                  max_depth=depth)


# ----------------------------------------------------------------------------- the proposer


@flax.struct.dataclass
class LookaheadState:
  history: TokenHistory  # the row's text (committed n-grams join the pool)
  window: jax.Array  # int32[B, N - 1, W]; [:, 0, 0] is the pending token once proposed
  pool: NGramPool
  passes: jax.Array  # int32[B] target passes seen (no window n-grams before N - 2)


_HASH = np.uint32(2654435761)  # Knuth's multiplicative hash: spreads window cells over the prompt


@dataclasses.dataclass(frozen=True)
class LookaheadProposer:
  """The proposer of ``sj.Lookahead``: ``guesses`` chains of ``ngram - 1`` tokens from the pool,
  and the ``window`` x ``ngram - 1`` window scored alongside (module docstring)."""

  window: int
  ngram: int
  guesses: int
  pool_size: int

  draft_calls_per_iteration = 0
  prefill_draft_calls = 0

  @property
  def num_candidates(self) -> int:
    return self.guesses * (self.ngram - 1)

  @property
  def depth(self) -> int:
    return self.ngram - 1

  @property
  def num_extra(self) -> int:
    return len(window_cells(self.window, self.ngram))

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    del params
    batch, width = prompt.shape
    n = self.ngram
    history = TokenHistory.of_prompt(prompt, prompt_lengths, cache_length)
    pool = NGramPool.empty(batch, self.pool_size, n)
    if width >= n:  # the prompt's n-grams, in order
      starts = jnp.broadcast_to(jnp.arange(width - n + 1, dtype=jnp.int32), (batch, width - n + 1))
      pool = pool.insert(sliding_ngrams(history.tokens, starts, n),
                         starts + n <= prompt_lengths[:, None], fresh=True)
    cell = jnp.arange(1, (n - 1) * self.window + 1, dtype=jnp.uint32) * _HASH
    pos = (cell[None, :] % prompt_lengths[:, None].astype(jnp.uint32)).astype(jnp.int32)
    window = jnp.take_along_axis(history.tokens, pos, axis=1).reshape(batch, n - 1, self.window)
    return LookaheadState(history=history, window=window, pool=pool,
                          passes=jnp.zeros((batch,), jnp.int32))

  def propose(self, params, state: LookaheadState, pending, keys, sampling):
    del params, keys, sampling  # deterministic whatever the sampling: one-hot rule
    batch = pending.shape[0]
    window = state.window.at[:, 0, 0].set(pending)
    chains, found = state.pool.lookup(pending, self.guesses)
    # No entry: the window's level 0 (Jacobi decoding's guess for positions length + 1..).
    level0 = window[:, 0, np.minimum(np.arange(1, self.ngram), self.window - 1)]  # [B, N - 1]
    chains = jnp.where(found[..., None], chains, level0[:, None, :])
    extra = None
    if self.num_extra:
      mask, depths = lookahead_mask(self.window, self.ngram)
      extra = ScoredExtra(tokens=window.reshape(batch, -1)[:, 1:],
                          mask=tuple(map(tuple, mask.tolist())), depths=tuple(depths.tolist()))
    candidates = Candidates(tokens=chains.reshape(batch, -1), q=None, kind=TREE, rule="one_hot",
                            row_trees=chain_trie(chains), extra=extra)
    return candidates, state.replace(history=state.history.with_pending(pending), window=window)

  def commit(self, params, state: LookaheadState, candidates, outcome):
    del params
    n, w = self.ngram, self.window
    top = n - 2
    # The top level's argmax: the pass row of cell (top, j) (the pending token's for (0, 0)).
    cells = window_cells(w, n)
    rows = [0 if (top, j) == (0, 0) else 1 + self.num_candidates + cells.index((top, j))
            for j in range(w)]
    new = sampling_lib.greedy(outcome.logits[:, np.asarray(rows)])  # [B, W]
    window_grams = jnp.concatenate([jnp.swapaxes(state.window, 1, 2), new[..., None]], axis=2)
    ready = jnp.broadcast_to((state.passes >= top)[:, None], new.shape)
    # The committed text's new n-grams: those ending at the pending token and the accepted ones.
    path = outcome.path  # [B, D]
    accepted = jnp.take_along_axis(candidates.tokens, jnp.maximum(path, 0), axis=1)
    history = state.history.commit(accepted, outcome)
    end = state.history.lengths[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]  # [B, N]
    text_grams = sliding_ngrams(history.tokens, end - (n - 1), n)
    written = end <= state.history.lengths[:, None] + outcome.num_accepted[:, None]
    pool = state.pool.insert(jnp.concatenate([window_grams, text_grams], axis=1),
                             jnp.concatenate([ready, written & (end >= n - 1)], axis=1))
    window = jnp.concatenate([state.window[:, 1:], new[:, None, :]], axis=1)
    new_state = LookaheadState(history=history, window=window, pool=pool,
                               passes=state.passes + 1)
    return keep_rows(outcome.active, new_state, state)
