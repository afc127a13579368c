"""An EAGLE head drafting a chain, a static tree or EAGLE-2's dynamic tree on the target's
features (``sj.Eagle``; Li et al. 2024, arXiv 2401.15077; the head: ``specjax.heads.eagle``).

The head's entry ``t`` pairs token ``t + 1`` with the target's feature at ``t``. Its drafts run
on its own predicted features, but what enters its KV cache for good must pair accepted tokens
with the *target's* features (the repository recomputes the accepted positions from the
verification pass's hidden states): ``commit`` keeps, per row, the ``n + 1`` pairs the iteration
made true (the accepted path's tokens and the token after it, with the target's features at the
pending token and along the path, ``Outcome.features``), and the next ``propose`` feeds them in
its first head pass (over ``depth + 1`` tokens; rows with fewer pairs pad, and their pads stay
past the committed length), so a chain's iteration costs ``gamma`` head passes, a tree's
``depth``.

Invariant between iterations: the head's committed length is the target's minus ``count``
(the pairs waiting); the last waiting pair is the pending token's, with the target's feature
at the token before it. Sampling: each draft token is drawn from the head's warped law, which is
the ``q`` the rejection rule verifies against (lossless, ALGORITHMS.md §1-3); greedy drafts are
argmax (q = None).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.kv_cache import KVCache, init_cache
from specjax.proposers.base import CHAIN, TREE, Candidates, Outcome
from specjax.proposers.draft_chain import GammaChain, draw, draw_rest
from specjax.proposers.draft_tree import Growth, StaticTree
from specjax.proposers.dynamic_tree import DynamicSizes, grow, pool_layout
from specjax.trees import DynamicTree, Tree


@flax.struct.dataclass
class EagleState:
  cache: KVCache  # the head's; committed = the pairs before the waiting ones
  tokens: jax.Array  # int32[B, D + 1] waiting pairs' tokens (the last one: pending, set later)
  features: jax.Array  # [B, D + 1, F, E] waiting pairs' target features (raw)
  count: jax.Array  # int32[B] waiting pairs (>= 1)


class Models:
  """The head and the target views one proposer call needs, from its ``(head, target)`` params:
  the target's embedding embeds tokens; the head turns the target's features into its input
  (``from_target``) and its predicted features into logits in the target's vocabulary
  (``draft_logits``: EAGLE-1/2 through the target's LM head, EAGLE-3 through its own)."""

  def __init__(self, head_graphdef, target_graphdef, params):
    head_state, target_state = params
    self.head = nnx.merge(head_graphdef, head_state)
    self.target = nnx.merge(target_graphdef, target_state)

  def with_head(self, head) -> "Models":
    """The same target with another head (one module of an ``MTPStack``)."""
    view = copy.copy(self)
    view.head = head
    return view

  def embed(self, tokens: jax.Array) -> jax.Array:
    return jnp.take(self.target.embed[...], tokens, axis=0)

  def step(self, tokens, hidden, cache, tree_mask=None, depths=None):
    """(predicted features [B, T, E], cache) of the pairs (tokens [B, T], head input features
    [B, T, E])."""
    return self.head(self.embed(tokens), hidden, cache, tree_mask, depths)

  def logits(self, hidden: jax.Array) -> jax.Array:
    return self.head.draft_logits(hidden, self.target)

  def draw(self, keys: jax.Array, hidden: jax.Array, sampling):
    """``draft_chain.draw`` from the head's logits at ``hidden``; greedy through the head's own
    ``greedy_draft`` where it has one (EAGLE-3: the argmax over its draft vocabulary, the same
    token without the V-wide row)."""
    greedy = getattr(self.head, "greedy_draft", None)
    if sampling.is_greedy and greedy is not None:
      return greedy(hidden), None
    return draw(keys, self.logits(hidden), sampling)


def prefill(models: Models, prompt: jax.Array, prompt_lengths: jax.Array, cache_length: int,
            features: jax.Array, depth: int) -> EagleState:
  """The prompt's pairs ``(x_{t+1}, f_t)`` into the head's cache (``t < length - 1``); the
  pending token's pair waits with ``f_{length - 1}``. features: [B, P, F, E] (the head's
  ``target_features``); waiting pairs keep them raw, ``from_target`` runs when they are fed."""
  return prefill_outputs(models, prompt, prompt_lengths, cache_length, features, depth)[0]


def prefill_outputs(models: Models, prompt: jax.Array, prompt_lengths: jax.Array,
                    cache_length: int, features: jax.Array, depth: int):
  """``prefill``'s state and the head's outputs over the prompt's pairs ([B, P - 1, E], entry
  ``t`` at column ``t``; None for a one-token width)."""
  batch, width = prompt.shape
  cache = init_cache(models.head.config, batch, cache_length)
  hidden = None
  if width > 1:
    hidden, cache = models.step(prompt[:, 1:], models.head.from_target(features[:, :-1]), cache)
  last = features[jnp.arange(batch), prompt_lengths - 1]  # [B, F, E]
  waiting = jnp.zeros((batch, depth + 1) + last.shape[1:], features.dtype).at[:, 0].set(last)
  state = EagleState(cache=cache.with_lengths(prompt_lengths - 1),
                     tokens=jnp.zeros((batch, depth + 1), jnp.int32), features=waiting,
                     count=jnp.ones((batch,), jnp.int32))
  return state, hidden


def catch_up(models: Models, state: EagleState, pending: jax.Array):
  """Feeds the waiting pairs (the pending token's last): returns (the head's guess of the
  feature after ``pending`` [B, E], its cache with the waiting pairs committed)."""
  _, hidden, cache = waiting_pass(models, state, pending)
  return hidden[jnp.arange(pending.shape[0]), state.count - 1], cache


def waiting_pass(models: Models, state: EagleState, pending: jax.Array):
  """``catch_up``'s pass: (its tokens int32[B, D + 1] (the waiting ones, ``pending`` last, then
  pads), the head's outputs over them [B, D + 1, E], its cache with the waiting pairs
  committed)."""
  tokens = state.tokens.at[jnp.arange(pending.shape[0]), state.count - 1].set(pending)
  hidden, cache = models.step(tokens, models.head.from_target(state.features), state.cache)
  return tokens, hidden, cache.with_lengths(cache.lengths + state.count)


def commit(state: EagleState, drafts: jax.Array, outcome: Outcome) -> EagleState:
  """The pairs this iteration made true wait for the next ``propose``: the accepted path's
  tokens and the next token, with the target's features at pending and along the path."""
  o = outcome
  depth = o.path.shape[1]
  j = jnp.arange(depth + 1)[None, :]
  node = jnp.maximum(o.path, 0)  # [B, D]
  rows = jnp.concatenate([jnp.zeros_like(node[:, :1]), 1 + node], axis=1)  # over [pending, ..]
  feats = jnp.take_along_axis(o.features, rows[:, :, None, None], axis=1)  # [B, D + 1, F, E]
  on_path = jnp.pad(jnp.take_along_axis(drafts, node, axis=1), ((0, 0), (0, 1)))
  n = o.num_accepted[:, None]
  tokens = jnp.where(j < n, on_path, jnp.where(j == n, o.next_token[:, None], 0))
  keep = lambda new, old: jnp.where(o.active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)
  # Committed: every pair up to the pending token's (its slot is target_length - 1); a finished
  # row keeps the invariant's length (its pairs still waiting).
  lengths = o.target_length - jnp.where(o.active, 0, state.count)
  return EagleState(cache=state.cache.with_lengths(lengths), tokens=keep(tokens, state.tokens),
                    features=keep(feats.astype(state.features.dtype), state.features),
                    count=keep(o.num_accepted + 1, state.count))


class EagleProposer:
  """What chains and trees share: params ``(head state, target state)`` (the target's arrays are
  the loop's own buffers), the features they read, prefill and commit."""

  prefill_draft_calls = 1

  def models(self, params) -> Models:
    return Models(self.head_graphdef, self.target_graphdef, params)

  def prefill(self, params, prompt, prompt_lengths, cache_length, features):
    return prefill(self.models(params), prompt, prompt_lengths, cache_length, features,
                   self.depth)

  def commit(self, params, state, candidates, outcome):
    del params
    return commit(state, candidates.tokens, outcome)


@dataclasses.dataclass(frozen=True)
class EagleChain(GammaChain, EagleProposer):
  """The proposer of ``sj.Eagle(head, gamma=...)``: ``gamma`` drafts, one head pass each."""

  head_graphdef: Any
  target_graphdef: Any
  features: tuple  # the target layers the head reads (its ``target_features``)
  gamma: int

  def propose(self, params, state, pending, keys, sampling):
    models = self.models(params)
    feature, cache = catch_up(models, state, pending)
    token, q = models.draw(keys[:, 0], feature, sampling)

    def step(carry, key):
      cache, token, feature = carry
      hidden, cache = models.step(token[:, None], feature[:, None], cache)
      cache = cache.with_lengths(cache.lengths + 1)
      feature = hidden[:, 0]
      token, q = models.draw(key, feature, sampling)
      return (cache, token, feature), (token, q)

    (cache, _, _), tokens, q = draw_rest(step, (cache, token, feature), token, q, keys)
    return Candidates(tokens=tokens, q=q, kind=CHAIN), state.replace(cache=cache)


@dataclasses.dataclass(frozen=True)
class EagleTree(StaticTree, EagleProposer):
  """The proposer of ``sj.Eagle(head, tree=sj.Tree...)``: a static token tree grown level by
  level from the head (EAGLE's tree drafting, Li et al. 2024 §4.2), with ``draft_tree``'s
  children rules (``Growth``: sampled without replacement and verified against the head's true
  law, top-k with the one-hot rule, or i.i.d.). A node's pair is (its token, the head's guess of
  its parent's feature); level ``d``'s pass feeds the nodes of depth <= ``d`` under their ancestor
  mask after the waiting pairs (``catch_up``), so an iteration costs ``depth`` head passes. The
  nodes' entries are scratch: the next ``catch_up`` writes the accepted path's true pairs."""

  head_graphdef: Any
  target_graphdef: Any
  features: tuple
  tree: Tree
  children: str = "sampled"

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.tree.max_depth

  def propose(self, params, state, pending, keys, sampling):
    models = self.models(params)
    tree = self.tree
    mask, depths = tree.verification_mask, tree.verification_depths  # rows: [pending, nodes]
    root, cache = catch_up(models, state, pending)  # [B, E]: the guess at pending
    grow = Growth(tree, pending, self.children, sampling, models.target.config.vocab_size)
    grow.add_children(0, models.logits(root)[:, None], keys[:, 0])
    guesses = jnp.zeros((root.shape[0], tree.num_nodes + 1) + root.shape[1:], root.dtype)
    guesses = guesses.at[:, 0].set(root)  # the head's feature guess per row [pending, nodes]
    for d in range(1, tree.max_depth):  # static: each level has its own (small) shapes
      seen = np.flatnonzero((depths >= 1) & (depths <= d))  # nodes known; ancestors precede
      parent_of = grow.parent_row[seen - 1]
      hidden, _ = models.step(grow.tokens[:, seen], guesses[:, parent_of], cache,
                              mask[np.ix_(seen, seen)], depths[seen] - 1)
      guesses = guesses.at[:, seen].set(hidden)
      at = np.searchsorted(seen, grow.parents(d))
      grow.add_children(d, models.logits(hidden[:, at]), keys[:, d])
    return grow.candidates(), state.replace(cache=cache)


@dataclasses.dataclass(frozen=True)
class EagleDynamicTree(DynamicSizes, EagleProposer):
  """The proposer of ``sj.Eagle(head, tree=sj.DynamicTree(...))``: EAGLE-2's context-aware
  dynamic tree (Li et al. 2024, arXiv 2406.16858, §4), ``dynamic_tree.grow``'s expansion and
  reranking with each level scored by the head: after ``catch_up`` (the root's children), one
  head pass per further level over the expanded slots (pairs: the slot's token, the head's guess
  at its parent slot), so ``depth`` head passes per iteration. Deterministic: verified by the
  one-hot rule at T > 0 and the greedy walk at T = 0."""

  head_graphdef: Any
  target_graphdef: Any
  features: tuple
  spec: DynamicTree

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.spec.depth

  def propose(self, params, state, pending, keys, sampling):
    del keys  # the tree is deterministic
    models = self.models(params)
    slot_level = pool_layout(self.spec)[3]
    root, cache = catch_up(models, state, pending)  # [B, E]: the guess at pending
    guesses = {"slots": jnp.zeros((root.shape[0], len(slot_level)) + root.shape[1:],
                                  root.dtype).at[:, 0].set(root)}  # per slot, filled by level

    def score(known, expand, slot_tokens, slot_mask, slot_parent):
      if known == 1:
        return models.logits(root)[:, None]
      fed = slice(1, known)  # the expanded slots (the root's pair is in the cache)
      parent_guess = jnp.take_along_axis(guesses["slots"], slot_parent[:, fed, None], axis=1)
      hidden, _ = models.step(slot_tokens[:, fed], parent_guess, cache,
                              slot_mask[:, fed, fed], slot_level[fed] - 1)
      guesses["slots"] = guesses["slots"].at[:, fed].set(hidden)
      return models.logits(hidden[:, np.asarray(expand) - 1])

    node_tokens, trees = grow(self.spec, pending, sampling, score)
    return (Candidates(tokens=node_tokens, q=None, kind=TREE, rule="one_hot", row_trees=trees),
            state.replace(cache=cache))
