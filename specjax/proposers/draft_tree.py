"""A draft model expanding a static token tree level by level (SpecInfer, Miao et al. 2024, arXiv
2305.09781; Sequoia, Chen et al. 2024, arXiv 2402.12374; ALGORITHMS.md §5, §7).

Per iteration the draft runs one forward per level: forward ``d`` feeds the root and every node
of depth <= d under the tree's ancestor mask (their tokens are known by then) and projects onto
the vocabulary only the nodes of depth ``d`` that have children, whose children it then chooses:

* ``children="sampled"`` (default, T > 0): drawn one after the other *without replacement* from
  the node's warped draft law q (Gumbel-top-k, Kool et al. 2019: the top-k of ``log q + Gumbel``
  noise is a sequential sample without replacement), verified by the recursive rule with
  ``q_{i+1} = norm(q_i without x_i)``;
* ``children="top_k"``: the node's k most likely draft tokens, deterministic, verified by the
  one-hot rule (§4);
* ``children="iid"``: drawn independently *with replacement* from q (SpecInfer's multi-draft;
  SpecTr's k i.i.d. chains), verified by the rule with ``q_i = q`` or, for chains, by the
  multi-draft ``rule`` given (``"k_seq"``, ``"naive_multi_draft"``: ``specjax.verify.spectr``);

all exact. At temperature 0 children are the draft's top-k and the verifier walks the target's
argmax (token-exact greedy). The last forward writes every node's key/value into the draft's
scratch slots, so that after verification the accepted path is compacted into place exactly as
in the target's cache (``kv_cache.compact_path``) and the draft never lags.

Cost: ``depth + 1`` draft forwards (the last over all ``N + 1`` tokens, to store their entries),
``sum_d |depth <= d|`` tokens in all, and one vocabulary row per internal node. Feeding the
earlier levels again is the price of the model's mask, which sees committed slots and the new
tokens only; a pass that also read the earlier levels' scratch entries would feed each node once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import sampling as sampling_lib
from specjax.models.kv_cache import KVCache, compact_path, init_cache
from specjax.options import TREE_CHILDREN as CHILDREN
from specjax.proposers import draft_chain
from specjax.proposers.base import TREE, Candidates, Outcome
from specjax.trees import Tree

_RULE = {"sampled": "without_replacement", "top_k": "one_hot", "iid": "with_replacement"}


@flax.struct.dataclass
class DraftTreeState:
  cache: KVCache  # committed = the target's committed tokens; lengths = the target's


def prefill(draft, prompt: jax.Array, prompt_lengths: jax.Array,
            cache_length: int) -> DraftTreeState:
  """The draft's cache holds exactly the prompt, like the target's."""
  cache = init_cache(draft.config, prompt.shape[0], cache_length)
  _, cache = draft(prompt, cache)
  return DraftTreeState(cache=cache.with_lengths(prompt_lengths))


def commit(state: DraftTreeState, outcome: Outcome) -> DraftTreeState:
  """The accepted path's entries (written by the proposal's last pass) move into place next to
  the pending token's, as in the target's cache; the draft never lags."""
  o = outcome
  cache = compact_path(state.cache, o.path)
  return DraftTreeState(cache=cache.with_lengths(
      jnp.where(o.active, o.target_length + 1 + o.num_accepted, o.target_length)))


def sync(draft, state: DraftTreeState, text: jax.Array, lengths: jax.Array, width: int,
         score=None, greedy: bool = False):
  """The draft's cache caught up with the committed text ``text[b, :lengths[b]]``
  (``draft_chain.catch_up``, ``width`` tokens a pass): after an adaptive method's plain
  iterations, which skip the draft. Returns the state, or (state, the sums) with ``score``."""
  behind = jnp.zeros(text.shape[:1], bool)  # a tree's draft holds all the committed text
  cache, _, sums = draft_chain.catch_up(draft, state.cache, behind, text, lengths, width, score,
                                        greedy)
  state = state.replace(cache=cache)
  return state if score is None else (state, sums)


class SkippableDraft:
  """What a draft-model tree proposer (``graphdef``, ``children``, ``first_level_ranks``) offers
  ``sj.Adaptive``: a draft that plain iterations skip and ``sync`` catches up."""

  def sync(self, params, state, text, lengths, width: int, score=None, greedy: bool = False):
    """``sync`` with the draft's weights ``params``."""
    return sync(nnx.merge(self.graphdef, params), state, text, lengths, width, score, greedy)

  def first_guesses(self, sampling) -> tuple[int, ...]:
    """The draft's ranks that the root's children hold at ``sampling`` (0: its most likely
    token), or () where they are drawn (sampled children at T > 0): a skipped draft's look
    scores its first guesses by whether the target's token is among those ranks."""
    deterministic = sampling.is_greedy or self.children == "top_k"
    return self.first_level_ranks if deterministic else ()


class Growth:
  """A static tree's nodes chosen level by level from a draft's logits (the children rules of the
  module docstring), for any proposer that scores a level's parents at a time (``DraftTree``,
  EAGLE heads). ``tokens``: int32[B, N + 1] over [pending, nodes], filled as levels come."""

  def __init__(self, tree: Tree, pending: jax.Array, children: str, sampling, vocab_size: int):
    self.tree, self.sampling, self.children = tree, sampling, children
    batch, n = pending.shape[0], tree.num_nodes
    self.parent_row = np.asarray(tree.parents, np.int32) + 1
    # Which of a parent's candidates each node holds: its rank-th most likely draft token for
    # top-k children; for sampled ones, its place in the sampling order (the i-th draw without
    # replacement), so that the verifier's q_i = q without the earlier siblings holds even where
    # the tree's ranks skip values.
    self.sampled = children == "sampled" and not sampling.is_greedy
    self.iid = children == "iid" and not sampling.is_greedy
    self.ranks = np.asarray(tree.sibling_index if self.sampled else tree.ranks, np.int32)
    self.has_children = np.zeros(n + 1, bool)
    self.has_children[self.parent_row] = True
    self.tokens = jnp.concatenate([pending[:, None], jnp.zeros((batch, n), jnp.int32)], axis=1)
    self.q = None if sampling.is_greedy else jnp.zeros((batch, n + 1, vocab_size), jnp.float32)

  def parents(self, d: int) -> np.ndarray:
    """Rows (over [pending, nodes]) of the depth-``d`` nodes whose children come next."""
    return np.flatnonzero((self.tree.verification_depths == d) & self.has_children)

  def children_of(self, d: int) -> np.ndarray:
    """Rows of the depth-``d + 1`` nodes (the children chosen by ``add_children(d, ...)``)."""
    return np.flatnonzero(self.tree.verification_depths == d + 1)

  def add_children(self, d: int, logits: jax.Array, key: jax.Array) -> None:
    """Chooses the children of ``parents(d)`` from their draft logits float32[B, P, V]; key[B]."""
    sampling = self.sampling
    parents = self.parents(d)
    if sampling.is_greedy:
      scores = logits
    else:
      q = sampling_lib.probabilities(logits, sampling)
      scores = jnp.log(q)
      if self.sampled:
        scores = scores + jax.vmap(lambda k: jax.random.gumbel(k, q.shape[1:], jnp.float32))(key)
      self.q = self.q.at[:, parents].set(q)
    children = self.children_of(d)
    slot = np.searchsorted(parents, self.parent_row[children - 1])  # each child's parent among P
    if self.iid:  # one independent Gumbel-argmax (a draw from q) per child
      noise = jax.vmap(lambda k: jax.random.gumbel(k, (len(children),) + q.shape[2:],
                                                   jnp.float32))(key)
      chosen = jnp.argmax(scores[:, slot] + noise, axis=-1).astype(jnp.int32)
    else:
      width = int(self.ranks[children - 1].max()) + 1
      best = jax.lax.top_k(scores, width)[1].astype(jnp.int32)  # [B, P, width]
      chosen = best[:, slot, self.ranks[children - 1]]
    self.tokens = self.tokens.at[:, children].set(chosen)

  def candidates(self, rule: str = "") -> Candidates:
    """The grown tree for the loop; ``rule``: the sampled children's verification rule ("" =
    the one ``children`` implies)."""
    rule = "one_hot" if self.sampling.is_greedy else (rule or _RULE[self.children])
    return Candidates(tokens=self.tokens[:, 1:], q=None if rule == "one_hot" else self.q,
                      kind=TREE, tree=self.tree, rule=rule)


class StaticTree:
  """The sizes of a proposer of the static tree ``self.tree``."""

  @property
  def num_candidates(self) -> int:
    return self.tree.num_nodes

  @property
  def depth(self) -> int:
    return self.tree.max_depth


@dataclasses.dataclass(frozen=True)
class DraftTree(StaticTree, SkippableDraft):
  """The proposer of ``sj.TreeSpeculative``; ``graphdef`` is the draft's static graph."""

  graphdef: Any
  tree: Tree
  children: str = "sampled"
  rule: str = ""  # the sampled children's verification rule; "" = the one ``children`` implies

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.tree.max_depth + 1

  prefill_draft_calls = 1

  @property
  def first_level_ranks(self) -> tuple[int, ...]:
    return tuple(r for r, d in zip(self.tree.ranks, self.tree.depths) if d == 1)

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    return prefill(nnx.merge(self.graphdef, params), prompt, prompt_lengths, cache_length)

  def propose(self, params, state, pending, keys, sampling):
    """keys: key[B, >= depth], one per row and level (the Gumbel noise of sampled children)."""
    draft = nnx.merge(self.graphdef, params)
    tree = self.tree
    mask, depths = tree.verification_mask, tree.verification_depths  # rows: [pending, nodes]
    grow = Growth(tree, pending, self.children, sampling, draft.config.vocab_size)
    for d in range(tree.max_depth):  # static: each level has its own (small) shapes
      seen = np.flatnonzero(depths <= d)  # rows whose tokens are known; ancestors precede
      at = tuple(int(i) for i in np.searchsorted(seen, grow.parents(d)))
      logits, _ = draft(grow.tokens[:, seen], state.cache, mask[np.ix_(seen, seen)], depths[seen],
                        logits_at=at)  # [B, P, V]: the vocabulary projection for parents only
      grow.add_children(d, logits, keys[:, d])
    # Every node's entry into the draft's scratch slots, for compact_path after verification.
    _, cache = draft(grow.tokens, state.cache, mask, depths, logits_at=0)
    return grow.candidates(self.rule), state.replace(cache=cache)

  def commit(self, params, state, candidates, outcome):
    del params, candidates
    return commit(state, outcome)
