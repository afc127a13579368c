"""Retrieval-based speculation: ``sj.Datastore`` (a corpus of token ids with its suffix array, built
offline with numpy) and ``sj.Retrieval``, the decoding method that drafts from it (REST, He et al.
2024, arXiv 2311.08252; SuffixDecoding, Oliaro et al. 2024, arXiv 2411.04975). The search and the
token tree inside the loop are ``specjax.proposers.retrieval``.

    store = sj.Datastore.build(token_lists, vocab_size=tok.vocab_size, tokenizer="smollm2-135m")
    store.save("my_store")  # a directory: datastore.npz + datastore.json
    out = sj.generate(model, prompts, sj.Retrieval(sj.Datastore.load("my_store")))

``experiments/build_datastore.py`` builds one from text files with a model's tokenizer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from typing import Any, Iterable, Sequence

import jax.numpy as jnp
import numpy as np

from specjax import cache, options
from specjax.decoding.methods import check_count, check_guesses
from specjax.models.transformer import Transformer
from specjax.proposers.retrieval import RetrievalProposer
from specjax.trees import MAX_NODES

FORMAT = "specjax-datastore-1"
ARRAYS, METADATA = "datastore.npz", "datastore.json"
MAX_SAMPLES = 1024  # occurrences counted per lookup (the trie is quadratic in them)


def suffix_array(tokens: np.ndarray) -> np.ndarray:
  """int32[n]: the positions of ``tokens`` (non-negative ints) sorted by the suffix starting there
  (lexicographic; a suffix sorts before its extensions). Prefix doubling (Manber and Myers 1993):
  round r sorts by the first ``2^r`` tokens as pairs of ranks, O(n log n) per round, rounds up to
  log2 of the longest repeated substring."""
  n = tokens.shape[0]
  if n == 0:
    return np.zeros((0,), np.int32)
  _, rank = np.unique(tokens, return_inverse=True)
  rank = rank.astype(np.int64).reshape(-1)
  step = 1
  while True:
    second = np.full(n, -1, np.int64)  # past the end: before every token
    if step < n:
      second[:n - step] = rank[step:]
    order = np.lexsort((second, rank))
    first_sorted, second_sorted = rank[order], second[order]
    new = np.empty(n, np.int64)
    new[order] = np.concatenate([[0], np.cumsum((first_sorted[1:] != first_sorted[:-1])
                                                | (second_sorted[1:] != second_sorted[:-1]))])
    rank = new
    if rank.max() == n - 1 or step >= n:
      return order.astype(np.int32)
    step *= 2


@dataclasses.dataclass(frozen=True, eq=False)
class Datastore:
  """Documents of token ids and their suffix array (``Datastore.build``, ``save``, ``load``).

  ``tokens`` holds the documents one after the other, each followed by the separator
  ``vocab_size`` (one past the vocabulary: it sorts after every token and matches none, so no
  match or continuation crosses a document's end); ``suffixes`` is their suffix array. The loop
  reads both as device arrays (``device_arrays``, made once). ``tokenizer`` names the tokenizer
  the ids come from (informative; the vocabulary size is what ``sj.Retrieval`` checks).
  """

  tokens: np.ndarray  # int32[n]
  suffixes: np.ndarray  # int32[n]
  vocab_size: int
  tokenizer: str = ""
  metadata: dict = dataclasses.field(default_factory=dict)  # free-form (sources, byte caps, ...)

  @classmethod
  def build(cls, documents: Iterable[Sequence[int]], vocab_size: int, tokenizer: str = "",
            metadata: dict | None = None) -> Datastore:
    """A datastore of ``documents`` (sequences of token ids in ``[0, vocab_size)``; empty ones
    are skipped)."""
    check_count(vocab_size, "vocab_size", "the tokenizer's vocabulary size")
    parts = []
    for i, doc in enumerate(documents):
      ids = np.asarray(doc)
      if ids.size == 0:
        continue
      if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"document {i} is not a flat sequence of integer token ids")
      bad = ids[(ids < 0) | (ids >= vocab_size)]
      if bad.size:
        raise ValueError(f"document {i}: token id {int(bad[0])} is outside the vocabulary "
                         f"[0, {vocab_size})")
      parts += [ids.astype(np.int32), np.asarray([vocab_size], np.int32)]
    if not parts:
      raise ValueError("a datastore needs at least one non-empty document")
    tokens = np.concatenate(parts)
    if tokens.size >= 2**31 - 2**16:
      raise ValueError(f"{tokens.size} tokens do not fit int32 positions")
    return cls(tokens=tokens, suffixes=suffix_array(tokens), vocab_size=int(vocab_size),
               tokenizer=str(tokenizer), metadata=dict(metadata or {}))

  @property
  def num_tokens(self) -> int:
    """Corpus length, separators included."""
    return int(self.tokens.shape[0])

  @property
  def num_documents(self) -> int:
    return int(np.sum(self.tokens == self.vocab_size))

  @functools.cached_property
  def device_arrays(self) -> tuple[Any, Any]:
    """(int32[n] corpus, int32[n] suffix array) on the default device, made on first use."""
    return jnp.asarray(self.tokens), jnp.asarray(self.suffixes)

  def save(self, path: str | os.PathLike) -> pathlib.Path:
    """Writes the directory ``path`` (``datastore.npz``: the arrays; ``datastore.json``: format,
    vocabulary size, tokenizer, sizes, metadata) atomically; returns it."""
    path = pathlib.Path(path)
    meta = {"format": FORMAT, "vocab_size": self.vocab_size, "tokenizer": self.tokenizer,
            "num_tokens": self.num_tokens, "num_documents": self.num_documents,
            "metadata": self.metadata}
    with cache.atomic_path(path) as tmp:
      tmp.mkdir()
      np.savez(tmp / ARRAYS, tokens=self.tokens, suffixes=self.suffixes)
      (tmp / METADATA).write_text(json.dumps(meta, indent=1, sort_keys=True))
    return path

  @classmethod
  def load(cls, path: str | os.PathLike) -> Datastore:
    """The datastore saved at ``path`` (a directory written by ``save``)."""
    path = pathlib.Path(path)
    meta = read_metadata(path)
    try:
      with np.load(path / ARRAYS) as arrays:
        tokens, suffixes = arrays["tokens"], arrays["suffixes"]
    except (OSError, KeyError, ValueError) as e:
      raise ValueError(f"datastore {path}: cannot read {ARRAYS}: {e}") from None
    n = meta["num_tokens"]
    if tokens.shape != (n,) or suffixes.shape != (n,) or tokens.dtype != np.int32 \
        or suffixes.dtype != np.int32:
      raise ValueError(f"datastore {path}: arrays are not int32[{n}] as {METADATA} says")
    return cls(tokens=tokens, suffixes=suffixes, vocab_size=meta["vocab_size"],
               tokenizer=meta["tokenizer"], metadata=meta.get("metadata", {}))

  def __repr__(self) -> str:
    return (f"Datastore({self.num_tokens} tokens, {self.num_documents} documents, vocab_size="
            f"{self.vocab_size}, tokenizer={self.tokenizer!r})")


def read_metadata(path: str | os.PathLike) -> dict:
  """The ``datastore.json`` of the datastore directory ``path``, checked (no arrays are read)."""
  file = pathlib.Path(path) / METADATA
  try:
    meta = json.loads(file.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{path} is not a datastore directory ({METADATA}: {e})") from None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT or not all(
      isinstance(meta.get(k), int) for k in ("vocab_size", "num_tokens")):
    raise ValueError(f"{file} is not a {FORMAT} datastore description")
  return meta


@dataclasses.dataclass(frozen=True, eq=False)
class Retrieval:
  """Retrieval-based speculative decoding (REST, He et al. 2024, arXiv 2311.08252): the row's
  longest suffix (up to ``max_suffix`` tokens) found in ``datastore``, and a token tree of the
  ``nodes`` most frequent continuations of its occurrences (``num_tokens`` deep, at most
  ``branches`` children per node, counted over at most ``samples`` occurrences), verified in one
  target pass (``specjax.proposers.retrieval``).

  ``per_request=True`` adds SuffixDecoding's per-request source (Oliaro et al. 2024, arXiv
  2411.04975): the same tree built from the row's own text (prompt + output so far), and each
  row takes, per pass, the tree whose nodes' estimated probabilities sum higher. With
  ``datastore=None`` the row's own text is the only source. ``max_spec_factor`` (SuffixDecoding's,
  which uses 1.0) caps a tree's depth at that factor times the length of the match it came from;
  ``None``: no cap (REST).

  No draft model; the tree is deterministic, verified by the one-hot rule (ALGORITHMS.md §4-5):
  lossless at any temperature, the greedy tokens at T = 0. It pays where the output repeats text
  the datastore (or the row's own text) holds: code, boilerplate, a domain's phrases; a row whose
  text matches nothing gets an empty tree (one token per pass, as without speculation).
  """

  datastore: Datastore | None
  num_tokens: int = 6
  nodes: int = 16
  branches: int = 4
  max_suffix: int = 12
  samples: int = options.RETRIEVAL_SAMPLES
  per_request: bool = False
  max_spec_factor: float | None = None
  name = "retrieval"

  def __post_init__(self):
    if self.datastore is None:
      if not self.per_request:
        raise ValueError("datastore=None needs per_request=True (the row's own text as the only "
                         "source); otherwise pass an sj.Datastore")
    elif not isinstance(self.datastore, Datastore):
      raise ValueError(f"datastore must be an sj.Datastore (sj.Datastore.build / load) or None, "
                       f"got {type(self.datastore).__name__}")
    if not isinstance(self.per_request, bool):
      raise ValueError(f"per_request must be True or False, got {self.per_request!r}")
    factor = self.max_spec_factor
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not 0 < factor < float("inf")):
      raise ValueError(f"max_spec_factor must be a positive number (tree depth per matched "
                       f"token) or None, got {factor!r}")
    check_count(self.num_tokens, "num_tokens", "the deepest guess: tokens per continuation")
    check_count(self.nodes, "nodes", "tokens verified per pass")
    check_count(self.branches, "branches", "children per node")
    check_count(self.max_suffix, "max_suffix", "the longest suffix looked up")
    check_count(self.samples, "samples", "occurrences counted per lookup")
    if self.nodes > MAX_NODES:
      raise ValueError(f"nodes {self.nodes} exceeds the limit of {MAX_NODES} tokens per pass")
    if self.samples > MAX_SAMPLES:
      raise ValueError(f"samples {self.samples} exceeds {MAX_SAMPLES}: the tree compares every "
                       f"pair of sampled continuations (samples^2 x num_tokens per row)")
    if self.nodes < self.num_tokens:
      raise ValueError(f"nodes {self.nodes} < num_tokens {self.num_tokens}: a continuation of "
                       f"num_tokens tokens needs that many nodes")
    if self.nodes > self.samples * self.num_tokens:
      raise ValueError(f"nodes {self.nodes} > samples x num_tokens = "
                       f"{self.samples * self.num_tokens}: the continuations cannot fill the tree")

  @property
  def gamma(self) -> int:
    """The most guesses one pass can accept (the tree's depth), as for a chain."""
    return self.num_tokens

  def at_depth(self, depth: int) -> Retrieval:
    """The method with its tree cut to ``depth`` levels (``sj.Adaptive``'s tree menu): a budget
    of ``branches`` nodes per level within ``nodes``, ``min(nodes, depth x branches)`` (at least
    ``depth``), so that a level's acceptance is much the same in every entry of the menu."""
    return dataclasses.replace(self, num_tokens=depth, nodes=options.depth_budget(
        depth, self.nodes, self.branches, self.samples))

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    del width, max_new_tokens, what  # generate checked the context
    vocab = target.config.vocab_size
    if self.datastore is not None and self.datastore.vocab_size != vocab:
      raise ValueError(f"datastore vocabulary size {self.datastore.vocab_size} (tokenizer "
                       f"{self.datastore.tokenizer or 'unnamed'}) differs from the target's "
                       f"{vocab}; build the datastore with the target's tokenizer")
    check_guesses(self.num_tokens, "num_tokens", target)
    check_guesses(self.nodes, "nodes", target)

  def proposer(self, target: Transformer):
    store = self.datastore
    proposer = RetrievalProposer(
        num_tokens=self.num_tokens, nodes=self.nodes, branches=self.branches,
        max_suffix=self.max_suffix, samples=self.samples,
        vocab_size=target.config.vocab_size, per_request=self.per_request,
        max_spec_factor=None if self.max_spec_factor is None else float(self.max_spec_factor))
    return proposer, None if store is None else store.device_arrays
