"""``sj.SelfSpeculative``: the target drafts for itself with some layers skipped (Draft & Verify,
Zhang et al. 2023, arXiv 2309.08168; SWIFT, Xia et al. 2024, arXiv 2410.06916).

1. The draft view (``skip_layers``): the target's own arrays, not copies (no new device buffer),
   a cache for the kept layers only, and the logits of the target whose skipped blocks add nothing
   to the residual stream.
2. Greedy exactness through the real loop: ``SelfSpeculative`` returns ``Autoregressive``'s tokens
   on a ragged batch, and with a per-row EOS those tokens cut after each row's first EOS; a skip
   that changes the draft accepts some drafts but not all, and another of its size reuses its
   compilation; ``skip=()`` accepts every draft (gamma + 1 tokens per iteration).
3. The sampled law (T = 1) through the law harness (``tests/lawcheck.py``, chi-square floor 1e-6).
4. Bad skips and gammas: one-line ``ValueError``s naming the value, before anything compiles.

The models are ``tests/test_speculative.py``'s and ``tests/test_laws.py``'s tiny random
transformers (2 layers, so that one skipped layer is half the model).
"""

from __future__ import annotations

import jax
import numpy as np
from absl.testing import absltest, parameterized
from flax import nnx

import specjax as sj
from specjax.decoding import loop
from specjax.models.kv_cache import init_cache
from specjax.models.layer_skip import skip_layers

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, tabular
  from tests.test_laws import PROMPT_A, _seed, law_transformer
  from tests.test_speculative import (GREEDY_PROMPTS, TF_CONFIG, check_stats, random_transformer,
                                      truncate_at_eos)
except ImportError:  # pragma: no cover
  import lawcheck
  import tabular
  from test_laws import PROMPT_A, _seed, law_transformer
  from test_speculative import (GREEDY_PROMPTS, TF_CONFIG, check_stats, random_transformer,
                                truncate_at_eos)

GAMMA = 3
NEW = 13  # 12 tokens after the prefill: three whole iterations of gamma + 1 when all are accepted
SKIP = (1,)  # on TF_CONFIG's target: greedy acceptance ~0.7 on GREEDY_PROMPTS


def _leaves(model) -> list:
  return jax.tree.leaves(nnx.state(model))


class DraftViewTest(absltest.TestCase):

  def test_view_shares_the_target_arrays(self):
    target = random_transformer(TF_CONFIG, 0)
    before = {id(a) for a in jax.live_arrays()}
    view = skip_layers(target, (0,))
    _, params = sj.SelfSpeculative(skip=(0,)).proposer(target)
    self.assertEqual(view.config.num_layers, 1)
    self.assertEqual(target.config.num_layers, 2)  # the target is left as it was
    self.assertLen(target.layers, 2)
    self.assertIs(view.layers[0].attn.q.kernel.get_value(),
                  target.layers[1].attn.q.kernel.get_value())
    self.assertIs(view.embed.get_value(), target.embed.get_value())
    self.assertIs(view.lm_head.get_value(), target.lm_head.get_value())
    target_ids = {id(a) for a in _leaves(target)}
    for leaves in (_leaves(view), jax.tree.leaves(params)):
      self.assertTrue(all(id(a) in target_ids for a in leaves))
    # No device buffer was allocated for the view: it holds no weight of its own.
    self.assertLessEqual({id(a) for a in jax.live_arrays()}, before)
    self.assertLen(init_cache(view.config, 2, 8).k, 1)  # a cache for the kept layer only

  def test_view_is_the_target_with_the_skipped_blocks_adding_nothing(self):
    target = random_transformer(TF_CONFIG, 0)
    # A copy of the target whose block 1 adds zero to the residual stream: x + 0 + 0 = x.
    bypass = nnx.clone(target)
    for kernel in (bypass.layers[1].attn.o.kernel, bypass.layers[1].mlp.down.kernel):
      kernel.set_value(kernel.get_value() * 0)
    tokens = np.array([GREEDY_PROMPTS[0]])
    np.testing.assert_allclose(sj.forward(skip_layers(target, (1,)), tokens),
                               sj.forward(bypass, tokens), atol=1e-6)


class GreedyTest(absltest.TestCase):

  def test_matches_autoregressive_with_and_without_eos(self):
    target = random_transformer(TF_CONFIG, 0)
    method = sj.SelfSpeculative(skip=SKIP, gamma=GAMMA)
    ar = sj.generate(target, GREEDY_PROMPTS, sj.Autoregressive(), max_new_tokens=NEW)
    out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=NEW)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    check_stats(self, out, GAMMA)
    self.assertBetween(out.stats.acceptance_rate, 0.1, 0.9)  # the skip changes the draft
    # Another skip set of the same size: the same graph, so no new compilation.
    compiled = loop.decode_jit._cache_size()
    other = sj.generate(target, GREEDY_PROMPTS, sj.SelfSpeculative(skip=(0,), gamma=GAMMA),
                        max_new_tokens=NEW)
    np.testing.assert_array_equal(other.tokens, ar.tokens)
    self.assertNotEqual(other.stats.acceptance_rate, out.stats.acceptance_rate)
    self.assertEqual(loop.decode_jit._cache_size(), compiled)
    # An EOS that ends some rows (not at their first token) and not others.
    expected = np.asarray(ar.tokens)
    eos = next(t for t in range(TF_CONFIG.vocab_size)
               if 0 < np.any(expected[:, 1:] == t, axis=1).sum() < len(expected)
               and not np.any(expected[:, 0] == t))
    # What Autoregressive(eos_token_id=eos) returns (tests/test_generate.py checks that; not run
    # here to save a loop compilation): the greedy tokens cut after the first EOS.
    expected = truncate_at_eos(expected, eos)
    out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=NEW, eos_token_id=eos)
    np.testing.assert_array_equal(out.tokens, expected)
    np.testing.assert_array_equal(out.lengths, (expected >= 0).sum(1))
    self.assertLess(int(out.lengths.min()), NEW)
    check_stats(self, out, GAMMA)

  def test_no_skip_accepts_every_draft(self):
    target = random_transformer(TF_CONFIG, 0)
    ar = sj.generate(target, GREEDY_PROMPTS, sj.Autoregressive(), max_new_tokens=NEW)
    out = sj.generate(target, GREEDY_PROMPTS, sj.SelfSpeculative(skip=(), gamma=GAMMA),
                      max_new_tokens=NEW)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    check_stats(self, out, GAMMA)
    s = out.stats
    self.assertEqual(s.acceptance_rate, 1.0)
    self.assertEqual(s.expected_alpha, 1.0)
    # Every iteration emits gamma + 1 tokens: the prefill's token, then (NEW - 1) / (GAMMA + 1).
    iterations = np.asarray(s.row_target_calls) - 1
    np.testing.assert_array_equal(iterations, (NEW - 1) // (GAMMA + 1))
    np.testing.assert_array_equal((np.asarray(s.generated) - 1) / iterations, GAMMA + 1)


class SampledLawTest(absltest.TestCase):

  def test_law_at_temperature_1(self):
    target, gamma = law_transformer(), 2
    method = sj.SelfSpeculative(skip=(1,), gamma=gamma)
    result = lawcheck.check_law(target, method, sj.Sampling(1.0), [PROMPT_A], gamma + 3,
                                seed=_seed("self_speculative"), exact_law=lawcheck.transformer_law)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    check_stats(self, result.out, gamma)
    self.assertBetween(result.out.stats.acceptance_rate, 0.3, 0.95)
    counts = np.asarray(result.out.stats.accepted_length_counts)
    self.assertTrue(np.all(counts > 0), msg=f"accepted-length counts {counts}")


class ErrorsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("out_of_range", (2,),
       r"skip index 2 is not a layer of the 2-layer target \(indices 0\.\.1\)"),
      ("negative", (-1,), r"skip index -1 is not a layer"),
      ("not_an_int", (0.5,), r"skip index 0\.5 is not a layer"),
      ("duplicate", (1, 1), r"skip lists layer 1 twice: \(1, 1\)"),
      ("all_layers", (1, 0), r"skip \(1, 0\) leaves none of the target's 2 layers"),
  )
  def test_bad_skip(self, skip, message):
    target = random_transformer(TF_CONFIG, 0)
    compiled = loop.decode_jit._cache_size()
    with self.assertRaisesRegex(ValueError, message):
      sj.generate(target, [[1, 2]], sj.SelfSpeculative(skip=skip), max_new_tokens=3)
    with self.assertRaisesRegex(ValueError, message):
      skip_layers(target, skip)
    self.assertEqual(loop.decode_jit._cache_size(), compiled)  # refused before compiling

  @parameterized.parameters(0, -1, 2.0, True)
  def test_bad_gamma(self, gamma):
    with self.assertRaisesRegex(ValueError, rf"gamma must be an integer >= 1, got {gamma!r}"):
      sj.SelfSpeculative(skip=(0,), gamma=gamma)

  def test_bad_skip_type_and_target(self):
    with self.assertRaisesRegex(ValueError, r"skip must be a sequence of layer indices, got 3"):
      sj.SelfSpeculative(skip=3)
    self.assertEqual(sj.SelfSpeculative(skip=[1, 0]).skip, (1, 0))  # a list is kept, as a tuple
    table = tabular.TabularLM.from_probs(np.full((3, 2), 0.5, np.float32))
    with self.assertRaisesRegex(ValueError, r"skips layers of an sj\.Transformer target, got "
                                r"TabularLM"):
      sj.generate(table, [[1]], sj.SelfSpeculative(), max_new_tokens=2)


if __name__ == "__main__":
  absltest.main()
