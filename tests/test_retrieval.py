"""``sj.Retrieval`` and ``sj.Datastore`` (REST, He et al. 2024, arXiv 2311.08252).

1. The pieces against direct Python definitions on random small corpora: the suffix array against
   sorting the suffixes as lists; every suffix length's match range against a naive scan of the
   corpus (where it occurs, the range in suffix order, the longest match); the sampled
   continuations and the tree against a Python trie counting prefixes (counts, frequency order,
   the branch cap, parents and ranks); save/load round trip.
2. Greedy: the tokens equal the cache-free greedy tokens (= ``sj.Autoregressive``'s) on a ragged
   batch with per-row EOS, with a datastore that holds the rows' greedy text (retrieval then
   really accepts) and with one of random text of the same size (one compilation for both).
3. Sampling: the law harness (tests/lawcheck.py) at T = 1 and with top-p on a tabular target; the
   same one-hot trees verified against a soft q are rejected by the same harness.
4. Bad input: one-line ValueErrors before compiling (sizes, cache room, vocabulary mismatch,
   datastore files and documents).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import pathlib
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax.decoding import loop
from specjax.proposers.retrieval import RetrievalProposer, longest_match, match_ranges
from specjax.retrieval import suffix_array

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, tabular
  from tests.test_draft_free import (GREEDY_NEW, GREEDY_PROMPTS, LOOP_TARGET_SEED, greedy_run,
                                     law_run)
  from tests.test_laws import patched
  from tests.test_lookahead import _soft_q_tree
  from tests.test_speculative import (TF_CONFIG, forward_greedy, random_transformer, slow,
                                      tabular_pair)
except ImportError:  # pragma: no cover
  import lawcheck
  import tabular
  from test_draft_free import GREEDY_NEW, GREEDY_PROMPTS, LOOP_TARGET_SEED, greedy_run, law_run
  from test_laws import patched
  from test_lookahead import _soft_q_tree
  from test_speculative import TF_CONFIG, forward_greedy, random_transformer, slow, tabular_pair

S = sj.Sampling

# ----------------------------------------------------------------------------- 1. the pieces


def naive_sorted_suffixes(corpus) -> list[int]:
  return sorted(range(len(corpus)), key=lambda i: list(corpus[i:]))


def naive_occurrences(corpus, pattern) -> list[int]:
  m = len(pattern)
  return [i for i in range(len(corpus) - m + 1) if list(corpus[i:i + m]) == list(pattern)]


def reference_trie(follows: list[tuple[int, ...]], nodes: int, branches: int):
  """REST's trie by frequency, written directly: every prefix of the continuations (in sample
  order) with its count; kept: the ``nodes`` first in (count desc, length asc, first sample asc)
  order whose ancestors and itself rank below ``branches`` among their siblings.
  Returns ([(prefix, count, rank among siblings)], in node order)."""
  info = {}
  for s, follow in enumerate(follows):
    for d in range(1, len(follow) + 1):
      info.setdefault(follow[:d], [0, s])[0] += 1
  order = sorted(info, key=lambda p: (-info[p][0], len(p), info[p][1]))
  seen, rank = collections.Counter(), {}
  for prefix in order:
    rank[prefix] = seen[prefix[:-1]]
    seen[prefix[:-1]] += 1
  kept = [p for p in order if all(rank[p[:e]] < branches for e in range(1, len(p) + 1))]
  return [(p, info[p][0], rank[p]) for p in kept[:nodes]]


def random_store(rng, vocab: int, num_docs: int, size: int) -> sj.Datastore:
  """``num_docs`` random documents of ``size`` tokens in all (cut at random points): the corpus
  has ``size + num_docs`` entries whatever the vocabulary, so one compilation serves them all."""
  tokens = rng.integers(0, vocab, size)
  cuts = np.sort(rng.choice(np.arange(1, size), num_docs - 1, replace=False))
  return sj.Datastore.build(np.split(tokens, cuts), vocab_size=vocab)


def ragged(rows, width):
  text = np.full((len(rows), width), -1, np.int32)
  for b, row in enumerate(rows):
    text[b, :len(row)] = row
  return jnp.asarray(text), jnp.asarray([len(r) for r in rows], jnp.int32)


@functools.partial(jax.jit, static_argnums=(3,))
def ranges_and_longest(arrays, text, lengths, max_suffix):
  return (match_ranges(*arrays, text, lengths, max_suffix),
          longest_match(*arrays, text, lengths, max_suffix))


class PiecesTest(parameterized.TestCase):

  @parameterized.parameters((2, 0), (3, 1), (7, 2))
  def test_suffix_array_sorts_the_suffixes(self, vocab, seed):
    rng = np.random.default_rng(seed)
    for n in (1, 2, 5, 40, 300):
      tokens = rng.integers(0, vocab, n)
      np.testing.assert_array_equal(suffix_array(tokens), naive_sorted_suffixes(tokens.tolist()))
    store = random_store(rng, vocab, 12, 200)  # separators included
    self.assertEqual(store.suffixes.tolist(), naive_sorted_suffixes(store.tokens.tolist()))

  def test_match_ranges_against_a_scan(self):
    rng = np.random.default_rng(0)
    max_suffix = 5
    for vocab in (2, 3, 5, 40):
      store = random_store(rng, vocab, 10, 200)
      corpus = store.tokens.tolist()
      rows = [rng.integers(0, vocab, rng.integers(1, 12)).tolist() for _ in range(24)]
      rows += [corpus[:corpus.index(vocab)][:9]]  # a document's text: long matches
      (lo, hi), (match, lo_best, hi_best) = jax.tree.map(np.asarray, ranges_and_longest(
          store.device_arrays, *ragged(rows, 16), max_suffix))
      for b, row in enumerate(rows):
        longest = 0
        for m in range(1, max_suffix + 1):
          if m > len(row):
            self.assertEqual(lo[b, m - 1], hi[b, m - 1])
            continue
          occ = naive_occurrences(corpus, row[-m:])  # the range holds exactly the occurrences
          self.assertEqual(sorted(store.suffixes[lo[b, m - 1]:hi[b, m - 1]].tolist()), occ,
                           msg=f"row {row} m {m}")
          longest = m if occ else longest
        self.assertEqual(match[b], longest, msg=f"row {row}")
        if longest:
          self.assertEqual((lo_best[b], hi_best[b]), (lo[b, longest - 1], hi[b, longest - 1]))
        else:
          self.assertEqual(lo_best[b], hi_best[b])
      self.assertIn(max_suffix, match.tolist())

  # (vocab, samples, depth, nodes, branches, seed, per_request, max_spec_factor): ranges larger
  # than the samples (strided) and smaller (all of them), a narrow and an unlimited branching,
  # chains (branches 1); the datastore alone (REST), with the row's own text (SuffixDecoding,
  # capped and not), and the row's own text alone (no datastore).
  @parameterized.parameters((3, 8, 3, 6, 2, 0, False, None), (4, 40, 2, 12, 40, 2, False, None),
                            (2, 3, 5, 15, 1, 3, False, None), (3, 8, 3, 6, 2, 4, True, 1.0),
                            (2, 6, 4, 10, 3, 5, True, None), (3, 5, 3, 6, 2, 6, "own", 0.5))
  def test_tree_against_a_python_trie(self, vocab, samples, depth, nodes, branches, seed,
                                      per_request, max_spec_factor):
    rng = np.random.default_rng(seed)
    store = random_store(rng, vocab, 30, 400)
    corpus = store.tokens.tolist()
    order = naive_sorted_suffixes(corpus)
    width = 14 if per_request else 8
    rows = [rng.integers(0, vocab, rng.integers(1, width - 1)).tolist() for _ in range(16)]
    proposer = RetrievalProposer(num_tokens=depth, nodes=nodes, branches=branches, max_suffix=4,
                                 samples=samples, vocab_size=vocab,
                                 per_request=bool(per_request), max_spec_factor=max_spec_factor)
    params = None if per_request == "own" else store.device_arrays
    candidates, match, counts = jax.jit(proposer.tree)(params, *ragged(rows, width))
    counts = np.asarray(counts)
    tokens = np.asarray(candidates.tokens)
    children = np.asarray(candidates.row_trees.children)
    mask = np.asarray(candidates.row_trees.verification_mask)
    depths = np.asarray(candidates.row_trees.verification_depths)
    won = set()  # which source's tree the rows got
    for b, row in enumerate(rows):
      sources = []  # (match length, continuations in sample order)
      if params is not None:
        m = max([k for k in range(1, min(4, len(row)) + 1)
                 if naive_occurrences(corpus, row[-k:])], default=0)
        where = set(naive_occurrences(corpus, row[-m:])) if m else set()
        occ = [i for i in order if i in where]  # in suffix order
        c = len(occ)
        picks = [occ[i if c <= samples else i * c // samples] for i in range(min(c, samples))]
        follows = []
        for pos in picks:
          cont = corpus[pos + m:pos + m + depth]
          follows.append(tuple(cont[:cont.index(vocab)] if vocab in cont else cont))
        sources.append((m, follows))
      if per_request:  # earlier occurrences in the row itself, the most recent first
        m = max([k for k in range(1, min(4, len(row) - 1) + 1)
                 if any(row[c - k:c] == row[-k:] for c in range(k, len(row)))], default=0)
        starts = [c for c in range(len(row) - 1, m - 1, -1) if m and row[c - m:c] == row[-m:]]
        sources.append((m, [tuple(row[c:c + depth]) for c in starts[:samples]]))
      best = None
      for source, (m, follows) in enumerate(sources):
        if max_spec_factor is not None:
          follows = [f[:int(m * max_spec_factor + 1e-6)] for f in follows]
        expected = reference_trie(follows, nodes, branches)
        score = sum(n for _, n, _ in expected) / max(sum(1 for f in follows if f), 1)
        if best is None or score >= best[0]:  # ties: the row's own text
          best = (score, m, expected, follows, source)
      _, m, expected, follows, source = best
      won.add(source)
      self.assertEqual(int(match[b]), m, msg=f"row {row}")
      got = []
      parent_of = {k: i for i, row_kids in enumerate(children[b]) for k in row_kids if k >= 0}
      for i in range(nodes):
        path = tuple(tokens[b][mask[b, i + 1, 1:]])  # ancestors and itself, parents first
        self.assertLen(path, depths[b, i + 1])
        if i < len(expected):
          rank = list(children[b, parent_of[i]]).index(i)
          got.append((path, int(counts[b, i]), rank))
          self.assertEqual(parent_of[i], 0 if len(path) == 1 else 1 + expected.index(
              next(e for e in expected if e[0] == path[:-1])))
        else:  # a dead slot: in no children list
          self.assertNotIn(i, parent_of)
          self.assertEqual(counts[b, i], 0)
      self.assertEqual(got, expected, msg=f"row {row}, match {m}, continuations {follows}")
    self.assertLen(won, 2 if per_request is True else 1)  # with both sources, each won a row

  def test_per_request_choice_by_score(self):
    """Both sources by hand: the tree with the higher sum of estimated probabilities wins, a tie
    goes to the row's own text, and max_spec_factor's cap lowers a short match's score."""
    store = sj.Datastore.build([[1, 3], [1, 3, 3], [1, 2, 4, 4]], vocab_size=5)
    row = [1, 2, 4, 1]  # own text: 1 -> (2, 4, 1); datastore: 1 -> (3), (3, 3), (2, 4, 4)

    def first_nodes(depth, nodes, factor=None):
      proposer = RetrievalProposer(num_tokens=depth, nodes=nodes, branches=3, max_suffix=3,
                                   samples=4, vocab_size=5, per_request=True,
                                   max_spec_factor=factor)
      candidates, match, counts = proposer.tree(store.device_arrays, *ragged([row], 4))
      live = np.asarray(counts[0]) > 0
      return np.asarray(candidates.tokens[0])[live].tolist(), int(match[0])

    # Depth 1, 2 nodes: datastore 3 (2/3) and 2 (1/3) score 1, own text 2 (1/1) scores 1: a tie,
    # to own text; with 1 node the datastore keeps 3 alone (2/3) and loses.
    self.assertEqual(first_nodes(1, 2), ([2], 1))
    self.assertEqual(first_nodes(1, 1), ([2], 1))
    # Depth 2, 3 nodes: datastore 3 (2/3), 2 (1/3), 3-3 (1/3) = 4/3 < own 2, 2-4 = 2.
    self.assertEqual(first_nodes(2, 3), ([2, 4], 1))
    # A cap of 1 token per matched token: both sources one deep, the tie again to own text.
    self.assertEqual(first_nodes(2, 3, factor=1.0), ([2], 1))
    # Own text [1, 2, 3, 1, 2]: match (1, 2) of length 2, continuation (3, 1, 2); the datastore
    # matches (1, 2) too, continued by (4, 4); at depth 3 both score 3 (own) and 2 (datastore).
    proposer = RetrievalProposer(num_tokens=3, nodes=3, branches=3, max_suffix=3, samples=4,
                                 vocab_size=5, per_request=True)
    candidates, match, counts = proposer.tree(store.device_arrays, *ragged([[1, 2, 3, 1, 2]], 5))
    self.assertEqual((np.asarray(candidates.tokens[0]).tolist(), int(match[0])), ([3, 1, 2], 2))
    no_own = dataclasses.replace(proposer, per_request=False)
    candidates, match, _ = no_own.tree(store.device_arrays, *ragged([[1, 2, 3, 1, 2]], 5))
    self.assertEqual((np.asarray(candidates.tokens[0])[:2].tolist(), int(match[0])), ([4, 4], 2))

  def test_save_load_round_trip(self):
    store = sj.Datastore.build([[1, 2, 3], [], [3, 1]], vocab_size=5, tokenizer="toy",
                               metadata={"source": "test"})
    self.assertEqual(store.tokens.tolist(), [1, 2, 3, 5, 3, 1, 5])
    self.assertEqual((store.num_tokens, store.num_documents), (7, 2))
    with tempfile.TemporaryDirectory() as tmp:
      back = sj.Datastore.load(store.save(f"{tmp}/store"))
    np.testing.assert_array_equal(back.tokens, store.tokens)
    np.testing.assert_array_equal(back.suffixes, store.suffixes)
    self.assertEqual((back.vocab_size, back.tokenizer, back.metadata),
                     (5, "toy", {"source": "test"}))


# ----------------------------------------------------------------------------- 2. greedy

GREEDY_EOS = 8  # as in greedy_run


def greedy_stores():
  """(a datastore holding every row's greedy text, one of random text of the same layout)."""
  target = random_transformer(TF_CONFIG, LOOP_TARGET_SEED)
  texts = [list(p) + row.tolist() for p, row in zip(GREEDY_PROMPTS, forward_greedy(
      target, GREEDY_PROMPTS, GREEDY_NEW))]
  rng = np.random.default_rng(5)
  noise = [rng.integers(0, TF_CONFIG.vocab_size, len(t)).tolist() for t in texts]
  return (sj.Datastore.build(texts, vocab_size=TF_CONFIG.vocab_size),
          sj.Datastore.build(noise, vocab_size=TF_CONFIG.vocab_size))


@slow
class GreedyTest(absltest.TestCase):

  def test_greedy_equals_autoregressive(self):
    holding, noise = greedy_stores()
    kwargs = dict(num_tokens=4, nodes=8, branches=2, max_suffix=4, samples=8)
    s, per_call, msg = greedy_run(self, sj.Retrieval(holding, **kwargs))
    self.assertGreater(s.tokens_per_target_call, 2.5, msg=msg)  # the datastore has the text
    self.assertTrue(np.all(per_call > 1.5), msg=msg)
    s, per_call, msg = greedy_run(self, sj.Retrieval(noise, **kwargs))  # same compiled loop
    self.assertLess(s.tokens_per_target_call, 2.5, msg=msg)
    noise_only = s.tokens_per_target_call
    # SuffixDecoding: the rows' own text beside the noise, and alone. Rows 0 and 1 repeat
    # themselves, so their own text pays where the noise does not.
    s, per_call, msg = greedy_run(self, sj.Retrieval(noise, per_request=True, **kwargs))
    self.assertGreater(s.tokens_per_target_call, noise_only, msg=msg)
    s, own_per_call, msg = greedy_run(self, sj.Retrieval(None, per_request=True,
                                                         max_spec_factor=1.0, **kwargs))
    self.assertTrue(np.all(own_per_call[:2] > 1.5), msg=msg)


# ----------------------------------------------------------------------------- 3. laws

LAW_STORE = random_store(np.random.default_rng(11), 4, 40, 300)
T1 = sj.Retrieval(LAW_STORE, num_tokens=2, nodes=4, branches=2, max_suffix=3, samples=8)
LAW_CASES = (  # (name, method, sampling)
    ("t1", T1, S(1.0)),
    ("t07_topp", sj.Retrieval(LAW_STORE, num_tokens=2, nodes=6, branches=3, max_suffix=3,
                              samples=8), S(0.7, top_p=0.9)),
    ("t1_per_request", sj.Retrieval(LAW_STORE, num_tokens=2, nodes=4, branches=2, max_suffix=3,
                                    samples=8, per_request=True, max_spec_factor=1.0), S(1.0)),
)


@slow
class LawTest(parameterized.TestCase):

  @parameterized.named_parameters(*LAW_CASES)
  def test_law(self, method, sampling):
    result = law_run(method, sampling, self._testMethodName)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    self.assertBetween(result.out.stats.acceptance_rate, 0.05, 0.95)  # the rule really decides

  def test_soft_q_control(self):  # the same trees against a soft q: rejected by the same harness
    with patched(((loop, "_verify", _soft_q_tree),)):
      mutant = law_run(T1, S(1.0), "soft_q")
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())


# ----------------------------------------------------------------------------- 4. errors

TINY_STORE = sj.Datastore.build([[0, 1, 2, 3]], vocab_size=4)


class ErrorsTest(parameterized.TestCase):

  @parameterized.parameters(0, -1, 2.0, True, "3", None)
  def test_bad_counts(self, value):
    for field in ("num_tokens", "nodes", "branches", "max_suffix", "samples"):
      with self.assertRaisesRegex(ValueError, rf"^{field} must be an integer >= 1 \(.*\), got"):
        sj.Retrieval(TINY_STORE, **{field: value})

  def test_inconsistent_sizes(self):
    with self.assertRaisesRegex(ValueError, r"^nodes 3 < num_tokens 4: .*$"):
      sj.Retrieval(TINY_STORE, num_tokens=4, nodes=3)
    with self.assertRaisesRegex(ValueError, r"^nodes 9 > samples x num_tokens = 8: .*$"):
      sj.Retrieval(TINY_STORE, num_tokens=2, nodes=9, samples=4)
    with self.assertRaisesRegex(ValueError, r"^samples 1025 exceeds 1024: .*$"):
      sj.Retrieval(TINY_STORE, samples=1025)
    with self.assertRaisesRegex(ValueError, r"^nodes 1025 exceeds the limit of 1024 tokens per "
                                r"pass$"):
      sj.Retrieval(TINY_STORE, nodes=1025)
    with self.assertRaisesRegex(ValueError, r"^datastore must be an sj.Datastore .*, got list$"):
      sj.Retrieval([0, 1, 2])

  def test_bad_suffix_decoding_settings(self):
    with self.assertRaisesRegex(ValueError, r"^datastore=None needs per_request=True .*$"):
      sj.Retrieval(None)
    with self.assertRaisesRegex(ValueError, r"^per_request must be True or False, got 1$"):
      sj.Retrieval(TINY_STORE, per_request=1)
    for factor in (0, -1.0, float("inf"), float("nan"), True, "1"):
      with self.assertRaisesRegex(ValueError, r"^max_spec_factor must be a positive number "
                                  rf"\(.*\) or None, got {re.escape(repr(factor))}$"):
        sj.Retrieval(TINY_STORE, per_request=True, max_spec_factor=factor)

  def test_refused_before_compiling(self):
    table = tabular_pair("mixed", 0)[0].logits_table
    short = tabular.TabularLM(table, max_position_embeddings=8)
    compiled = loop.decode_jit._cache_size()
    for method, message in (
        (sj.Retrieval(TINY_STORE, num_tokens=8, nodes=8), r"^num_tokens 8: 8 guesses \+ the "
         r"pending token do not fit the target model's maximum context 8$"),
        (sj.Retrieval(TINY_STORE, num_tokens=2, nodes=9), r"^nodes 9: 9 guesses \+ the pending "
         r"token do not fit the target model's maximum context 8$"),
        (sj.Retrieval(sj.Datastore.build([[0, 1, 9]], vocab_size=16, tokenizer="other")),
         r"^datastore vocabulary size 16 \(tokenizer other\) differs from the target's 4; build "
         r"the datastore with the target's tokenizer$")):
      with self.assertRaisesRegex(ValueError, message):
        sj.generate(short, [[1, 2]], method, max_new_tokens=2)
    sj.Retrieval(TINY_STORE, num_tokens=2, nodes=7).validate(short, 2, 2, "prompt length")
    self.assertEqual(loop.decode_jit._cache_size(), compiled)  # refused before compiling

  def test_bad_documents_and_files(self):
    with self.assertRaisesRegex(ValueError, r"^document 1: token id 4 is outside the vocabulary "
                                r"\[0, 4\)$"):
      sj.Datastore.build([[0], [1, 4]], vocab_size=4)
    with self.assertRaisesRegex(ValueError, r"^a datastore needs at least one non-empty document$"):
      sj.Datastore.build([[], []], vocab_size=4)
    with tempfile.TemporaryDirectory() as tmp:
      with self.assertRaisesRegex(ValueError, rf"^{tmp} is not a datastore directory"):
        sj.Datastore.load(tmp)
      with open(f"{tmp}/datastore.json", "w") as f:
        json.dump({"format": "other"}, f)
      with self.assertRaisesRegex(ValueError, r"is not a specjax-datastore-1 datastore"):
        sj.Datastore.load(tmp)


# ----------------------------------------------------------------------------- 5. the runner


class _SplitTokenizer:
  """Just what ``build_datastore.build`` reads of a tokenizer: whitespace-separated integers."""

  eos_token_id = 0

  def __init__(self):
    self.backend_tokenizer = self

  def __len__(self):
    return 100

  def encode_batch(self, texts, add_special_tokens=False):
    del add_special_tokens
    return [type("Encoding", (), {"ids": [int(w) for w in t.split()]}) for t in texts]


class RunnerTest(absltest.TestCase):

  def test_config_file(self):
    from experiments import default_pair, runconfig
    file = pathlib.Path(__file__).resolve().parents[1] / "configs" / "retrieval.py"
    config = default_pair.load_config(file)
    self.assertIn("python -m experiments.run --config=configs/retrieval.py", file.read_text())
    runconfig.validate(config)
    self.assertEqual(set(config.keys()), set(runconfig.base_config().keys()))
    self.assertIn("retrieval", config.methods)
    config.gammas = (config.retrieval_nodes + 1,)
    with self.assertRaisesRegex(runconfig.ConfigError, r"^retrieval_nodes must be an integer >= "):
      runconfig.validate(config)

  def test_datastore_checks_and_build_from_files(self):
    from experiments import build_datastore, resolve, runconfig
    with tempfile.TemporaryDirectory() as tmp:
      for name, text in (("a.txt", "5 6 7 0 8"), ("b.txt", "9 9"), ("c.bin", "1")):
        with open(f"{tmp}/{name}", "w") as f:
          f.write(text)
      texts, paths = build_datastore.file_texts([f"{tmp}/*.txt"], max_bytes=1000)
      self.assertEqual(texts, ["5 6 7 0 8", "9 9"])
      store = build_datastore.build(texts, _SplitTokenizer(), "split", {"files": paths})
      self.assertEqual(store.tokens.tolist(), [5, 6, 7, 100, 8, 100, 9, 9, 100])  # EOS splits
      self.assertEqual((store.vocab_size, store.tokenizer), (100, "split"))
      path = str(store.save(f"{tmp}/store"))
      config = runconfig.base_config()
      config.methods, config.datastore = ("retrieval",), path
      runconfig.validate(config)
      target = resolve.ModelSpec("target", "t", "/t", None, 100, 512, {})
      resolve.resolve_datastore(config, target)
      with self.assertRaisesRegex(runconfig.ConfigError, rf"^datastore {path} has vocab_size 100 "
                                  r"but the target t has 7; build it with the target's "
                                  r"tokenizer$"):
        resolve.resolve_datastore(config, dataclasses.replace(target, vocab_size=7))
      config.datastore = tmp
      with self.assertRaisesRegex(runconfig.ConfigError, rf"^datastore {tmp} is not a datastore "):
        runconfig.validate(config)
      config.methods, config.datastore = ("suffix",), "none"  # the rows' own text alone
      runconfig.validate(config)
      resolve.resolve_datastore(config, target)
      self.assertEqual(config.datastore, "none")
      config.methods = ("retrieval", "suffix")
      with self.assertRaisesRegex(runconfig.ConfigError, r"^method 'retrieval' needs a datastore; "
                                  r"datastore='none' only serves method 'suffix' "):
        runconfig.validate(config)
      config.methods, config.max_spec_factor = ("suffix",), -1.0
      with self.assertRaisesRegex(runconfig.ConfigError, r"^max_spec_factor must be a number >= 0 "
                                  r"\(0 = no cap\), got -1.0$"):
        runconfig.validate(config)


if __name__ == "__main__":
  absltest.main()
