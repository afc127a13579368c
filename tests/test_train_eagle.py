"""Tests for specjax.training.eagle (EAGLE-1 and EAGLE-3 training) on a tiny random target: the
training forward equals the heads' inference path (step 0, and training-time-test step k against
drafting run on its own predictions), training lowers the loss and raises greedy acceptance,
resumption is bit-identical, features are cached, the draft vocabulary, and errors.

Run: python -m pytest -q -n 0 tests/test_train_eagle.py
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from flax import nnx

import specjax as sj
from specjax.heads.eagle3 import Eagle3Head
from specjax.models.kv_cache import init_cache
from specjax.training import eagle as et
from specjax.training import eagle_data, eagle_eval, eagle_forward, head_loop
from specjax.training.progress import set_verbose

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests.test_speculative import TF_CONFIG, random_transformer
except ImportError:  # pragma: no cover
  from test_speculative import TF_CONFIG, random_transformer

CONFIG = dataclasses.replace(TF_CONFIG, num_layers=4, max_position_embeddings=128)  # V = 16
DRAFT_VOCAB = 12
SEQ = 24
FAST = dict(lr=1e-2, warmup_steps=5, ttt_steps=3, eval_steps=3, log_every=10)


def setUpModule():
  set_verbose(False)


@functools.lru_cache(maxsize=None)
def rows():
  """The tiny target's own greedy answers to 28 random prompts: (tokens, answer mask)."""
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(0, CONFIG.vocab_size, int(rng.integers(3, 8))))
             for _ in range(28)]
  return prompts, *et.eagle_rows(random_transformer(CONFIG, 0), prompts, SEQ - 4, None, SEQ)


def new_head(kind: str, seed: int = 1, scale: float = 1.0):
  tokens, mask = rows()[1:]
  ids = et.draft_vocabulary(tokens, mask, DRAFT_VOCAB, CONFIG.vocab_size) if kind == "eagle3" \
      else None
  head = et.init_eagle_head(random_transformer(CONFIG, 0), kind, ids, key=seed,
                            from_target=scale == 1.0)
  if scale != 1.0:  # random weights, scaled: drafts visibly input-dependent (equivalence checks)
    state = nnx.state(head, nnx.Param)
    nnx.update(head, jax.tree.map(lambda x: x * scale if x.ndim == 2 else x, state))
  return head


def vocab_logits(head, target, hidden):
  """Logits over the head's own vocabulary (EAGLE-3: draft ids; EAGLE-1: the target's)."""
  if isinstance(head, Eagle3Head):
    return head.draft_vocab_logits(hidden)
  return head.draft_logits(hidden, target)


class ForwardMatchesInferenceTest(parameterized.TestCase):
  """The training forward (no cache, every position at once) is the drafting path's math."""

  def _inputs(self, kind, steps):
    target = random_transformer(CONFIG, 0)
    head = new_head(kind, scale=6.0)
    t = 12
    rng = np.random.default_rng(3)
    f = len(head.target_features(CONFIG))
    feats = jnp.asarray(rng.normal(size=(1, t, f, CONFIG.hidden_size)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, CONFIG.vocab_size, (1, t + steps)), jnp.int32)
    outs = eagle_forward.ttt_forward(head, target.embed[...], tokens,
                                     eagle_forward.head_input(head, feats), steps)
    return target, head, feats, tokens, outs

  @parameterized.parameters("eagle", "eagle3", "mtp")
  def test_step_zero_is_the_heads_call(self, kind):
    target, head, feats, tokens, outs = self._inputs(kind, 1)
    t = feats.shape[1]
    embeds = jnp.take(target.embed[...], tokens[:, :t], axis=0)
    hidden, _ = head(embeds, head.from_target(feats), init_cache(head.config, 1, t + 2))
    want = vocab_logits(head, target, hidden)
    self.assertGreater(float(jnp.std(want)), 0.5)  # logits that depend on the inputs
    np.testing.assert_allclose(vocab_logits(head, target, outs[0]), want, atol=1e-5, rtol=1e-5)

  @parameterized.parameters("eagle", "eagle3", "mtp")
  def test_ttt_step_k_is_drafting_on_its_own_predictions(self, kind):
    """Position t's step k equals drafting after the true pairs 0..t: k single-token passes
    each feeding (the next token, the head's previous output), at positions t + 1, ..."""
    steps = 3
    target, head, feats, tokens, outs = self._inputs(kind, steps)
    t = feats.shape[1]
    starts = np.array([0, 4, t - 1])  # one row per start position
    b = len(starts)
    embed = lambda ids: jnp.take(target.embed[...], ids, axis=0)
    cache = init_cache(head.config, b, t + steps + 1)
    hidden, cache = head(embed(jnp.repeat(tokens[:, :t], b, 0)),
                         head.from_target(jnp.repeat(feats, b, 0)), cache)
    cache = cache.with_lengths(jnp.asarray(starts + 1, jnp.int32))
    hidden = hidden[np.arange(b), starts]
    for k in range(1, steps):
      np.testing.assert_allclose(vocab_logits(head, target, outs[k - 1][0, starts]),
                                 vocab_logits(head, target, hidden), atol=1e-5, rtol=1e-5)
      h, cache = head(embed(tokens[0, starts + k])[:, None], hidden[:, None], cache)
      cache = cache.with_lengths(cache.lengths + 1)
      hidden = h[:, 0]
    np.testing.assert_allclose(vocab_logits(head, target, outs[-1][0, starts]),
                               vocab_logits(head, target, hidden), atol=1e-5, rtol=1e-5)


class LayerFromTargetTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("llama", {}), ("qwen2_biases", dict(model_type="qwen2", attention_bias=True)),
      ("qwen3_qk_norms", dict(model_type="qwen3")))
  def test_eagle3_head_starts_as_the_layer_after_its_high_feature(self, changes):
    """``layer_from_target``: the midlayer is the target's next block, so the head's step 0 over
    the target's own features returns that block's output (the fc passes the high feature)."""
    config = dataclasses.replace(CONFIG, **changes)
    target = random_transformer(config, 0)
    if changes:  # random biases and q/k norms, so that copying them is tested
      state = nnx.state(target, nnx.Param)
      leaves, treedef = jax.tree.flatten(state)
      rng = np.random.default_rng(5)
      nnx.update(target, jax.tree.unflatten(treedef, [
          x + jnp.asarray(0.3 * rng.normal(size=x.shape), x.dtype) if x.ndim == 1 else x
          for x in leaves]))
    head = et.init_eagle_head(target, "eagle3", layer_from_target=True)
    layers = head.target_features(config)
    tokens = jnp.asarray(rows()[1][:2, :16])
    _, _, feats = target(tokens, init_cache(config, 2, 16), features=layers + (layers[-1] + 1,))
    outs = eagle_forward.ttt_forward(head, target.embed[...], tokens[:, 1:],
                                     eagle_forward.head_input(head, feats[:, :15, :3]), 1)
    self.assertGreater(float(jnp.std(feats[:, :15, 3] - feats[:, :15, 2])), 1e-3)  # a real block
    np.testing.assert_allclose(outs[0], feats[:, :15, 3], atol=1e-5, rtol=1e-5)
    with self.assertRaisesRegex(ValueError, "layer_from_target is an EAGLE-3 initialisation"):
      et.init_eagle_head(target, "eagle", layer_from_target=True)
    top = Eagle3Head(head.config, nnx.Rngs(0), target_layers=(0, 1, 3))
    with self.assertRaisesRegex(ValueError, r"output of the target's last layer \(3\)"):
      et._copy_target_layer(target, top)


class TrainTest(parameterized.TestCase):

  @parameterized.parameters("eagle", "eagle3")
  def test_loss_falls_and_acceptance_rises(self, kind):
    prompts, tokens, mask = rows()
    target = random_transformer(CONFIG, 0)
    held_out = prompts[-4:]
    untrained = new_head(kind)
    before = et.eagle_acceptance(target, untrained, held_out, gamma=3, max_new_tokens=16)
    head, report = et.train_eagle(target, untrained, tokens, mask, eval_rows=4, steps=60,
                                  batch_size=8, eval_prompts=held_out, eval_gamma=3,
                                  eval_new_tokens=16, **FAST)
    first, last = report["history"][0], report["history"][-1]
    self.assertLess(last["loss"], 0.9 * first["loss"])  # the CE has the target's entropy as floor
    self.assertGreater(last["acc"][0], first["acc"][0] + 0.2)
    after = report["acceptance"]
    self.assertGreater(after["acceptance_rate"], before["acceptance_rate"] + 0.1)
    self.assertGreater(after["per_position"][0], before["per_position"][0])
    self.assertLen(report["agreement"], 3)
    self.assertGreater(report["agreement"][0], 0.5)

  def test_acceptance_reports_the_draft_vocabulary_coverage(self):
    """EAGLE-3: the share of the target's greedy tokens inside the head's draft vocabulary,
    counted independently from autoregressive decoding's output (greedy drafting emits exactly
    those tokens); EAGLE-1 heads, whose vocabulary is the target's, report none."""
    prompts = rows()[0][-4:]
    target = random_transformer(CONFIG, 0)
    ids = np.arange(0, CONFIG.vocab_size, 2)  # the even ids: the target emits odd ones too
    head = et.init_eagle_head(target, "eagle3", ids, key=1)
    np.testing.assert_array_equal(head.draft_ids[...], ids)
    got = et.eagle_acceptance(target, head, prompts, gamma=2, max_new_tokens=12)
    out = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=12)
    emitted = [int(t) for b in range(len(prompts)) for t in out.tokens[b, :out.lengths[b]]]
    expected = np.mean([t in set(ids.tolist()) for t in emitted])
    self.assertLess(expected, 1.0)  # some emitted tokens fall outside: the count is tested
    self.assertAlmostEqual(got["vocab_coverage"], expected, places=6)
    self.assertIn(f"(draft vocabulary holds {expected:.3f} of the target's tokens)",
                  eagle_eval.describe_acceptance(got))
    self.assertNotIn("vocab_coverage",
                     et.eagle_acceptance(target, new_head("eagle"), prompts, 2, 12))

  def test_resumed_run_is_bit_identical(self):
    _, tokens, mask = rows()
    target = random_transformer(CONFIG, 0)
    hp = dict(FAST, steps=6, batch_size=4, ckpt_every=3)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
      whole, _ = et.train_eagle(target, new_head("eagle3"), tokens, mask, checkpoint_dir=a, **hp)
      _, first = et.train_eagle(target, new_head("eagle3"), tokens, mask, checkpoint_dir=b,
                                max_steps_per_run=4, **hp)
      self.assertTrue(first["stopped_early"])
      resumed, second = et.train_eagle(target, new_head("eagle3"), tokens, mask,
                                       checkpoint_dir=b, **hp)
      self.assertEqual(second["start_step"], 4)
    for x, y in zip(jax.tree.leaves(nnx.state(whole, nnx.Param)),
                    jax.tree.leaves(nnx.state(resumed, nnx.Param))):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

  def test_eagle1_noise_is_deterministic_and_changes_training(self):
    _, tokens, mask = rows()
    target = random_transformer(CONFIG, 0)
    hp = dict(FAST, steps=2, batch_size=4)
    runs = [et.train_eagle(target, new_head("eagle"), tokens, mask, noise=n, **hp)[0]
            for n in (0.2, 0.2, 0.0)]
    kernels = [np.asarray(h.fc.kernel[...]) for h in runs]
    np.testing.assert_array_equal(kernels[0], kernels[1])
    self.assertFalse(np.array_equal(kernels[0], kernels[2]))


class DataTest(absltest.TestCase):

  def test_answer_rows_mask_the_answers(self):
    tokens, mask = et.answer_rows([[5, 6, 7], [1, 2, 3, 4, 5]], [[8, 9], [6, 7, 8]], seq_len=6)
    np.testing.assert_array_equal(tokens, [[5, 6, 7, 8, 9, 0], [3, 4, 5, 6, 7, 8]])
    np.testing.assert_array_equal(mask, [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]])

  def test_answers_are_the_targets_greedy_continuations(self):
    prompts, tokens, mask = rows()
    out = sj.generate(random_transformer(CONFIG, 0), prompts[:2], max_new_tokens=SEQ - 4)
    for i in range(2):
      np.testing.assert_array_equal(tokens[i][mask[i]], np.asarray(out.tokens[i]))

  def test_draft_vocabulary_is_the_most_frequent_answer_tokens(self):
    tokens = np.array([[1, 1, 1, 2, 2, 3, 9, 9, 9, 9]])
    mask = np.array([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1]], bool)  # one 1 and no more in the answers
    np.testing.assert_array_equal(et.draft_vocabulary(tokens, mask, 2, 16), [2, 9])
    np.testing.assert_array_equal(et.draft_vocabulary(tokens, mask, 4, 16), [1, 2, 3, 9])
    np.testing.assert_array_equal(et.draft_vocabulary(tokens, None, 2, 16), [1, 9])

  def test_batches_are_seeded_and_follow_the_weights(self):
    p = np.array([0, 0, 1, 1, 1, 1, 0, 0, 0, 0]) / 4
    rows = head_loop.batch_rows(0, 3, 10, 4, p)
    np.testing.assert_array_equal(rows, [2, 3, 4, 5])
    np.testing.assert_array_equal(head_loop.batch_rows(5, 7, 10, 4),
                                  head_loop.batch_rows(5, 7, 10, 4))
    self.assertLen(set(head_loop.batch_rows(5, 7, 10, 4)), 4)

  def test_features_are_cached_and_reused(self):
    target = random_transformer(CONFIG, 0)
    tokens = rows()[1][:5]
    layers = new_head("eagle3").target_features(CONFIG) + ("normed",)
    with tempfile.TemporaryDirectory() as d:
      first = eagle_data.extract_features(target, tokens, layers, batch_size=4, cache_dir=d)
      with mock.patch.object(eagle_data, "_feature_pass", side_effect=AssertionError):
        again = eagle_data.extract_features(target, tokens, layers, batch_size=4, cache_dir=d)
    np.testing.assert_array_equal(first.view(np.uint16), again.view(np.uint16))
    self.assertEqual(first.shape, (5, SEQ, 4, CONFIG.hidden_size))
    cache = init_cache(CONFIG, 5, SEQ)
    want = target(jnp.asarray(tokens), cache, features=layers)[2]
    np.testing.assert_allclose(np.asarray(first, np.float32), want, atol=0.05, rtol=0.02)


class ErrorsTest(absltest.TestCase):

  def test_bad_inputs_are_refused_by_name(self):
    _, tokens, mask = rows()
    target = random_transformer(CONFIG, 0)
    cases = [(dict(steps=0), "steps must be >= 1, got 0"),
             (dict(ttt_steps=0), "ttt_steps must be >= 1, got 0"),
             (dict(eval_rows=len(tokens)), f"eval_rows {len(tokens)} must leave")]
    for kwargs, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        et.train_eagle(target, new_head("eagle3"), tokens, mask, **kwargs)
    with self.assertRaisesRegex(ValueError, "weights must be 24 non-negative numbers"):
      et.train_eagle(target, new_head("eagle3"), tokens, mask, eval_rows=4, weights=[1.0, 2.0])
    with self.assertRaisesRegex(ValueError, "rows of 4 tokens are too short for 3 TTT step"):
      et.train_eagle(target, new_head("eagle3"), tokens[:, :4], mask[:, :4], ttt_steps=3)
    with self.assertRaisesRegex(ValueError, "draft vocabulary size 17 must be in 1..16"):
      et.draft_vocabulary(tokens, mask, 17, 16)
    with self.assertRaisesRegex(ValueError, "seq_len 2 is too short"):
      et.answer_rows([[1]], [[2]], 2)
    with self.assertRaisesRegex(ValueError,
                                "head kind must be 'eagle', 'eagle3' or 'mtp', got 'x'"):
      et.init_eagle_head(target, "x")


if __name__ == "__main__":
  absltest.main()
