"""EAGLE-3 heads (``specjax.heads.eagle3``) through ``sj.Eagle``, with a reduced draft vocabulary:
greedy exactness of chains, static and dynamic trees (with the features the loop hands the head
checked against one full forward, ``tests/test_features.py``'s recorder), an oracle head that
accepts everything, acceptance equal to the cache-free reference (and a stale-features mutation
it catches), the law harness with a mutation it rejects, and the published layout both ways
(``sj.load_head`` / ``sj.save_head``) against an independent NumPy forward, with its errors."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest, parameterized
from flax import nnx

import specjax as sj
from specjax.heads.eagle import head_config
from specjax.heads.eagle3 import Eagle3Head, init_head3
from specjax.models.config import rope_inverse_frequencies
from specjax.models.kv_cache import init_cache
from specjax.proposers import eagle as eagle_lib

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck
  from tests.test_eagle import (DYNAMIC, SMALL_TREE, TREE, assert_acceptance_equals_reference,
                                assert_accepts_everything, assert_round_trip, numpy_layer,
                                numpy_rms, random_head)
  from tests.test_features import TOL, Recorded, run_recorded
  from tests.test_laws import LAW_CONFIG, patched
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed,
                                      greedy_reference, random_transformer, truncate_at_eos)
except ImportError:  # pragma: no cover
  import lawcheck
  from test_eagle import (DYNAMIC, SMALL_TREE, TREE, assert_acceptance_equals_reference,
                          assert_accepts_everything, assert_round_trip, numpy_layer, numpy_rms,
                          random_head)
  from test_features import TOL, Recorded, run_recorded
  from test_laws import LAW_CONFIG, patched
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed, greedy_reference,
                                random_transformer, truncate_at_eos)

S = sj.Sampling
E3_CONFIG = dataclasses.replace(TF_CONFIG, num_layers=4)  # 16 tokens, 4 layers
DRAFT_IDS = (0, 1, 3, 4, 6, 7, 9, 10, 12, 13, 15)  # 11 of the 16 tokens
LAYERS = (0, 2, -1)  # low, middle, top (the default for 4 layers, (1, 1, 0), repeats one)
LAW3_CONFIG = dataclasses.replace(LAW_CONFIG, num_layers=4)  # 6 tokens
LAW_DRAFT_IDS = (0, 2, 3, 5)  # the law target emits 1 and 4 too (checked)


def random_head3(config=E3_CONFIG, seed: int = 1, draft_ids=DRAFT_IDS, target_layers=LAYERS):
  return random_head(config, seed, init=init_head3, draft_ids=np.asarray(draft_ids),
                     target_layers=target_layers)


def oracle_pair(seed: int = 0, fc_noise: float = 0.0):
  """(target, head): a one-layer target whose next token is a function ``g`` of the last token
  (attention and MLP outputs zero, its LM head solved so that ``argmax = g`` with values in 6
  ids of a 10-id draft vocabulary), and an EAGLE-3 head that drafts ``g`` exactly.

  The head's hidden is ``M one_hot(t)`` over the dims that its ``lm_head`` reads as target id
  ``t``'s logit (through the draft ids), and each pair replaces it: head 0 attends to its own
  slot (constant q and k with RoPE: the scores peak where the positions agree) and reads a code
  of ``g(token)`` solved from the normed embedding, written as ``+M one_hot(g(token))``; head 2,
  also on its own slot, reads a code of the normed hidden (``hidden_norm``'s scale makes it the
  hidden itself) and writes ``-hidden``. The MLP is off. A wrong position, slot, mask, pairing or
  draft-id map breaks the chain. ``fc`` is zero (``fc_noise``: a random ``fc`` of that scale, so
  that the target's features move the drafts)."""
  config = dataclasses.replace(TF_CONFIG, num_layers=1)
  v, e, d = config.vocab_size, config.hidden_size, config.head_dim
  target = nnx.clone(random_transformer(config, seed))  # a copy: the cached one is shared
  block = target.layers[0]
  for dense in (block.attn.o, block.mlp.down):
    dense.kernel.set_value(jnp.zeros_like(dense.kernel.get_value()))
  rng = np.random.default_rng(seed)
  ids = np.sort(rng.choice(v, 10, replace=False))
  image = np.sort(rng.choice(ids, 6, replace=False))
  g = rng.choice(image, v)
  embed = np.asarray(target.embed.get_value(), np.float64)
  normed = numpy_rms(embed, np.asarray(target.final_norm.scale.get_value()), config)
  logits = 4.0 * np.eye(v)[g] + 0.1 * rng.standard_normal((v, v))
  target.lm_head.set_value(jnp.asarray(np.linalg.lstsq(normed, logits, rcond=None)[0],
                                       jnp.float32))

  hc = dataclasses.replace(head_config(config), attention_bias=True, attention_out_bias=False)
  head = Eagle3Head(hc, nnx.Rngs(seed), draft_ids=ids, target_layers=(0, 0, 0))
  layer, big = head.midlayer, 10.0
  set_ = lambda var, value: var.set_value(jnp.asarray(value, jnp.float32))
  zeros = lambda var: np.zeros(var.get_value().shape)
  set_(head.fc.kernel, fc_noise * rng.standard_normal((3 * e, e)))
  set_(layer.hidden_norm.scale, np.full(e, big / np.sqrt(e)))  # norm(M one_hot) = M one_hot
  inv = np.asarray(rope_inverse_frequencies(hc))
  offsets = np.arange(1, 2 * config.max_position_embeddings)
  gap = np.min(np.sum(1 - np.cos(offsets[:, None] * inv[None]), 1))  # per unit pair norm
  c = np.concatenate([np.full(d // 2, np.sqrt(60.0 * np.sqrt(d) / gap)), np.zeros(d // 2)])
  set_(layer.attn.q.kernel, zeros(layer.attn.q.kernel))  # scores >= 60 below the own slot's
  set_(layer.attn.q.bias, np.concatenate([c, 0 * c, c, 0 * c]))  # heads 0 and 2
  set_(layer.attn.k.kernel, zeros(layer.attn.k.kernel))
  set_(layer.attn.k.bias, np.concatenate([c, c]))
  rank = np.searchsorted(image, g)  # code of g(token): its rank in the image
  value = zeros(layer.attn.v.kernel)
  value[:e, :d] = np.linalg.lstsq(numpy_rms(embed, 1.0, hc), np.eye(d)[rank], rcond=None)[0]
  value[e + image, d + np.arange(len(image))] = 1.0 / big  # the hidden's code
  set_(layer.attn.v.kernel, value)
  out = zeros(layer.attn.o.kernel)
  out[np.arange(len(image)), image] = big  # head 0: + M one_hot(g(token))
  out[2 * d + np.arange(len(image)), image] = -big  # head 2: - hidden
  set_(layer.attn.o.kernel, out)
  set_(layer.mlp.down.kernel, zeros(layer.mlp.down.kernel))
  lm = np.zeros((e, len(ids)))
  lm[ids, np.arange(len(ids))] = 1.0
  set_(head.lm_head, lm)
  np.testing.assert_array_equal(np.argmax(np.asarray(sj.forward(target, jnp.arange(v)[None]))[0],
                                          -1), g)  # the target is the bigram g
  return target, head


class GreedyTest(parameterized.TestCase):
  """At temperature 0 an EAGLE-3 head with a reduced vocabulary returns the Autoregressive
  tokens exactly (ragged batch; EOS on the chain), and the target states the loop hands it equal
  one full forward's at its three layers, after the prefill, chains, trees and rollbacks."""

  @parameterized.named_parameters(("chain", None), ("tree", TREE), ("dynamic", DYNAMIC))
  def test_matches_autoregressive_with_true_features(self, tree):
    target = random_transformer(E3_CONFIG, 0)
    expected = greedy_reference(E3_CONFIG, GREEDY_NEW)
    head = random_head3()
    method = sj.Eagle(head, gamma=3) if tree is None else sj.Eagle(head, tree=tree)
    eos = int(expected[2, 1]) if tree is None else None
    out, worst = run_recorded(target, Recorded(method.proposer), GREEDY_PROMPTS, S(0.0),
                              GREEDY_NEW, eos_token_id=eos)
    np.testing.assert_array_equal(out.tokens, expected if eos is None else
                                  truncate_at_eos(expected, eos))
    self.assertLess(worst, TOL)
    passes = 3 if tree is None else (tree.depth if tree is DYNAMIC else tree.max_depth)
    self.assertEqual(int(out.stats.draft_calls), 1 + passes * (int(out.stats.target_calls) - 1))

  def test_oracle_head_accepts_everything(self):
    assert_accepts_everything(self, *oracle_pair())

  def test_greedy_draft_is_the_argmax_of_the_scattered_row(self):
    """The greedy chain's shortcut (the argmax over the draft vocabulary, then its target id)
    picks the token the V-wide row's argmax picks, for a reduced and a full vocabulary, and on a
    tie the lowest target id, as the row's argmax does."""
    hidden = jax.random.normal(jax.random.key(3), (5, 7, E3_CONFIG.hidden_size))
    for ids in (DRAFT_IDS, tuple(range(E3_CONFIG.vocab_size))):
      head = random_head3(draft_ids=ids)
      want = jnp.argmax(head.draft_logits(hidden), axis=-1)
      self.assertGreater(len(np.unique(want)), 3)  # the rows do not all agree
      np.testing.assert_array_equal(head.greedy_draft(hidden), want)
    head = random_head3()
    w = np.zeros(head.lm_head[...].shape, np.float32)
    w[:, 2] = w[:, 5] = 0.1  # draft ids 2 and 5 (target ids 3 and 7) tie at the top
    head.lm_head.value = jnp.asarray(w, head.lm_head[...].dtype)
    ones = jnp.ones((2, E3_CONFIG.hidden_size))
    np.testing.assert_array_equal(jnp.argmax(head.draft_logits(ones), -1), [3, 3])
    np.testing.assert_array_equal(head.greedy_draft(ones), [3, 3])
    head_graph, head_state = nnx.split(head)
    target_graph, target_state = nnx.split(random_transformer(E3_CONFIG, 0))
    models = eagle_lib.Models(head_graph, target_graph, (head_state, target_state))
    token, q = models.draw(None, ones, S(0.0))
    np.testing.assert_array_equal(token, [3, 3])
    self.assertIsNone(q)


  @pytest.mark.slow  # ~20 s; the greedy runs against autoregressive stay in the default run
  def test_acceptance_equals_reference(self):
    """Every row accepts exactly as many drafts as the cache-free reference (static tree); a
    proposer that keeps the last iteration's features instead of the accepted path's (the
    mutation) does not."""
    clean_commit = eagle_lib.commit
    stale = lambda state, drafts, o: clean_commit(state, drafts, o).replace(
        features=state.features)
    assert_acceptance_equals_reference(self, *oracle_pair(fc_noise=50.0), TREE, stale)


class LawTest(absltest.TestCase):
  """The law harness on sampled EAGLE-3 drafts whose vocabulary lacks tokens the target emits.

  A dynamic tree has no law run of its own here: its children are the head's top-k, verified
  by the one-hot rule, so the reduced vocabulary's q never reaches its verifier; the dynamic
  tree's law is tested with the EAGLE-1 head (``tests/test_eagle.py``) and its EAGLE-3 tokens
  by the greedy tests above.

  Its mutation: the verifier handed the draft vocabulary's law unscattered (draft id ``k``'s
  probability at target id ``k``) while the token is the mapped one. A wrong map inside
  ``draft_logits`` (shifted ids) or stale features would keep the law: the token is drawn from
  the very ``q`` the verifier reads, so only acceptance moves; the oracle and reference tests
  above catch those."""

  def law(self, method, name: str, n_tokens: int):
    result = lawcheck.check_law(random_transformer(LAW3_CONFIG, 0), method, S(1.0),
                                [(3, 1, 4, 1, 5)], n_tokens, seed=_seed(name),
                                exact_law=lawcheck.transformer_law)
    emitted = np.bincount(np.asarray(result.tokens[0]).ravel(), minlength=LAW3_CONFIG.vocab_size)
    outside = np.setdiff1d(np.arange(LAW3_CONFIG.vocab_size), LAW_DRAFT_IDS)
    self.assertTrue(np.all(emitted[outside] > 100), msg=str(emitted))  # not in the draft vocab
    return result

  def head(self):
    return random_head3(LAW3_CONFIG, 3, LAW_DRAFT_IDS, None)

  @pytest.mark.slow  # ~1 min law run; test_sampled_tree keeps EAGLE-3's law in the default run
  def test_sampled_chain_and_unscattered_law(self):
    gamma = 2
    clean = self.law(sj.Eagle(self.head(), gamma=gamma), "eagle3_chain", gamma + 3)
    self.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
    counts = np.asarray(clean.out.stats.accepted_length_counts)
    self.assertTrue(np.all(counts > 0), msg=str(counts))

    clean_draw = eagle_lib.draw
    ids = jnp.asarray(LAW_DRAFT_IDS)

    def unscattered(keys, logits, sampling):  # the verifier gets the draft vocabulary's law
      token, q = clean_draw(keys, logits, sampling)
      return token, jnp.zeros_like(q).at[..., :len(LAW_DRAFT_IDS)].set(q[..., ids])

    with patched(((eagle_lib, "draw", unscattered),)):
      mutant = self.law(sj.Eagle(self.head(), gamma=gamma), "eagle3_unscattered", gamma + 3)
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())

  @pytest.mark.slow  # ~36 s; the sampled chain's law stays in the default run
  def test_sampled_tree(self):
    result = self.law(sj.Eagle(self.head(), tree=SMALL_TREE), "eagle3_tree",
                      SMALL_TREE.max_depth + 3)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    counts = np.asarray(result.out.stats.accepted_length_counts)
    self.assertTrue(np.all(counts > 0), msg=str(counts))


def numpy_head3(tensors: dict, config: sj.ModelConfig, tokens, features, embed) -> np.ndarray:
  """An independent NumPy forward of an EAGLE-3 head from its published tensors (torch layout):
  [T] tokens and [T, 3, E] target features at positions 0..T-1 -> [T, V] logits in the target
  vocabulary (``-inf`` outside the draft vocabulary, draft id d at target id d + d2t[d])."""
  w = lambda name: np.asarray(tensors[name], np.float64)
  hidden = features.reshape(len(tokens), -1) @ w("fc.weight").T
  x = np.concatenate([numpy_rms(np.asarray(embed, np.float64)[tokens],
                                w("midlayer.input_layernorm.weight"), config),
                      numpy_rms(hidden, w("midlayer.hidden_norm.weight"), config)], -1)
  out = numpy_layer(tensors, "midlayer.", config, x, hidden)
  draft = numpy_rms(out, w("norm.weight"), config) @ w("lm_head.weight").T
  logits = np.full((len(tokens), config.vocab_size), -np.inf)
  logits[:, np.arange(draft.shape[1]) + tensors["d2t"]] = draft
  return logits


class LayoutTest(absltest.TestCase):

  def published(self, path, target, with_embed=False, config_extra=None, pickled=False):
    """Writes a random EAGLE-3 head for ``target`` in the published layout (draft vocabulary
    ``DRAFT_IDS``); returns its tensors."""
    c = target.config
    e, i, d, vd = c.hidden_size, c.intermediate_size, c.head_dim, len(DRAFT_IDS)
    rng = np.random.default_rng(0)
    r = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
    m = "midlayer."
    tensors = {"fc.weight": r(e, 3 * e), "norm.weight": 1 + r(e), "lm_head.weight": r(vd, e),
               f"{m}hidden_norm.weight": 1 + r(e), f"{m}input_layernorm.weight": 1 + r(e),
               f"{m}self_attn.q_proj.weight": r(c.num_heads * d, 2 * e),
               f"{m}self_attn.k_proj.weight": r(c.num_kv_heads * d, 2 * e),
               f"{m}self_attn.v_proj.weight": r(c.num_kv_heads * d, 2 * e),
               f"{m}self_attn.o_proj.weight": r(e, c.num_heads * d),
               f"{m}mlp.gate_proj.weight": r(i, e), f"{m}mlp.up_proj.weight": r(i, e),
               f"{m}mlp.down_proj.weight": r(e, i),
               f"{m}post_attention_layernorm.weight": 1 + r(e),
               "d2t": np.asarray(DRAFT_IDS, np.int64) - np.arange(vd),
               "t2d": np.isin(np.arange(c.vocab_size), DRAFT_IDS)}
    if with_embed:
      tensors["embed_tokens.weight"] = np.asarray(target.embed.get_value())
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": e,
              "intermediate_size": i, "num_attention_heads": c.num_heads,
              "num_key_value_heads": c.num_kv_heads, "num_hidden_layers": 1,
              "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta,
              "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
              "draft_vocab_size": vd, "hidden_act": "silu", "torch_dtype": "float16",
              "tie_word_embeddings": False, **(config_extra or {})}
    self.write(path, config, tensors, pickled)
    return tensors

  def write(self, path, config, tensors, pickled=False):
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(config, f)
    if pickled:
      import torch
      torch.save({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()},
                 os.path.join(path, "pytorch_model.bin"))
    else:
      from safetensors.numpy import save_file
      save_file(tensors, os.path.join(path, "model.safetensors"))

  def check_forward(self, head, tensors, target):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, target.config.vocab_size, 6)
    feats = rng.standard_normal((6, 3, target.config.hidden_size)).astype(np.float32)
    embed = np.asarray(target.embed.get_value())
    expected = numpy_head3(tensors, target.config, tokens, feats, embed)
    hidden, _ = head(jnp.asarray(embed[tokens])[None], head.from_target(jnp.asarray(feats)[None]),
                     init_cache(head.config, 1, 8))
    logits = np.asarray(head.draft_logits(hidden, target))[0]
    np.testing.assert_array_equal(np.isinf(logits), np.isinf(expected))
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-5)

  def test_load_published_and_round_trip(self):
    target = random_transformer(E3_CONFIG, 0)
    for with_embed in (False, True):
      with tempfile.TemporaryDirectory() as path:
        tensors = self.published(path, target, with_embed)
        head = sj.load_head(path)
        self.assertIsInstance(head, Eagle3Head)
        self.assertEqual(head.config.dtype, "float32")  # float16 files load as float32
        self.assertEqual(head.embed is not None, with_embed)
        np.testing.assert_array_equal(head.draft_ids.get_value(), DRAFT_IDS)
        self.assertIsNone(head.target_layers)  # the config names none: the default
        self.check_forward(head, tensors, target)
        sj.Eagle(head).validate(target, 4, 4, "prompt length")  # sizes, layers, embedding
        with tempfile.TemporaryDirectory() as out:
          again, written = assert_round_trip(head, tensors, out, target)
          self.assertEqual((written["d2t"].dtype, written["t2d"].dtype), (np.int64, bool))
          with open(os.path.join(out, "config.json")) as f:
            hf = json.load(f)
        self.assertEqual(hf["architectures"], ["LlamaForCausalLMEagle3"])
        self.assertEqual((hf["draft_vocab_size"], hf["num_hidden_layers"]), (len(DRAFT_IDS), 1))
        self.assertFalse(hf["tie_word_embeddings"])
        self.assertNotIn("bias", hf)
        self.assertEqual(hf["eagle_aux_hidden_state_layer_ids"], [2, 2, 1])  # inputs
        self.assertEqual(hf["eagle_config"]["eagle_aux_hidden_state_layer_ids"], [1, 1, 0])
        self.assertEqual(again.target_layers, (1, 1, 0))  # the default for 4 layers, explicit
        np.testing.assert_array_equal(again.draft_ids.get_value(), DRAFT_IDS)

  def test_feature_layers_in_config(self):
    target = random_transformer(E3_CONFIG, 0)
    inputs = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}  # vLLM / the repository: inputs
    outputs = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}}  # SGLang
    for extra in (inputs, outputs, {**inputs, **outputs}):
      with tempfile.TemporaryDirectory() as path:
        self.published(path, target, config_extra=extra)
        head = sj.load_head(path)
        self.assertEqual(head.target_layers, (0, 2, 3))
        self.assertEqual(head.target_features(target.config), (0, 2, 3))
    head = random_head3()  # LAYERS = (0, 2, -1): counted from the end
    with tempfile.TemporaryDirectory() as path:
      with self.assertRaisesRegex(ValueError, r"count from the end: give target="):
        sj.save_head(head, path)
      sj.save_head(head, path, target)
      self.assertEqual(sj.load_head(path).target_layers, (0, 2, 3))
      sj.save_head(init_head3(E3_CONFIG, 0), path)  # no layers, no target: the default
      with open(os.path.join(path, "config.json")) as f:
        self.assertNotIn("eagle_aux_hidden_state_layer_ids", json.load(f))
      self.assertIsNone(sj.load_head(path).target_layers)

  def test_pickled(self):
    if importlib.util.find_spec("torch") is None:
      self.skipTest("torch is not installed")
    target = random_transformer(E3_CONFIG, 0)
    with tempfile.TemporaryDirectory() as path:
      tensors = self.published(path, target, pickled=True)
      head = sj.load_head(path)
      np.testing.assert_array_equal(head.draft_ids.get_value(), DRAFT_IDS)
      self.check_forward(head, tensors, target)

  def test_errors(self):
    from safetensors.numpy import save_file
    target = random_transformer(E3_CONFIG, 0)
    v, e = E3_CONFIG.vocab_size, E3_CONFIG.hidden_size
    d2t = np.asarray(DRAFT_IDS, np.int64) - np.arange(len(DRAFT_IDS))
    t2d = np.isin(np.arange(v), DRAFT_IDS)
    cases = [  # (tensor changes, config changes, error)
        ({"d2t": np.where(np.arange(len(d2t)) == 4, d2t - 1, d2t)}, {},
         r"t2d\[5\] is False but d2t maps a draft id to target id 5"),
        ({"d2t": np.where(np.arange(len(d2t)) == 2, d2t - 2, d2t)}, {},
         r"d2t maps draft ids 1 and 2 to target ids 1 and 1: target ids must be ascending"),
        ({"d2t": d2t + 5}, {}, r"d2t\[8\] = 9 maps draft id 8 to target id 17, outside the "
                               r"16-token vocabulary"),
        ({"d2t": d2t[:-1]}, {}, r"d2t is int64\[10\], expected integers of shape \(11,\)"),
        ({"t2d": t2d[:-1]}, {}, r"t2d has shape \(15,\), expected \(16,\)"),
        ({"t2d": ~t2d}, {}, r"t2d\[0\] is False but d2t maps a draft id to target id 0"),
        ({"d2t": None, "t2d": None}, {}, r"no d2t tensor, so draft_vocab_size 11 must equal "
                                         r"vocab_size 16"),
        ({"lm_head.weight": np.zeros((len(DRAFT_IDS) + 1, e), np.float32)}, {},
         r"tensor 'lm_head.weight' has shape \(12, 32\), expected \(11, 32\)"),
        ({"midlayer.hidden_norm.weight": None}, {},
         r"missing tensor 'midlayer.hidden_norm.weight' of an EAGLE-3 head"),
        ({"fc.bias": np.zeros(e, np.float32)}, {}, r"unexpected tensor 'fc.bias'"),
        ({}, {"num_hidden_layers": 2}, r"one decoder layer \(midlayer\), config.json has "
                                       r"num_hidden_layers=2"),
        ({}, {"draft_vocab_size": 17}, r"draft_vocab_size 17 is not in 1..16"),
        ({}, {"target_hidden_size": 64}, r"target_hidden_size 64 differs"),
        ({}, {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]},
         r"inputs of layers; 0 is the embedding\) must be a list of integers >= 1"),
        ({}, {"eagle_aux_hidden_state_layer_ids": [1, 2, 3],
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}},
         r"\[1, 2, 3\] \(inputs of layers, vLLM\) and eagle_config's \[1, 2, 3\]"),
        ({}, {"eagle_aux_hidden_state_layer_ids": [1, 2]}, r"fuses 3 target layers, config.json "
                                                           r"names 2"),
    ]
    with tempfile.TemporaryDirectory() as path:
      with self.assertRaisesRegex(FileNotFoundError, r"no config.json in"):
        sj.load_head(path)
      for tensor_changes, config_changes, error in cases:
        tensors = self.published(path, target, config_extra=config_changes)
        if tensor_changes:
          tensors.update(tensor_changes)
          save_file({k: v for k, v in tensors.items() if v is not None},
                    os.path.join(path, "model.safetensors"))
        with self.subTest(error), self.assertRaisesRegex(ValueError, error):
          sj.load_head(path)
      os.remove(os.path.join(path, "model.safetensors"))
      with self.assertRaisesRegex(FileNotFoundError, r"neither model.safetensors nor "):
        sj.load_head(path)
    for config, error in ((dataclasses.replace(E3_CONFIG, hidden_size=16),
                           r"hidden size 16 differs from the target's 32"),
                          (dataclasses.replace(E3_CONFIG, vocab_size=20),
                           r"vocabulary of 20 tokens differs from the target's 16")):
      with self.assertRaisesRegex(ValueError, error):
        sj.generate(target, [[1]], sj.Eagle(init_head3(config, 0)), max_new_tokens=2)
    with self.assertRaisesRegex(ValueError, r"feature layer 5 is not a layer of the 4-layer"):
      sj.generate(target, [[1]], sj.Eagle(init_head3(E3_CONFIG, 0, target_layers=(0, 1, 5))),
                  max_new_tokens=2)
    with self.assertRaisesRegex(ValueError, r"need a target of >= 4 layers, got 2"):
      sj.generate(random_transformer(TF_CONFIG, 0), [[1]], sj.Eagle(init_head3(TF_CONFIG, 0)),
                  max_new_tokens=2)
    with tempfile.TemporaryDirectory() as path:
      self.published(path, target, with_embed=True)
      head = sj.load_head(path)
      head.embed.set_value(head.embed.get_value() + 1)
      with self.assertRaisesRegex(ValueError, r"embed_tokens.weight differs from the target"):
        sj.generate(target, [[1]], sj.Eagle(head), max_new_tokens=2)
    with self.assertRaisesRegex(ValueError, r"head must be an EAGLE-1/2, EAGLE-3, Medusa or Hydra head"):
      sj.save_head(object(), "unused")


if __name__ == "__main__":
  absltest.main()
