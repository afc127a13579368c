"""``sj.MTP`` (DeepSeek-V3's multi-token-prediction module, ``specjax.heads.mtp``) through the
real loop: greedy exactness (chain, static tree, ragged batch), an oracle module accepting every
draft, the law harness with a wrong-step-law mutation, the published layout both ways against an
independent NumPy forward, training, and errors."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest
from flax import nnx

import specjax as sj
from specjax.heads.mtp import MTPHead, MTPStack, init_mtp
from specjax.models.kv_cache import init_cache
from specjax.proposers import eagle as eagle_lib
from specjax.proposers import mtp as mtp_lib
from specjax.proposers.base import Outcome
from specjax.training import eagle as et
from specjax.training.progress import set_verbose

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck
  from tests.test_eagle import TREE, numpy_layer, numpy_rms
  from tests.test_laws import LAW_CONFIG, law_transformer, patched
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed,
                                      greedy_reference, random_transformer)
  from tests.test_train_eagle import CONFIG as TRAIN_CONFIG, rows
except ImportError:  # pragma: no cover
  import lawcheck
  from test_eagle import TREE, numpy_layer, numpy_rms
  from test_laws import LAW_CONFIG, law_transformer, patched
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed, greedy_reference,
                                random_transformer)
  from test_train_eagle import CONFIG as TRAIN_CONFIG, rows

S = sj.Sampling
HEAD_SCALE = 8.0


def random_mtp(config: sj.ModelConfig, seed: int, own_head: bool = False,
               num_modules: int = 1) -> MTPHead | MTPStack:
  """An MTP module (or a stack of ``num_modules``) with random weights x ``HEAD_SCALE`` (random
  norms too): drafts that depend visibly on both inputs."""
  head = init_mtp(config, seed, own_head, num_modules)
  state = nnx.state(head, nnx.Param)
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(state))))
  nnx.update(head, jax.tree.map(
      lambda x: x * HEAD_SCALE if x.ndim == 2 else 1 + 0.3 * jax.random.normal(next(keys), x.shape),
      state))
  return head


def oracle_pair(seed: int = 0):
  """(target, module): a one-layer target whose attention output is zero and whose embedding
  rows have unit RMS (so ``enorm`` leaves them as they are), and the MTP module that reproduces
  its next state from the embedding alone: ``eh_proj`` = [I ; 0], attention zero, the target's
  MLP and final-norm scale, the target's LM head. Its draft is the target's greedy token."""
  config = dataclasses.replace(TF_CONFIG, num_layers=1)
  target = nnx.clone(random_transformer(config, seed))
  block = target.layers[0]
  block.attn.o.kernel.set_value(jnp.zeros_like(block.attn.o.kernel.get_value()))
  e = target.embed.get_value()
  target.embed.set_value(e / jnp.sqrt(jnp.mean(e * e, axis=-1, keepdims=True)))
  head = init_mtp(config, seed + 1)
  n = config.hidden_size
  head.fc.kernel.set_value(jnp.concatenate([jnp.eye(n), jnp.zeros((n, n))], axis=0))
  layer = head.layers[0]
  layer.attn.o.kernel.set_value(jnp.zeros_like(layer.attn.o.kernel.get_value()))
  layer.mlp_norm.scale.set_value(block.mlp_norm.scale.get_value())
  for name in ("gate", "up", "down"):
    getattr(layer.mlp, name).kernel.set_value(getattr(block.mlp, name).kernel.get_value())
  head.norm.scale.set_value(target.final_norm.scale.get_value())
  return target, head


class GreedyTest(absltest.TestCase):
  """At temperature 0 ``sj.MTP`` returns the Autoregressive tokens exactly, whatever the module."""

  def test_chain_and_tree_match_autoregressive(self):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    # seed 4: modules whose drafts pass now and then (random ones often never match)
    for method in (sj.MTP(random_mtp(TF_CONFIG, 4), gamma=3),
                   sj.MTP(random_mtp(TF_CONFIG, 4, own_head=True), tree=TREE,
                          children="top_k")):
      out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW)
      np.testing.assert_array_equal(out.tokens, expected)
      passes = method.gamma  # head passes per iteration (a tree: its depth)
      self.assertEqual(int(out.stats.draft_calls), 1 + passes * (int(out.stats.target_calls) - 1))
      self.assertGreater(int(np.sum(out.stats.accepted)), 0)

  def test_oracle_module_accepts_everything(self):
    target, head = oracle_pair()
    new = 13
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, TF_CONFIG.vocab_size, n)) for n in (1, 5, 9)]
    ar = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=new)
    gamma = 3
    out = sj.generate(target, prompts, sj.MTP(head, gamma=gamma), max_new_tokens=new)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    # gamma + 1 tokens per target call after the prefill's first token
    self.assertEqual(int(out.stats.target_calls), 1 + -(-(new - 1) // (gamma + 1)))


def wrong_step_law(draw_rest):
  """The mutation: draft k verified against draft k - 1's law (the chain's q rolled by one)."""
  def mutant(*args):
    carry, tokens, q = draw_rest(*args)
    return carry, tokens, None if q is None else jnp.roll(q, 1, axis=1)
  return mutant


def check_law_and_mutant(test, head, name: str, patch) -> None:
  """A sampled ``sj.MTP(head, gamma=2)`` chain emits the target's law (every accepted length
  seen) and, with ``patch`` (``patched``'s triple) applied, is rejected."""
  gamma = 2
  run = lambda name: lawcheck.check_law(
      law_transformer(), sj.MTP(head, gamma=gamma), S(1.0), [(3, 1, 4, 1, 5)], gamma + 3,
      seed=_seed(name), exact_law=lawcheck.transformer_law)
  clean = run(name)
  test.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
  counts = np.asarray(clean.out.stats.accepted_length_counts)
  test.assertTrue(np.all(counts > 0), msg=str(counts))
  with patched((patch,)):
    mutant = run(name + "_mutant")
  test.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())


class LawTest(absltest.TestCase):

  def test_sampled_chain_and_wrong_step_law_mutant(self):
    check_law_and_mutant(self, random_mtp(LAW_CONFIG, 3), "mtp_chain",
                         (eagle_lib, "draw_rest", wrong_step_law(eagle_lib.draw_rest)))


def numpy_mtp_stack(tensors: dict, prefixes, config: sj.ModelConfig, tokens, hidden, embed,
                    lm_head) -> list:
  """An independent NumPy forward of the published MTP layers ``prefixes`` (torch layout) as
  DeepSeek's sequential modules: [T + 1] tokens and [T, E] hiddens at positions 0..T-1; module
  k (k = 1..) at position t reads module k-1's output at t and token t + k -> float64[T - k + 1,
  V] logits per module (``lm_head`` [V, E]: the target's, used by a layer without
  ``shared_head.head``)."""
  hidden = np.asarray(hidden, np.float64)
  logits = []
  for k, prefix in enumerate(prefixes, 1):
    w = lambda name: np.asarray(tensors[prefix + name], np.float64)
    e = numpy_rms(np.asarray(embed, np.float64)[tokens[k:]], w("enorm.weight"), config)
    h = numpy_rms(hidden[:len(tokens) - k], w("hnorm.weight"), config)
    x = np.concatenate([e, h], -1) @ w("eh_proj.weight").T
    hidden = numpy_layer(tensors, prefix, config,
                         numpy_rms(x, w("input_layernorm.weight"), config), x)
    own = prefix + "shared_head.head.weight" in tensors
    head = w("shared_head.head.weight") if own else lm_head
    logits.append(numpy_rms(hidden, w("shared_head.norm.weight"), config)
                  @ np.asarray(head, np.float64).T)
  return logits


class LayoutTest(absltest.TestCase):

  def published(self, path, target, own_head: bool, with_embed: bool, count: int = 1) -> dict:
    """Writes a DeepSeek-V3-style checkpoint: the target's config + num_nextn_predict_layers, the
    main model's tensors and ``count`` random MTP layers at indices N..N+count-1 (the last with
    its own head when ``own_head``); returns the MTP layers' tensors."""
    c = target.config
    e, i, d, n = c.hidden_size, c.intermediate_size, c.head_dim, c.num_layers
    rng = np.random.default_rng(0)
    r = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
    tensors = {}
    for k in range(count):
      p = f"model.layers.{n + k}."
      tensors.update({
          p + "enorm.weight": 1 + r(e), p + "hnorm.weight": 1 + r(e),
          p + "eh_proj.weight": r(e, 2 * e), p + "shared_head.norm.weight": 1 + r(e),
          p + "self_attn.q_proj.weight": r(c.num_heads * d, e),
          p + "self_attn.k_proj.weight": r(c.num_kv_heads * d, e),
          p + "self_attn.v_proj.weight": r(c.num_kv_heads * d, e),
          p + "self_attn.o_proj.weight": r(e, c.num_heads * d),
          p + "mlp.gate_proj.weight": r(i, e), p + "mlp.up_proj.weight": r(i, e),
          p + "mlp.down_proj.weight": r(e, i), p + "input_layernorm.weight": 1 + r(e),
          p + "post_attention_layernorm.weight": 1 + r(e)})
      if own_head and k == count - 1:
        tensors[p + "shared_head.head.weight"] = r(c.vocab_size, e)
      if with_embed:
        tensors[p + "embed_tokens.weight"] = np.asarray(target.embed.get_value())
    main = {"model.embed_tokens.weight": r(c.vocab_size, e), "model.norm.weight": r(e),
            "model.layers.0.input_layernorm.weight": r(e)}  # the main model's: ignored
    hf = dict(model_type="llama",
              architectures=["LlamaForCausalLM"], hidden_size=e, intermediate_size=i,
              num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
              num_hidden_layers=n, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
              max_position_embeddings=c.max_position_embeddings, vocab_size=c.vocab_size,
              hidden_act="silu", torch_dtype="float32", num_nextn_predict_layers=count)
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump(hf, f)
    from safetensors.numpy import save_file
    save_file({**main, **tensors}, os.path.join(path, "model.safetensors"))
    return tensors

  def test_load_published_and_round_trip(self):
    target = random_transformer(TF_CONFIG, 0)
    c = TF_CONFIG
    p = f"model.layers.{c.num_layers}."
    for own_head, with_embed in ((False, True), (True, False)):
      with tempfile.TemporaryDirectory() as path:
        tensors = self.published(path, target, own_head, with_embed)
        head = sj.load_head(path)
        self.assertIsInstance(head, MTPHead)
        self.assertEqual(head.lm_head is not None, own_head)
        self.assertEqual(head.embed is not None, with_embed)
        self.check_forward([head], [p], tensors, target)
        sj.MTP(head).validate(target, 4, 4, "prompt length")  # sizes and embedding match
        self.round_trip(head, target, tensors, set(tensors) | {p + "embed_tokens.weight"}, 1)

  def test_stack_load_published_and_round_trip(self):
    """num_nextn_predict_layers = 2: layers N and N + 1 load as an ``MTPStack`` whose chained
    modules match an independent NumPy forward of DeepSeek's sequential modules, and write back
    tensor for tensor."""
    target = random_transformer(TF_CONFIG, 0)
    c = TF_CONFIG
    prefixes = [f"model.layers.{c.num_layers + k}." for k in range(2)]
    with tempfile.TemporaryDirectory() as path:
      tensors = self.published(path, target, True, True, count=2)
      stack = sj.load_head(path)
      self.assertIsInstance(stack, MTPStack)
      self.assertEqual([(m.depth, m.layer_index, m.lm_head is not None)
                        for m in stack.modules], [(1, 2, False), (2, 3, True)])
      self.check_forward(stack.modules, prefixes, tensors, target)
      sj.MTP(stack).validate(target, 4, 4, "prompt length")
      self.round_trip(stack, target, tensors, set(tensors), 2)

  def check_forward(self, modules, prefixes, tensors: dict, target) -> None:
    """The loaded ``modules`` chained as DeepSeek's sequential modules (module k on module k-1's
    output and token t + k) give ``numpy_mtp_stack``'s logits of the layers ``prefixes``."""
    c = target.config
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, c.vocab_size, 7)
    hidden = rng.standard_normal((6, c.hidden_size)).astype(np.float32)
    embed = np.asarray(target.embed.get_value())
    expected = numpy_mtp_stack(tensors, prefixes, c, tokens, hidden, embed,
                               np.asarray(target.lm_head.get_value()).T)
    h = jnp.asarray(hidden)[None]
    for k, module in enumerate(modules, 1):
      h, _ = module(jnp.asarray(embed[tokens[k:]])[None], h[:, :len(tokens) - k],
                    init_cache(module.config, 1, 8))
      np.testing.assert_allclose(module.draft_logits(h[0], target), expected[k - 1],
                                 atol=1e-4, rtol=1e-4, err_msg=f"module {k}")

  def round_trip(self, head, target, tensors: dict, names: set, count: int) -> None:
    """``sj.save_head(head, .., target)`` writes ``names`` (``tensors`` as they were) and a
    config of ``count`` modules, which loads back to the same parameters (embeddings aside)."""
    from safetensors.numpy import load_file
    with tempfile.TemporaryDirectory() as out:
      sj.save_head(head, out, target)
      written = load_file(os.path.join(out, "model.safetensors"))
      self.assertEqual(sorted(written), sorted(names))
      for name, value in tensors.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
      with open(os.path.join(out, "config.json")) as f:
        hf = json.load(f)
      self.assertEqual((hf["num_nextn_predict_layers"], hf["num_hidden_layers"]),
                       (count, target.config.num_layers))
      again = sj.load_head(out)
      flat = lambda m: {k: v.get_value() for k, v in nnx.to_flat_state(
          nnx.state(m, nnx.Param)) if k[-1] != "embed"}
      before, after = flat(head), flat(again)
      self.assertEqual(sorted(before), sorted(after))
      for k, v in before.items():
        np.testing.assert_array_equal(v, after[k], err_msg=str(k))

  def test_load_pickled_shards(self):
    """A checkpoint in pickled shards (``pytorch_model.bin.index.json``) loads through
    ``torch.load(weights_only=True)``, the module's tensors in any shard; none: a clear error."""
    try:
      import torch
    except ImportError:
      self.skipTest("pickled checkpoints need torch")
    target = random_transformer(TF_CONFIG, 0)
    with tempfile.TemporaryDirectory() as ref, tempfile.TemporaryDirectory() as path:
      self.published(ref, target, False, True)
      from safetensors.numpy import load_file
      everything = load_file(os.path.join(ref, "model.safetensors"))
      names = sorted(everything)
      shards = {"pytorch_model-00001-of-00002.bin": names[::2],
                "pytorch_model-00002-of-00002.bin": names[1::2]}
      for file, part in shards.items():
        torch.save({n: torch.from_numpy(np.array(everything[n])) for n in part},
                   os.path.join(path, file))
      with open(os.path.join(path, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"weight_map": {n: file for file, part in shards.items() for n in part}}, f)
      shutil.copy(os.path.join(ref, "config.json"), path)
      flat = lambda m: dict(nnx.to_flat_state(nnx.state(m, nnx.Param)))
      expected, got = flat(sj.load_head(ref)), flat(sj.load_head(path))
      self.assertEqual(sorted(expected), sorted(got))
      for k, v in expected.items():
        np.testing.assert_array_equal(v.get_value(), got[k].get_value(), err_msg=str(k))
      os.remove(os.path.join(path, "pytorch_model.bin.index.json"))
      with self.assertRaisesRegex(FileNotFoundError, r"none of model.safetensors, "
                                  r"pytorch_model.bin or their .index.json exists"):
        sj.load_head(path)

  def test_errors(self):
    target = random_transformer(TF_CONFIG, 0)
    with tempfile.TemporaryDirectory() as path:
      tensors = self.published(path, target, False, True)
      with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
      for count, pattern in ((2, r"no tensor named model.layers.3.\*: MTP module 2 of 2 "
                                 r"\(num_nextn_predict_layers\) is layer 3"),
                             ("1", r"num_nextn_predict_layers must be an integer >= 1")):
        with open(os.path.join(path, "config.json"), "w") as f:
          json.dump(dict(hf, num_nextn_predict_layers=count), f)
        with self.assertRaisesRegex(ValueError, pattern):
          sj.load_head(path)
      with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf, f)
      from safetensors.numpy import save_file
      p = f"model.layers.{TF_CONFIG.num_layers}."
      bad = dict(tensors, **{p + "embed_tokens.weight": tensors[p + "embed_tokens.weight"] + 1})
      save_file(bad, os.path.join(path, "model.safetensors"))
      with self.assertRaisesRegex(ValueError, r"embed_tokens.weight differs from the target"):
        sj.generate(target, [[1]], sj.MTP(sj.load_head(path)), max_new_tokens=2)
      save_file({k: v for k, v in tensors.items() if "hnorm" not in k},
                os.path.join(path, "model.safetensors"))
      with self.assertRaisesRegex(ValueError, r"missing tensor 'model.layers.2.hnorm.weight'"):
        sj.load_head(path)
    with self.assertRaisesRegex(ValueError, r"head must be an MTP module"):
      sj.MTP(init_eagle1())
    for field, value, pattern in (
        ("hidden_size", 16, r"hidden size 16 differs from the target's 32"),
        ("vocab_size", 8, r"vocabulary of 8 tokens differs from the target's 16"),
        ("num_layers", 3, r"MTP module is layer 3 of a 3-layer model, the target has 2")):
      other = init_mtp(dataclasses.replace(TF_CONFIG, **{field: value}))
      with self.assertRaisesRegex(ValueError, pattern):
        sj.generate(target, [[1]], sj.MTP(other), max_new_tokens=2)
    with self.assertRaisesRegex(ValueError, r"head kind must be 'eagle', 'eagle3' or 'mtp'"):
      et.init_eagle_head(target, "deepseek")


def init_eagle1():
  from specjax.heads.eagle import init_head
  return init_head(TF_CONFIG)


# ---- DeepSeek-V3's stack of D > 1 modules (``MTPStack``, ``specjax.proposers.mtp``) ----------

STACK_PROMPTS = ([3, 1, 4, 1, 5, 9, 2, 6], [2], [1, 8, 2, 8, 1])  # row 1 shorter than D


def oracle_stack(depth: int):
  """(target, stack): ``depth`` copies of ``oracle_pair``'s module as modules 1..depth (each
  reproduces the target's next state from its token alone, so module k reading x_{t+k} drafts
  the target's greedy x_{t+k+1})."""
  target, head = oracle_pair()
  modules = []
  for k in range(1, depth + 1):
    module = nnx.clone(head)
    module.depth, module.layer_index = k, head.layer_index + k - 1
    modules.append(module)
  return target, MTPStack(modules)


class StackGreedyTest(absltest.TestCase):
  """At temperature 0 a stack's chain returns the Autoregressive tokens, D = 2 and 3, gamma = D
  and gamma < D (1 too), ragged rows (one shorter than D), EOS; one pass of each drafting module
  per iteration."""

  @pytest.mark.slow  # ~20 s; GreedyTest's chain and tree stay in the default run
  def test_chains_match_autoregressive(self):
    target = random_transformer(TF_CONFIG, 0)
    ar = sj.generate(target, STACK_PROMPTS, sj.Autoregressive(), max_new_tokens=GREEDY_NEW)
    eos = int(ar.tokens[2, 1])  # row 2 stops early; the others run on
    ar_eos = sj.generate(target, STACK_PROMPTS, sj.Autoregressive(), max_new_tokens=GREEDY_NEW,
                         eos_token_id=eos)
    for depth, gamma, eos_id, expected in ((2, 2, None, ar.tokens), (3, 3, eos, ar_eos.tokens),
                                           (3, 2, None, ar.tokens), (2, 1, None, ar.tokens)):
      stack = random_mtp(TF_CONFIG, 4, num_modules=depth)
      out = sj.generate(target, STACK_PROMPTS, sj.MTP(stack, gamma=gamma),
                        max_new_tokens=GREEDY_NEW, eos_token_id=eos_id)
      np.testing.assert_array_equal(out.tokens, expected, err_msg=f"D={depth} gamma={gamma}")
      self.assertEqual(int(out.stats.draft_calls), gamma * int(out.stats.target_calls))

  def test_oracle_stack_accepts_everything(self):
    target, stack = oracle_stack(3)
    new, gamma = 13, 3
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, TF_CONFIG.vocab_size, n)) for n in (1, 5, 9)]
    ar = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=new)
    out = sj.generate(target, prompts, sj.MTP(stack, gamma=gamma), max_new_tokens=new)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    self.assertEqual(int(out.stats.target_calls), 1 + -(-(new - 1) // (gamma + 1)))


class StackErrorsTest(absltest.TestCase):

  def test_errors(self):
    target = random_transformer(TF_CONFIG, 0)
    stack = init_mtp(TF_CONFIG, 0, num_modules=3)
    with self.assertRaisesRegex(ValueError, r"gamma 4 exceeds the stack's 3 MTP modules"):
      sj.MTP(stack, gamma=4)
    with self.assertRaisesRegex(ValueError, r"a stack of 3 MTP modules drafts a chain \(gamma "
                                r"<= 3\), not a tree"):
      sj.MTP(stack, tree=TREE)
    self.assertEqual(sj.MTP(stack).gamma, 3)  # default: every module
    modules = list(stack.modules)
    with self.assertRaisesRegex(ValueError, r"an MTP stack has at least 2 modules"):
      MTPStack(modules[:1])
    with self.assertRaisesRegex(ValueError, r"module 2 of the stack must have depth 2 and "
                                r"layer_index 3, got depth 1 and layer_index 2"):
      MTPStack([modules[0], modules[0]])
    with self.assertRaisesRegex(ValueError, r"module 2 of the stack must be an MTPHead"):
      MTPStack([modules[0], init_eagle1()])
    other = init_mtp(dataclasses.replace(TF_CONFIG, num_layers=3), 0, num_modules=2)
    with self.assertRaisesRegex(ValueError, r"MTP module is layer 3 of a 3-layer model, the "
                                r"target has 2"):
      sj.generate(target, [[1, 2]], sj.MTP(other), max_new_tokens=2)


class StackRunnerTest(absltest.TestCase):

  def test_runner_builds_and_times_a_stack(self):
    """experiments' ``head_method`` makes ``sj.MTP`` of a stack (a tree: its ConfigError), and
    the cost table times a stack's chain step (one module's pass)."""
    from experiments import methods
    from specjax import costs
    target = random_transformer(TF_CONFIG, 0)
    stack = init_mtp(TF_CONFIG, 0, num_modules=2)
    method = methods.head_method({"gamma": 2, "tree": None}, stack)
    self.assertIsInstance(method, sj.MTP)
    self.assertEqual(method.gamma, 2)
    with self.assertRaisesRegex(methods.ConfigError, r"not a tree"):
      methods.head_method({"gamma": None, "tree": "dynamic:2x2x3"}, stack)
    table, _ = costs.measure({"target": target}, 1, 4, 16, heads={"mtp": stack},
                             steps_per_call=2, min_seconds=0.01, max_iters=2)
    self.assertGreater(table.head_step["mtp"], 0.0)


def drive_by_hand(target, method, lengths: np.ndarray, width: int = 40):
  """(rng, text [B, width], the target's features of it, the proposer's state prefilled with
  rows of ``lengths``, jitted propose at T = 1, jitted commit, params): a proposer driven by hand
  over random text (seed 0), for checks against from-scratch references."""
  proposer, params = method.proposer(target)
  rng = np.random.default_rng(0)
  batch, prompt = len(lengths), int(max(lengths))
  text = rng.integers(0, target.config.vocab_size, (batch, width)).astype(np.int32)
  feats = target(jnp.asarray(text), init_cache(target.config, batch, width),
                 features=proposer.features)[2]  # [B, W, F, E]
  state = proposer.prefill(params, jnp.asarray(text[:, :prompt]), jnp.asarray(lengths),
                           width + 8, feats[:, :prompt])
  propose = jax.jit(lambda params, state, pending, keys: proposer.propose(
      params, state, pending, keys, S(1.0)))
  commit = jax.jit(lambda params, state, candidates, outcome: proposer.commit(
      params, state, candidates, outcome))
  return rng, text, feats, state, propose, commit, params


def stack_reference(target, stack, text, pending_at: int, drafts) -> np.ndarray:
  """float32[gamma, V] the drafts' logits recomputed from scratch: every module over the whole
  prefix (fresh caches), module k at entry t reading module k-1's output at t and token t + k of
  ``text[:pending_at + 1] ++ drafts``; draft k's logits are module k's at entry pending_at - 1."""
  p = pending_at
  width = p + 8
  feats = target(jnp.asarray(text[None, :p]), init_cache(target.config, 1, width),
                 features=("normed",))[2]
  hidden = stack.modules[0].from_target(feats)
  seq = np.concatenate([text[:p + 1], np.asarray(drafts)])
  logits = []
  for k, module in enumerate(stack.modules[:len(drafts)], 1):
    embeds = jnp.take(target.embed[...], jnp.asarray(seq[k:k + p]), axis=0)[None]
    hidden, _ = module(embeds, hidden, init_cache(module.config, 1, width))
    logits.append(module.draft_logits(hidden[0, p - 1], target))
  return np.stack(logits)


def stale_carry_commit(commit):
  """The mutation: the carries are never updated (module k reads a stale h^{k-1} at its first
  column)."""
  def mutant(state, drafts, outcome):
    new = commit(state, drafts, outcome)
    return new.replace(carries=state.carries, next_carries=state.carries)
  return mutant


class StackProposerTest(absltest.TestCase):
  """The proposer driven by hand over a fixed text (ragged rows, random accepted counts, a
  finished row): every draft law equals a from-scratch forward of the stack over the whole
  prefix, so the incremental caches, lengths and carries are DeepSeek's sequential modules; a
  stale-carry mutant (invisible to the law harness: losslessness holds for any q) fails it."""

  def max_error(self, target, stack, gamma) -> float:
    method = sj.MTP(stack, gamma=gamma)
    lengths = np.array([1, 6])  # row 0: modules 2..gamma have no entry yet
    rng, text, feats, state, propose, commit, params = drive_by_hand(target, method, lengths)
    batch, rows = len(lengths), np.arange(len(lengths))
    error = 0.0
    for it in range(5):
      keys = jax.random.split(jax.random.key(it), (batch, gamma))
      cands, state = propose(params, state, jnp.asarray(text[rows, lengths]), keys)
      for b in range(batch):
        ref = jax.nn.softmax(stack_reference(target, stack, text[b], int(lengths[b]),
                                             np.asarray(cands.tokens[b])), axis=-1)
        error = max(error, float(np.max(np.abs(np.asarray(cands.q[b]) - np.asarray(ref)))))
      n = rng.integers(0, gamma + 1, batch)
      active = np.array([True, it != 2])  # row 1 sits out iteration 2: its state must hold
      j = np.arange(gamma)
      at = lengths[:, None] + np.arange(gamma + 1)[None]
      outcome = Outcome(target_length=jnp.asarray(lengths), num_accepted=jnp.asarray(n),
                        path=jnp.asarray(np.where(j[None] < n[:, None], j[None], -1)),
                        next_token=jnp.asarray(text[rows, lengths + n + 1]),
                        active=jnp.asarray(active),
                        logits=jnp.zeros((batch, gamma + 1, TF_CONFIG.vocab_size)),
                        features=feats[rows[:, None], at])
      true = cands.replace(tokens=jnp.asarray(text[rows[:, None], at[:, 1:]]))
      state = commit(params, state, true, outcome)
      lengths = np.where(active, lengths + n + 1, lengths)
    return error

  @pytest.mark.slow  # ~1 min: from-scratch stack forwards per row and iteration
  def test_drafts_are_the_sequential_modules(self):
    target = random_transformer(TF_CONFIG, 0)
    stack = random_mtp(TF_CONFIG, 4, num_modules=3)
    self.assertLess(self.max_error(target, stack, 3), 1e-4)
    with patched(((mtp_lib, "commit", stale_carry_commit(mtp_lib.commit)),)):
      self.assertGreater(self.max_error(target, stack, 3), 1e-2)


def rolled_laws(stack_candidates):
  """The mutation: draft k verified against module k - 1's law (the chain's q rolled by one)."""
  def mutant(tokens, laws):
    candidates = stack_candidates(tokens, laws)
    q = candidates.q
    return candidates.replace(q=None if q is None else jnp.roll(q, 1, axis=1))
  return mutant


class StackLawTest(absltest.TestCase):

  @pytest.mark.slow  # ~1 min law run; LawTest keeps MTP's law in the default run
  def test_sampled_stack_chain_and_rolled_law_mutant(self):
    check_law_and_mutant(self, random_mtp(LAW_CONFIG, 3, num_modules=2), "mtp_stack_chain",
                         (mtp_lib, "chain_candidates", rolled_laws(mtp_lib.chain_candidates)))


class TrainTest(absltest.TestCase):

  def setUp(self):
    set_verbose(False)

  def test_init_drafts_the_targets_law_and_training_lowers_the_loss(self):
    _, tokens, mask = rows()
    target = random_transformer(TRAIN_CONFIG, 0)
    head = et.init_eagle_head(target, "mtp")
    self.assertIsInstance(head, MTPHead)
    # from_target: the first guess is the target's own law at t (temperature included, up to
    # the norms' eps)
    feats = target(jnp.asarray(tokens[:1]), init_cache(TRAIN_CONFIG, 1, tokens.shape[1]),
                   features=("normed",))[2]
    embeds = jnp.take(target.embed[...], jnp.asarray(tokens[:1]), axis=0)
    h, _ = head(embeds, head.from_target(feats), init_cache(head.config, 1, tokens.shape[1]))
    np.testing.assert_allclose(head.draft_logits(h, target), target.project(feats[:, :, 0]),
                               atol=1e-2, rtol=1e-2)
    _, report = et.train_eagle(target, head, tokens, mask, eval_rows=4, steps=30,
                                     batch_size=8, lr=1e-2, warmup_steps=5, ttt_steps=2,
                                     eval_steps=2, log_every=10)
    self.assertEqual(report["kind"], "mtp")
    first, last = report["history"][0], report["history"][-1]
    # the CE's floor is the target's entropy (about 2 nats a step here): a drop, not a ratio
    self.assertLess(last["loss"], first["loss"] - 0.3)
    self.assertGreater(last["acc"][0], first["acc"][0] + 0.2)
    self.assertLen(report["agreement"], 2)
    self.assertGreater(report["agreement"][0], 0.5)  # held out: the trained module drafts well

  def test_stack_init_forward_and_training(self):
    """A stack of 2: each module starts as the target's own law at t; the training forward
    (``stack_forward``: module k on module k-1's output and token t + k) is the inference
    modules' pass; DeepSeek's D-depth loss trains both modules."""
    from specjax.training.eagle_forward import stack_forward
    _, tokens, mask = rows()
    target = random_transformer(TRAIN_CONFIG, 0)
    stack = et.init_eagle_head(target, "mtp", num_modules=2)
    self.assertIsInstance(stack, MTPStack)
    seq = jnp.asarray(tokens[:2])
    t = seq.shape[1] - 2
    feats = target(seq, init_cache(TRAIN_CONFIG, 2, seq.shape[1]), features=("normed",))[2]
    hidden = stack.modules[0].from_target(feats[:, :t])
    outs = stack_forward(stack, target.embed[...], seq[:, 1:], hidden, 2)
    for k, (module, out) in enumerate(zip(stack.modules, outs), 1):
      embeds = jnp.take(target.embed[...], seq[:, k:k + t], axis=0)
      hidden, _ = module(embeds, hidden, init_cache(module.config, 2, seq.shape[1]))
      np.testing.assert_allclose(out, hidden, atol=1e-5, rtol=1e-5, err_msg=f"module {k}")
      np.testing.assert_allclose(module.draft_logits(out, target),
                                 target.project(feats[:, :t, 0]), atol=1e-2, rtol=1e-2)
    _, report = et.train_eagle(target, stack, tokens, mask, eval_rows=4, steps=30,
                               batch_size=8, lr=1e-2, warmup_steps=5, eval_steps=4,
                               log_every=10)
    self.assertEqual((report["kind"], report["config"]["ttt_steps"]), ("mtp", 2))
    first, last = report["history"][0], report["history"][-1]
    self.assertLen(last["acc"], 2)
    self.assertLess(last["loss"], first["loss"] - 0.3)
    for k in range(2):
      self.assertGreater(last["acc"][k], first["acc"][k] + 0.1)
    self.assertLen(report["agreement"], 2)


if __name__ == "__main__":
  absltest.main()
