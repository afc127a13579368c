"""A draft model expanding a static token tree level by level (SpecInfer, Miao et al. 2024, arXiv
2305.09781; Sequoia, Chen et al. 2024, arXiv 2402.12374; ALGORITHMS.md §5, §7).

Per iteration the draft runs ``depth + 1`` forwards over the whole tree ``[pending, nodes]``
under the tree's ancestor mask (fixed shape: one compilation; nodes whose tokens are not chosen
yet hold placeholders, which no chosen node can see). After forward ``d`` every node at depth
``d`` has its final context, so its children are chosen from its logits:

* ``children="sampled"`` (default, T > 0): drawn one after the other *without replacement* from
  the node's warped draft law q (Gumbel-top-k, Kool et al. 2019: the top-k of ``log q + Gumbel``
  noise is a sequential sample without replacement), verified by the recursive rule with
  ``q_{i+1} = norm(q_i without x_i)``;
* ``children="top_k"``: the node's k most likely draft tokens, deterministic, verified by the
  one-hot rule (§4);

both exact. At temperature 0 children are the draft's top-k and the verifier walks the target's
argmax (token-exact greedy). The last forward writes every node's key/value into the draft's
scratch slots, so that after verification the accepted path is compacted into place exactly as
in the target's cache (``kv_cache.compact_path``) and the draft never lags.

Cost: ``(depth + 1)`` draft forwards of ``N + 1`` tokens each, with the vocabulary projection for
every node each time (the price of one static shape; a level-sized pass over the earlier levels'
scratch would cut it to ``N + 1`` tokens in all).
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
from specjax.proposers.base import TREE, Candidates
from specjax.trees import Tree

CHILDREN = ("sampled", "top_k")
_RULE = {"sampled": "without_replacement", "top_k": "one_hot"}


@flax.struct.dataclass
class DraftTreeState:
  cache: KVCache  # committed = the target's committed tokens; lengths = the target's


@dataclasses.dataclass(frozen=True)
class DraftTree:
  """The proposer of ``sj.TreeSpeculative``; ``graphdef`` is the draft's static graph."""

  graphdef: Any
  tree: Tree
  children: str = "sampled"

  @property
  def num_candidates(self) -> int:
    return self.tree.num_nodes

  @property
  def depth(self) -> int:
    return self.tree.max_depth

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.tree.max_depth + 1

  prefill_draft_calls = 1

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    draft = nnx.merge(self.graphdef, params)
    cache = init_cache(draft.config, prompt.shape[0], cache_length)
    _, cache = draft(prompt, cache)
    return DraftTreeState(cache=cache.with_lengths(prompt_lengths))

  def propose(self, params, state, pending, keys, sampling):
    """keys: key[B, >= depth], one per row and level (the Gumbel noise of sampled children)."""
    draft = nnx.merge(self.graphdef, params)
    tree = self.tree
    batch, n = pending.shape[0], tree.num_nodes
    width = tree.children.shape[1]
    mask = tree.verification_mask()
    depths = np.concatenate([[0], tree.depths]).astype(np.int32)
    parent_row = np.asarray(tree.parents, np.int32) + 1  # node i's parent's row in [pending, nodes]
    ranks = np.asarray(tree.ranks, np.int32)
    sampled = self.children == "sampled" and not sampling.is_greedy
    level_keys = jnp.swapaxes(keys[:, :tree.max_depth], 0, 1)  # [D, B]

    def level(d, carry):
      tokens, q_all = carry
      logits, _ = draft(tokens, state.cache, mask, depths)  # [B, N + 1, V]
      if sampling.is_greedy:
        scores = logits
      else:
        q = sampling_lib.probabilities(logits, sampling)
        scores = jnp.log(q)
        if sampled:
          gumbel = jax.vmap(lambda k: jax.random.gumbel(k, q.shape[1:], jnp.float32))(
              level_keys[d])
          scores = scores + gumbel
        q_all = jnp.where((jnp.asarray(depths) == d)[None, :, None], q, q_all)
      best = jax.lax.top_k(scores, width)[1].astype(jnp.int32)  # [B, N + 1, C]
      chosen = best[:, parent_row, ranks]  # [B, N]: each node's token from its parent's row
      nodes = jnp.where((jnp.asarray(tree.depths) == d + 1)[None, :], chosen, tokens[:, 1:])
      return tokens.at[:, 1:].set(nodes), q_all

    tokens = jnp.concatenate([pending[:, None], jnp.zeros((batch, n), jnp.int32)], axis=1)
    v = draft.config.vocab_size
    q_all = jnp.zeros((batch, n + 1, v), jnp.float32) if not sampling.is_greedy else None
    tokens, q_all = jax.lax.fori_loop(0, tree.max_depth, level, (tokens, q_all))
    # Every node's entry into the draft's scratch slots, for compact_path after verification.
    _, cache = draft(tokens, state.cache, mask, depths, logits_at=0)
    rule = "one_hot" if sampling.is_greedy else _RULE[self.children]
    candidates = Candidates(tokens=tokens[:, 1:], q=None if rule == "one_hot" else q_all,
                            kind=TREE, tree=tree, rule=rule)
    return candidates, state.replace(cache=cache)

  def commit(self, params, state, candidates, target_length, path, num_accepted, active):
    del params, candidates
    cache = compact_path(state.cache, path)
    return DraftTreeState(cache=cache.with_lengths(
        jnp.where(active, target_length + 1 + num_accepted, target_length)))
