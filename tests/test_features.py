"""Target features through the proposer protocol (DESIGN.md §6): the hidden states the loop hands
a proposer that declares ``features`` equal those of one full forward at those layers, after the
prefill, chains, trees (compacted paths) and rollbacks; a stale-features control fails the same
check; proposers without features compile to the same program.

The mechanism (``Recorded``, ``Recorder``, ``mismatch``) wraps any proposer: one without features
of its own (a draft chain or tree) is handed ``FEATURES``; one with (an EAGLE head's,
``tests/test_eagle3.py``) is handed its own, which the recorder passes on."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from flax import nnx

import specjax as sj
from specjax.models.kv_cache import init_cache
from specjax.models.transformer import NORMED
from specjax.proposers import base
from specjax.proposers.draft_chain import DraftChain
from specjax.proposers.draft_tree import DraftTree

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests.test_speculative import GREEDY_PROMPTS, TF_CONFIG, noisy_copy, random_transformer
except ImportError:  # pragma: no cover
  from test_speculative import GREEDY_PROMPTS, TF_CONFIG, noisy_copy, random_transformer

FEATURES = (0, -1)  # after the first block; the last block's output (before the final norm)
TOL = 1e-5


@dataclasses.dataclass(frozen=True)
class Recorder:
  """Wraps a proposer, declares its features (``FEATURES`` if it has none) and sends each
  committed position's handed features to the host (``records``): (row, position, float[F, E]).
  ``stale``: records the previous pass's features instead (the control)."""

  inner: Any  # a proposer (DraftChain, DraftTree, an EAGLE proposer, ...)
  stale: bool = False

  @property
  def features(self) -> tuple:
    return base.features(self.inner) or FEATURES

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def prefill(self, params, prompt, prompt_lengths, cache_length, features):
    positions = jnp.broadcast_to(jnp.arange(prompt.shape[1]), prompt.shape)
    _send(positions, positions < prompt_lengths[:, None], features)
    shape = (prompt.shape[0], 1 + self.inner.num_candidates) + features.shape[2:]
    first = jnp.broadcast_to(features[:, :1], shape)  # "the previous pass" of the first commit
    own = (features,) if base.features(self.inner) else ()
    return self.inner.prefill(params, prompt, prompt_lengths, cache_length, *own), first

  def propose(self, params, state, pending, keys, sampling):
    candidates, inner = self.inner.propose(params, state[0], pending, keys, sampling)
    return candidates, (inner, state[1])

  def commit(self, params, state, candidates, outcome):
    o = outcome
    feats = o.features
    if self.stale:  # the previous pass's features (the prefill's first ones at the start)
      feats = state[1]
    depth = o.path.shape[1]
    j = jnp.arange(depth + 1)[None, :]
    rows = jnp.concatenate([jnp.zeros_like(o.path[:, :1]), 1 + jnp.maximum(o.path, 0)], axis=1)
    on_path = jnp.take_along_axis(feats, rows[:, :, None, None], axis=1)  # [B, D + 1, F, E]
    _send(o.target_length[:, None] + j, (j <= o.num_accepted[:, None]) & o.active[:, None],
          on_path)
    return self.inner.commit(params, state[0], candidates, o), o.features


@dataclasses.dataclass(frozen=True)
class Recorded:
  """A method whose proposer, ``make(target) -> (proposer, params)`` (e.g. another method's
  ``proposer``), is wrapped in a ``Recorder``."""

  make: Callable
  stale: bool = False

  def validate(self, target, width, max_new_tokens, what):
    del target, width, max_new_tokens, what

  def proposer(self, target):
    inner, params = self.make(target)
    return Recorder(inner, self.stale), params


RECORDS: list = []


def _send(positions, valid, features):
  jax.debug.callback(lambda *a: RECORDS.append(tuple(map(np.asarray, a))), positions, valid,
                     features)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _full_features(graphdef, state, tokens, features):
  model = nnx.merge(graphdef, state)
  return model(tokens, init_cache(model.config, tokens.shape[0], tokens.shape[1]),
               features=features)[2]


def run_recorded(target, method: Recorded, prompts, sampling, max_new_tokens: int = 12, **kwargs):
  """(``sj.generate``'s output, ``mismatch``) of ``method`` (its records cleared first)."""
  RECORDS.clear()
  out = sj.generate(target, prompts, method, sampling=sampling, max_new_tokens=max_new_tokens,
                    key=jax.random.key(3), **kwargs)
  jax.effects_barrier()
  return out, mismatch(target, prompts, out, method.proposer(target)[0].features)


def mismatch(target, prompts, out, features=FEATURES) -> float:
  """Largest difference between the recorded features and one full forward's at ``features``."""
  graphdef, state = nnx.split(target)
  worst, seen = 0.0, 0
  for b, prompt in enumerate(prompts):
    tokens = np.asarray(list(prompt) + [t for t in np.asarray(out.tokens[b]) if t >= 0], np.int32)
    full = np.asarray(_full_features(graphdef, state, tokens[None], tuple(features)))[0]
    for positions, valid, feats in RECORDS:
      for j in np.flatnonzero(valid[b] & (positions[b] < len(tokens) - 1)):
        worst = max(worst, float(np.abs(feats[b, j] - full[positions[b, j]]).max()))
        seen += 1
  assert seen > len(prompts), "nothing recorded"
  return worst


class FeaturesTest(parameterized.TestCase):

  def mismatch_of(self, inner, stale=False, sampling=sj.Sampling(1.0)):
    target = random_transformer(TF_CONFIG, 0)
    graphdef, params = nnx.split(noisy_copy(TF_CONFIG, 1, 0.4))
    method = Recorded(lambda target: (inner(graphdef), params), stale)
    out, worst = run_recorded(target, method, GREEDY_PROMPTS, sampling)
    self.assertGreater(int(out.stats.target_calls), 2)
    return worst

  @parameterized.named_parameters(
      ("chain", lambda g: DraftChain(graphdef=g, gamma=3)),
      ("tree", lambda g: DraftTree(graphdef=g, tree=sj.Tree.full(depth=2, branching=2))))
  def test_equal_full_forward(self, inner):
    self.assertLess(self.mismatch_of(inner), TOL)

  def test_stale_features_are_caught(self):
    self.assertGreater(self.mismatch_of(lambda g: DraftChain(graphdef=g, gamma=3), stale=True),
                       1e-2)

  def test_layer_indices(self):
    target = random_transformer(TF_CONFIG, 0)
    tokens = jnp.asarray([[1, 2, 3]], jnp.int32)
    cache = init_cache(TF_CONFIG, 1, 3)
    logits, _, hidden = target(tokens, cache, features=(-1, 1, 0))
    self.assertEqual(hidden.shape, (1, 3, 3, TF_CONFIG.hidden_size))
    np.testing.assert_array_equal(hidden[:, :, 0], hidden[:, :, 1])  # -1 is the last (1)
    np.testing.assert_allclose(target.project(target.final_norm(hidden[:, :, 0])), logits,
                               atol=1e-5)
    _, _, normed = target(tokens, cache, features=(NORMED, -1), logits_at=2)
    np.testing.assert_allclose(normed[:, :, 0], target.final_norm(hidden[:, :, 0]), atol=1e-6)
    self.assertLen(target(tokens, cache), 2)  # no features: the plain (logits, cache)
    with self.assertRaisesRegex(ValueError, r"feature layer 2 is not a layer of the 2-layer "):
      target(tokens, cache, features=(2,))


if __name__ == "__main__":
  absltest.main()
