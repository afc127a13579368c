"""Hydra++'s prefix layer (``HydraHead`` with ``prefix_layer``; Ankner et al. 2024, arXiv
2402.05109, the Hydra repository's ``HydraPrefixMLP``) through ``sj.Hydra``: greedy exactness
for a chain and a tree on ragged rows, the proposer driven by hand against a from-scratch
reference (the prefix layer over the whole committed prefix, then the heads) with a stale-cache
mutant it rejects, the law harness on a sampled tree (slow), the repository's ``prefix-mlp``
layout both ways against a NumPy forward, and training."""

from __future__ import annotations

import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized

import specjax as sj
from specjax.decoding import head_methods
from specjax.heads.hydra import init_hydra
from specjax.models.kv_cache import init_cache
from specjax.proposers import hydra as hydra_lib
from specjax.proposers.base import Outcome

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import test_train_eagle
  from tests.test_mtp import drive_by_hand
  from tests.test_hydra import TREE, check_tree_law, numpy_hydra, published, random_heads
  from tests.test_laws import LAW_CONFIG, patched
  from tests.test_speculative import (GPT2_CONFIG, GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG,
                                      greedy_reference, random_transformer)
except ImportError:  # pragma: no cover
  import test_train_eagle
  from test_mtp import drive_by_hand
  from test_hydra import TREE, check_tree_law, numpy_hydra, published, random_heads
  from test_laws import LAW_CONFIG, patched
  from test_speculative import (GPT2_CONFIG, GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG,
                                greedy_reference, random_transformer)

S = sj.Sampling


class GreedyTest(parameterized.TestCase):

  @parameterized.named_parameters(("chain3", dict(gamma=3)), ("tree_sampled", dict(tree=TREE)))
  def test_matches_autoregressive(self, kwargs):
    target = random_transformer(TF_CONFIG, 0)
    method = sj.Hydra(random_heads(TF_CONFIG, 1, prefix_layer=True), **kwargs)
    out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(out.tokens, greedy_reference(TF_CONFIG, GREEDY_NEW))
    # one prefix pass at prefill and per iteration, besides a heads pass per depth
    self.assertEqual(int(out.stats.draft_calls),
                     1 + (method.gamma + 1) * (int(out.stats.target_calls) - 1))


def reference_feature(heads, feats: jax.Array, length: int) -> jax.Array:
  """[E] the prefix layer run from scratch over the target states of positions < ``length``
  (feats [P, 1, E]), at the last one."""
  out, _ = heads.prefix_pass(feats[None, :length, 0], init_cache(heads.config.prefix, 1, length))
  return out[0, -1]


def root_path(tree: sj.Tree, rng) -> list[int]:
  """A random path of ``tree`` from the root down (node indices; may be empty)."""
  path, parent = [], 0  # children rows: 0 the root's, i + 1 node i's
  while True:
    kids = [int(c) for c in tree.children[parent] if c >= 0]
    if not kids or rng.random() < 0.25:
      return path
    path.append(kids[rng.integers(len(kids))])
    parent = path[-1] + 1


class StaleCacheTree(hydra_lib.HydraTree):
  """The mutation: commit advances the prefix cache's lengths without writing the accepted
  states (the layer attends to stale entries)."""

  def commit(self, params, state, candidates, outcome):
    new = super().commit(params, state, candidates, outcome)
    return new.replace(cache=state.cache.with_lengths(new.cache.lengths))


@pytest.mark.slow  # ~50 s: from-scratch references per row and iteration; GreedyTest stays default
class ProposerTest(absltest.TestCase):
  """The proposer driven by hand over a fixed text (ragged rows, random accepted tree paths, a
  row sitting out an iteration): the state and every reported law equal a from-scratch prefix
  pass over the committed prefix followed by the heads on the node's path."""

  def max_error(self, target, heads) -> float:
    tree = TREE
    lengths = np.array([1, 4, 7])
    rng, text, feats, state, propose, commit, params = drive_by_hand(
        target, sj.Hydra(heads, tree=tree), lengths)  # feats [B, W, 1, E]
    batch, rows = len(lengths), np.arange(len(lengths))
    depth, n_nodes = tree.max_depth, tree.num_nodes
    error = 0.0
    for it in range(4):
      keys = jax.random.split(jax.random.key(it), (batch, depth))
      pending = text[rows, lengths]
      cands, state = propose(params, state, jnp.asarray(pending), keys)
      tokens = np.asarray(cands.tokens)
      for b in range(batch):
        h = reference_feature(heads, feats[b], int(lengths[b]))
        error = max(error, float(jnp.max(jnp.abs(state.feature[b, 0] - h))))
        for r in np.flatnonzero(np.any(tree.children >= 0, axis=1)):  # rows with children
          d = 0 if r == 0 else int(tree.depths[r - 1])  # their law: given their path
          path = [int(pending[b])] + ([] if r == 0 else [
              int(tokens[b, j]) for j in np.flatnonzero(tree.ancestor_mask[r - 1])])
          embeds = target.embed_tokens(jnp.asarray(path))
          law = jax.nn.softmax(heads.project(d, heads.state(d, h, embeds)))
          error = max(error, float(jnp.max(jnp.abs(cands.q[b, r] - law))))
      paths = [root_path(tree, rng) for _ in rows]
      n = np.array([len(p) for p in paths])
      path = np.full((batch, depth), -1, np.int32)
      for b, p in enumerate(paths):
        path[b, :len(p)] = p
      # the pass's states: pending's and the path's from the text, the other nodes' noise
      pass_feats = np.asarray(rng.standard_normal((batch, 1 + n_nodes) + feats.shape[2:]),
                              np.float32)
      for b in rows:
        pass_feats[b, 0] = feats[b, lengths[b]]
        for j, node in enumerate(paths[b]):
          pass_feats[b, 1 + node] = feats[b, lengths[b] + 1 + j]
      active = np.array([True, it != 2, True])  # row 1 sits out iteration 2: its state holds
      outcome = Outcome(target_length=jnp.asarray(lengths), num_accepted=jnp.asarray(n),
                        path=jnp.asarray(path), next_token=jnp.asarray(text[rows, lengths + n + 1]),
                        active=jnp.asarray(active),
                        logits=jnp.zeros((batch, 1 + n_nodes, TF_CONFIG.vocab_size)),
                        features=jnp.asarray(pass_feats))
      state = commit(params, state, cands, outcome)
      lengths = np.where(active, lengths + n + 1, lengths)
    return error

  def test_drafts_are_the_prefix_layer_over_the_whole_prefix(self):
    target = random_transformer(TF_CONFIG, 0)
    heads = random_heads(TF_CONFIG, 1, prefix_layer=True)
    self.assertLess(self.max_error(target, heads), 1e-4)
    with patched(((head_methods, "HydraTree", StaleCacheTree),)):
      self.assertGreater(self.max_error(target, heads), 1e-2)


class LawTest(absltest.TestCase):

  @pytest.mark.slow  # ~1.5 min law run (test_hydra.py's LawTest runs by default)
  def test_sampled_tree_and_a_siblings_law(self):
    """The law harness through the prefix state (its mutant: a sibling's path's law)."""
    check_tree_law(self, random_heads(LAW_CONFIG, 3, num_heads=2, prefix_layer=True),
                   "hydra_prefix_tree")


def numpy_prefix(tensors: dict, config: sj.ModelConfig, x: np.ndarray) -> np.ndarray:
  """[T, E] the repository's one-layer LlamaModel over ``inputs_embeds`` x [T, E] (positions
  0..T-1, causal; float64)."""
  w = lambda name: np.asarray(tensors["prefix_embeding_layer." + name], np.float64)
  c = config
  rms = lambda z, name: w(name) * z / np.sqrt(np.mean(z * z, -1, keepdims=True) + c.norm_eps)
  silu = lambda z: z / (1 + np.exp(-z))
  t, d = x.shape[0], c.head_dim
  p = "layers.0."
  h = rms(x, p + "input_layernorm.weight")
  proj = lambda name, heads: (h @ w(f"{p}self_attn.{name}_proj.weight").T).reshape(t, heads, d)
  q, k, v = proj("q", c.num_heads), proj("k", c.num_kv_heads), proj("v", c.num_kv_heads)
  inv = 1.0 / c.rope_theta ** (np.arange(0, d, 2) / d)
  ang = np.arange(t)[:, None] * inv[None]
  cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
  half = lambda z: np.concatenate([-z[..., d // 2:], z[..., :d // 2]], -1)
  rope = lambda z: z * cos[:, None] + half(z) * sin[:, None]
  q, k = rope(q), rope(k)
  group = c.num_heads // c.num_kv_heads
  k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
  scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(d)
  scores = np.where(np.tril(np.ones((t, t), bool))[None], scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  attn = np.einsum("hts,shd->thd", probs, v).reshape(t, -1)
  x = x + attn @ w(p + "self_attn.o_proj.weight").T
  m = rms(x, p + "post_attention_layernorm.weight")
  x = x + (silu(m @ w(p + "mlp.gate_proj.weight").T) * (m @ w(p + "mlp.up_proj.weight").T)
           ) @ w(p + "mlp.down_proj.weight").T
  return rms(x, "norm.weight")


def published_prefix(path: str, config: sj.ModelConfig, heads: int, layers: int) -> dict:
  """Random prefix-mlp heads in the repository's layout (its config.json: no base config, the
  unused embedding present); returns the tensors."""
  tensors = published(path, config, heads, layers)
  rng = np.random.default_rng(2)
  e, i, d = config.hidden_size, config.intermediate_size, config.head_dim
  r = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
  p = "prefix_embeding_layer."
  shapes = {"self_attn.q_proj": (config.num_heads * d, e), "self_attn.k_proj":
            (config.num_kv_heads * d, e), "self_attn.v_proj": (config.num_kv_heads * d, e),
            "self_attn.o_proj": (e, config.num_heads * d), "mlp.gate_proj": (i, e),
            "mlp.up_proj": (i, e), "mlp.down_proj": (e, i)}
  for name, shape in shapes.items():
    tensors[f"{p}layers.0.{name}.weight"] = r(*shape)
  for name in ("layers.0.input_layernorm", "layers.0.post_attention_layernorm", "norm"):
    tensors[f"{p}{name}.weight"] = 1.0 + r(e)
  tensors[p + "embed_tokens.weight"] = r(config.vocab_size, e)
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(dict(hf, hydra_head_arch="prefix-mlp"), f)
  from safetensors.numpy import save_file
  save_file(tensors, os.path.join(path, "hydra_lm_head.safetensors"))
  return tensors


class LayoutTest(absltest.TestCase):

  def test_load_repository_file_and_round_trip(self):
    target = random_transformer(TF_CONFIG, 0)
    with tempfile.TemporaryDirectory() as tmp:
      tensors = published_prefix(os.path.join(tmp, "in"), TF_CONFIG, 2, 2)
      with self.assertRaisesRegex(ValueError, "pass load_head\\(target_config=\\)"):
        sj.load_head(os.path.join(tmp, "in"))
      heads = sj.load_head(os.path.join(tmp, "in"), target_config=TF_CONFIG)
      self.assertTrue(heads.has_prefix)
      rng = np.random.default_rng(1)
      x = rng.standard_normal((6, TF_CONFIG.hidden_size))
      want = numpy_prefix(tensors, TF_CONFIG, x)
      got, _ = heads.prefix_pass(jnp.asarray(x[None], jnp.float32),
                                 init_cache(heads.config.prefix, 1, 8))
      np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-4, atol=1e-4)
      for k in range(2):
        path = rng.standard_normal((k + 1, TF_CONFIG.hidden_size))
        logits = heads.project(k, heads.state(k, got[0, -1], jnp.asarray(path, jnp.float32)))
        np.testing.assert_allclose(np.asarray(logits), numpy_hydra(tensors, k, 2, want[-1], path),
                                   rtol=1e-3, atol=1e-3)
      sj.save_head(heads, os.path.join(tmp, "out"), target=target)
      from safetensors.numpy import load_file
      written = load_file(os.path.join(tmp, "out", "hydra_lm_head.safetensors"))
      self.assertEqual(sorted(written), sorted(tensors))
      for name, value in tensors.items():
        if "embed_tokens" not in name:
          np.testing.assert_array_equal(written[name], value, err_msg=name)
      np.testing.assert_array_equal(written["prefix_embeding_layer.embed_tokens.weight"],
                                    np.asarray(target.embed.get_value()))
      with open(os.path.join(tmp, "out", "config.json")) as f:
        self.assertEqual(json.load(f)["hydra_head_arch"], "prefix-mlp")
      again = sj.load_head(os.path.join(tmp, "out"))  # its config.json carries the layer's
      np.testing.assert_array_equal(
          np.asarray(again.prefix_pass(jnp.asarray(x[None], jnp.float32),
                                       init_cache(again.config.prefix, 1, 8))[0]),
          np.asarray(got))

  def test_non_llama_prefix_is_refused(self):
    with self.assertRaisesRegex(ValueError, "Llama-family decoder layer, got model_type 'gpt2'"):
      init_hydra(GPT2_CONFIG, 2, prefix_layer=True)


class TrainTest(absltest.TestCase):

  def test_teacher_forced_training_raises_agreement(self):
    from specjax.training import medusa as mt
    _, tokens, mask = test_train_eagle.rows()
    target = random_transformer(test_train_eagle.CONFIG, 0)
    heads = mt.init_hydra_heads(target, num_heads=2, prefix_layer=True)
    self.assertTrue(heads.has_prefix)
    _, before = mt.train_medusa(target, heads, tokens, mask, eval_rows=4, steps=1,
                                batch_size=8, lr=0.0, warmup_steps=0, log_every=1,
                                labels="hard", loss_vocab=12)
    heads = mt.init_hydra_heads(target, num_heads=2, prefix_layer=True)
    _, report = mt.train_medusa(target, heads, tokens, mask, eval_rows=4, steps=60,
                                batch_size=8, lr=1e-2, warmup_steps=5, log_every=10,
                                labels="hard", loss_vocab=12)
    first, last = report["history"][0], report["history"][-1]
    self.assertLess(last["loss"], 0.9 * first["loss"])
    self.assertGreater(np.mean(report["agreement"]), np.mean(before["agreement"]) + 0.05)


class CostTest(absltest.TestCase):

  def test_prefix_pass_is_timed_and_modelled(self):
    """The runner's cost measurement times a Hydra++ head's prefix pass apart from its heads'
    pass (``prefix_cost_ratio``), and the head model adds it once per iteration."""
    from experiments import analysis
    from specjax import costs
    target = random_transformer(TF_CONFIG, 0)
    heads = {"hydra": random_heads(TF_CONFIG, 1, prefix_layer=True),
             "plain": random_heads(TF_CONFIG, 1)}
    cost = costs.measure_step_costs({"target": target}, 2, 5, 16, widths=(1, 4), heads=heads,
                                    steps_per_call=2, min_seconds=0.0, max_iters=3)
    self.assertEqual(sorted(cost["prefix_cost_ratio"]), ["hydra"])  # plain heads have none
    prefix = cost["prefix_cost_ratio"]["hydra"]
    self.assertGreater(prefix, 0)
    e = dict(method="hydra", gamma=3, tree=None, tokens_per_iteration=2.0, speedup=1.0,
             row_utilisation=1.0)
    analysis._head_model(e, 3, cost, None)
    c, v = cost["head_cost_ratio"]["hydra"], cost["target_verify_ms"]["3"] / cost["target_step_ms"]
    self.assertAlmostEqual(e["iteration_cost"], 3 * c + prefix + v)


if __name__ == "__main__":
  absltest.main()
