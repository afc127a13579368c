"""Tests for the Qwen3 and Phi-3 families beyond what every fixture family gets.

The fixtures ``qwen3`` (per-head q/k norms with random weights, head_dim 24 != hidden / heads)
and ``phi3`` (fused qkv_proj / gate_up_proj, rotary on half of each head, sliding window 8) live
in ``hf_fixtures.CONFIGS``, so ``test_models.HFParityTest`` (logits, save -> transformers'
``from_pretrained`` -> load) and ``test_generate`` (greedy tokens of ragged prompts vs
transformers' ``generate``) cover them like the other families. Here: logits of a ragged batch
through the cache, the training fast path, a Qwen3 GGUF file, what each feature changes, and
one-line config errors.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest, parameterized
import jax.numpy as jnp
import numpy as np
from flax import nnx

import specjax as sj
from specjax.models.config import ModelConfig, from_hf_dict
from specjax.models.hf_layout import params_from_hf, params_to_hf
from specjax.models.kv_cache import init_cache
from specjax.training import forward as training_forward

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import hf_fixtures as F
  from tests import test_gguf as G  # the module, so that its test classes are not collected here
except ImportError:
  import hf_fixtures as F
  import test_gguf as G

FAMILIES = ("qwen3", "phi3")
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

  @parameterized.parameters(*FAMILIES)
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

  def test_phi3_gguf_is_refused_by_name(self):
    file = G.write_gguf(os.path.join(self.tmp, "phi3.gguf"), F.cached_checkpoint("llama")[1],
                        arch="phi3")
    with self.assertRaisesRegex(ValueError, r"unsupported GGUF architecture 'phi3' .*; supported: "
                                r"llama, qwen2, qwen3$"):
      sj.load_model(file)


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


if __name__ == "__main__":
  absltest.main()
