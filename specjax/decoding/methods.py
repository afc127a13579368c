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

import dataclasses

from flax import nnx

from specjax.models.transformer import Transformer, check_context, check_model
from specjax.proposers.base import NoProposer
from specjax.proposers.draft_chain import DraftChain
from specjax.proposers.draft_tree import CHILDREN, DraftTree
from specjax.trees import Tree


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
    graphdef, params = nnx.split(self.draft)
    return DraftChain(graphdef=graphdef, gamma=self.gamma), params


@dataclasses.dataclass(frozen=True, eq=False)
class TreeSpeculative:
  """A draft model proposes a static token tree; the target verifies every node in one forward
  under the tree mask (SpecInfer, Miao et al. 2024, arXiv 2305.09781; Medusa-style trees, Cai et
  al. 2024, arXiv 2401.10774; sampled children without replacement: Sequoia, Chen et al. 2024,
  arXiv 2402.12374). ``tree``: an ``sj.Tree``. ``children``: ``"sampled"`` (default: drawn
  without replacement from the draft's warped law, recursive rule of ALGORITHMS.md §5) or
  ``"top_k"`` (the draft's most likely tokens, one-hot rule §4); both exact. At temperature 0 the
  children are the draft's top-k and the walk follows the target's argmax (greedy tokens).
  """

  draft: Transformer
  tree: Tree
  children: str = "sampled"
  name = "tree_speculative"

  def __post_init__(self):
    check_model(self.draft, "draft")
    if not isinstance(self.tree, Tree):
      raise ValueError(f"tree must be an sj.Tree (sj.Tree.from_paths / full / chains), got "
                       f"{type(self.tree).__name__}")
    if self.children not in CHILDREN:
      raise ValueError(f"children must be one of {CHILDREN}, got {self.children!r}")

  @property
  def gamma(self) -> int:
    """The most tokens one iteration can accept (the tree's depth), as for a chain."""
    return self.tree.max_depth

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    check_draft(self.draft, target, width, max_new_tokens, what)
    vocab = target.config.vocab_size
    if max(self.tree.ranks) >= vocab:
      raise ValueError(f"the tree asks for a node's rank-{max(self.tree.ranks)} candidate, but "
                       f"the vocabulary has only {vocab} tokens")
    for role, model in (("target", target), ("draft", self.draft)):
      limit = model.config.max_position_embeddings
      if self.tree.max_depth >= limit:
        raise ValueError(f"the tree's depth {self.tree.max_depth} does not fit the {role} "
                         f"model's maximum context {limit}")

  def proposer(self, target: Transformer):
    del target
    graphdef, params = nnx.split(self.draft)
    return DraftTree(graphdef=graphdef, tree=self.tree, children=self.children), params


def check_draft(draft: Transformer, target: Transformer, width: int, max_new_tokens: int,
                what: str) -> None:
  """A draft must share the target's vocabulary and fit the prompt + new tokens."""
  vocab = target.config.vocab_size
  if draft.config.vocab_size != vocab:
    raise ValueError(
        f"draft vocabulary size {draft.config.vocab_size} differs from the target's {vocab}; "
        f"target and draft must share one tokenizer (different tokenizers are not supported yet)")
  check_context(draft, "draft", width, max_new_tokens, what)
