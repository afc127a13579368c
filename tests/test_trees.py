"""``sj.Tree`` (specjax/trees.py): construction, validation, derived arrays against direct
definitions, and one tree pass of a real transformer == separate chain passes."""

from __future__ import annotations

import jax
import numpy as np
from absl.testing import absltest, parameterized

import specjax as sj
from specjax.models.kv_cache import init_cache
from specjax.trees import MAX_NODES

CACHE_TOL = 1e-5


def brute_ancestors(parents, i):
  """Node i and its ancestors, by walking up (a direct definition)."""
  out = {i}
  while parents[i] >= 0:
    i = parents[i]
    out.add(i)
  return out


class ConstructionTest(parameterized.TestCase):

  def test_from_paths_orders_by_depth_then_path(self):
    tree = sj.Tree.from_paths([(0, 1), (1,), (0,), (0, 0), (0, 1, 0)])
    self.assertEqual(tree.parents, (-1, -1, 0, 0, 3))  # (0,), (1,), (0,0), (0,1), (0,1,0)
    self.assertEqual(tree.ranks, (0, 1, 0, 1, 0))
    np.testing.assert_array_equal(tree.depths, [1, 1, 2, 2, 3])
    self.assertEqual(tree.max_depth, 3)
    np.testing.assert_array_equal(tree.paths, [[1, -1, -1], [0, 2, -1], [0, 3, 4]])
    np.testing.assert_array_equal(tree.children, [[0, 1], [2, 3], [-1, -1], [-1, -1], [4, -1],
                                                  [-1, -1]])

  def test_sibling_index_with_rank_gaps(self):
    tree = sj.Tree.from_paths([(0,), (2,), (0, 1), (2, 3), (2, 0)])  # (0,),(2,),(0,1),(2,0),(2,3)
    np.testing.assert_array_equal(tree.ranks, [0, 2, 1, 0, 3])
    np.testing.assert_array_equal(tree.sibling_index, [0, 1, 0, 0, 1])

  @parameterized.parameters((1, 1), (2, 2), (3, 2), (2, 4))
  def test_full(self, depth, branching):
    tree = sj.Tree.full(depth=depth, branching=branching)
    self.assertEqual(tree.num_nodes, sum(branching ** d for d in range(1, depth + 1)))
    self.assertEqual(tree.max_depth, depth)
    self.assertEqual(int(tree.is_leaf.sum()), branching ** depth)
    self.assertTrue(np.all((tree.children[1:] >= 0).sum(1)[~tree.is_leaf] == branching))

  def test_chains(self):
    tree = sj.Tree.chains(num=3, depth=4)
    self.assertEqual(tree.num_nodes, 12)
    self.assertEqual(tree.paths.shape, (3, 4))
    for path in tree.paths:  # each path is a chain: every node's parent is the previous one
      self.assertEqual([tree.parents[n] for n in path], [-1] + list(path[:-1]))
    self.assertEqual(sj.Tree.chains(num=1, depth=5).parents, (-1, 0, 1, 2, 3))

  def test_at_depth(self):
    """A static tree cut to its first levels keeps exactly the paths that short (an adaptive
    menu's entries); a dynamic tree keeps its width, its node budget prorated by depth."""
    paths = [(0,), (1,), (0, 0), (1, 0), (1, 1), (0, 0, 0), (1, 1, 0), (2,)]
    tree = sj.Tree.from_paths(paths)
    for depth in (1, 2, 3):
      self.assertEqual(tree.at_depth(depth),
                       sj.Tree.from_paths([p for p in paths if len(p) <= depth]))
    with self.assertRaisesRegex(ValueError, "depth 4 exceeds the tree's depth 3"):
      tree.at_depth(4)
    with self.assertRaisesRegex(ValueError, "depth must be an integer >= 1, got 0"):
      tree.at_depth(0)
    dynamic = sj.DynamicTree(depth=5, width=4, nodes=18)
    self.assertEqual([dynamic.at_depth(k) for k in (1, 2, 5)],
                     [sj.DynamicTree(1, 4, 4), sj.DynamicTree(2, 4, 8), dynamic])
    self.assertEqual(sj.DynamicTree(depth=4, width=2, nodes=4).at_depth(1).nodes, 1)
    with self.assertRaisesRegex(ValueError, "depth 6 exceeds the tree's depth 5"):
      dynamic.at_depth(6)

  @parameterized.parameters(
      sj.Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (1, 1), (0, 0, 0), (1, 1, 0)]),
      sj.Tree.full(depth=3, branching=2),
      sj.Tree.chains(num=2, depth=3))
  def test_derived_arrays_match_direct_definitions(self, tree):
    n = tree.num_nodes
    for i in range(n):
      self.assertEqual(set(np.flatnonzero(tree.ancestor_mask[i])), brute_ancestors(tree.parents, i))
      self.assertEqual(tree.depths[i], len(brute_ancestors(tree.parents, i)))
    mask = tree.verification_mask
    np.testing.assert_array_equal(tree.verification_depths, [0, *tree.depths])
    self.assertTrue(mask[:, 0].all())
    np.testing.assert_array_equal(mask[0, 1:], False)
    np.testing.assert_array_equal(mask[1:, 1:], tree.ancestor_mask)
    leaves = {i for i in range(n) if i not in tree.parents}
    self.assertEqual({int(p[p >= 0][-1]) for p in tree.paths}, leaves)
    for path in tree.paths:
      nodes = path[path >= 0]
      self.assertEqual(set(nodes.tolist()), brute_ancestors(tree.parents, int(nodes[-1])))

  def test_hashable_and_static(self):
    a, b = sj.Tree.full(depth=2, branching=2), sj.Tree.full(depth=2, branching=2)
    self.assertEqual(a, b)
    self.assertEqual(hash(a), hash(b))
    self.assertNotEqual(a, sj.Tree.chains(num=2, depth=2))


class ValidationTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("empty", [], r"at least one path"),
      ("empty_path", [()], r"empty path \(\) names the root"),
      ("missing_parent", [(0,), (1, 0)], r"path \(1, 0\)'s parent path \(1,\) is missing"),
      ("duplicate", [(0,), (0,)], r"path \(0,\) appears twice"),
      ("negative_rank", [(0,), (-1,)], r"path \(-1,\): ranks must be integers >= 0"),
  )
  def test_bad_paths(self, paths, message):
    with self.assertRaisesRegex(ValueError, message):
      sj.Tree.from_paths(paths)

  def test_bad_parents(self):
    with self.assertRaisesRegex(ValueError, r"node 1's parent 1 must be -1 \(the root\) or an "
                                r"earlier node"):
      sj.Tree(parents=(-1, 1), ranks=(0, 0))
    with self.assertRaisesRegex(ValueError, r"node 1 repeats rank 0 under parent -1"):
      sj.Tree(parents=(-1, -1), ranks=(0, 0))
    with self.assertRaisesRegex(ValueError, r"at least one node"):
      sj.Tree(parents=(), ranks=())

  def test_size_limits(self):
    with self.assertRaisesRegex(ValueError, rf"exceeds the limit of {MAX_NODES}"):
      sj.Tree.full(depth=11, branching=2)
    for bad in (0, -1, 1.5, True):
      with self.assertRaisesRegex(ValueError, r"must be an integer >= 1"):
        sj.Tree.full(depth=bad, branching=2)
      with self.assertRaisesRegex(ValueError, r"must be an integer >= 1"):
        sj.Tree.chains(num=2, depth=bad)


class TreePassTest(absltest.TestCase):
  """One target pass over a whole tree == one chain pass per root-to-leaf path."""

  def test_tree_pass_equals_chain_passes(self):
    config = sj.ModelConfig(model_type="llama", vocab_size=32, hidden_size=32, num_layers=2,
                            num_heads=4, num_kv_heads=2, intermediate_size=64,
                            max_position_embeddings=64)
    model = sj.init_model(config, jax.random.key(0))
    tree = sj.Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 1, 0)])
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 32, (1, 7))
    nodes = rng.integers(0, 32, tree.num_nodes)
    pending = 5

    def prefilled(length=16):
      cache = init_cache(config, 1, length)
      _, cache = model(np.asarray(prompt), cache)
      return cache.with_lengths(np.array([prompt.shape[1]]))

    tokens = np.concatenate([[pending], nodes])[None]
    tree_logits, _ = model(tokens, prefilled(), tree.verification_mask, tree.verification_depths)
    for path in tree.paths:
      path = path[path >= 0]
      chain = np.concatenate([[pending], nodes[path]])[None]
      chain_logits, _ = model(chain, prefilled())
      np.testing.assert_allclose(tree_logits[0, 1 + path], chain_logits[0, 1:], atol=CACHE_TOL,
                                 rtol=0)
      np.testing.assert_allclose(tree_logits[0, 0], chain_logits[0, 0], atol=CACHE_TOL, rtol=0)


if __name__ == "__main__":
  absltest.main()
