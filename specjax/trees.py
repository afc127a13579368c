"""Static token trees (ALGORITHMS.md §7): the shapes that tree proposers fill and the loop verifies.

A tree of ``N`` nodes hangs below an implicit root, the row's pending token (the last emitted
token, not yet in the target cache). Node ``i`` has a parent ``parents[i]`` (``-1`` = the root)
that precedes it (``parents[i] < i``: topological order, as SGLang and Medusa store trees) and a
``rank``: its place among its siblings, which says which of the parent's top candidates it holds
(rank 0 = the most likely child). Everything here is plain Python/numpy, fixed when the method is
built, so shapes and masks are static under ``jit``.

* ``Tree.from_paths(paths)``: Medusa-style choice lists; each path is a tuple of child ranks from
  the root, e.g. ``[(0,), (1,), (0, 0), (0, 1)]`` (Cai et al. 2024, arXiv 2401.10774, §2.1.2 and
  its ``medusa_choices``); every path's parent path must be in the list.
* ``Tree.full(depth=, branching=)``: every node has ``branching`` children down to ``depth``.
* ``Tree.chains(num=, depth=)``: ``num`` disjoint chains of ``depth`` tokens (SpecInfer's
  multi-draft shape; ``num = 1`` is the plain speculative chain).

Derived arrays: ``depths`` (1 for the root's children), ``ancestor_mask`` (node i sees node j iff j
is i or an ancestor of i; the root is seen by all), ``paths`` (root-to-leaf node lists, padded with
-1: Medusa's ``retrieve_indices``), ``children`` (per node, by rank, -1 padded).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
from typing import Iterable, Sequence

import numpy as np

MAX_NODES = 1024  # a target pass over more candidates than this is no longer a "decoding step"


@dataclasses.dataclass(frozen=True)
class Tree:
  """A validated static token tree; build it with ``from_paths``, ``full`` or ``chains``."""

  parents: tuple[int, ...]  # parent node of each node; -1 = the root (pending token)
  ranks: tuple[int, ...]  # each node's rank among its siblings (0 = most likely child)

  def __post_init__(self):
    parents, ranks = tuple(self.parents), tuple(self.ranks)
    n = len(parents)
    if n == 0:
      raise ValueError("a token tree needs at least one node")
    if n > MAX_NODES:
      raise ValueError(f"a token tree of {n} nodes exceeds the limit of {MAX_NODES}")
    if len(ranks) != n:
      raise ValueError(f"{n} parents but {len(ranks)} ranks")
    seen = set()
    for i, (parent, rank) in enumerate(zip(parents, ranks)):
      if not isinstance(parent, (int, np.integer)) or not -1 <= parent < i:
        raise ValueError(f"node {i}'s parent {parent!r} must be -1 (the root) or an earlier node "
                         f"(parents precede children)")
      if not isinstance(rank, (int, np.integer)) or rank < 0:
        raise ValueError(f"node {i}'s rank {rank!r} must be an integer >= 0")
      if (parent, rank) in seen:
        raise ValueError(f"node {i} repeats rank {rank} under parent {parent}")
      seen.add((int(parent), int(rank)))
    object.__setattr__(self, "parents", tuple(int(p) for p in parents))
    object.__setattr__(self, "ranks", tuple(int(r) for r in ranks))

  # --------------------------------------------------------------------------- constructors

  @classmethod
  def from_paths(cls, paths: Iterable[Sequence[int]]) -> "Tree":
    """A tree from Medusa-style choice paths (tuples of child ranks from the root).

    Nodes are ordered by depth, then by path, so parents precede children. Raises for an empty
    list, an empty or repeated path, a negative rank, or a path whose parent path is missing.
    """
    paths = [tuple(p) for p in paths]
    if not paths:
      raise ValueError("a token tree needs at least one path")
    for p in paths:
      if not p:
        raise ValueError("an empty path () names the root, which is implicit; give paths of "
                         "length >= 1")
      if any(not isinstance(r, (int, np.integer)) or isinstance(r, bool) or r < 0 for r in p):
        raise ValueError(f"path {p}: ranks must be integers >= 0")
    if len(set(paths)) != len(paths):
      dup = next(p for p in paths if paths.count(p) > 1)
      raise ValueError(f"path {dup} appears twice")
    ordered = sorted(paths, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(ordered)}
    parents = []
    for p in ordered:
      if len(p) > 1 and p[:-1] not in index:
        raise ValueError(f"path {p}'s parent path {p[:-1]} is missing: the tree would be "
                         f"disconnected")
      parents.append(index[p[:-1]] if len(p) > 1 else -1)
    return cls(parents=tuple(parents), ranks=tuple(p[-1] for p in ordered))

  @classmethod
  def full(cls, *, depth: int, branching: int) -> "Tree":
    """Every node has ``branching`` children, down to ``depth`` (sum of branching^d nodes)."""
    _check_positive(depth=depth, branching=branching)
    paths = [p for d in range(1, depth + 1) for p in itertools.product(range(branching), repeat=d)]
    return cls.from_paths(paths)

  @classmethod
  def medusa(cls, name: str = "mc_sim_7b_63") -> "Tree":
    """One of Medusa's released trees (``specjax.tree_presets.MEDUSA_TREES``: 63 nodes, depth
    4), e.g. ``"mc_sim_7b_63"`` (the repository's default) or ``"vicuna_7b_stage2"``."""
    from specjax.tree_presets import MEDUSA_TREES
    if name not in MEDUSA_TREES:
      raise ValueError(f"unknown Medusa tree {name!r}; known: {', '.join(MEDUSA_TREES)}")
    return cls.from_paths(MEDUSA_TREES[name])

  @classmethod
  def from_accuracies(cls, accuracies, num_nodes: int) -> "Tree":
    """The Medusa paper's greedy tree (Cai et al. 2024, arXiv 2401.10774, §3.3.2): with
    ``accuracies[k][r]`` the measured probability that head ``k``'s rank-``r`` candidate is the
    right token (float[K, R]), a node's value is the product of its path's accuracies (its
    chance of being accepted, heads taken as independent); nodes join in order of value, each
    joining the tree it extends, until there are ``num_nodes``. Ties: the shorter, then the
    lexicographically smaller path."""
    acc = np.asarray(accuracies, np.float64)
    if acc.ndim != 2 or acc.size == 0 or not np.all((acc >= 0) & (acc <= 1)):
      raise ValueError(f"accuracies must be a [heads, ranks] array of probabilities in [0, 1], "
                       f"got shape {acc.shape}")
    _check_positive(num_nodes=num_nodes)
    heads, ranks = acc.shape
    if num_nodes > sum(ranks ** d for d in range(1, heads + 1)):
      raise ValueError(f"num_nodes {num_nodes} exceeds the {heads} heads' full tree of top-{ranks}")
    frontier = [(-acc[0, r], 1, (r,)) for r in range(ranks)]
    heapq.heapify(frontier)
    paths = []
    while len(paths) < num_nodes:
      value, depth, path = heapq.heappop(frontier)
      paths.append(path)
      if depth < heads:
        for r in range(ranks):
          heapq.heappush(frontier, (value * acc[depth, r], depth + 1, path + (r,)))
    return cls.from_paths(paths)

  @classmethod
  def chains(cls, *, num: int, depth: int) -> "Tree":
    """``num`` disjoint chains of ``depth`` tokens each: the i-th starts with the root's rank-i
    child and continues with rank-0 children."""
    _check_positive(num=num, depth=depth)
    return cls.from_paths([(i,) + (0,) * d for i in range(num) for d in range(depth)])

  def at_depth(self, depth: int) -> "Tree":
    """The tree cut to its first ``depth`` levels (the nodes at most ``depth`` deep, in their
    order): an ``sj.Adaptive`` menu entry of a draft-model tree method, whose levels are the full
    tree's, so that a level's acceptance is the same in every entry."""
    _check_positive(depth=depth)
    if depth > self.max_depth:
      raise ValueError(f"depth {depth} exceeds the tree's depth {self.max_depth}")
    kept = np.flatnonzero(self.depths <= depth)
    index = {int(node): i for i, node in enumerate(kept)}
    return Tree(parents=tuple(index[self.parents[n]] if self.parents[n] >= 0 else -1
                              for n in kept), ranks=tuple(self.ranks[n] for n in kept))

  # --------------------------------------------------------------------------- derived arrays

  @property
  def num_nodes(self) -> int:
    return len(self.parents)

  @functools.cached_property
  def depths(self) -> np.ndarray:
    """int32[N]: 1 for the root's children, parent's depth + 1 below."""
    depths = np.zeros(self.num_nodes, np.int32)
    for i, parent in enumerate(self.parents):
      depths[i] = 1 if parent < 0 else depths[parent] + 1
    return depths

  @property
  def max_depth(self) -> int:
    return int(self.depths.max())

  @functools.cached_property
  def ancestor_mask(self) -> np.ndarray:
    """bool[N, N]: ``[i, j]`` iff node j is node i or one of its ancestors."""
    mask = np.eye(self.num_nodes, dtype=bool)
    for i, parent in enumerate(self.parents):
      if parent >= 0:
        mask[i] |= mask[parent]
    return mask

  @functools.cached_property
  def is_leaf(self) -> np.ndarray:
    """bool[N]: nodes without children."""
    leaf = np.ones(self.num_nodes, bool)
    leaf[[p for p in self.parents if p >= 0]] = False
    return leaf

  @functools.cached_property
  def paths(self) -> np.ndarray:
    """int32[L, D]: the nodes on each root-to-leaf path (root excluded), -1 padded."""
    rows = []
    for leaf in np.flatnonzero(self.is_leaf):
      rows.append(np.flatnonzero(self.ancestor_mask[leaf]))  # ancestors precede: sorted = path
    out = np.full((len(rows), self.max_depth), -1, np.int32)
    for r, nodes in enumerate(rows):
      out[r, :len(nodes)] = nodes
    return out

  @functools.cached_property
  def children(self) -> np.ndarray:
    """int32[N + 1, C]: row 0 = the root's children, row i + 1 = node i's, by rank, -1 padded."""
    kids = [[] for _ in range(self.num_nodes + 1)]
    for i in sorted(range(self.num_nodes), key=lambda i: self.ranks[i]):
      kids[self.parents[i] + 1].append(i)
    width = max(1, max(len(k) for k in kids))
    out = np.full((self.num_nodes + 1, width), -1, np.int32)
    for row, k in enumerate(kids):
      out[row, :len(k)] = k
    return out

  @functools.cached_property
  def sibling_index(self) -> np.ndarray:
    """int32[N]: each node's column in ``children`` (its place among its siblings by rank: 0, 1,
    ... even where ranks skip values)."""
    out = np.zeros(self.num_nodes, np.int32)
    for row in self.children:
      for column, node in enumerate(row):
        if node >= 0:
          out[node] = column
    return out

  @functools.cached_property
  def chain_table(self) -> np.ndarray:
    """int32[K, L] for a tree of ``K`` disjoint chains of depth ``L`` (``Tree.chains``): the
    node at depth ``d + 1`` of chain ``j``; raises for any other shape (``chain_table``)."""
    return chain_table(self.children)

  @functools.cached_property
  def verification_mask(self) -> np.ndarray:
    """bool[N + 1, N + 1]: the mask of a pass over ``[pending, nodes]`` (everyone sees the
    pending token; node i sees its ancestors and itself)."""
    n = self.num_nodes
    mask = np.zeros((n + 1, n + 1), bool)
    mask[:, 0] = True
    mask[1:, 1:] = self.ancestor_mask
    return mask

  @functools.cached_property
  def verification_depths(self) -> np.ndarray:
    """int32[N + 1]: the depths of ``[pending, nodes]`` (0 for the pending token)."""
    return np.concatenate([[0], self.depths]).astype(np.int32)

  @property
  def draft_pass_widths(self) -> tuple[int, ...]:
    """The tokens of each draft pass growing this tree level by level (``sj.TreeSpeculative``;
    ``specjax.proposers.draft_tree``): level d's over the root and the nodes at most d deep,
    then the last over all N + 1 (storing their keys and values); what ``sj.CostTable`` prices."""
    depths = self.verification_depths
    return tuple(int(np.sum(depths <= d)) for d in range(self.max_depth)) + (self.num_nodes + 1,)

  def __repr__(self) -> str:
    return f"Tree(nodes={self.num_nodes}, depth={self.max_depth}, leaves={int(self.is_leaf.sum())})"



@dataclasses.dataclass(frozen=True)
class DynamicTree:
  """A token tree the draft grows per row and per iteration (EAGLE-2, Li et al. 2024, arXiv
  2406.16858, §4): from the root, each of the ``width`` most confident nodes of a level (by the
  draft's cumulative probability along the path) gets its ``width`` most likely children; after
  ``depth`` levels the ``nodes`` most confident of all candidates are verified. Only the sizes are
  static; the parents are per-row arrays (``specjax.proposers.dynamic_tree``). The children are a
  deterministic function of the draft, so the target verifies them with the one-hot rule
  (ALGORITHMS.md §4): exact at any temperature.
  """

  depth: int
  width: int
  nodes: int

  def __post_init__(self):
    _check_positive(depth=self.depth, width=self.width, nodes=self.nodes)
    if self.nodes > self.pool_size:
      raise ValueError(f"nodes={self.nodes} exceeds the {self.pool_size} candidates that depth="
                       f"{self.depth}, width={self.width} grow (width + (depth - 1) width^2)")
    if self.nodes > MAX_NODES:
      raise ValueError(f"a token tree of {self.nodes} nodes exceeds the limit of {MAX_NODES}")

  def at_depth(self, depth: int) -> "DynamicTree":
    """The tree grown ``depth`` levels (an ``sj.Adaptive`` menu entry) with the same ``width``
    and a node budget prorated by depth, ``nodes x depth / self.depth`` rounded up (at least
    ``depth``, at most what ``depth`` levels grow), so that each level keeps about as many
    nodes as in the full tree."""
    _check_positive(depth=depth)
    if depth > self.depth:
      raise ValueError(f"depth {depth} exceeds the tree's depth {self.depth}")
    pool = self.width + (depth - 1) * self.width ** 2
    return DynamicTree(depth=depth, width=self.width,
                       nodes=min(pool, max(depth, -(-self.nodes * depth // self.depth))))

  @property
  def pool_size(self) -> int:
    """Candidates grown: ``width`` children of the root, then ``width^2`` per further level."""
    return self.width + (self.depth - 1) * self.width ** 2

  @property
  def num_nodes(self) -> int:
    return self.nodes

  @property
  def max_depth(self) -> int:
    """The deepest a verified node can be (a level-``depth`` node is kept only if its parents
    are)."""
    return min(self.depth, self.nodes)

  @property
  def draft_pass_widths(self) -> tuple[int, ...]:
    """The tokens of each draft pass growing this tree (``specjax.proposers.dynamic_tree``):
    level l's over the root and the ``width`` nodes expanded at each earlier level, then the
    last over ``nodes + 1``."""
    return tuple(1 + (lvl - 1) * self.width for lvl in range(1, self.depth + 1)) + (self.nodes + 1,)

  @property
  def ranks(self) -> tuple[int, ...]:
    """The ranks a node's children can take (for validation against the vocabulary)."""
    return tuple(range(self.width))

def _check_positive(**values) -> None:
  for name, value in values.items():
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def chain_table(children: np.ndarray) -> np.ndarray:
  """int32[K, L] from a ``Tree.children`` table of ``K`` disjoint chains of equal depth ``L``:
  entry ``[j, d]`` is the node at depth ``d + 1`` of the chain that starts at the root's j-th
  child. Multi-draft rules (SpecTr) walk such independent chains; any other shape is refused."""
  children = np.asarray(children)
  table = []
  for head in (int(c) for c in children[0] if c >= 0):
    chain = [head]
    while True:
      kids = [int(c) for c in children[chain[-1] + 1] if c >= 0]
      if not kids:
        break
      if len(kids) > 1:
        raise ValueError(f"node {chain[-1]} has {len(kids)} children; a multi-draft tree is "
                         f"disjoint chains (sj.Tree.chains)")
      chain.append(kids[0])
    table.append(chain)
  if len({len(c) for c in table}) != 1:
    raise ValueError(f"chains of depths {sorted({len(c) for c in table})}; a multi-draft tree's "
                     f"chains all have one depth (sj.Tree.chains)")
  return np.asarray(table, np.int32)
