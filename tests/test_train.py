"""Tests for specjax.training and experiments.train / corpus / default_pair on a few KB of stdlib
source and tiny models.

Run: PYTHONPATH=. python -m pytest tests/test_train.py -q
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import time
from unittest import mock

from absl.testing import absltest
import pytest
import jax
import jax.numpy as jnp
import numpy as np

from experiments import corpus as corpus_lib
from experiments import default_pair
from experiments import train
from specjax import training
from specjax.models.config import ModelConfig
from specjax.models.transformer import forward, init_model

_TINY_CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "train_tiny.py"


def tiny_config():
  import importlib.util
  spec = importlib.util.spec_from_file_location("train_tiny_config", _TINY_CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


class _Shared:
  """Tokenizer and token streams built once for the module (a few KB of text)."""
  tokenizer = train_stream = val_stream = None

  @classmethod
  def get(cls):
    if cls.tokenizer is None:
      c = tiny_config()
      corpus = corpus_lib.load_corpus(max_train_bytes=c.corpus.max_train_bytes,
                                      max_val_bytes=c.corpus.max_val_bytes,
                                      val_percent=c.corpus.val_percent)
      cls.tokenizer = corpus_lib.train_tokenizer(corpus.train, c.tokenizer.vocab_size)
      cls.train_stream = corpus_lib.encode_stream(cls.tokenizer, corpus.train)
      cls.val_stream = corpus_lib.encode_stream(cls.tokenizer, corpus.val)
    return cls


def _params(model):
  return jax.tree.map(np.asarray, training.forward.split(model)[1])


class CorpusTest(absltest.TestCase):

  def test_split_is_by_file_and_deterministic(self):
    a = corpus_lib.load_corpus(max_train_bytes=20_000, max_val_bytes=5_000, val_percent=20.0)
    b = corpus_lib.load_corpus(max_train_bytes=20_000, max_val_bytes=5_000, val_percent=20.0)
    self.assertEqual(a.train_files, b.train_files)
    self.assertEqual(a.val_files, b.val_files)
    self.assertEmpty(set(a.train_files) & set(a.val_files))
    self.assertLessEqual(a.train_bytes, 20_000)
    self.assertTrue(all(f.endswith(".py") and "site-packages" not in f for f in a.train_files))

  def test_tokenizer_round_trip_and_autotokenizer(self):
    from transformers import AutoTokenizer
    s = _Shared.get()
    self.assertEqual(len(s.tokenizer), 320)
    self.assertEqual(s.tokenizer.eos_token_id, 0)
    with tempfile.TemporaryDirectory() as d:
      s.tokenizer.save_pretrained(d)
      tok = AutoTokenizer.from_pretrained(d)
    text = "def f(x):\n    return x + 1  # é\n"
    self.assertEqual(tok.decode(tok.encode(text, add_special_tokens=False)), text)
    self.assertEqual(tok.eos_token, corpus_lib.EOS_TOKEN)
    self.assertEqual(s.train_stream.dtype, np.int32)
    self.assertEqual(int((s.train_stream == 0).sum()), s.train_stream.tolist().count(0))


class PiecesTest(absltest.TestCase):

  def test_batches_depend_only_on_step(self):
    stream = np.arange(1000, dtype=np.int32)
    b = training.Batches(stream, batch_size=4, seq_len=16, seed=3)
    np.testing.assert_array_equal(b(7), training.Batches(stream, 4, 16, seed=3)(7))
    self.assertFalse(np.array_equal(b(7), b(8)))
    x = b(7)
    self.assertEqual(x.shape, (4, 17))
    np.testing.assert_array_equal(np.diff(x, axis=1), 1)  # contiguous windows

  def test_learning_rate_schedule(self):
    cfg = training.train_defaults(steps=100, lr=1e-2, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [training.learning_rate(cfg, s) for s in range(100)]
    self.assertAlmostEqual(lrs[0], 1e-3)
    self.assertAlmostEqual(max(lrs), 1e-2)
    self.assertAlmostEqual(training.learning_rate(cfg, 100), 1e-3)
    self.assertTrue(all(a >= b for a, b in zip(lrs[10:], lrs[11:])))
    # A time budget nearly spent pulls the schedule to its end even at an early step.
    self.assertAlmostEqual(training.learning_rate(cfg, 20, progress=1.0), 1e-3)

  def test_fast_causal_logits_match_forward(self):
    config = ModelConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=48, max_position_embeddings=64)
    model = init_model(config, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, 50)
    graphdef, params, rest = training.forward.split(model)
    fast = jax.jit(training.forward.logits, static_argnums=0)(graphdef, params, rest, tokens)
    np.testing.assert_allclose(fast, forward(model, tokens), atol=1e-5, rtol=1e-5)

  def test_grow_model_preserves_function(self):
    small_cfg = ModelConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2,
                            intermediate_size=48)
    small = init_model(small_cfg, jax.random.key(0))
    big_cfg = ModelConfig(vocab_size=50, hidden_size=32, num_layers=3, num_heads=2,
                          intermediate_size=48)
    big = training.grow_model(small, big_cfg, training.train_defaults(seed=4))
    tokens = np.random.default_rng(0).integers(0, 50, (2, 7))
    np.testing.assert_allclose(forward(big, tokens), forward(small, tokens), atol=1e-6)
    self.assertGreater(float(jnp.abs(big.layers[2].mlp.up.kernel[...]).max()), 0.0)
    self.assertEqual(float(jnp.abs(big.layers[2].mlp.down.kernel[...]).max()), 0.0)

  def test_greedy_agreement_and_kl(self):
    config = ModelConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2,
                         intermediate_size=32)
    a, b = init_model(config, jax.random.key(0)), init_model(config, jax.random.key(1))
    tokens = np.random.default_rng(0).integers(0, 40, (3, 9))
    self.assertEqual(training.greedy_agreement(a, a, tokens), 1.0)
    self.assertAlmostEqual(training.mean_kl(a, a, tokens), 0.0, places=6)
    ta = np.asarray(jnp.argmax(forward(a, tokens), -1))
    tb = np.asarray(jnp.argmax(forward(b, tokens), -1))
    self.assertAlmostEqual(training.greedy_agreement(a, b, tokens), float((ta == tb).mean()))


  def test_top1_agreement_is_argmax_agreement(self):
    from specjax.training.losses import top1_agreement
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 50, 33)), rng.normal(size=(2, 50, 33))
    b[0, :25] = a[0, :25] * 2.0 + 1.0  # half the rows agree by construction
    want = (np.argmax(a, -1) == np.argmax(b, -1)).astype(np.float32)
    self.assertBetween(float(want.mean()), 0.2, 0.8)
    np.testing.assert_array_equal(top1_agreement(jnp.asarray(a), jnp.asarray(b)), want)
    tied = jnp.asarray([[1.0, 3.0, 3.0], [1.0, 3.0, 3.0]])  # any tied top counts
    np.testing.assert_array_equal(
        top1_agreement(jnp.asarray([[0.0, 0.0, 5.0], [5.0, 0.0, 0.0]]), tied), [1.0, 0.0])

class TrainingTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.s = _Shared.get()
    cls.config = tiny_config()
    c = cls.config
    cls.vocab = len(cls.s.tokenizer)
    cls.val = training.eval_windows(cls.s.val_stream, c.data.seq_len, c.data.eval_tokens)
    cls.batches = training.Batches(cls.s.train_stream, c.target.train.batch_size, c.data.seq_len)
    cls.tmp = tempfile.mkdtemp()
    # One trained tiny target shared by the tests below (also the teacher for distillation).
    cls.target_cfg = training.model_config(c.target.model, cls.vocab, c.data.seq_len)
    cls.target_init = init_model(cls.target_cfg, jax.random.key(0))
    cls.target_init_loss = training.evaluate(cls.target_init, cls.val)
    cls.target, cls.target_report = training.train_model(
        init_model(cls.target_cfg, jax.random.key(0)), c.target.train, cls.batches, cls.val,
        os.path.join(cls.tmp, "ckpt_target"), name="target")

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def test_loss_decreases(self):
    history = self.target_report["history"]
    self.assertLess(history[-1]["loss"], history[0]["loss"] - 0.3)
    self.assertLess(self.target_report["val_loss"], self.target_init_loss - 0.3)
    self.assertEqual(self.target_report["steps"], self.config.target.train.steps)

  def test_resume_from_checkpoint(self):
    c = self.config
    ckpt = os.path.join(self.tmp, "ckpt_resume")
    cfg = training.train_defaults(**dict(c.target.train, steps=12, ckpt_every=100))
    first, rep1 = training.train_model(init_model(self.target_cfg, jax.random.key(0)), cfg,
                                       self.batches, None, ckpt, name="first")
    self.assertEqual(rep1["steps"], 12)
    # The checkpoint holds exactly the parameters of the first run, at step 12.
    mngr = training.checkpoint.checkpoint_manager(pathlib.Path(ckpt), cfg)
    self.assertEqual(mngr.latest_step(), 12)
    tx = training.make_optimizer(cfg)
    _, p0, _ = training.forward.split(init_model(self.target_cfg, jax.random.key(5)))
    step, restored, _, seconds = training.restore_checkpoint(mngr, p0, tx.init(p0))
    mngr.close()
    self.assertEqual(step, 12)
    self.assertGreater(seconds, 0.0)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, restored),
                 _params(first))
    # A second run with more steps continues from step 12 (its own init is overwritten) ...
    cfg2 = training.train_defaults(**dict(cfg, steps=20))
    resumed, rep2 = training.train_model(init_model(self.target_cfg, jax.random.key(9)), cfg2,
                                         self.batches, None, ckpt, name="second")
    self.assertEqual(rep2["start_step"], 12)
    self.assertEqual(rep2["steps"], 20)
    self.assertFalse(np.array_equal(_params(resumed)["embed"], _params(first)["embed"]))

  def test_interrupted_run_resumes_exactly(self):
    cfg = training.train_defaults(**dict(self.config.target.train, steps=20, ckpt_every=5))
    ckpt = os.path.join(self.tmp, "ckpt_interrupted")
    cut = training.train_defaults(**dict(cfg, max_steps_per_run=7))
    _, rep1 = training.train_model(init_model(self.target_cfg, jax.random.key(0)), cut,
                                   self.batches, None, ckpt, name="interrupted")
    self.assertEqual((rep1["steps"], rep1["stopped_early"]), (7, True))
    resumed, rep2 = training.train_model(init_model(self.target_cfg, jax.random.key(3)), cfg,
                                         self.batches, None, ckpt, name="resumed")
    self.assertEqual((rep2["start_step"], rep2["steps"]), (7, 20))
    straight, _ = training.train_model(init_model(self.target_cfg, jax.random.key(0)), cfg,
                                       self.batches, None, None, name="straight")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 _params(resumed), _params(straight))

  def test_max_seconds_stops_cleanly(self):
    cfg = training.train_defaults(**dict(self.config.target.train, steps=1000, max_seconds=1e-3))
    ckpt = os.path.join(self.tmp, "ckpt_capped")
    _, rep = training.train_model(init_model(self.target_cfg, jax.random.key(0)), cfg, self.batches,
                                  None, ckpt, name="capped")
    self.assertTrue(rep["stopped_early"])
    self.assertEqual(rep["steps"], 1)
    mngr = training.checkpoint.checkpoint_manager(pathlib.Path(ckpt), cfg)
    self.assertEqual(mngr.latest_step(), 1)
    mngr.close()

  @pytest.mark.slow  # ~17 s: two short training runs
  def test_time_limits_count_finished_steps(self):
    # JAX dispatches steps asynchronously: a loop that read the clock at dispatch ran ~10 steps
    # past the budget (8 s here: 11 s, 28 steps instead of 14) before it returned.
    limit = 8.0
    batches = training.Batches(self.s.train_stream, 512, self.batches.seq_len)  # ~0.3 s a step
    for field in ("time_budget", "max_seconds"):
      with self.subTest(field):
        cfg = training.train_defaults(**dict(self.config.target.train, steps=100_000,
                                             log_every=100_000, **{field: limit}))
        model = init_model(self.target_cfg, jax.random.key(0))
        start = time.perf_counter()
        model, rep = training.train_model(model, cfg, batches, None, None, name=field)
        _params(model)  # waits for every step dispatched
        elapsed = time.perf_counter() - start
        self.assertEqual(rep["ended_by"], field)
        self.assertGreater(rep["steps"], 2)
        step_seconds = (rep["wall_seconds"] - rep["compile_seconds"]) / (rep["steps"] - 1)
        self.assertLess(elapsed, limit + 3 * step_seconds + 0.5)

  def test_fit_and_distill_are_train_model_on_a_stream(self):
    c = self.config
    hp = dict(steps=4, batch_size=c.target.train.batch_size, lr=1e-2, warmup_steps=2, log_every=2)
    ref, _ = training.train_model(init_model(self.target_cfg, jax.random.key(0)),
                                  training.train_defaults(**hp), self.batches, None, None)
    model, rep = training.fit(init_model(self.target_cfg, jax.random.key(0)), self.s.train_stream,
                              seq_len=c.data.seq_len, val_stream=self.s.val_stream, **hp)
    jax.tree.map(np.testing.assert_array_equal, _params(model), _params(ref))
    self.assertIn("val_loss", rep)
    draft_cfg = training.model_config(c.draft.model, self.vocab, c.data.seq_len)
    draft, rep = training.distill(self.target, init_model(draft_cfg, jax.random.key(1)),
                                  self.s.train_stream, seq_len=c.data.seq_len, **hp)
    self.assertIn("kl", rep["history"][-1])
    with self.assertRaisesRegex(TypeError, "unknown training hyper-parameters"):
      training.fit(draft, self.s.train_stream, seq_len=c.data.seq_len, stepz=3)

  def test_export_loads_in_transformers(self):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out = pathlib.Path(self.tmp) / "hf_target"
    training.export_model(self.target, self.s.tokenizer, out)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok.encode("import os\nimport sys\n\ndef main():\n", add_special_tokens=False)
    self.assertEqual(tok.eos_token_id, 0)
    with torch.no_grad():
      hf_logits = hf(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(hf_logits, np.asarray(forward(self.target, [ids])), atol=1e-4,
                               rtol=1e-4)
    self.assertFalse(out.with_name(out.name + ".tmp").exists())

  def test_distillation_reduces_kl(self):
    c = self.config
    draft_cfg = training.model_config(c.draft.model, self.vocab, c.data.seq_len)
    inputs = self.val[:, :-1]
    before = training.mean_kl(self.target, init_model(draft_cfg, jax.random.key(1)), inputs)
    cfg = training.train_defaults(**dict(c.draft_distill.train, steps=30))
    draft, rep = training.train_model(init_model(draft_cfg, jax.random.key(1)), cfg, self.batches,
                                      self.val, None, teacher=self.target, name="distill")
    after = training.mean_kl(self.target, draft, inputs)
    self.assertLess(after, 0.7 * before)
    self.assertIn("kl", rep["history"][-1])
    self.assertLess(rep["history"][-1]["kl"], rep["history"][0]["kl"])


class DefaultPairTest(absltest.TestCase):

  def test_build_reuse_and_rebuild_incomplete(self):
    c = tiny_config()
    c.phases = "target,draft,draft_distill"
    for phase in ("target", "draft", "draft_distill"):
      c[phase].train.steps = 6
    with tempfile.TemporaryDirectory() as cache, \
        mock.patch.dict(os.environ, {"SPECJAX_CACHE": cache}), \
        mock.patch.object(default_pair, "default_train_config", return_value=c) as get_config:
      dest = default_pair.default_pair_dir()
      self.assertEqual(dest, pathlib.Path(cache) / default_pair.VERSION)
      # A half-written cache (no marker) must be rebuilt, not used.
      (dest / "target").mkdir(parents=True)
      (dest / "target" / "config.json").write_text("{}")
      self.assertFalse(default_pair.is_complete(dest))
      target_dir, draft_dir = default_pair.ensure_default_pair(verbose=False)
      self.assertEqual(get_config.call_count, 1)
      self.assertTrue(default_pair.is_complete(dest))
      for d in (target_dir, draft_dir, dest / "draft_data"):
        for f in default_pair.REQUIRED_FILES:
          self.assertTrue((d / f).is_file(), d / f)
      report = json.loads((dest / train.REPORT_FILE).read_text())
      self.assertEqual(report["default_draft"], "draft_distill")
      self.assertIn("greedy_agreement", report["agreement"]["draft_distill"])
      self.assertFalse((dest / "checkpoints").exists())
      self.assertFalse(dest.with_name(dest.name + ".partial").exists())
      # Cached: the second call trains nothing.
      self.assertEqual(default_pair.ensure_default_pair(verbose=False), (target_dir, draft_dir))
      self.assertEqual(get_config.call_count, 1)
      # Loads with specjax.
      from specjax.models.hf import load_model
      self.assertEqual(load_model(str(draft_dir)).config.num_layers, c.draft.model.num_layers)


if __name__ == "__main__":
  absltest.main()
