"""``sj.Eagle`` (EAGLE-1/2 heads, ``specjax.heads``) through the real loop: greedy exactness, an
oracle head, acceptance equal to a cache-free reference of the algorithm (with a stale-features
mutation it catches), the law harness, the published layout both ways, and errors."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized
from flax import nnx

import specjax as sj
from specjax.heads.eagle import init_head
from specjax.models.kv_cache import init_cache
from specjax.proposers import draft_tree
from specjax.proposers import eagle as eagle_lib

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck
  from tests.test_laws import LAW_CONFIG, law_transformer, patched
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed,
                                      greedy_reference, random_transformer, truncate_at_eos)
except ImportError:  # pragma: no cover
  import lawcheck
  from test_laws import LAW_CONFIG, law_transformer, patched
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed, greedy_reference,
                                random_transformer, truncate_at_eos)

S = sj.Sampling
TREE = sj.Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
SMALL_TREE = sj.Tree.from_paths([(0,), (1,), (0, 0)])  # two levels: cheap law checks
DYNAMIC = sj.DynamicTree(depth=3, width=2, nodes=6)
HEAD_SCALE = 8.0  # random heads' weights x this: drafts that depend visibly on their inputs


def random_head(config: sj.ModelConfig, seed: int, scale: float = HEAD_SCALE, init=init_head,
                **kwargs):
  """``init(config, seed, **kwargs)``'s head (EAGLE-1 by default) with its matrices x ``scale``."""
  head = init(config, seed, **kwargs)
  state = nnx.state(head, nnx.Param)
  nnx.update(head, jax.tree.map(lambda x: x * scale if x.ndim == 2 else x, state))
  return head


def bigram_pair(seed: int = 0):
  """(target, head): a one-layer target whose attention output is zero (its next token depends on
  the last token only) and the head that reproduces its next feature up to the final norm's
  positive factor (same argmax): fc passes the embedding, the layer's attention is zero too and
  its MLP is the target's."""
  config = dataclasses.replace(TF_CONFIG, num_layers=1)
  target = nnx.clone(random_transformer(config, seed))  # a copy: the cached one is shared
  block = target.layers[0]
  block.attn.o.kernel.set_value(jnp.zeros_like(block.attn.o.kernel.get_value()))
  head = init_head(config, seed + 1)
  e = config.hidden_size
  head.fc.kernel.set_value(jnp.concatenate([jnp.eye(e), jnp.zeros((e, e))], axis=0))
  layer = head.layers[0]
  layer.attn.o.kernel.set_value(jnp.zeros_like(layer.attn.o.kernel.get_value()))
  layer.mlp_norm.scale.set_value(block.mlp_norm.scale.get_value())
  for name in ("gate", "up", "down"):
    getattr(layer.mlp, name).kernel.set_value(getattr(block.mlp, name).kernel.get_value())
  return target, head


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _features(graphdefs, states, width, layers, tokens):
  """The head's input features [1, T, E] (``from_target`` of the target's ``layers``)."""
  head, target = (nnx.merge(g, s) for g, s in zip(graphdefs, states))
  features = target(tokens, init_cache(target.config, 1, width), features=layers)[2]
  return head.from_target(features)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _head_logits(graphdefs, states, width, tokens, features):
  head, target = (nnx.merge(g, s) for g, s in zip(graphdefs, states))
  embeds = jnp.take(target.embed[...], tokens, axis=0)
  hidden, _ = head(embeds, features, init_cache(head.config, 1, width))
  return head.draft_logits(hidden, target), hidden


def reference_accepted(target, head, prompt, out, tree: sj.Tree, budget: int) -> int:
  """Accepted drafts of greedy EAGLE with top-k children on ``tree`` (a chain: ``Tree.chains(1,
  gamma)``) over ``prompt`` for ``budget`` tokens (``out``: the greedy tokens, ``budget + depth``
  or more), by the algorithm's definition and no cache bookkeeping: each iteration recomputes the
  target's features of the whole context in one full pass, and the head's guess at every node
  from scratch over the context's pairs and the node's path (causal passes over one fixed
  width, padded at the end); the target's greedy walk then accepts the longest matching path.
  Any head (EAGLE-1/2 or EAGLE-3): its ``target_features``, ``from_target``, ``draft_logits``."""
  width = len(prompt) + budget + tree.max_depth + 2
  pad = lambda ids: jnp.asarray([list(ids) + [0] * (width - len(ids))], jnp.int32)
  (tg, ts), (hg, hs) = nnx.split(target), nnx.split(head)
  layers = tuple(head.target_features(target.config))
  out = [int(t) for t in out]
  seq, accepted, done = list(prompt) + out[:1], 0, 1
  while done < budget:
    feats = _features((hg, tg), (hs, ts), width, layers, pad(seq[:-1]))  # f_t: all but pending
    context = list(seq[1:])  # pair t: (token t + 1, f_t); the last is the pending token's

    def guess(path_tokens, path_guesses):  # (logits, feature guess) after a path below the root
      f = feats
      for i, g in enumerate(path_guesses):
        f = f.at[0, len(context) + i].set(g)
      logits, hidden = _head_logits((hg, tg), (hs, ts), width, pad(context + path_tokens), f)
      last = len(context) + len(path_tokens) - 1
      return np.asarray(logits[0, last]), hidden[0, last]

    nodes = {-1: guess([], []) + ([], [])}  # node -> (logits, guess, path tokens, path guesses)
    tokens = []
    for i, (parent, rank) in enumerate(zip(tree.parents, tree.ranks)):
      logits, parent_guess, path, guesses = nodes[parent]
      tokens.append(int(np.argsort(-logits, kind="stable")[rank]))
      path, guesses = path + [tokens[-1]], guesses + [parent_guess]
      nodes[i] = guess(path, guesses) + (path, guesses)
    node, n = -1, 0
    while True:
      match = [i for i, p in enumerate(tree.parents) if p == node and tokens[i] == out[done + n]]
      if not match:
        break
      node, n = match[0], n + 1
    accepted += n
    seq += out[done:done + n + 1]
    done += n + 1
  return accepted


class GreedyTest(parameterized.TestCase):
  """At temperature 0 EAGLE returns the Autoregressive tokens exactly, whatever the head."""

  @parameterized.parameters(1, 3)
  def test_matches_autoregressive(self, gamma):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    out = sj.generate(target, GREEDY_PROMPTS, sj.Eagle(random_head(TF_CONFIG, 1), gamma=gamma),
                      max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(out.tokens, expected)
    self.assertEqual(int(out.stats.draft_calls), 1 + gamma * (int(out.stats.target_calls) - 1))

  @parameterized.named_parameters(("sampled", TREE, "sampled"), ("top_k", TREE, "top_k"),
                                  ("dynamic", DYNAMIC, None))
  def test_tree_matches_autoregressive(self, tree, children):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    out = sj.generate(target, GREEDY_PROMPTS,
                      sj.Eagle(random_head(TF_CONFIG, 1), tree=tree, children=children),
                      max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(out.tokens, expected)
    passes = tree.depth if tree is DYNAMIC else tree.max_depth  # head passes per iteration
    self.assertEqual(int(out.stats.draft_calls), 1 + passes * (int(out.stats.target_calls) - 1))

  def test_eos(self):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    eos = int(expected[2, 1])
    out = sj.generate(target, GREEDY_PROMPTS, sj.Eagle(random_head(TF_CONFIG, 1), gamma=3),
                      max_new_tokens=GREEDY_NEW, eos_token_id=eos)
    np.testing.assert_array_equal(out.tokens, truncate_at_eos(expected, eos))

  def test_oracle_head_accepts_everything(self):
    assert_accepts_everything(self, *bigram_pair())

  @parameterized.named_parameters(("chain", None), ("tree", TREE))
  def test_acceptance_equals_reference(self, tree):
    """Every row accepts exactly as many drafts as the cache-free reference; a head fed features
    one position stale (the mutation) does not."""
    target, head = bigram_pair()
    noise = jax.random.normal(jax.random.key(5), (TF_CONFIG.hidden_size,) * 2)
    e = TF_CONFIG.hidden_size  # the features now matter: fc = [I; noise]
    head.fc.kernel.set_value(head.fc.kernel.get_value().at[e:].set(0.3 * noise))
    clean_commit = eagle_lib.commit
    stale = lambda state, drafts, o: clean_commit(
        state, drafts, o.replace(features=jnp.roll(o.features, 1, axis=1)))
    assert_acceptance_equals_reference(self, target, head, tree, stale)


def assert_accepts_everything(test, target, head) -> None:
  """``head`` (an oracle of ``target``'s greedy next token) has every draft accepted, chain and
  static tree, on a ragged batch: the Autoregressive tokens in the fewest target calls."""
  new = 13
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(0, TF_CONFIG.vocab_size, n)) for n in (1, 5, 9)]
  ar = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=new)
  for method in (sj.Eagle(head, gamma=3), sj.Eagle(head, tree=TREE, children="top_k")):
    out = sj.generate(target, prompts, method, max_new_tokens=new)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    test.assertEqual(int(out.stats.target_calls), 1 + -(-(new - 1) // (method.gamma + 1)))


def assert_acceptance_equals_reference(test, target, head, tree, stale_commit) -> None:
  """Greedy ``sj.Eagle(head)`` (a chain of 3 when ``tree`` is None, else ``tree`` with top-k
  children) accepts, row by row, exactly what ``reference_accepted`` does, some drafts but not
  all; with ``eagle_lib.commit`` replaced by ``stale_commit`` (a features mutation) the tokens
  stay exact but the acceptance differs."""
  method = (sj.Eagle(head, gamma=3) if tree is None else
            sj.Eagle(head, tree=tree, children="top_k"))
  shape = sj.Tree.chains(num=1, depth=3) if tree is None else tree
  prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7], [1, 8, 2, 8, 1], [11]]
  run = lambda: sj.generate(target, prompts, method, max_new_tokens=GREEDY_NEW)
  out = run()
  longer = sj.generate(target, prompts, max_new_tokens=GREEDY_NEW + shape.max_depth + 1).tokens
  reference = [reference_accepted(target, head, p, longer[b], shape, GREEDY_NEW)
               for b, p in enumerate(prompts)]
  test.assertBetween(sum(reference), 1, len(prompts) * (GREEDY_NEW - 1) - 1)  # some, not all
  np.testing.assert_array_equal(out.stats.accepted, reference)
  with patched(((eagle_lib, "commit", stale_commit),)):
    mutant = run()
  np.testing.assert_array_equal(mutant.tokens, out.tokens)  # greedy: still exact ...
  test.assertFalse(np.array_equal(mutant.stats.accepted, reference))  # ... but not EAGLE


class LawTest(absltest.TestCase):

  def test_sampled_chain(self):
    target = law_transformer()
    gamma = 2
    result = lawcheck.check_law(target, sj.Eagle(random_head(LAW_CONFIG, 3), gamma=gamma),
                                S(1.0), [(3, 1, 4, 1, 5), (2, 0)], gamma + 3,
                                seed=_seed("eagle_chain"), exact_law=lawcheck.transformer_law)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    counts = np.asarray(result.out.stats.accepted_length_counts)
    self.assertTrue(np.all(counts > 0), msg=str(counts))

  @pytest.mark.slow  # ~18 s; the sampled chain's law stays in the default run
  def test_sampled_tree(self):
    result = self.tree_law("sampled", "eagle_tree")
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    counts = np.asarray(result.out.stats.accepted_length_counts)
    self.assertTrue(np.all(counts > 0), msg=str(counts))

  @pytest.mark.slow  # ~45 s law run; the chain and static-tree laws stay in the default run
  def test_dynamic_tree(self):
    result = lawcheck.check_law(law_transformer(), sj.Eagle(random_head(LAW_CONFIG, 3),
                                                            tree=sj.DynamicTree(2, 2, 4)),
                                S(1.0), [(3, 1, 4, 1, 5)], 2 + 3, seed=_seed("eagle_dynamic"),
                                exact_law=lawcheck.transformer_law)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    self.assertGreater(int(np.sum(result.out.stats.accepted)), 0)

  @pytest.mark.slow  # ~1 min mutation control (test_tree_speculative has the same control)
  def test_soft_q_for_top_k_children_is_rejected(self):
    clean = self.tree_law("top_k", "eagle_top_k")
    self.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
    bug = dict(draft_tree._RULE, top_k="without_replacement")  # EAGLE issues 74/110/183
    with patched(((draft_tree, "_RULE", bug),)):
      mutant = self.tree_law("top_k", "eagle_soft_q")
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())

  def tree_law(self, children: str, name: str):
    return lawcheck.check_law(law_transformer(),
                              sj.Eagle(random_head(LAW_CONFIG, 3), tree=SMALL_TREE,
                                       children=children),
                              S(1.0), [(3, 1, 4, 1, 5)], SMALL_TREE.max_depth + 3,
                              seed=_seed(name), exact_law=lawcheck.transformer_law)


def numpy_layer(tensors: dict, prefix: str, config: sj.ModelConfig, x, residual) -> np.ndarray:
  """An independent NumPy forward of the published Llama layer ``prefix`` (torch layout), its
  input norm left out: causal attention of [T, D_in] ``x`` at positions 0..T-1 (RoPE), added to
  ``residual`` [T, E], then the MLP half (post-attention norm, SwiGLU)."""
  w = lambda name: np.asarray(tensors[prefix + name], np.float64)
  n, kv, d = config.num_heads, config.num_kv_heads, config.head_dim
  q = (x @ w("self_attn.q_proj.weight").T).reshape(-1, n, d)
  k = (x @ w("self_attn.k_proj.weight").T).reshape(-1, kv, d)
  v = (x @ w("self_attn.v_proj.weight").T).reshape(-1, kv, d)
  t = len(x)
  inv = 1.0 / config.rope_theta ** (np.arange(0, d, 2) / d)
  ang = np.arange(t)[:, None] * inv[None]
  cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(
      np.concatenate([ang, ang], -1))[:, None]
  rot = lambda a: a * cos + np.concatenate([-a[..., d // 2:], a[..., :d // 2]], -1) * sin
  q, k = rot(q), rot(k)
  k, v = np.repeat(k, n // kv, axis=1), np.repeat(v, n // kv, axis=1)
  s = np.einsum("thd,shd->hts", q, k) / np.sqrt(d)
  s = np.where(np.tril(np.ones((t, t), bool))[None], s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  h = residual + np.einsum("hts,shd->thd", p, v).reshape(t, -1) @ w(
      "self_attn.o_proj.weight").T
  g = numpy_rms(h, w("post_attention_layernorm.weight"), config)
  gate = g @ w("mlp.gate_proj.weight").T
  return h + (gate / (1 + np.exp(-gate)) * (g @ w("mlp.up_proj.weight").T)) @ w(
      "mlp.down_proj.weight").T


def numpy_rms(x, scale, config: sj.ModelConfig) -> np.ndarray:
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + config.norm_eps) * scale


def numpy_head(tensors: dict, config: sj.ModelConfig, tokens, features, embed) -> np.ndarray:
  """An independent NumPy forward of an EAGLE-1 head from its published tensors (torch layout):
  [T] tokens and [T, E] features at positions 0..T-1 -> [T, E] predicted features."""
  w = lambda name: np.asarray(tensors[name], np.float64)
  x = np.concatenate([np.asarray(embed, np.float64)[tokens], features], -1) @ w(
      "fc.weight").T + w("fc.bias")
  return numpy_layer(tensors, "layers.0.", config, x, x)


def assert_round_trip(head, tensors: dict, out: str, target):
  """``sj.save_head(head, out, target)`` writes exactly the published ``tensors`` plus the
  target's embedding, and they load back to ``head``'s parameters (the embedding: the
  target's). Returns (the loaded head, the written tensors)."""
  from safetensors.numpy import load_file
  sj.save_head(head, out, target)
  written = load_file(os.path.join(out, "model.safetensors"))
  assert sorted(written) == sorted(set(tensors) | {"embed_tokens.weight"}), sorted(written)
  for name, value in tensors.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  again = sj.load_head(out)
  params = lambda h: {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(h, nnx.Param))}
  before, after = params(head), params(again)
  np.testing.assert_array_equal(after.pop(("embed",)), target.embed.get_value())
  before.pop(("embed",), None)
  assert sorted(before) == sorted(after), (sorted(before), sorted(after))
  for p, value in before.items():
    np.testing.assert_array_equal(value, after[p], err_msg=str(p))
  return again, written


class LayoutTest(absltest.TestCase):

  def published(self, path, target, with_embed: bool, pickled: bool = False):
    """Writes a random EAGLE-1 head in the repository's layout; returns its tensors."""
    c = target.config
    e, i, d = c.hidden_size, c.intermediate_size, c.head_dim
    rng = np.random.default_rng(0)
    r = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
    tensors = {"fc.weight": r(e, 2 * e), "fc.bias": r(e),
               "layers.0.self_attn.q_proj.weight": r(c.num_heads * d, e),
               "layers.0.self_attn.k_proj.weight": r(c.num_kv_heads * d, e),
               "layers.0.self_attn.v_proj.weight": r(c.num_kv_heads * d, e),
               "layers.0.self_attn.o_proj.weight": r(e, c.num_heads * d),
               "layers.0.mlp.gate_proj.weight": r(i, e), "layers.0.mlp.up_proj.weight": r(i, e),
               "layers.0.mlp.down_proj.weight": r(e, i),
               "layers.0.post_attention_layernorm.weight": 1 + r(e)}
    if with_embed:
      tensors["embed_tokens.weight"] = np.asarray(target.embed.get_value())
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": True,
              "hidden_size": e, "intermediate_size": i, "num_attention_heads": c.num_heads,
              "num_key_value_heads": c.num_kv_heads, "num_hidden_layers": 1,
              "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta,
              "max_position_embeddings": c.max_position_embeddings,
              "vocab_size": c.vocab_size, "hidden_act": "silu", "torch_dtype": "float32"}
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(config, f)
    if pickled:
      import torch
      torch.save({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()},  # writable copies
                 os.path.join(path, "pytorch_model.bin"))
    else:
      from safetensors.numpy import save_file
      save_file(tensors, os.path.join(path, "model.safetensors"))
    return tensors

  def check_forward(self, head, tensors, target):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, target.config.vocab_size, 6)
    feats = rng.standard_normal((6, target.config.hidden_size)).astype(np.float32)
    embed = np.asarray(target.embed.get_value())
    expected = numpy_head(tensors, target.config, tokens, feats, embed)
    hidden, _ = head(jnp.asarray(embed[tokens])[None], jnp.asarray(feats)[None],
                     init_cache(head.config, 1, 8))
    np.testing.assert_allclose(hidden[0], expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(target.project(hidden[0]),
                               expected @ np.asarray(target.lm_head.get_value(), np.float64),
                               atol=1e-4, rtol=1e-5)

  def test_load_published_and_round_trip(self):
    target = random_transformer(TF_CONFIG, 0)
    for with_embed in (False, True):
      with tempfile.TemporaryDirectory() as path:
        tensors = self.published(path, target, with_embed)
        head = sj.load_head(path)
        self.assertEqual(head.embed is not None, with_embed)
        self.check_forward(head, tensors, target)
        sj.Eagle(head).validate(target, 4, 4, "prompt length")  # the embedding matches
        with tempfile.TemporaryDirectory() as out:
          assert_round_trip(head, tensors, out, target)

  def test_pickled(self):
    target = random_transformer(TF_CONFIG, 0)
    with tempfile.TemporaryDirectory() as path:
      try:
        import torch  # noqa: F401
      except ImportError:
        self.published(path, target, False)
        os.rename(os.path.join(path, "model.safetensors"), os.path.join(path, "pytorch_model.bin"))
        with self.assertRaisesRegex(ValueError, r"needs torch"):
          sj.load_head(path)
        return
      tensors = self.published(path, target, True, pickled=True)
      self.check_forward(sj.load_head(path), tensors, target)
      with mock.patch.dict("sys.modules", {"torch": None}):
        with self.assertRaisesRegex(ValueError, r"pytorch_model.bin needs torch"):
          sj.load_head(path)

  def test_errors(self):
    target = random_transformer(TF_CONFIG, 0)
    with tempfile.TemporaryDirectory() as path:
      tensors = self.published(path, target, True)
      tensors["embed_tokens.weight"] = tensors["embed_tokens.weight"] + 1
      from safetensors.numpy import save_file
      save_file(tensors, os.path.join(path, "model.safetensors"))
      with self.assertRaisesRegex(ValueError, r"embed_tokens.weight differs from the target"):
        sj.generate(target, [[1]], sj.Eagle(sj.load_head(path)), max_new_tokens=2)
      tensors["layers.0.input_layernorm.weight"] = np.ones(TF_CONFIG.hidden_size, np.float32)
      save_file(tensors, os.path.join(path, "model.safetensors"))
      with self.assertRaisesRegex(ValueError, r"unexpected tensor 'layers.0.input_layernorm"):
        sj.load_head(path)
    with self.assertRaisesRegex(ValueError, r"head must be an EAGLE-1/2 or EAGLE-3 head"):
      sj.Eagle(object())
    with self.assertRaisesRegex(ValueError, r"gamma must be an integer >= 1"):
      sj.Eagle(init_head(TF_CONFIG), gamma=0)
    with self.assertRaisesRegex(ValueError, r"give gamma \(a chain\) or tree, not both"):
      sj.Eagle(init_head(TF_CONFIG), gamma=2, tree=TREE)
    with self.assertRaisesRegex(ValueError, r"children='top_k'"):
      sj.Eagle(init_head(TF_CONFIG), tree=DYNAMIC, children="sampled")
    other = init_head(dataclasses.replace(TF_CONFIG, hidden_size=16))
    with self.assertRaisesRegex(ValueError, r"hidden size 16 differs from the target's 32"):
      sj.generate(target, [[1]], sj.Eagle(other), max_new_tokens=2)


if __name__ == "__main__":
  absltest.main()
