"""Tests for ``sj.generate`` with ``sj.Autoregressive()``: Hugging Face greedy parity, per-row EOS,
the token budget, sampling determinism and law (chi-square), compilation reuse, errors, stats,
bfloat16.

Compilation dominates the run time, so the tests share a few shapes: batches of 3 ragged prompts
(longest 11, padded to 16) with 32 new tokens, on the "llama" fixture unless a test is about
another architecture.
"""

from __future__ import annotations

from absl.testing import absltest, parameterized
import jax
import numpy as np
import torch
import transformers

import specjax as sj
from specjax import sampling as sampling_lib
from specjax.decoding import loop

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import hf_fixtures as F
  from tests.stats_util import chi_square_pvalue
except ImportError:
  import hf_fixtures as F
  from stats_util import chi_square_pvalue

NAMES = tuple(F.CONFIGS)
V = F.VOCAB
MAX_NEW = 32
P_FLOOR = 1e-6  # chi-square p-value floor (stats_util)
GREEDY = sj.Sampling(temperature=0.0)
SAMPLE = sj.Sampling(temperature=1.0)
# Exercises all three warpers at once: temperature 1.5, then top-k 10, then top-p 0.9 (9 tokens
# survive at the first position of the law test).
WARPED = sj.Sampling(temperature=1.5, top_k=10, top_p=0.9)


def _prompts(seed: int, lengths=(5, 11, 2)) -> list[list[int]]:
  """Ragged prompts of Python ints; all pad to width 16, so calls share one compilation."""
  rng = np.random.default_rng(seed)
  return [[int(t) for t in rng.integers(0, V, n)] for n in lengths]


def _hf_greedy(hf_model, prompt: list[int], max_new_tokens: int) -> np.ndarray:
  """Hugging Face greedy ``generate`` on one unpadded prompt.

  ``eos_token_id=[]`` disables EOS entirely. (``None`` falls back to the checkpoint's
  ``eos_token_id`` 2 and stops there; ``min_new_tokens`` would keep going but *suppresses* EOS's
  logit, which changes the greedy tokens whenever 2 is the argmax: neither is plain greedy.)
  """
  config = transformers.GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False,
                                         eos_token_id=[], pad_token_id=0)
  ids = torch.tensor([prompt], dtype=torch.long)
  with torch.no_grad():
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
  return out[0, len(prompt):].numpy()


def _truncate_at_eos(row: np.ndarray, eos_ids) -> np.ndarray:
  """The row up to and including its first EOS (the whole row if there is none)."""
  hits = np.flatnonzero(np.isin(row, list(eos_ids)))
  return row if hits.size == 0 else row[:hits[0] + 1]


class GenerateTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hf = {name: F.cached_checkpoint(name) for name in NAMES}  # name -> (path, torch model)
    cls.models = {name: sj.load_model(path) for name, (path, _) in cls.hf.items()}
    cls.prompts = _prompts(0)
    cls._greedy_cache = {}
    # Hugging Face runs are ~5x faster with one torch thread on a busy machine.
    cls._torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)

  @classmethod
  def tearDownClass(cls):
    torch.set_num_threads(cls._torch_threads)
    super().tearDownClass()

  def greedy_output(self, name: str = "llama") -> sj.GenerateOutput:
    """Greedy output for ``self.prompts``, 32 new tokens (one compilation per config, shared)."""
    if name not in self._greedy_cache:
      self._greedy_cache[name] = sj.generate(self.models[name], self.prompts,
                                             max_new_tokens=MAX_NEW)
    return self._greedy_cache[name]

  def greedy_tokens(self, name: str = "llama") -> np.ndarray:
    return np.asarray(self.greedy_output(name).tokens)

  def assert_well_formed(self, out, max_new_tokens: int, eos_ids=()):
    """-1 exactly past each row's length; a row shorter than the budget ends with its first EOS;
    nothing is emitted after an EOS."""
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    self.assertEqual(tokens.shape, (len(lengths), max_new_tokens))
    self.assertEqual(tokens.dtype, np.int32)
    self.assertEqual(lengths.dtype, np.int32)
    for b, (row, n) in enumerate(zip(tokens, lengths)):
      self.assertBetween(n, 1, max_new_tokens, msg=f"row {b}")
      np.testing.assert_array_equal(row[n:], -1, err_msg=f"row {b}")
      self.assertTrue(np.all((row[:n] >= 0) & (row[:n] < V)), msg=f"row {b}: {row}")
      is_eos = np.isin(row[:n], list(eos_ids))
      self.assertFalse(is_eos[:-1].any(), msg=f"row {b} goes on after an EOS: {row}")
      if n < max_new_tokens:
        self.assertTrue(is_eos[-1], msg=f"row {b} stopped early without EOS: {row}")
    np.testing.assert_array_equal(np.asarray(out.stats.generated), lengths)

  # 1. Greedy parity with Hugging Face ---------------------------------------------------------

  @parameterized.parameters(*NAMES)
  def test_greedy_matches_hf_generate(self, name):
    out = self.greedy_output(name)
    np.testing.assert_array_equal(out.lengths, [MAX_NEW] * 3)
    tokens = np.asarray(out.tokens)
    hf_model = self.hf[name][1]
    for b, prompt in enumerate(self.prompts):
      expected = _hf_greedy(hf_model, prompt, MAX_NEW)
      self.assertLen(expected, MAX_NEW)
      np.testing.assert_array_equal(tokens[b], expected, err_msg=f"{name}, row {b}")

  # 2. Per-row EOS ----------------------------------------------------------------------------

  def test_greedy_eos_stops_each_row(self):
    full = self.greedy_tokens()
    # An id that row 0 emits early and row 1 never emits: row 0 stops, row 1 runs to the end.
    eos = next((int(t) for t in full[0, 1:8] if t not in full[1]), None)
    self.assertIsNotNone(eos, f"no suitable EOS id in {full}")
    for eos_arg in (eos, [eos]):
      out = sj.generate(self.models["llama"], self.prompts, max_new_tokens=MAX_NEW,
                        eos_token_id=eos_arg)
      self.assert_well_formed(out, MAX_NEW, (eos,))
      lengths = np.asarray(out.lengths)
      for b in range(3):
        expected = _truncate_at_eos(full[b], (eos,))
        self.assertEqual(lengths[b], len(expected), msg=f"row {b}")
        np.testing.assert_array_equal(np.asarray(out.tokens)[b, :len(expected)], expected)
      self.assertLess(lengths[0], 9)
      self.assertEqual(int(out.tokens[0, lengths[0] - 1]), eos)  # the EOS itself is emitted
      self.assertEqual(lengths[1], MAX_NEW)
      # A finished row stops counting target calls; the batch runs until its longest row is done.
      stats = out.stats
      np.testing.assert_array_equal(np.asarray(stats.row_target_calls), lengths)
      self.assertEqual(int(stats.target_calls), lengths.max())
      self.assertEqual(stats.tokens_per_target_call, 1.0)

  def test_sampled_eos_stops_each_row(self):
    key = jax.random.key(7)
    free = sj.generate(self.models["llama"], self.prompts, sampling=SAMPLE,
                       max_new_tokens=MAX_NEW, key=key)
    free_tokens = np.asarray(free.tokens)
    eos_ids = (int(free_tokens[0, 3]), int(free_tokens[2, 10]))
    for k in (key, jax.random.key(8), jax.random.key(9)):
      out = sj.generate(self.models["llama"], self.prompts, sampling=SAMPLE,
                        max_new_tokens=MAX_NEW, key=k, eos_token_id=eos_ids)
      self.assert_well_formed(out, MAX_NEW, eos_ids)
    # Step t of row b draws with fold_in(fold_in(key, b), t) whether or not an EOS came earlier,
    # so with the same key the EOS run is the free run cut after its first EOS.
    out = sj.generate(self.models["llama"], self.prompts, sampling=SAMPLE,
                      max_new_tokens=MAX_NEW, key=key, eos_token_id=eos_ids)
    for b in range(3):
      expected = _truncate_at_eos(free_tokens[b], eos_ids)
      self.assertEqual(int(out.lengths[b]), len(expected), msg=f"row {b}")
      np.testing.assert_array_equal(np.asarray(out.tokens)[b, :len(expected)], expected)
    self.assertLessEqual(int(out.lengths[0]), 4)

  # 3. The token budget, and 7. stats ---------------------------------------------------------

  @parameterized.parameters(1, 5, MAX_NEW)
  def test_max_new_tokens_exact(self, max_new_tokens):
    full = self.greedy_tokens()
    if max_new_tokens == MAX_NEW:
      out = self.greedy_output()
    else:
      out = sj.generate(self.models["llama"], self.prompts, max_new_tokens=max_new_tokens)
    np.testing.assert_array_equal(out.lengths, [max_new_tokens] * 3)
    self.assert_well_formed(out, max_new_tokens)
    np.testing.assert_array_equal(out.tokens, full[:, :max_new_tokens])  # greedy is a prefix
    stats = out.stats
    self.assertEqual(int(stats.target_calls), max_new_tokens)  # prefill + max_new_tokens - 1 steps
    np.testing.assert_array_equal(stats.row_target_calls, [max_new_tokens] * 3)
    self.assertEqual(int(stats.draft_calls), 0)
    np.testing.assert_array_equal(stats.proposed, 0)
    np.testing.assert_array_equal(stats.accepted, 0)
    self.assertEqual(stats.tokens_per_target_call, 1.0)
    self.assertTrue(np.isnan(stats.acceptance_rate))
    self.assertEqual(stats.summary()["generated"], 3 * max_new_tokens)

  # 4. Sampling -------------------------------------------------------------------------------

  def test_sampling_is_a_function_of_key_prompt_and_row(self):
    """Row b draws with ``fold_in(key, b)``: same key -> same tokens; another key -> other tokens;
    a row's tokens do not depend on its batch mates (same batch size and padded width)."""
    model = self.models["llama"]
    run = lambda prompts, seed: np.asarray(sj.generate(
        model, prompts, sampling=SAMPLE, max_new_tokens=MAX_NEW, key=jax.random.key(seed)).tokens)
    a = run(self.prompts, 1)
    np.testing.assert_array_equal(a, run(self.prompts, 1))
    b = run(self.prompts, 2)
    for row in range(3):
      self.assertFalse(np.array_equal(a[row], b[row]), msg=f"row {row} ignores the key")
    mates = [self.prompts[0]] + _prompts(5, (16, 1))  # new batch mates, same padded width 16
    c = run(mates, 1)
    np.testing.assert_array_equal(c[0], a[0])
    self.assertFalse(np.array_equal(c[1:], a[1:]))
    # The same prompt in every row still gives independent rows.
    same = run([self.prompts[0]] * 3, 1)
    np.testing.assert_array_equal(same[0], a[0])
    self.assertFalse(np.array_equal(same[1], same[0]))

  def test_sampled_law_of_first_two_tokens(self):
    """2000 rows of one prompt: the first token follows the warped target law
    ``probabilities(forward(prompt)[-1])``, and (first, second) the exact joint law, computed from
    ``sj.forward`` over every one-token continuation."""
    model, n = self.models["llama"], 2000
    prompt = self.prompts[0]
    out = sj.generate(model, [prompt] * n, sampling=WARPED, max_new_tokens=2,
                      key=jax.random.key(123))
    tokens = np.asarray(out.tokens)
    np.testing.assert_array_equal(out.lengths, 2)
    first, second = tokens[:, 0], tokens[:, 1]

    # Row t: prompt + [t]. Position len(prompt) - 1 scores the first token (the same in every
    # row), the last position the second token given first token t.
    continuations = np.concatenate([np.tile(prompt, (V, 1)), np.arange(V)[:, None]], axis=1)
    logits = sj.forward(model, continuations)
    p1 = np.asarray(sampling_lib.probabilities(logits[0, len(prompt) - 1], WARPED), np.float64)
    p2 = np.asarray(sampling_lib.probabilities(logits[:, -1], WARPED), np.float64)  # [V, V]
    joint = p1[:, None] * p2
    self.assertBetween(int((p1 > 0).sum()), 5, 10)  # the warpers really cut the support

    first_counts = np.bincount(first, minlength=V)
    joint_counts = np.bincount(first * V + second, minlength=V * V)
    self.assertGreater(chi_square_pvalue(first_counts, p1), P_FLOOR)
    self.assertGreater(chi_square_pvalue(joint_counts, joint.ravel()), P_FLOOR)

    # Negative controls: the same checks reject the unwarped law, and laws with the right
    # support but wrong (uniform) weights, for the first token and for the second given the first.
    raw = np.asarray(sampling_lib.probabilities(logits[0, len(prompt) - 1], SAMPLE), np.float64)
    uniform = lambda p: (p > 0) / (p > 0).sum(-1, keepdims=True)
    self.assertLess(chi_square_pvalue(first_counts, raw), P_FLOOR)
    self.assertLess(chi_square_pvalue(first_counts, uniform(p1)), P_FLOOR)
    self.assertLess(chi_square_pvalue(joint_counts, (p1[:, None] * uniform(p2)).ravel()), P_FLOOR)

  # 5. No recompilation -----------------------------------------------------------------------

  def test_same_shapes_do_not_recompile(self):
    model = self.models["llama"]
    gen = lambda prompts, seed, max_new_tokens=MAX_NEW: sj.generate(
        model, prompts, sampling=SAMPLE, max_new_tokens=max_new_tokens,
        key=jax.random.key(seed)).tokens.block_until_ready()
    loop.decode_jit.clear_cache()  # so that compilations by other tests cannot hide one here
    gen(self.prompts, 0)
    compiled = loop.decode_jit._cache_size()
    self.assertEqual(compiled, 1)
    gen(_prompts(11, (16, 3, 9)), 1)  # new key, new prompts and lengths, same padded width
    gen(np.array(_prompts(12, (7, 7, 7))), 2)  # an array of prompts
    self.assertEqual(loop.decode_jit._cache_size(), compiled)
    gen(self.prompts, 3, max_new_tokens=1)  # max_new_tokens is static: one new compilation
    self.assertEqual(loop.decode_jit._cache_size(), compiled + 1)
    gen(self.prompts, 4, max_new_tokens=1)
    self.assertEqual(loop.decode_jit._cache_size(), compiled + 1)

  def test_prompt_width_shares_one_compilation_and_changes_no_token(self):
    """``prompt_width`` pads every call alike: batches whose longest prompts are 11 and 20 tokens
    (natural widths 16 and 32) share one compilation, and the tokens (greedy autoregressive, and
    sampled speculative with a different draft, one key) equal those of the natural padding."""
    model, draft = self.models["llama"], self.models["qwen2"]
    gen = lambda prompts, sampling, width, method=sj.Autoregressive(): np.asarray(sj.generate(
        model, prompts, method=method, sampling=sampling, max_new_tokens=MAX_NEW,
        key=jax.random.key(5), prompt_width=width).tokens)
    spec = sj.Speculative(draft=draft, gamma=2)
    for sampling, method in ((GREEDY, sj.Autoregressive()), (SAMPLE, spec)):
      np.testing.assert_array_equal(gen(self.prompts, sampling, 20, method),
                                    gen(self.prompts, sampling, None, method))
    compiled = loop.decode_jit._cache_size()
    long_prompts = _prompts(13, (20, 4, 7))
    gen(long_prompts, GREEDY, 20)
    gen(long_prompts, SAMPLE, 20, spec)
    self.assertEqual(loop.decode_jit._cache_size(), compiled)

  @parameterized.parameters("mistral", "gpt2")
  def test_prompt_width_sliding_window_and_learned_positions(self, name):
    """Extra padding changes nothing under a sliding window (mistral: 8) or learned positions."""
    out = sj.generate(self.models[name], self.prompts, max_new_tokens=MAX_NEW, prompt_width=40)
    np.testing.assert_array_equal(np.asarray(out.tokens), self.greedy_tokens(name))

  # 6. Errors ---------------------------------------------------------------------------------

  @parameterized.named_parameters(
      ("no_prompts", dict(prompts=[]), r"prompts is empty"),
      ("empty_prompt", dict(prompts=[[1, 2], []]), r"prompt 1 is empty"),
      ("negative_id", dict(prompts=[[1, 2], [3, -1]]),
       r"prompt 1: token id -1 is outside the vocabulary \[0, 128\)"),
      ("id_too_large", dict(prompts=[[1, 128]]), r"token id 128 is outside the vocabulary"),
      ("float_ids", dict(prompts=[[1.0, 2.5]]), r"token ids must be integers"),
      ("array_rank", dict(prompts=np.zeros((1, 2, 3), np.int32)), r"must be \[batch, length\]"),
      ("context", dict(prompts=[[1] * 100], max_new_tokens=29),
       r"prompt length 100 \+ max_new_tokens 29 = 129 exceeds the target model's maximum context "
       r"128"),
      ("zero_new_tokens", dict(max_new_tokens=0), r"max_new_tokens must be an integer >= 1, got 0"),
      ("negative_new_tokens", dict(max_new_tokens=-2), r"max_new_tokens .* got -2"),
      ("float_new_tokens", dict(max_new_tokens=4.0), r"max_new_tokens .* got 4\.0"),
      ("no_key", dict(sampling=sj.Sampling(temperature=0.5)),
       r"temperature 0\.5 needs a PRNG key"),
      ("eos_too_large", dict(eos_token_id=128), r"eos_token_id 128 is outside the vocabulary"),
      ("eos_negative", dict(eos_token_id=[2, -1]), r"eos_token_id -1 is outside the vocabulary"),
      ("sampling_type", dict(sampling="greedy"), r"sampling must be an sj.Sampling, got str"),
      ("method", dict(method="beam"), r"unknown decoding method 'beam'"),
      ("prompt_width_short", dict(prompt_width=10),
       r"prompt_width must be an integer >= the longest prompt \(11 tokens\), got 10"),
      ("prompt_width_float", dict(prompt_width=16.0), r"prompt_width must be an integer .* 16\.0"),
      ("prompt_width_bool", dict(prompt_width=True), r"prompt_width must be an integer .* True"),
      ("prompt_width_context", dict(prompt_width=100, max_new_tokens=29),
       r"prompt_width 100 \+ max_new_tokens 29 = 129 exceeds the target model's maximum context "
       r"128"),
      ("not_a_model", dict(model=object()), r"target must be a specjax model .* got object"),
  )
  def test_errors(self, kwargs, message):
    kwargs = dict(model=self.models["llama"], prompts=self.prompts) | kwargs
    with self.assertRaisesRegex(ValueError, message):
      sj.generate(**kwargs)

  def test_torch_model_is_rejected(self):
    with self.assertRaisesRegex(ValueError, r"target must be a specjax model .* got LlamaForCausalLM"):
      sj.generate(self.hf["llama"][1], self.prompts)

  @parameterized.named_parameters(
      ("negative_temperature", dict(temperature=-1.0), r"temperature must be >= 0"),
      ("nan_temperature", dict(temperature=float("nan")), r"temperature must be finite"),
      ("negative_top_k", dict(top_k=-1), r"top_k must be >= 0"),
      ("float_top_k", dict(top_k=2.5), r"top_k must be an int"),
      ("zero_top_p", dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
      ("large_top_p", dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
  )
  def test_invalid_sampling(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      sj.Sampling(**kwargs)

  # 8. bfloat16 -------------------------------------------------------------------------------

  def test_bfloat16(self):
    """bfloat16 weights generate well-formed output whose tokens are (nearly always) what the
    float32 model picks given the same prefix: compared teacher-forced, so that one near-tie
    flip does not derail the rest of the row."""
    model = sj.load_model(self.hf["llama"][0], dtype="bfloat16")
    self.assertEqual(model.config.dtype, "bfloat16")
    out = sj.generate(model, self.prompts, max_new_tokens=MAX_NEW)
    self.assert_well_formed(out, MAX_NEW)
    np.testing.assert_array_equal(out.lengths, MAX_NEW)
    tokens = np.asarray(out.tokens)
    full = self.greedy_tokens()
    np.testing.assert_array_equal(tokens[:, 0], full[:, 0])  # the first token is far from a tie

    width = max(map(len, self.prompts)) + MAX_NEW
    seqs = np.zeros((3, width), np.int32)  # right padding cannot affect earlier (causal) logits
    for b, prompt in enumerate(self.prompts):
      seqs[b, :len(prompt) + MAX_NEW] = np.concatenate([prompt, tokens[b]])
    logits = np.asarray(sj.forward(self.models["llama"], seqs))
    agree = [np.mean(logits[b, len(p) - 1:len(p) - 1 + MAX_NEW].argmax(-1) == tokens[b])
             for b, p in enumerate(self.prompts)]
    self.assertGreaterEqual(np.mean(agree), 0.9, msg=f"float32/bfloat16 agreement {agree}")


if __name__ == "__main__":
  absltest.main()
