"""Decoding methods: frozen dataclasses whose hyper-parameters are static under ``jit``.

A method only says *what* to do; ``specjax.decoding.loop`` does it. Every method runs through the
same loop (propose -> one target pass -> verify -> commit) and differs only in its proposer
(``specjax.proposers``): ``Autoregressive`` is the loop with no proposals.

The protocol a method follows (so that ``sj.generate`` has no method-specific code):

* ``validate(target, width, max_new_tokens, what)`` raises a one-line ``ValueError`` for a method
  that cannot run with this target and this many tokens (called before anything compiles);
* ``proposer(target)`` returns ``(proposer, params)``: the static proposer (hashable, part of the
  compiled loop's key) and the pytree of arrays it reads (e.g. a draft's weights, or the target's
  own for a method that drafts with the target), passed traced.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

from flax import nnx

from specjax.models.layer_skip import check_skip, skip_layers
from specjax.models.transformer import Transformer, check_context, check_model
from specjax.proposers.base import NoProposer
from specjax.proposers.draft_chain import DraftChain
from specjax.proposers.draft_tree import CHILDREN, DraftTree
from specjax.proposers.dynamic_tree import DraftDynamicTree
from specjax.proposers.jacobi import JacobiProposer
from specjax.proposers.lookahead import LookaheadProposer
from specjax.proposers.prompt_lookup import PromptLookupProposer
from specjax.trees import DynamicTree, Tree


_SPLITS = contextvars.ContextVar("specjax_splits", default=None)


def split(model: Transformer, skip: tuple[int, ...] | None = None):
  """``nnx.split`` of ``model`` (with ``skip``: of its layer-skipping view, ``skip_layers``),
  done once per model within ``shared_splits``: ``sj.Adaptive`` builds one proposer per menu
  entry from the same model, and one split gives them one graph object, which the menu's key
  for the compiled loop then holds once (``AdaptiveProposer``; splitting and hashing a graph
  per entry cost ~3.5 ms a call, 3.5% of a batch-1 call on the benchmark pair)."""
  memo = _SPLITS.get()
  key = (id(model), skip)
  if memo is None or key not in memo:
    made = nnx.split(model if skip is None else skip_layers(model, skip))
    if memo is None:
      return made
    memo[key] = (model, made)  # the model kept: its id stays its own while the memo lives
  return memo[key][1]


@contextlib.contextmanager
def shared_splits():
  """Within: ``split`` splits each model once."""
  token = _SPLITS.set({})
  try:
    yield
  finally:
    _SPLITS.reset(token)


@dataclasses.dataclass(frozen=True)
class Autoregressive:
  """Plain decoding: one target forward per token."""

  name = "autoregressive"

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    del target, width, max_new_tokens, what

  def proposer(self, target: Transformer):
    del target
    return NoProposer(), None


@dataclasses.dataclass(frozen=True, eq=False)
class Speculative:
  """Draft-then-verify with a smaller draft model (Leviathan et al. 2023, arXiv 2211.17192,
  Algorithm 1; Chen et al. 2023, arXiv 2302.01318).

  The draft proposes ``gamma`` tokens autoregressively, warped with the same ``Sampling`` as the
  target; the target scores all ``gamma + 1`` positions in one forward; the verifier accepts a
  prefix and emits one more token, so each iteration yields 1..gamma+1 tokens per row.
  """

  draft: Transformer
  gamma: int = 4
  name = "speculative"

  def __post_init__(self):
    if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
      raise ValueError(f"gamma must be an integer >= 1, got {self.gamma!r}")
    check_model(self.draft, "draft")

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    check_draft(self.draft, target, width, max_new_tokens, what)

  def proposer(self, target: Transformer):
    del target
    graphdef, params = split(self.draft)
    return DraftChain(graphdef=graphdef, gamma=self.gamma), params


@dataclasses.dataclass(frozen=True)
class SelfSpeculative:
  """Self-speculative decoding: the draft is the target with the layers ``skip`` left out (Draft
  & Verify, Zhang et al. 2023, arXiv 2309.08168; SWIFT, Xia et al. 2024, arXiv 2410.06916;
  ALGORITHMS.md §12).

  Same weights, no second checkpoint: ``sj.Speculative``'s draft chain runs on a view of the
  target (``skip_layers``) with its own KV cache for the kept layers, and the same lossless chain
  rule verifies it. The loop receives the kept layers' arrays twice, as the target's state and as
  the proposer's params (the proposer protocol passes them apart); both are the same device
  buffers, which jit neither copies nor donates, so no weight memory is duplicated. ``skip=()``
  drafts with the whole target: every draft is accepted.
  """

  skip: tuple[int, ...] = ()
  gamma: int = 4
  name = "self_speculative"

  def __post_init__(self):
    if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
      raise ValueError(f"gamma must be an integer >= 1, got {self.gamma!r}")
    try:
      object.__setattr__(self, "skip", tuple(self.skip))  # a list works too, and stays hashable
    except TypeError:
      raise ValueError(f"skip must be a sequence of layer indices, got {self.skip!r}") from None

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    del width, max_new_tokens, what  # the draft is the target: generate checked its context
    if not isinstance(target, Transformer):
      raise ValueError(f"self-speculative decoding skips layers of an sj.Transformer target, got "
                       f"{type(target).__name__}")
    check_skip(self.skip, target.config.num_layers)

  def proposer(self, target: Transformer):
    graphdef, params = split(target, self.skip)
    return DraftChain(graphdef=graphdef, gamma=self.gamma), params


class DraftTreeSizes:
  """What ``sj.Adaptive`` reads of a method whose draft model grows ``self.tree``: its target
  pass's nodes and its draft passes' tokens (``sj.CostTable.entry_cost``)."""

  @property
  def nodes(self) -> int:
    return self.tree.num_nodes

  @property
  def draft_pass_widths(self) -> tuple[int, ...]:
    return self.tree.draft_pass_widths


@dataclasses.dataclass(frozen=True, eq=False)
class TreeSpeculative(DraftTreeSizes):
  """A draft model proposes a token tree; the target verifies every node in one forward under
  the tree mask (SpecInfer, Miao et al. 2024, arXiv 2305.09781; Medusa-style trees, Cai et al.
  2024, arXiv 2401.10774; sampled children without replacement: Sequoia, Chen et al. 2024, arXiv
  2402.12374; dynamic trees: EAGLE-2, Li et al. 2024, arXiv 2406.16858).

  ``tree``: a static ``sj.Tree``, or an ``sj.DynamicTree`` grown per row by the draft's
  confidence. ``children`` (static trees): ``"sampled"`` (default: drawn without replacement
  from the draft's warped law, recursive rule of ALGORITHMS.md §5), ``"top_k"`` (the draft's
  most likely tokens, one-hot rule §4) or ``"iid"`` (drawn with replacement, SpecInfer's
  multi-draft rule §5); a dynamic tree's children are always the draft's top-k. All exact. At
  temperature 0 the children are the draft's top-k and the walk follows the target's argmax
  (greedy tokens).
  """

  draft: Transformer
  tree: Tree | DynamicTree
  children: str | None = None  # None: "sampled" for a static tree, "top_k" for a dynamic one
  name = "tree_speculative"

  def __post_init__(self):
    check_model(self.draft, "draft")
    object.__setattr__(self, "children", tree_children(self.tree, self.children, "draft"))

  @property
  def gamma(self) -> int:
    """The most tokens one iteration can accept (the tree's depth), as for a chain."""
    return self.tree.max_depth

  def at_depth(self, depth: int) -> TreeSpeculative:
    """The method with its tree cut to ``depth`` levels (``sj.Adaptive``'s tree menu:
    ``sj.Tree.at_depth``, ``sj.DynamicTree.at_depth``)."""
    return dataclasses.replace(self, tree=self.tree.at_depth(depth))

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    check_tree(self.tree, self.draft, target, width, max_new_tokens, what)

  def proposer(self, target: Transformer):
    del target
    graphdef, params = split(self.draft)
    if isinstance(self.tree, DynamicTree):
      return DraftDynamicTree(graphdef=graphdef, spec=self.tree), params
    return DraftTree(graphdef=graphdef, tree=self.tree, children=self.children), params


@dataclasses.dataclass(frozen=True, eq=False)
class SpecTr(DraftTreeSizes):
  """``num_drafts`` i.i.d. draft chains of ``gamma`` tokens, verified in one target pass and
  selected by K-SEQ (SpecTr, Sun et al. 2023, arXiv 2310.15141; ALGORITHMS.md §6).

  The chains are sampled together (one draft forward per depth over all of them) and scored by
  the target in one forward under their block-causal mask (``sj.Tree.chains``). At each depth the
  chains that agree with the accepted prefix are i.i.d. draws of the draft's law there, and K-SEQ
  picks among them with ``rho*`` for their number; ``selection="naive"`` applies SpecInfer's
  multi-draft rule to the same survivors instead (the baseline of the paper's Table 1). Both are
  exact. At temperature 0 the chains start from the draft's top ``num_drafts`` tokens and the
  walk follows the target's argmax (greedy tokens).
  """

  draft: Transformer
  num_drafts: int = 4
  gamma: int = 4
  selection: str = "k_seq"
  name = "spectr"

  def __post_init__(self):
    for field in ("num_drafts", "gamma"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
    if self.selection not in SELECTION_RULES:
      raise ValueError(f"selection must be one of {tuple(SELECTION_RULES)}, got "
                       f"{self.selection!r}")
    check_model(self.draft, "draft")

  @property
  def tree(self) -> Tree:
    return Tree.chains(num=self.num_drafts, depth=self.gamma)

  def at_depth(self, depth: int) -> SpecTr:
    """The method with chains ``depth`` long (``sj.Adaptive``'s menu)."""
    return dataclasses.replace(self, gamma=depth)

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    check_tree(self.tree, self.draft, target, width, max_new_tokens, what)

  def proposer(self, target: Transformer):
    del target
    graphdef, params = split(self.draft)
    return DraftTree(graphdef=graphdef, tree=self.tree, children="iid",
                     rule=SELECTION_RULES[self.selection]), params



SELECTION_RULES = {"k_seq": "k_seq", "naive": "naive_multi_draft"}  # SpecTr's -> tree rules


@dataclasses.dataclass(frozen=True)
class PromptLookup:
  """Prompt lookup decoding (Saxena 2023; Hugging Face ``prompt_lookup_num_tokens``;
  ALGORITHMS.md §10): the guesses are the ``num_tokens`` tokens that followed the most recent
  earlier occurrence of the row's last n tokens (n = ``max_ngram`` down to 1) in its own text.

  No draft model: the guesses are deterministic, verified by the one-hot rule (§4), so the method
  is lossless at any temperature. It pays off where the output copies its input (code edits,
  extraction, summaries quoting the source). See ``specjax.proposers.prompt_lookup`` for where
  it differs from transformers.
  """

  max_ngram: int = 3
  num_tokens: int = 4
  name = "prompt_lookup"

  def __post_init__(self):
    check_count(self.max_ngram, "max_ngram", "the longest n-gram looked up")
    check_count(self.num_tokens, "num_tokens", "guesses per iteration")

  @property
  def gamma(self) -> int:
    """Guesses per iteration, as for a chain."""
    return self.num_tokens

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    del width, max_new_tokens, what  # generate checked the context; the guesses come from it
    check_guesses(self.num_tokens, "num_tokens", target)

  def proposer(self, target: Transformer):
    del target
    return PromptLookupProposer(max_ngram=self.max_ngram, num_tokens=self.num_tokens), None


@dataclasses.dataclass(frozen=True)
class Jacobi:
  """Jacobi decoding (Santilli et al. 2023, "Accelerating Transformer Inference for Translation
  via Parallel Decoding", ACL 2023; ALGORITHMS.md §8): a block of ``block`` guesses, each the
  target's own output at that position in the previous pass (the fixed-point update).

  No draft model; the guesses are deterministic (argmax at any temperature), verified by the
  one-hot rule (§4): lossless. Greedy, it is Jacobi iteration on the block.
  """

  block: int = 4
  name = "jacobi"

  def __post_init__(self):
    check_count(self.block, "block", "guesses per iteration")

  @property
  def gamma(self) -> int:
    """Guesses per iteration, as for a chain."""
    return self.block

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    del width, max_new_tokens, what  # generate checked the context
    check_guesses(self.block, "block", target)

  def proposer(self, target: Transformer):
    del target
    return JacobiProposer(block=self.block), None


@dataclasses.dataclass(frozen=True)
class Lookahead:
  """Lookahead decoding (Fu et al. 2024, arXiv 2402.02057; ALGORITHMS.md §9): Jacobi iteration on
  a ``window`` x ``ngram - 1`` window, scored in the verification pass itself, fills a per-row
  pool of ``ngram``-grams; up to ``guesses`` pool entries that start with the pending token are
  verified as a trie of ``ngram - 1``-token chains.

  No draft model; the guesses are deterministic (argmax, n-grams), verified by the one-hot rule
  (§4, §5): lossless at any temperature, greedy tokens at T = 0. One target pass scores
  ``1 + guesses (ngram - 1) + window (ngram - 1) - 1`` tokens. ``pool_size``: n-grams each row
  remembers (``specjax.proposers.lookahead.NGramPool``).
  """

  window: int = 4
  ngram: int = 4
  guesses: int = 4
  pool_size: int = 4096
  name = "lookahead"

  def __post_init__(self):
    check_count(self.window, "window", "W, the lookahead window's columns")
    check_count(self.ngram, "ngram", "N, the n-gram size", minimum=2)
    check_count(self.guesses, "guesses", "G, n-grams verified per pass")
    check_count(self.pool_size, "pool_size", "n-grams remembered per row",
                minimum=max(self.window + self.ngram, self.guesses))

  @property
  def gamma(self) -> int:
    """The most guesses one pass can accept (ngram - 1), as for a chain."""
    return self.ngram - 1

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    del width, max_new_tokens, what  # generate checked the context
    proposer, _ = self.proposer(target)
    tokens = 1 + proposer.num_candidates + proposer.num_extra
    limit = target.config.max_position_embeddings
    if tokens > limit:
      raise ValueError(f"lookahead window={self.window}, ngram={self.ngram}, guesses="
                       f"{self.guesses}: its pass over {tokens} tokens does not fit the target "
                       f"model's maximum context {limit}")

  def proposer(self, target: Transformer):
    del target
    return LookaheadProposer(window=self.window, ngram=self.ngram, guesses=self.guesses,
                             pool_size=self.pool_size), None


def tree_children(tree, children: str | None, drafter: str) -> str:
  """The children rule of ``tree`` (validated): ``children``, or by default ``"sampled"`` for a
  static ``sj.Tree`` and ``"top_k"`` for an ``sj.DynamicTree`` (the only rule it has)."""
  if not isinstance(tree, (Tree, DynamicTree)):
    raise ValueError(f"tree must be an sj.Tree (sj.Tree.from_paths / full / chains) or an "
                     f"sj.DynamicTree, got {type(tree).__name__}")
  dynamic = isinstance(tree, DynamicTree)
  if children is None:
    children = "top_k" if dynamic else "sampled"
  if children not in CHILDREN:
    raise ValueError(f"children must be one of {CHILDREN}, got {children!r}")
  if dynamic and children != "top_k":
    raise ValueError(f"a DynamicTree's children are the {drafter}'s top-k (children='top_k'), "
                     f"got children={children!r}")
  return children


def check_count(value, field: str, meaning: str, minimum: int = 1) -> None:
  """A hyper-parameter that counts something must be a (non-bool) integer >= ``minimum``."""
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{field} must be an integer >= {minimum} ({meaning}), got {value!r}")


def check_guesses(count: int, field: str, target: Transformer) -> None:
  """``count`` guesses and the pending token are scored in one target pass: they must fit the
  target's context (the cache always has room: ``generate`` sizes it with the guesses)."""
  limit = target.config.max_position_embeddings
  if count >= limit:
    raise ValueError(f"{field} {count}: {count} guesses + the pending token do not fit the target "
                     f"model's maximum context {limit}")


def check_tree(tree: Tree | DynamicTree, draft: Transformer, target: Transformer, width: int,
               max_new_tokens: int, what: str) -> None:
  """A draft (``check_draft``) expanding ``tree``: its ranks must exist in the vocabulary and its
  depth fit both models' context."""
  check_draft(draft, target, width, max_new_tokens, what)
  check_ranks(tree, target.config.vocab_size)
  for role, model in (("target", target), ("draft", draft)):
    limit = model.config.max_position_embeddings
    if tree.max_depth >= limit:
      raise ValueError(f"the tree's depth {tree.max_depth} does not fit the {role} "
                       f"model's maximum context {limit}")


def check_ranks(tree: Tree | DynamicTree, vocab: int) -> None:
  """A tree's ranks must exist in the vocabulary."""
  if max(tree.ranks) >= vocab:
    raise ValueError(f"the tree asks for a node's rank-{max(tree.ranks)} candidate, but "
                     f"the vocabulary has only {vocab} tokens")


def check_draft(draft: Transformer, target: Transformer, width: int, max_new_tokens: int,
                what: str) -> None:
  """A draft must share the target's vocabulary and fit the prompt + new tokens."""
  vocab = target.config.vocab_size
  if draft.config.vocab_size != vocab:
    raise ValueError(
        f"draft vocabulary size {draft.config.vocab_size} differs from the target's {vocab}; "
        f"target and draft must share one tokenizer (different tokenizers are not supported yet)")
  check_context(draft, "draft", width, max_new_tokens, what)
