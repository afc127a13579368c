"""Tests for specjax.models: HF parity, save/load round trips, cache consistency, errors."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import re
import shutil
import tempfile

from absl.testing import absltest, parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file
import torch
import transformers

from specjax.models import hf as hf_io
from specjax.models.config import ModelConfig
from specjax.models.hf_config import from_hf_dict
from specjax.models.kv_cache import init_cache
from specjax.models.transformer import Transformer, forward

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import hf_fixtures as F
except ImportError:
  import hf_fixtures as F

NAMES = tuple(F.CONFIGS)
PARITY_TOL = 1e-4  # float32 logits vs transformers
CACHE_TOL = 1e-5  # incremental / tree passes vs one full forward
BATCH, LENGTH = 2, 24


def _tokens(seed: int = 0, shape=(BATCH, LENGTH)) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, F.VOCAB, shape).astype(np.int32)


def _flat_params(model) -> dict:
  return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _read_tensors(file: str) -> dict[str, np.ndarray]:
  with safe_open(file, "numpy") as f:
    return {k: f.get_tensor(k) for k in f.keys()}


def _write_checkpoint(path: str, config: dict, tensors: dict[str, np.ndarray] | None) -> str:
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  if tensors is not None:
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  return path


@functools.lru_cache(maxsize=None)
def _loaded(name: str):
  """(our model, HF logits on _tokens()) for a cached fixture checkpoint."""
  path, model = F.cached_checkpoint(name)
  return hf_io.load_model(path), F.hf_logits(model, _tokens())


class TempDirTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix="specjax_test_models_")

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def dir(self, name: str) -> str:
    return os.path.join(self.tmp, f"{self._testMethodName}_{name}")


class HFParityTest(TempDirTest):

  @parameterized.named_parameters(*((n, n) for n in NAMES))
  def test_logits_match_transformers(self, name):
    model, ref = _loaded(name)
    self.assertEqual(model.config.model_type, F.CONFIGS[name]().model_type)
    self.assertGreater(ref.std(), 0.1, "logits too close to zero for a meaningful comparison")
    ours = np.asarray(forward(model, _tokens()))
    self.assertEqual(ours.dtype, np.float32)
    diff = np.abs(ours - ref).max()
    print(f"\n[{name}] max |specjax - transformers| = {diff:.2e} (logit std {ref.std():.2f})")
    self.assertLessEqual(diff, PARITY_TOL)

  @parameterized.named_parameters(*((n, n) for n in NAMES))
  def test_save_then_transformers_from_pretrained(self, name):
    model, ref = _loaded(name)
    out = self.dir(name)
    hf_io.save_model(model, out)
    self.assertTrue(os.path.isfile(os.path.join(out, "model.safetensors")))
    self.assertTrue(os.path.isfile(os.path.join(out, "generation_config.json")))
    hf_model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, attn_implementation="eager")
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
      self.assertEmpty(info.get(key, []), key)
    self.assertEqual(hf_model.dtype, torch.float32)
    np.testing.assert_allclose(F.hf_logits(hf_model.eval(), _tokens()), ref, atol=PARITY_TOL, rtol=0)
    # And back: the exact same parameters.
    reloaded = hf_io.load_model(out)
    self.assertEqual(reloaded.config, model.config)
    a, b = _flat_params(model), _flat_params(reloaded)
    self.assertEqual(a.keys(), b.keys())
    for path in a:
      np.testing.assert_array_equal(a[path], b[path], err_msg=str(path))

  def test_params_to_hf_matches_checkpoint(self):
    """The name table is the inverse of loading: same names, same values as save_pretrained."""
    for name in ("llama", "gpt2", "qwen3", "phi3"):  # phi3: fused qkv_proj / gate_up_proj
      path, _ = F.cached_checkpoint(name)
      written = _read_tensors(os.path.join(path, "model.safetensors"))
      ours = hf_io.params_to_hf(_loaded(name)[0])
      self.assertEqual(sorted(ours), sorted(written))
      for k in ours:
        np.testing.assert_array_equal(ours[k], written[k], err_msg=k)

  def test_sliding_window_matters(self):
    """The mistral fixture's window changes transformers' logits, so parity above tests it."""
    _, hf_model = F.cached_checkpoint("mistral")
    windowed = F.hf_logits(hf_model, _tokens())
    hf_model.config.sliding_window = None
    try:
      full = F.hf_logits(hf_model, _tokens())
    finally:
      hf_model.config.sliding_window = 8
    self.assertGreater(np.abs(windowed - full)[:, 8:].max(), 1e-2)
    np.testing.assert_allclose(windowed[:, :8], full[:, :8], atol=1e-5)

  def test_sharded_save_and_load(self):
    model, ref = _loaded("llama")
    out = self.dir("sharded")
    hf_io.save_model(model, out, max_shard_size="40KB")
    files = sorted(os.listdir(out))
    shards = [f for f in files if re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", f)]
    self.assertGreaterEqual(len(shards), 3, files)
    self.assertNotIn("model.safetensors", files)
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
      index = json.load(f)
    self.assertEqual(sorted(set(index["weight_map"].values())), shards)
    for shard in shards:  # every shard within the limit unless it holds one big tensor
      tensors = _read_tensors(os.path.join(out, shard))
      size = sum(t.nbytes for t in tensors.values())
      self.assertTrue(size <= 40_000 or len(tensors) == 1, (shard, size))
    reloaded = hf_io.load_model(out)
    np.testing.assert_allclose(np.asarray(forward(reloaded, _tokens())), ref, atol=PARITY_TOL,
                               rtol=0)
    hf_model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    self.assertEmpty(info["missing_keys"])
    self.assertEmpty(info["unexpected_keys"])
    np.testing.assert_allclose(F.hf_logits(hf_model.eval(), _tokens()), ref, atol=PARITY_TOL, rtol=0)
    # Saving again unsharded removes the stale shards and index.
    hf_io.save_model(model, out)
    self.assertEqual(sorted(os.listdir(out)),
                     ["config.json", "generation_config.json", "model.safetensors"])


class ConfigStyleTest(TempDirTest):

  _COMMON = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=F.VOCAB,
                 hidden_size=F.HIDDEN, num_hidden_layers=F.LAYERS, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=96,
                 max_position_embeddings=F.MAX_POSITIONS, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, hidden_act="silu")
  _LLAMA3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                 original_max_position_embeddings=32)

  def test_transformers_4_and_5_config_json_load_the_same(self):
    path, _ = F.cached_checkpoint("llama3_rope")
    styles = {
        "v4_type": dict(self._COMMON, rope_theta=10000.0, torch_dtype="bfloat16",
                        rope_scaling=dict(self._LLAMA3, type="llama3")),
        "v4_rope_type": dict(self._COMMON, rope_theta=10000.0, torch_dtype="bfloat16",
                             rope_scaling=dict(self._LLAMA3, rope_type="llama3")),
        "v5": dict(self._COMMON, dtype="bfloat16",
                   rope_parameters=dict(self._LLAMA3, rope_type="llama3", rope_theta=10000.0)),
    }
    configs = {}
    for style, hf_config in styles.items():
      out = _write_checkpoint(self.dir(style), hf_config, None)
      shutil.copy(os.path.join(path, "model.safetensors"), out)
      model = hf_io.load_model(out)
      configs[style] = model.config
      self.assertEqual(model.embed.get_value().dtype, jnp.bfloat16)
    self.assertEqual(configs["v4_type"], configs["v5"])
    self.assertEqual(configs["v4_rope_type"], configs["v5"])
    # ... and the same as what transformers 5's own save_pretrained wrote (dtype aside).
    self.assertEqual(configs["v5"], dataclasses.replace(_loaded("llama3_rope")[0].config,
                                                        dtype="bfloat16"))
    self.assertEqual(configs["v5"].rope_type, "llama3")
    self.assertEqual(configs["v5"].rope_scaling_dict["factor"], 8.0)

  def test_rope_theta_location(self):
    v4 = dict(self._COMMON, rope_theta=5e5, torch_dtype="float32")
    v5 = dict(self._COMMON, rope_parameters=dict(rope_type="default", rope_theta=5e5),
              dtype="float32")
    self.assertEqual(from_hf_dict(v4), from_hf_dict(v5))
    self.assertEqual(from_hf_dict(v5).rope_theta, 5e5)
    self.assertIsNone(from_hf_dict(v5).rope_scaling)


class BFloat16Test(TempDirTest):

  def _check_close(self, logits, ref):
    rel = np.abs(np.asarray(logits) - ref).max() / np.abs(ref).max()
    print(f"\n[bfloat16] max |diff| / max |logit| = {rel:.2e}")
    self.assertLess(rel, 5e-2)

  def test_load_float32_checkpoint_as_bfloat16(self):
    path, _ = F.cached_checkpoint("llama")
    model = hf_io.load_model(path, dtype="bfloat16")
    self.assertEqual(model.config.dtype, "bfloat16")
    for p, v in _flat_params(model).items():
      self.assertEqual(v.dtype, jnp.bfloat16, p)
    self.assertEqual(model.inv_freq.get_value().dtype, jnp.float32)
    logits = forward(model, _tokens())
    self.assertEqual(logits.dtype, jnp.float32)
    self._check_close(logits, _loaded("llama")[1])
    # A jnp dtype works too.
    self.assertEqual(hf_io.load_model(path, dtype=jnp.bfloat16).config.dtype, "bfloat16")

  def test_bfloat16_checkpoint(self):
    path, hf_model = F.cached_checkpoint("llama", "bfloat16")
    model = hf_io.load_model(path)  # the checkpoint's own dtype
    self.assertEqual(model.config.dtype, "bfloat16")
    q = model.layers[0].attn.q.kernel.get_value()
    self.assertEqual(q.dtype, jnp.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(q, np.float32),
        hf_model.model.layers[0].self_attn.q_proj.weight.detach().float().numpy().T)
    self._check_close(forward(model, _tokens()),
                      F.hf_logits(copy.deepcopy(hf_model).float(), _tokens()))
    out = self.dir("saved")
    hf_io.save_model(model, out)
    with safe_open(os.path.join(out, "model.safetensors"), "flax") as f:
      self.assertEqual(f.get_slice("model.embed_tokens.weight").get_dtype(), "BF16")
    with open(os.path.join(out, "config.json")) as f:
      self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")


@functools.partial(jax.jit, static_argnums=0)
def _call(graphdef, state, tokens, cache, tree_mask, depths):
  return nnx.merge(graphdef, state)(tokens, cache, tree_mask, depths)


def _causal(t):
  return np.tril(np.ones((t, t), bool)), np.arange(t, dtype=np.int32)


# A static tree: root 0; children 1, 2; grandchildren 3, 4 (of 1) and 5 (of 2); 6 (of 3).
_PARENTS = (-1, 0, 0, 1, 1, 2, 3)


def _tree(parents):
  t = len(parents)
  mask = np.zeros((t, t), bool)
  depths = np.zeros(t, np.int32)
  paths = []
  for i in range(t):
    path, j = [], i
    while j >= 0:
      path.append(j)
      j = parents[j]
    path = path[::-1]
    paths.append(path)
    mask[i, path] = True
    depths[i] = len(path) - 1
  return mask, depths, paths


class CacheConsistencyTest(parameterized.TestCase):
  """Incremental and tree passes through ``Transformer.__call__`` == full causal forwards."""

  MAX_LEN = 32

  @parameterized.named_parameters(("llama", "llama"), ("mistral", "mistral"))
  def test_attention_forms_agree(self, name):
    """The per-token dots (CPU, <= 16 new tokens) and the one-contraction form (accelerators,
    prefill) give the same logits, for a chain and a tree over a ragged cache."""
    from unittest import mock
    from specjax.models import transformer

    model, _ = _loaded(name)
    graphdef, state = nnx.split(model)
    prefix = jnp.asarray(_tokens(shape=(BATCH, 6)))
    cache = init_cache(model.config, BATCH, self.MAX_LEN)
    _, cache = _call(graphdef, state, prefix, cache, *_causal(6))
    cache = cache.with_lengths(jnp.array([6, 4]))
    tree_mask, depths, _ = _tree(_PARENTS)
    tokens = jnp.asarray(_tokens(1, shape=(BATCH, len(_PARENTS))))
    for mask, dep in (_causal(len(_PARENTS)), (tree_mask, depths)):
      run = lambda: nnx.merge(graphdef, state)(tokens, cache, mask, dep)
      per_token, per_token_cache = run()
      with mock.patch.object(transformer, "_PER_TOKEN_MAX", 0):
        contraction, contraction_cache = run()
      np.testing.assert_allclose(per_token, contraction, rtol=CACHE_TOL, atol=CACHE_TOL)
      # The two forms round differently (jax 0.10.2's XLA:CPU: keys of layer 1 differ by 2e-6).
      chex.assert_trees_all_close(per_token_cache, contraction_cache, rtol=CACHE_TOL,
                                  atol=CACHE_TOL)

  def test_logits_at_one_token(self):
    model, _ = _loaded("llama")
    tokens = jnp.asarray(_tokens(shape=(BATCH, 5)))
    cache = init_cache(model.config, BATCH, self.MAX_LEN).with_lengths(jnp.array([0, 3]))
    full, full_cache = model(tokens, cache)
    for i in (0, 3, -1):
      one, one_cache = model(tokens, cache, logits_at=i)
      chex.assert_shape(one, (BATCH, 1, model.config.vocab_size))
      np.testing.assert_allclose(one[:, 0], full[:, i], rtol=CACHE_TOL, atol=CACHE_TOL)
      chex.assert_trees_all_close(one_cache, full_cache)
    some, _ = model(tokens, cache, logits_at=(4, 1))  # several tokens, in the order asked
    chex.assert_shape(some, (BATCH, 2, model.config.vocab_size))
    np.testing.assert_allclose(some, full[:, [4, 1]], rtol=CACHE_TOL, atol=CACHE_TOL)
    rows, _ = model(tokens, cache, logits_at=jnp.asarray([4, 2]))  # per row (traced indices)
    chex.assert_shape(rows, (BATCH, 1, model.config.vocab_size))
    np.testing.assert_allclose(rows[:, 0], full[[0, 1], [4, 2]], rtol=CACHE_TOL, atol=CACHE_TOL)
    pairs, _ = model(tokens, cache, logits_at=jnp.asarray([[0, 4], [3, 1]]))
    np.testing.assert_allclose(pairs, full[[[0], [1]], [[0, 4], [3, 1]]], rtol=CACHE_TOL,
                               atol=CACHE_TOL)

  def test_writes_land_at_each_rows_slots_and_past_the_end_are_dropped(self):
    """New token j of row r is stored at slot lengths[r] + j and nowhere else; slots past the
    cache end are dropped (a one-token write also carries a dropped dummy update: see
    Transformer.__call__), and the logits stay finite."""
    model, _ = _loaded("llama")
    slots = 6
    _, cache = model(jnp.ones((2, 5), jnp.int32), init_cache(model.config, 2, slots))
    for t, lengths in ((1, (5, 6)), (1, (0, 3)), (2, (4, 5)), (3, (6, 2))):
      with self.subTest(t=t, lengths=lengths):
        before = cache.with_lengths(jnp.asarray(lengths, jnp.int32))
        logits, after = model(jnp.full((2, t), 3, jnp.int32), before)
        expected = [[lengths[r] <= s < lengths[r] + t for s in range(slots)] for r in range(2)]
        for old, new in zip(before.k + before.v, after.k + after.v):
          changed = np.any(np.asarray(old) != np.asarray(new), axis=(1, 3))  # [B, S]
          np.testing.assert_array_equal(changed, expected)
        self.assertTrue(np.all(np.isfinite(np.asarray(logits))))

  @parameterized.named_parameters(("llama", "llama"), ("gpt2", "gpt2"), ("mistral", "mistral"))
  def test_prefill_then_steps_with_ragged_lengths(self, name):
    model, _ = _loaded(name)
    graphdef, state = nnx.split(model)
    seqs = _tokens()
    full = np.asarray(forward(model, seqs))  # [B, 24, V]
    cache = init_cache(model.config, BATCH, self.MAX_LEN)
    lengths = np.zeros(BATCH, np.int32)
    # (new tokens per row, tokens each row commits): ragged commits leave rejected entries behind
    # in the scratch slots, which later steps overwrite.
    schedule = [(6, (6, 3)), (1, (1, 1)), (3, (2, 3)), (1, (1, 1)), (3, (3, 1))] + [(1, (1, 1))] * 4
    for t, commits in schedule:
      tokens = np.stack([seqs[b, lengths[b]:lengths[b] + t] for b in range(BATCH)])
      logits, cache = _call(graphdef, state, tokens, cache, *_causal(t))
      for b in range(BATCH):
        np.testing.assert_allclose(np.asarray(logits[b]), full[b, lengths[b]:lengths[b] + t],
                                   atol=CACHE_TOL, rtol=0, err_msg=f"row {b} at {lengths[b]}")
      lengths = lengths + np.asarray(commits, np.int32)
      cache = cache.with_lengths(lengths)
    self.assertEqual(tuple(lengths.tolist()), (17, 13))  # past mistral's window of 8

  @parameterized.named_parameters(("llama", "llama"), ("gpt2", "gpt2"), ("mistral", "mistral"))
  def test_tree_pass_equals_chains(self, name):
    model, _ = _loaded(name)
    graphdef, state = nnx.split(model)
    prompts = _tokens(1, (BATCH, 12))
    cache = init_cache(model.config, BATCH, self.MAX_LEN)
    # Ragged prompts: two prefill chunks, committing (6, 4) then (6, 5) -> lengths (12, 9).
    lengths = np.zeros(BATCH, np.int32)
    for commits in ((6, 4), (6, 5)):
      chunk = np.stack([prompts[b, lengths[b]:lengths[b] + 6] for b in range(BATCH)])
      _, cache = _call(graphdef, state, chunk, cache, *_causal(6))
      lengths = lengths + np.asarray(commits, np.int32)
      cache = cache.with_lengths(lengths)
    mask, depths, paths = _tree(_PARENTS)
    nodes = _tokens(2, (BATCH, len(_PARENTS)))
    tree_logits, cache = _call(graphdef, state, nodes, cache, mask, depths)
    # Accept the path to node 6, compact it into place, and decode one more token.
    accepted = paths[6]
    cache = cache.compact(jnp.asarray(lengths[:, None] + np.asarray(accepted)[None]),
                          jnp.asarray(lengths))
    cache = cache.with_lengths(lengths + len(accepted))
    extra = _tokens(3, (BATCH, 1))
    step_logits, _ = _call(graphdef, state, extra, cache, *_causal(1))

    # Reference: every root-to-node chain (and the accepted chain + extra token), right-padded
    # into one causal batch.
    chains, where = [], []
    for b in range(BATCH):
      prefix = list(prompts[b, :lengths[b]])
      for i, path in enumerate(paths):
        chains.append(prefix + list(nodes[b, path]))
        where.append(("tree", b, i))
      chains.append(prefix + list(nodes[b, accepted]) + [extra[b, 0]])
      where.append(("step", b, 0))
    width = max(map(len, chains))
    batch = np.zeros((len(chains), width), np.int32)
    for r, chain in enumerate(chains):
      batch[r, :len(chain)] = chain
    ref = np.asarray(forward(model, batch))
    for r, (kind, b, i) in enumerate(where):
      got = tree_logits[b, i] if kind == "tree" else step_logits[b, 0]
      want = ref[r, len(chains[r]) - 1]
      # Within 1e-5 of the row's logit scale (its largest |logit|, 2-3 here): the tree pass, the
      # cached step and the full forward sum in different orders (jax 0.10.2's XLA:CPU: 1.05e-5
      # on one logit of 2.3).
      np.testing.assert_allclose(np.asarray(got), want, rtol=0,
                                 atol=CACHE_TOL * max(1.0, float(np.abs(want).max())),
                                 err_msg=f"{kind} row {b} node {i}")


def _while_bodies(hlo: str) -> list[str]:
  """The text of every while-loop body computation in optimized HLO text."""
  names = set(re.findall(r"body=(%[\w.\-]+)", hlo))
  blocks = re.split(r"\n(?=\S)", hlo)  # computations start at column 0
  return [b for b in blocks if b.split(" ", 1)[0] in names]


class CacheInPlaceTest(absltest.TestCase):
  """The decoding loop updates each layer's KV buffer in place: no copy of a whole buffer per step.
  Regressions seen: reading the cache before writing the new entries (two copies of every buffer
  per step); a one-token write lowered to a dynamic-update-slice, which XLA also fused into the
  attention reads at batch 1 (four copies per step, autoregressive loop and the draft's steps)."""

  def _loop_bodies(self, model, batch, gamma, sampling):
    from specjax.decoding import loop

    from specjax.decoding.methods import Autoregressive, Speculative

    graphdef, state = nnx.split(model)
    proposer, params = (Speculative(model, gamma) if gamma else Autoregressive()).proposer(model)
    width, max_new = 8, 8
    cache_length = width + max_new + gamma + 1
    hlo = loop.decode_jit.lower(
        graphdef, state, proposer, params,
        jnp.ones((batch, width), jnp.int32), jnp.full((batch,), width, jnp.int32),
        jax.random.key(0), sampling=sampling, max_new_tokens=max_new, eos_ids=(),
        cache_length=cache_length).compile().as_text()
    c = model.config
    return _while_bodies(hlo), f"f32[{batch},{c.num_kv_heads},{cache_length},{c.head_dim}]"

  def test_decoding_loops_have_no_cache_copies(self):
    from specjax.sampling import Sampling

    model, _ = _loaded("llama")
    for batch, gamma, temperature in ((1, 0, 0.0), (2, 0, 1.0), (1, 3, 0.0), (2, 3, 0.0),
                                      (2, 3, 1.0)):
      with self.subTest(batch=batch, gamma=gamma, temperature=temperature):
        bodies, buffer = self._loop_bodies(model, batch, gamma, Sampling(temperature=temperature))
        self.assertNotEqual(bodies, [])
        for body in bodies:
          copies = re.findall(re.escape(buffer) + r"\{[\d,]*\} copy\(", body)
          self.assertEqual(copies, [], "a whole KV buffer is copied inside a loop")
        self.assertIn(buffer, "\n".join(bodies))  # the pattern does match the buffers


class ErrorTest(TempDirTest):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    path, _ = F.cached_checkpoint("llama")
    cls.llama_dir = path
    cls.llama_tensors = _read_tensors(os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
      cls.llama_config = json.load(f)

  def _load_modified(self, tensors):
    return hf_io.load_model(_write_checkpoint(self.dir("ckpt"), self.llama_config, tensors))

  def test_missing_directory(self):
    missing = os.path.join(self.tmp, "does_not_exist")
    with self.assertRaisesRegex(FileNotFoundError, re.escape(missing)):
      hf_io.load_model(missing)

  def test_head_option(self):
    """``head="auto"`` loads a checkpoint without ``draft_vocab.json`` as it is; a checkpoint with
    one decodes through the reduced head; anything else is refused by name."""
    from specjax.models import reduced_vocab

    self.assertNotIsInstance(hf_io.load_model(self.llama_dir, head="auto"),
                             reduced_vocab.ReducedVocabTransformer)
    out = _write_checkpoint(self.dir("reduced"), self.llama_config, self.llama_tensors)
    reduced_vocab.save_vocab_ids(out, [0, 3, 5])
    model = hf_io.load_model(out, head="auto")
    self.assertIsInstance(model, reduced_vocab.ReducedVocabTransformer)
    self.assertEqual(np.asarray(model.kept_ids).tolist(), [0, 3, 5])
    self.assertNotIsInstance(hf_io.load_model(out), reduced_vocab.ReducedVocabTransformer)
    with self.assertRaisesRegex(ValueError, r"head must be 'full' or 'auto', got 'small'"):
      hf_io.load_model(out, head="small")

  def test_missing_config(self):
    out = self.dir("empty")
    os.makedirs(out)
    with self.assertRaisesRegex(FileNotFoundError, re.escape(os.path.join(out, "config.json"))):
      hf_io.load_model(out)

  def test_missing_weights(self):
    out = _write_checkpoint(self.dir("no_weights"), self.llama_config, None)
    with self.assertRaisesRegex(FileNotFoundError,
                                re.escape(os.path.join(out, "model.safetensors"))):
      hf_io.load_model(out)
    open(os.path.join(out, "pytorch_model.bin"), "wb").close()
    with self.assertRaisesRegex(FileNotFoundError, "pytorch_model.bin is present"):
      hf_io.load_model(out)

  def test_missing_shard(self):
    out = self.dir("sharded")
    hf_io.save_model(_loaded("llama")[0], out, max_shard_size=40_000)
    shard = sorted(f for f in os.listdir(out) if f.startswith("model-"))[1]
    os.remove(os.path.join(out, shard))
    with self.assertRaisesRegex(FileNotFoundError, re.escape(os.path.join(out, shard))):
      hf_io.load_model(out)

  def test_unsupported_model_type(self):
    out = _write_checkpoint(self.dir("bert"), dict(self.llama_config, model_type="bert"), None)
    with self.assertRaisesRegex(ValueError, "unsupported model_type 'bert'"):
      hf_io.load_model(out)

  def test_unsupported_gpt2_attention_options(self):
    base = {"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4}
    for key, value in (("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False)):
      with self.subTest(key=key):
        with self.assertRaisesRegex(ValueError,
                                    f"GPT-2 checkpoints with {key}={value} are not supported"):
          from_hf_dict(dict(base, **{key: value}))
    # Precision-only and default-valued options load.
    from_hf_dict(dict(base, reorder_and_upcast_attn=True,
                                 scale_attn_by_inverse_layer_idx=False, scale_attn_weights=True))

  def test_unsupported_dtype(self):
    with self.assertRaisesRegex(ValueError, "unsupported dtype 'float16'"):
      hf_io.load_model(self.llama_dir, dtype="float16")

  def test_wrong_shape(self):
    name = "model.layers.1.self_attn.k_proj.weight"
    tensors = dict(self.llama_tensors, **{name: np.zeros((16, 64), np.float32)})
    with self.assertRaisesRegex(ValueError,
                                re.escape(f"{name!r} has shape (16, 64), expected (32, 64)")):
      self._load_modified(tensors)

  def test_missing_tensor(self):
    tensors = dict(self.llama_tensors)
    del tensors["model.layers.0.mlp.up_proj.weight"]
    with self.assertRaisesRegex(ValueError, "missing tensor 'model.layers.0.mlp.up_proj.weight'"):
      self._load_modified(tensors)
    tensors = dict(self.llama_tensors)
    del tensors["lm_head.weight"]  # untied: the head is required
    with self.assertRaisesRegex(ValueError, "missing tensor 'lm_head.weight'"):
      self._load_modified(tensors)

  def test_unexpected_tensor(self):
    name = "model.layers.0.self_attn.q_norm.weight"
    tensors = dict(self.llama_tensors, **{name: np.ones((64,), np.float32)})
    with self.assertRaisesRegex(ValueError, f"unexpected tensor {re.escape(repr(name))}"):
      self._load_modified(tensors)

  def test_tolerated_names(self):
    """Non-parameter buffers, a tied checkpoint's lm_head, and headless names load fine."""
    config = _loaded("llama3_rope")[0].config
    tensors = hf_io.params_to_hf(_loaded("llama3_rope")[0])
    extra = dict(tensors, **{"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32),
                             "lm_head.weight": tensors["model.embed_tokens.weight"] + 1.0})
    model = hf_io.params_from_hf(config, extra)
    np.testing.assert_array_equal(np.asarray(model.embed.get_value()),
                                  tensors["model.embed_tokens.weight"])
    with self.assertRaisesRegex(ValueError, "unexpected tensor 'lm_head.weight'"):  # wrong shape
      hf_io.params_from_hf(config, dict(tensors, **{"lm_head.weight": np.ones((3, 64))}))

    gpt2 = _loaded("gpt2")[0]
    tensors = hf_io.params_to_hf(gpt2)
    headless = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    headless["h.0.attn.bias"] = np.tril(np.ones((1, 1, 128, 128), bool))
    headless["h.1.attn.masked_bias"] = np.float32(-1e4)
    model = hf_io.params_from_hf(gpt2.config, headless)
    a, b = _flat_params(gpt2), _flat_params(model)
    for path in a:
      np.testing.assert_array_equal(a[path], b[path], err_msg=str(path))

  def test_truncated_safetensors(self):
    out = shutil.copytree(self.llama_dir, self.dir("truncated"))
    file = os.path.join(out, "model.safetensors")
    with open(file, "rb") as f:
      data = f.read()
    for cut in (len(data) // 2, 20):
      with open(file, "wb") as f:
        f.write(data[:cut])
      with self.assertRaisesRegex(ValueError, re.escape(file)):
        hf_io.load_model(out)

  def test_token_outside_vocab(self):
    model = _loaded("llama")[0]
    with self.assertRaisesRegex(ValueError, f"token id {F.VOCAB} is outside the vocabulary"):
      forward(model, [[0, 1, F.VOCAB]])
    with self.assertRaisesRegex(ValueError, "token id -1 is outside the vocabulary"):
      forward(model, [[-1, 1]])

  def test_bad_max_shard_size(self):
    with self.assertRaisesRegex(ValueError, "max_shard_size"):
      hf_io.save_model(_loaded("llama")[0], self.dir("x"), max_shard_size="lots")

  def test_save_gpt2_without_biases(self):
    config = ModelConfig(model_type="gpt2", vocab_size=16, hidden_size=8, num_layers=1,
                         num_heads=2, max_position_embeddings=8)
    with self.assertRaisesRegex(ValueError, "GPT-2 checkpoints have biases"):
      hf_io.save_model(nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0))),
                       self.dir("gpt2"))

  def test_tokenizer(self):
    missing = os.path.join(self.tmp, "no_tokenizer")
    with self.assertRaisesRegex(FileNotFoundError, re.escape(missing)):
      hf_io.load_tokenizer(missing)
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1, "b": 2},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    out = self.dir("tokenizer")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(out)
    self.assertEqual(hf_io.load_tokenizer(out)("a b c")["input_ids"], [1, 2, 0])


if __name__ == "__main__":
  absltest.main()
