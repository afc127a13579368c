"""Typical acceptance (Medusa, Cai et al. 2024, arXiv 2401.10774, §2.3.1; ALGORITHMS.md §11):
**LOSSY**, opt-in only. It does not preserve the target's distribution.

A candidate ``x`` whose parent's target law (warped at the run's temperature) is ``p`` passes
when ``p(x) > min(epsilon, delta * exp(-H(p)))``, ``H(p) = -sum p log(p + 1e-5)`` as in the
Medusa repository (``evaluate_posterior``, "fast" typical mode). The accepted path is the
deepest node all of whose ancestors and itself pass (ties: the most likely path, the sum of
``log p(x)`` along it, as the repository picks among its candidate paths); the token after it is
drawn from the target's warped law there. The defaults are the released ones
(``posterior_threshold`` = epsilon = 0.09, ``posterior_alpha`` = delta = 0.3: the repository's
MT-bench runs).

Where it is exact: with a threshold at or above every probability (epsilon >= 1 and a large
delta) nothing passes and every token is the target's own draw (no speedup); as the temperature
goes to 0 the warped law concentrates on the argmax and the rule becomes greedy matching (the
paper's limit); at temperature 0 the loop verifies greedily, as the repository does, so greedy
outputs stay exact. With epsilon or delta at 0 every candidate of positive probability passes.
How far the output law strays in between is computed by enumeration in ``tests/test_medusa.py``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax.sampling import sample_from_probs
from specjax.trees import Tree
from specjax.verify.tree import TreeVerdict


@dataclasses.dataclass(frozen=True)
class Typical:
  """The parameters of typical acceptance (lossy): ``epsilon`` the hard threshold, ``delta``
  the entropy-scaled one."""

  epsilon: float = 0.09
  delta: float = 0.3

  def __post_init__(self):
    for name in ("epsilon", "delta"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
          math.isfinite(value) and value >= 0):
        raise ValueError(f"typical acceptance {name} must be a finite number >= 0, got {value!r}")

  @property
  def label(self) -> str:
    """How reports name the verifier (never mistaken for an exact rule)."""
    return f"typical(epsilon={self.epsilon:g}, delta={self.delta:g}; lossy)"


def threshold(p: jax.Array, typical: Typical) -> jax.Array:
  """float32[...] ``min(epsilon, delta * exp(-H(p)))`` of laws p[..., V]."""
  entropy = -jnp.sum(p * jnp.log(p + 1e-5), axis=-1)
  return jnp.minimum(jnp.float32(typical.epsilon), typical.delta * jnp.exp(-entropy))


class TypicalCore(NamedTuple):
  """The deterministic part of typical acceptance (everything but the last draw)."""

  path: jax.Array  # int32[D] accepted nodes from the root down, -1 after
  num_accepted: jax.Array  # int32[]
  next_dist: jax.Array  # float32[V] the law of the token emitted after the path


def typical_core(p: jax.Array, tokens: jax.Array, tree: Tree, typical: Typical) -> TypicalCore:
  """One row: ``p`` float32[N + 1, V] the warped target laws over [pending, nodes], ``tokens``
  int32[N] the nodes' tokens, ``tree`` static (a chain is a one-path tree)."""
  parent_row = np.asarray(tree.parents, np.int32) + 1
  ancestors = jnp.asarray(tree.ancestor_mask)  # [i, j]: j is i or an ancestor of i
  depths = jnp.asarray(tree.depths)
  prob = jnp.take_along_axis(p[parent_row], tokens[:, None], axis=1)[:, 0]
  passes = prob > threshold(p, typical)[parent_row]
  good = jnp.all(passes[None, :] | ~ancestors, axis=1)
  n = jnp.max(jnp.where(good, depths, 0))
  likelihood = ancestors.astype(jnp.float32) @ jnp.log(jnp.maximum(prob, 1e-30))
  best = jnp.argmax(jnp.where(good & (depths == n), likelihood, -jnp.inf)).astype(jnp.int32)
  path = jnp.where(n > 0, jnp.asarray(_paths_by_node(tree))[best], -1)
  return TypicalCore(path=path, num_accepted=n.astype(jnp.int32),
                     next_dist=p[jnp.where(n > 0, best + 1, 0)])


def typical_tree(key: jax.Array, p: jax.Array, tokens: jax.Array, tree: Tree,
                 typical: Typical) -> TreeVerdict:
  """``typical_core``, then the token after the path drawn from the target's law there."""
  core = typical_core(p, tokens, tree, typical)
  return TreeVerdict(path=core.path, num_accepted=core.num_accepted,
                     next_token=sample_from_probs(key, core.next_dist))


def _paths_by_node(tree: Tree) -> np.ndarray:
  """int32[N, D] node i's path from the root (its ancestors and itself by depth), -1 padded."""
  out = np.full((tree.num_nodes, tree.max_depth), -1, np.int32)
  for i, row in enumerate(tree.ancestor_mask):
    nodes = np.flatnonzero(row)  # ancestors precede their descendants
    out[i, :len(nodes)] = nodes
  return out
