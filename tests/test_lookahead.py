"""``sj.Lookahead`` (Fu et al. 2024, arXiv 2402.02057; ALGORITHMS.md §9).

1. The pieces: the window's mask equals a direct definition (Python loops over cells) and the
   reference's block construction (``j_make_causal_mask_multilevel``, ported), with the
   reference's positions; the pass layout keeps candidates and extras apart; the pool's
   insert/lookup equals a Python dict of LRU lists (the reference's ``update_token_map``) on random
   insert sequences, and a ring bound model when the ring is small; the candidates' trie makes the
   greedy walk accept the longest matching chain; the proposer's window shift and n-gram
   collection, driven through prefill/propose/commit, equal a Python port of the reference's.
2. Greedy: the tokens equal the cache-free greedy tokens (= ``sj.Autoregressive``'s) on a ragged
   batch with per-row EOS, through a random transformer whose greedy text loops; lookahead
   really accepts there (tokens per target call > 1).
3. Sampling: the law harness (tests/lawcheck.py) at T = 1 and with top-p on a tabular target; the
   same one-hot guesses verified against a soft q are rejected by the same harness.
4. Bad hyper-parameters and passes beyond the context: one-line ValueErrors before compiling.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax import verify
from specjax.decoding import loop
from specjax.proposers.base import Candidates, Outcome, ScoredExtra
from specjax.proposers.lookahead import (LookaheadProposer, NGramPool, chain_trie, lookahead_mask,
                                         window_cells)

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, tabular
  from tests.test_draft_free import greedy_run, law_run
  from tests.test_laws import patched
  from tests.test_speculative import slow, tabular_pair
except ImportError:  # pragma: no cover
  import lawcheck
  import tabular
  from test_draft_free import greedy_run, law_run
  from test_laws import patched
  from test_speculative import slow, tabular_pair

S = sj.Sampling
SIZES = ((1, 2), (3, 2), (1, 4), (4, 3), (5, 5))  # (W, N)

# ----------------------------------------------------------------------------- 1. the pieces


def reference_mask(window: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
  """The reference's mask and positions over [pending, level 0 (W - 1), levels 1..N-2 (W each)]
  (``lade/models/modeling_llama.py``: ``j_make_causal_mask_multilevel`` without guesses, and
  ``jforward_multilevel``'s ``ids_list``), ported to numpy."""
  sizes = [window - 1] + [window] * (ngram - 2)
  t = 1 + sum(sizes)
  mask = np.zeros((t, t), bool)
  causal = np.tril(np.ones((window, window), bool))
  for ll in range(len(sizes)):
    mask[window * ll:window * (ll + 1), :window] |= causal
    for row in range(1, ll + 1):
      np.fill_diagonal(mask[window * ll:window * (ll + 1), window * row:window * (row + 1)], True)
  ids = [0] + list(range(1, window))
  for ll in range(1, ngram - 1):
    ids += list(range(ll, ll + window))
  return mask, np.asarray(ids)


class PiecesTest(parameterized.TestCase):

  @parameterized.parameters(*SIZES)
  def test_mask_direct_definition(self, window, ngram):
    mask, depths = lookahead_mask(window, ngram)
    cells = [(0, 0)] + list(window_cells(window, ngram))  # [pending, extras]
    self.assertLen(cells, (ngram - 1) * window)
    for i, (level, col) in enumerate(cells[1:]):
      self.assertEqual(depths[i], level + col)
      for k, (lv, c) in enumerate(cells):
        sees = (lv == 0 and c <= col) or (1 <= lv <= level and c == col)
        self.assertEqual(bool(mask[i, k]), sees, msg=f"({level}, {col}) sees ({lv}, {c})?")

  @parameterized.parameters(*SIZES)
  def test_mask_reference_construction(self, window, ngram):
    mask, depths = lookahead_mask(window, ngram)
    ref, ids = reference_mask(window, ngram)
    np.testing.assert_array_equal(mask, ref[1:])
    np.testing.assert_array_equal(depths, ids[1:])

  def test_pass_layout_keeps_candidates_and_extras_apart(self):
    window, ngram = 3, 3
    mask, depths = lookahead_mask(window, ngram)
    m = mask.shape[0]
    extra = ScoredExtra(tokens=jnp.zeros((2, m), jnp.int32), mask=tuple(map(tuple, mask.tolist())),
                        depths=tuple(depths.tolist()))
    chains = jnp.asarray([[[1, 2], [1, 3]], [[4, 5], [6, 7]]])
    for cand in (Candidates(tokens=jnp.zeros((2, 3), jnp.int32), q=None, extra=extra),
                 Candidates(tokens=jnp.zeros((2, 3), jnp.int32), q=None, kind="tree",
                            tree=sj.Tree.chains(num=1, depth=3), extra=extra),
                 Candidates(tokens=chains.reshape(2, 4), q=None, kind="tree",
                            row_trees=jax.jit(chain_trie)(chains), extra=extra)):
      n = cand.tokens.shape[1]
      if cand.structure is None:  # a chain: causal
        head, head_depths = np.tril(np.ones((n + 1, n + 1), bool)), np.arange(n + 1)
      else:
        head, head_depths = (cand.structure.verification_mask,
                             cand.structure.verification_depths)
      rows = lambda x, shape: np.broadcast_to(np.asarray(x), (2,) + shape)
      full, full_depths = cand.pass_layout()
      full = rows(full, (n + 1 + m,) * 2)
      np.testing.assert_array_equal(full[:, :n + 1, :n + 1], rows(head, (n + 1, n + 1)))
      self.assertFalse(full[:, :n + 1, n + 1:].any())  # candidates never see extras
      self.assertFalse(full[:, n + 1:, 1:n + 1].any())  # extras never see candidates
      np.testing.assert_array_equal(full[:, n + 1:, 0], rows(mask[:, 0], (m,)))
      np.testing.assert_array_equal(full[:, n + 1:, n + 1:], rows(mask[:, 1:], (m, m)))
      np.testing.assert_array_equal(rows(full_depths, (n + 1 + m,)), np.concatenate(
          [rows(head_depths, (n + 1,)), rows(depths, (m,))], axis=1))

  @parameterized.parameters((7, 4096), (7, 5))  # a ring larger than all insertions; a small one
  def test_pool_against_python_model(self, seed, capacity):
    rng = np.random.default_rng(seed)
    batch, ngram, guesses, vocab, per_call = 3, 3, 3, 4, 6
    insert = jax.jit(lambda pool, grams, valid: pool.insert(grams, valid))
    lookup = jax.jit(lambda pool, keys: pool.lookup(keys, guesses))
    pool = NGramPool.empty(batch, capacity, ngram)
    dicts = [collections.defaultdict(list) for _ in range(batch)]  # the reference's LRU lists
    logs = [[] for _ in range(batch)]  # every insertion, for the ring bound
    for _ in range(25):
      grams = rng.integers(0, vocab, (batch, per_call, ngram))
      grams[:, :, 1] %= 2  # few distinct continuations: repeats and evictions
      valid = rng.random((batch, per_call)) < 0.8
      pool = insert(pool, jnp.asarray(grams, jnp.int32), jnp.asarray(valid))
      for b in range(batch):
        call = [tuple(g) for g in grams[b][valid[b]].tolist()]
        for i, gram in enumerate(call):
          lru = dicts[b][gram[0]]
          if tuple(gram[1:]) in lru:
            lru.remove(tuple(gram[1:]))
          elif len(lru) == guesses:
            lru.pop(0)
          lru.append(tuple(gram[1:]))
          if gram not in call[i + 1:]:  # a repeat within one call takes one ring slot
            logs[b].append(gram)
      for key in range(vocab):
        follow, found = lookup(pool, jnp.full((batch,), key, jnp.int32))
        for b in range(batch):
          got = [tuple(f) for f, ok in zip(np.asarray(follow[b]).tolist(), np.asarray(found[b]))
                 if ok]
          if capacity >= len(logs[b]):  # exactly the reference's pool, most recent first
            expected = dicts[b][key][::-1]
          else:  # the G most recent distinct n-grams among the last R insertions
            expected = list(dict.fromkeys(g[1:] for g in logs[b][::-1][:capacity]
                                          if g[0] == key))[:guesses]
          self.assertEqual(got, expected, msg=f"row {b} key {key}")
          self.assertTrue(np.all(np.asarray(follow[b])[~np.asarray(found[b])] == -1))

  def test_pool_keeps_the_last_insertions_of_a_long_call(self):
    insert = jax.jit(lambda pool, grams: pool.insert(grams, jnp.ones(grams.shape[:2], bool),
                                                     fresh=True))
    pool = insert(NGramPool.empty(1, 4, 2), jnp.asarray([[[k, k] for k in range(7)]], jnp.int32))
    keys = sorted(g[0] for g in np.asarray(pool.grams[0]).tolist())
    self.assertEqual(keys, [3, 4, 5, 6])
    self.assertEqual(int(pool.count[0]), 7)

  def test_trie_greedy_walk_takes_the_longest_match(self):
    rng = np.random.default_rng(0)
    batch, num, depth, vocab = 48, 4, 3, 3
    chains = rng.integers(0, vocab, (batch, num, depth))
    truth = rng.integers(0, vocab, (batch, depth + 1))  # the target's greedy continuation
    trees = jax.jit(chain_trie)(jnp.asarray(chains, jnp.int32))
    tokens = chains.reshape(batch, -1)
    # The argmax after a node is the truth's next token where the node's path follows the truth.
    mask = np.asarray(trees.verification_mask)[:, 1:, 1:]
    node_depth = np.tile(np.arange(depth), num)
    argmax = np.empty((batch, num * depth + 1), np.int64)
    argmax[:, 0] = truth[:, 0]
    for b in range(batch):
      for i in range(num * depth):
        path = tokens[b][mask[b, i]]  # the node's ancestors and itself, root first
        self.assertLen(path, node_depth[i] + 1)
        on_truth = np.array_equal(path, truth[b, :len(path)])
        argmax[b, i + 1] = truth[b, len(path)] if on_truth else (truth[b, len(path)] + 1) % vocab
    out = jax.jit(jax.vmap(lambda a, t, c: verify.greedy_tree(a, t, c, depth)))(
        jnp.asarray(argmax, jnp.int32), jnp.asarray(tokens, jnp.int32), trees.children)
    for b in range(batch):
      best = max(int(np.cumprod(chains[b, g] == truth[b, :depth]).sum()) for g in range(num))
      self.assertEqual(int(out.num_accepted[b]), best, msg=f"chains {chains[b]} truth {truth[b]}")
      self.assertEqual(int(out.next_token[b]), truth[b, best])
    children = np.asarray(trees.children)
    for b in range(batch):  # a node repeating an earlier sibling's token is a dead leaf
      for row in children[b]:
        kids = [k for k in row if k >= 0]
        for i, k in enumerate(kids):
          if tokens[b][k] in tokens[b][kids[:i]]:
            self.assertTrue(np.all(children[b, k + 1] < 0))

  @parameterized.parameters((2, 2, 3), (4, 4, 2))  # (W, N, G): no middle level; two
  def test_window_and_pool_follow_the_reference(self, window, ngram, guesses):
    rng = np.random.default_rng(window * 10 + ngram)
    vocab, prompt = 5, [1, 2, 3, 1, 2, 4, 0]
    proposer = LookaheadProposer(window=window, ngram=ngram, guesses=guesses, pool_size=512)
    nc, top = proposer.num_candidates, ngram - 2
    prefill = jax.jit(lambda p, n: proposer.prefill(None, p, n, 64))
    propose = jax.jit(lambda s, pending: proposer.propose(None, s, pending, None, S(0.0)))
    commit = jax.jit(lambda s, c, o: proposer.commit(None, s, c, o))
    state = prefill(jnp.asarray([prompt]), jnp.asarray([len(prompt)]))
    levels = np.asarray(state.window[0]).tolist()  # the initial window: prompt tokens
    self.assertTrue(all(t in prompt for row in levels for t in row))
    pool = collections.defaultdict(list)

    def add(gram):  # the reference's LRU update (update_token_map, fill_pool_with_prompt)
      lru = pool[gram[0]]
      if tuple(gram[1:]) in lru:
        lru.remove(tuple(gram[1:]))
      elif len(lru) == guesses:
        lru.pop(0)
      lru.append(tuple(gram[1:]))

    text = list(prompt)
    for s in range(len(text) - ngram + 1):
      add(text[s:s + ngram])
    pending = 3
    for step in range(8):
      cand, state = propose(state, jnp.asarray([pending]))
      chains = np.asarray(cand.tokens[0]).reshape(guesses, ngram - 1)
      hits = pool.get(pending, [])[::-1][:guesses]
      self.assertEqual([tuple(c) for c in chains[:len(hits)].tolist()], hits)
      # The pass: random argmax everywhere; the first n tokens of chain 0 are accepted.
      out = rng.integers(0, vocab, 1 + nc + proposer.num_extra)
      n = int(rng.integers(0, ngram))
      nxt = int(rng.integers(0, vocab))
      outcome = Outcome(target_length=state.history.lengths, num_accepted=jnp.asarray([n]),
                        path=jnp.asarray([[d if d < n else -1 for d in range(ngram - 1)]]),
                        next_token=jnp.asarray([nxt]), active=jnp.asarray([True]),
                        logits=jax.nn.one_hot(out[None], vocab))
      state = commit(state, cand, outcome)
      cells = window_cells(window, ngram)
      new = [out[0] if (top, j) == (0, 0) else out[1 + nc + cells.index((top, j))]
             for j in range(window)]
      if step >= ngram - 2:  # update_token_map: column j's n-gram, keyed by level 0 (pending)
        for j in range(window):
          add([pending if j == 0 else levels[0][j]] + [levels[lv][j] for lv in range(1, top + 1)]
              + [new[j]])
      levels = levels[1:] + [new]  # ALWAYS_FWD_ONE: every level moves down, new on top
      for token in [pending] + chains[0, :n].tolist():  # append_new_generated_pool
        text.append(token)
        if len(text) >= ngram:
          add(text[-ngram:])
      pending = nxt
      np.testing.assert_array_equal(np.asarray(state.window[0]), levels)
      np.testing.assert_array_equal(np.asarray(state.history.tokens[0, :len(text)]), text)


# ----------------------------------------------------------------------------- 2. greedy

GREEDY_METHODS = (("w3_n3_g2", sj.Lookahead(window=3, ngram=3, guesses=2, pool_size=64)),
                  ("w4_n4_g4", sj.Lookahead(window=4, ngram=4, guesses=4)))


@slow
class GreedyTest(parameterized.TestCase):

  @parameterized.named_parameters(*GREEDY_METHODS)
  def test_greedy_equals_autoregressive(self, method):
    s, per_call, msg = greedy_run(self, method)  # the tokens are the greedy ones
    self.assertGreater(s.tokens_per_target_call, 1.5, msg=msg)
    self.assertTrue(np.all(per_call[[0, 1, 2, 4]] > 1.5), msg=msg)  # every row that loops


# ----------------------------------------------------------------------------- 3. laws

def _soft_q_tree(keys, logits, candidates, sampling):
  """Bug: the one-hot guesses verified as if drawn from a uniform q (SpecInfer's rule)."""
  soft = jnp.full(logits.shape, 1.0 / logits.shape[2])
  return _REAL_VERIFY(keys, logits, candidates.replace(q=soft, rule="with_replacement"), sampling)


_REAL_VERIFY = loop._verify
T1 = sj.Lookahead(window=2, ngram=3, guesses=2, pool_size=8)
# (name, method, sampling, mutant verifier or None)
LAW_CASES = (
    ("t1", T1, S(1.0), None),
    ("t07_topp", sj.Lookahead(window=3, ngram=3, guesses=3, pool_size=8), S(0.7, top_p=0.9), None),
    ("soft_q_control", T1, S(1.0), _soft_q_tree),
)


@slow
class LawTest(parameterized.TestCase):

  @parameterized.named_parameters(*LAW_CASES)
  def test_law(self, method, sampling, mutant):
    if mutant is None:  # the real loop: the target's law, and the rule really decides
      result = law_run(method, sampling, self._testMethodName)
      self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
      self.assertBetween(result.out.stats.acceptance_rate, 0.05, 0.95)
      return
    with patched(((loop, "_verify", mutant),)):  # the same harness rejects a wrong rule
      result = law_run(method, sampling, "soft_q")
    self.assertLess(result.pvalue, lawcheck.MUTANT_CEILING, msg=result.summary())


# ----------------------------------------------------------------------------- 4. errors


class ErrorsTest(parameterized.TestCase):

  @parameterized.parameters(0, -1, 2.0, True, "3", None)
  def test_bad_sizes(self, value):
    for field, minimum in (("window", 1), ("ngram", 2), ("guesses", 1)):
      with self.assertRaisesRegex(ValueError, rf"^{field} must be an integer >= {minimum} "
                                  r"\(.*\), got"):
        sj.Lookahead(**{field: value})
    with self.assertRaisesRegex(ValueError, r"^ngram must be an integer >= 2 \(N, the n-gram "
                                r"size\), got 1$"):
      sj.Lookahead(ngram=1)
    with self.assertRaisesRegex(ValueError, r"^pool_size must be an integer >= 9 .*, got 8$"):
      sj.Lookahead(window=5, ngram=4, pool_size=8)

  def test_pass_beyond_the_context(self):
    table = tabular_pair("mixed", 0)[0].logits_table
    short = tabular.TabularLM(table, max_position_embeddings=16)
    compiled = loop.decode_jit._cache_size()
    method = sj.Lookahead(window=4, ngram=3, guesses=3)  # 1 + 3 x 2 + 2 x 4 - 1 = 14 tokens: fit
    method.validate(short, 2, 2, "prompt length")
    with self.assertRaisesRegex(ValueError, r"^lookahead window=5, ngram=3, guesses=3: its pass "
                                r"over 16 tokens does not fit the target model's maximum context "
                                r"15$"):
      sj.generate(tabular.TabularLM(table, max_position_embeddings=15), [[1, 2]],
                  sj.Lookahead(window=5, ngram=3, guesses=3), max_new_tokens=2)
    self.assertEqual(loop.decode_jit._cache_size(), compiled)  # refused before compiling


if __name__ == "__main__":
  absltest.main()
