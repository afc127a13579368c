"""``sj.Hydra`` (sequentially dependent heads, ``specjax.heads.hydra``) through the real loop:
greedy exactness, oracle heads that read only the candidate's path and reach depth + 1 tokens
per call (a path from the wrong sibling loses them), the law harness with a mutation control
(children verified against a law given the wrong path), the released layout both ways against a
NumPy forward, training, errors."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
import pytest
from flax import nnx

import specjax as sj
from specjax import sampling as sampling_lib
from specjax.decoding import head_methods
from specjax.heads.hydra import init_hydra, start_hydra_from_target
from specjax.proposers import hydra as hydra_lib
from specjax.proposers.draft_tree import Growth

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, test_train_eagle
  from tests.test_laws import LAW_CONFIG, law_transformer, patched
  from tests.test_medusa import oracle_pair
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed,
                                      greedy_reference, random_transformer)
except ImportError:  # pragma: no cover
  import lawcheck
  import test_train_eagle
  from test_laws import LAW_CONFIG, law_transformer, patched
  from test_medusa import oracle_pair
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed, greedy_reference,
                                random_transformer)

S = sj.Sampling
TREE = sj.Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
SMALL_TREE = sj.Tree.from_paths([(0,), (1,), (0, 0), (1, 0)])  # siblings' subtrees differ


def random_heads(config: sj.ModelConfig, seed: int, num_heads: int = 3, scale: float = 8.0,
                 path_scale: float = 50.0, prefix_layer: bool = False):
  """Random heads, matrices x ``scale``; the rows reading the path's embeddings also x
  ``path_scale`` (the embeddings are ~50x smaller than the normed state: without it the path
  would hardly move the laws, and a test could not tell a wrong path from the right one).
  ``prefix_layer``: with Hydra++'s prefix layer (its matrices x ``scale`` too)."""
  heads = init_hydra(config, num_heads, key=seed, prefix_layer=prefix_layer)
  nnx.update(heads, jax.tree.map(lambda x: x * scale if x.ndim == 2 else x,
                                 nnx.state(heads, nnx.Param)))
  e = config.hidden_size
  for dense in (*heads.inputs, *heads.residuals):
    dense.kernel.set_value(dense.kernel.get_value().at[e:].multiply(path_scale))
  return heads


def path_oracle(seed: int = 0):
  """(target, heads): ``oracle_pair``'s bigram target (greedy next token ``f`` of the last
  token alone) and Hydra heads that read ONLY the last token of their path: head k's state is
  ``E(x_{k+1})`` (its residual selects that slot, every other weight 0) and its projection maps
  ``E(y)`` to ``f(y)`` (least squares over the V embeddings, hidden 32 >= V 16). Right paths
  give every draft; a wrong path gives the wrong tokens."""
  target, _ = oracle_pair(seed)
  config = target.config
  e, v = config.hidden_size, config.vocab_size
  heads = start_hydra_from_target(init_hydra(config, 3, key=seed), target)
  embeds = np.asarray(target.embed.get_value(), np.float64)  # [V, E]
  nxt = np.argmax(_next_logits(target), axis=1)
  w = np.linalg.pinv(embeds) @ (10.0 * np.eye(v)[nxt])
  for k in range(heads.num_heads):
    res = heads.residuals[k].kernel
    res.set_value(jnp.zeros_like(res.get_value()).at[(k + 1) * e:].set(jnp.eye(e)))
    heads.lm_heads[k].kernel.set_value(jnp.asarray(w, jnp.float32))
  return target, heads


def _next_logits(target) -> np.ndarray:
  """[V, V] the target's logits after each single token (attention output zero: a bigram)."""
  from specjax.models.kv_cache import init_cache
  v = target.config.vocab_size
  tokens = jnp.arange(v, dtype=jnp.int32)[:, None]
  logits, _ = target(tokens, init_cache(target.config, v, 2))
  return np.asarray(logits[:, 0], np.float64)


class GreedyTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("chain3", dict(gamma=3)), ("tree_sampled", dict(tree=TREE)),
      ("tree_top_k", dict(tree=TREE, children="top_k")),
      ("typical_tree", dict(tree=TREE, verify="typical")))
  def test_matches_autoregressive(self, kwargs):
    target = random_transformer(TF_CONFIG, 0)
    method = sj.Hydra(random_heads(TF_CONFIG, 1), **kwargs)
    out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(out.tokens, greedy_reference(TF_CONFIG, GREEDY_NEW))
    self.assertEqual(int(out.stats.draft_calls),
                     method.gamma * (int(out.stats.target_calls) - 1))

  def test_path_oracle_accepts_everything_and_a_wrong_path_does_not(self):
    target, heads = path_oracle()
    new = 13
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, TF_CONFIG.vocab_size, n)) for n in (1, 5, 9)]
    ar = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=new)
    method = sj.Hydra(heads, tree=TREE, children="top_k")
    out = sj.generate(target, prompts, method, max_new_tokens=new)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    self.assertEqual(int(out.stats.target_calls), 1 + -(-(new - 1) // 4))
    with patched(((head_methods, "HydraTree", SiblingPathTree),)):
      mutant = sj.generate(target, prompts, method, max_new_tokens=new)
    np.testing.assert_array_equal(mutant.tokens, ar.tokens)
    self.assertGreater(int(mutant.stats.target_calls), int(out.stats.target_calls))


class GemmaTargetTest(absltest.TestCase):

  @pytest.mark.slow  # ~16 s: Gemma's scaled embeddings; Hydra's Llama paths stay in the default run
  def test_paths_are_the_targets_scaled_input_embeddings(self):
    """On a Gemma target the path enters the heads as Gemma's input embeddings, sqrt(hidden) x
    the table's rows (``embed_tokens``, what the Hydra paper's base model feeds its own layers):
    greedy chain drafts equal a reference built on them, and differ from one on the raw rows."""
    from specjax.models.hf_config import from_hf_dict
    from specjax.models.kv_cache import init_cache
    try:
      from tests import hf_fixtures
    except ImportError:  # pragma: no cover
      import hf_fixtures
    config = from_hf_dict(hf_fixtures.CONFIGS["gemma3"]().to_dict())
    self.assertGreater(config.embed_scale, 5.0)
    target = sj.init_model(config, jax.random.key(0))
    heads = random_heads(config, 1, num_heads=2)
    proposer, params = sj.Hydra(heads, gamma=2).proposer(target)
    rng = np.random.default_rng(0)
    batch, width = 4, 7
    text = jnp.asarray(rng.integers(0, config.vocab_size, (batch, width)), jnp.int32)
    feats = target(text, init_cache(config, batch, width), features=proposer.features)[2]
    lengths = jnp.full((batch,), width, jnp.int32)
    state = proposer.prefill(params, text, lengths, width + 8, feats)
    pending = jnp.asarray(rng.integers(0, config.vocab_size, batch), jnp.int32)
    keys = jax.random.split(jax.random.key(0), (batch, 2))
    drafts = np.asarray(proposer.propose(params, state, pending, keys, S())[0].tokens)

    def reference(embed):
      out = []
      for b in range(batch):
        h, path = state.feature[b, 0], [int(pending[b])]
        for k in range(2):
          logits = heads.project(k, heads.state(k, h, embed(jnp.asarray(path))))
          path.append(int(jnp.argmax(logits)))
        out.append(path[1:])
      return np.asarray(out)

    np.testing.assert_array_equal(drafts, reference(target.embed_tokens))
    raw = reference(lambda tokens: jnp.take(target.embed[...], tokens, axis=0))
    self.assertFalse(np.array_equal(drafts, raw))


def sibling_paths(tree: sj.Tree, parents: np.ndarray) -> np.ndarray:
  """The mutation: each parent's path taken from the LAST parent at its depth (a sibling's or
  cousin's path for every other parent, the rank-0 chain's included)."""
  last = {}
  for r in parents:
    last[0 if r == 0 else int(tree.depths[r - 1])] = r
  right = lambda r: [0] + [j + 1 for j in np.flatnonzero(tree.ancestor_mask[r - 1])] if r else [0]
  return np.array([right(last[0 if r == 0 else int(tree.depths[r - 1])]) for r in parents],
                  np.int32)


def _grow(self, params, state, pending, keys, sampling, wrong_draw: bool, wrong_q: bool):
  """``HydraTree.propose`` with the draws and/or the reported laws given sibling paths."""
  head_state, target_state = params
  heads = nnx.merge(self.head_graphdef, head_state)
  target = nnx.merge(self.target_graphdef, target_state)
  grow = Growth(self.tree, pending, self.children, sampling, target.config.vocab_size)
  feature = state.feature[:, 0]
  for d in range(self.tree.max_depth):
    parents = grow.parents(d)
    right = np.array([[0] + [j + 1 for j in np.flatnonzero(self.tree.ancestor_mask[r - 1])]
                      if r else [0] for r in parents], np.int32)
    wrong = sibling_paths(self.tree, parents)

    def logits_of(paths):
      embeds = jnp.take(target.embed[...], grow.tokens[:, paths], axis=0)
      h = jnp.broadcast_to(feature[:, None], embeds.shape[:2] + feature.shape[-1:])
      return heads.project(d, heads.state(d, h, embeds))

    grow.add_children(d, logits_of(wrong if wrong_draw else right), keys[:, d])
    if wrong_q and not sampling.is_greedy:
      grow.q = grow.q.at[:, parents].set(sampling_lib.probabilities(logits_of(wrong), sampling))
  return grow.candidates(), state


class SiblingPathTree(hydra_lib.HydraTree):
  """Drafts from the heads given a sibling's path (acceptance mutant; still exact)."""

  def propose(self, params, state, pending, keys, sampling):
    return _grow(self, params, state, pending, keys, sampling, wrong_draw=True, wrong_q=False)


class SiblingLawTree(hydra_lib.HydraTree):
  """Draws given the right path but reports the law given a sibling's (law mutant)."""

  def propose(self, params, state, pending, keys, sampling):
    return _grow(self, params, state, pending, keys, sampling, wrong_draw=False, wrong_q=True)


def check_tree_law(test: absltest.TestCase, heads, name: str) -> None:
  """The law harness on a sampled ``SMALL_TREE`` of ``heads``: the clean run passes (every
  accepted length seen), the sibling's-law mutant fails."""
  method = sj.Hydra(heads, tree=SMALL_TREE)
  run = lambda name: lawcheck.check_law(
      law_transformer(), method, S(1.0), [(3, 1, 4, 1, 5)], SMALL_TREE.max_depth + 3,
      seed=_seed(name), exact_law=lawcheck.transformer_law)
  clean = run(name)
  test.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
  counts = np.asarray(clean.out.stats.accepted_length_counts)
  test.assertTrue(np.all(counts > 0), msg=str(counts))
  with patched(((head_methods, "HydraTree", SiblingLawTree),)):
    mutant = run(name.replace("tree", "sibling_law"))
  test.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())


class LawTest(absltest.TestCase):

  def test_sampled_tree_and_a_siblings_law(self):
    check_tree_law(self, random_heads(LAW_CONFIG, 3, num_heads=2), "hydra_tree")


def published(path: str, config: sj.ModelConfig, heads: int, layers: int) -> dict:
  """Random heads written in the Hydra repository's layout; returns the tensors."""
  rng = np.random.default_rng(0)
  e, v = config.hidden_size, config.vocab_size
  r = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
  tensors = {}
  for k in range(heads):
    for part in ("linear", "res_connection"):
      tensors[f"hydra_mlp.{k}.0.{part}.weight"] = r(e, (k + 2) * e)
      tensors[f"hydra_mlp.{k}.0.{part}.bias"] = r(e)
    for j in range(1, layers):
      tensors[f"hydra_mlp.{k}.{j}.linear.weight"], tensors[f"hydra_mlp.{k}.{j}.linear.bias"] = (
          r(e, e), r(e))
    tensors[f"hydra_lm_head.{k}.weight"], tensors[f"hydra_lm_head.{k}.bias"] = r(v, e), r(v)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"hydra_num_heads": heads, "hydra_num_layers": layers, "hydra_head_arch": "mlp",
               "grounded_heads": True, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}, f)
  from safetensors.numpy import save_file
  save_file(tensors, os.path.join(path, "hydra_lm_head.safetensors"))
  return tensors


def numpy_hydra(tensors: dict, k: int, layers: int, h: np.ndarray, path: np.ndarray):
  """Head k's logits [V] of state h [E] and path embeddings [k + 1, E] (torch layout)."""
  silu = lambda z: z / (1 + np.exp(-z))
  w = lambda name: np.asarray(tensors[name], np.float64)
  x = np.concatenate([h, path.reshape(-1)])
  p = f"hydra_mlp.{k}."
  y = (x @ w(p + "0.res_connection.weight").T + w(p + "0.res_connection.bias")
       + silu(x @ w(p + "0.linear.weight").T + w(p + "0.linear.bias")))
  for j in range(1, layers):
    y = y + silu(y @ w(f"{p}{j}.linear.weight").T + w(f"{p}{j}.linear.bias"))
  return y @ w(f"hydra_lm_head.{k}.weight").T + w(f"hydra_lm_head.{k}.bias")


class LayoutTest(absltest.TestCase):

  def test_load_published_and_round_trip(self):
    with tempfile.TemporaryDirectory() as tmp:
      tensors = published(os.path.join(tmp, "in"), TF_CONFIG, 3, 2)
      heads = sj.load_head(os.path.join(tmp, "in"))
      rng = np.random.default_rng(1)
      e = TF_CONFIG.hidden_size
      for k in range(3):
        h, path = rng.standard_normal(e), rng.standard_normal((k + 1, e))
        got = heads.project(k, heads.state(k, jnp.asarray(h, jnp.float32),
                                           jnp.asarray(path, jnp.float32)))
        np.testing.assert_allclose(np.asarray(got), numpy_hydra(tensors, k, 2, h, path),
                                   rtol=1e-4, atol=1e-4)
      sj.save_head(heads, os.path.join(tmp, "out"))
      from safetensors.numpy import load_file
      written = load_file(os.path.join(tmp, "out", "hydra_lm_head.safetensors"))
      self.assertEqual(sorted(written), sorted(tensors))
      for name, value in tensors.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)

  def test_other_architectures_are_refused(self):
    with tempfile.TemporaryDirectory() as tmp:
      published(tmp, TF_CONFIG, 1, 1)
      with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump({"hydra_num_heads": 1, "hydra_head_arch": "cross-attention"}, f)
      with self.assertRaisesRegex(ValueError, "only the grounded MLP heads"):
        sj.load_head(tmp)


class TrainTest(absltest.TestCase):

  def test_teacher_forced_training_raises_acceptance(self):
    from specjax.training import medusa as mt
    prompts, tokens, mask = test_train_eagle.rows()
    target = random_transformer(test_train_eagle.CONFIG, 0)
    held_out = prompts[-4:]
    untrained = mt.init_hydra_heads(target, num_heads=2)
    before = mt.medusa_acceptance(target, untrained, held_out, max_new_tokens=16)
    heads, report = mt.train_medusa(target, untrained, tokens, mask, eval_rows=4, steps=60,
                                    batch_size=8, lr=1e-2, warmup_steps=5, log_every=10,
                                    labels="hard", loss_vocab=12, eval_prompts=held_out,
                                    eval_new_tokens=16)
    self.assertEqual(report["kind"], "hydra")
    first, last = report["history"][0], report["history"][-1]
    self.assertLess(last["loss"], 0.9 * first["loss"])
    self.assertGreater(report["acceptance"]["acceptance_rate"], before["acceptance_rate"] + 0.05)


class ErrorTest(absltest.TestCase):

  def test_bad_methods(self):
    heads = random_heads(TF_CONFIG, 1, num_heads=2)
    with self.assertRaisesRegex(ValueError, "gamma 3 exceeds the 2 Hydra heads"):
      sj.Hydra(heads, gamma=3)
    from specjax.heads.medusa import init_medusa
    with self.assertRaisesRegex(ValueError, "heads must be Hydra heads"):
      sj.Hydra(init_medusa(TF_CONFIG, 2))
    wide = random_heads(dataclasses.replace(TF_CONFIG, hidden_size=16), 1)
    target = random_transformer(TF_CONFIG, 0)
    with self.assertRaisesRegex(ValueError, "hidden size 16 differs from the target's 32"):
      sj.generate(target, GREEDY_PROMPTS, sj.Hydra(wide), max_new_tokens=4)


if __name__ == "__main__":
  absltest.main()
