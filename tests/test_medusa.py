"""``sj.Medusa`` (Medusa heads, ``specjax.heads.medusa``) through the real loop: greedy exactness
(chains, trees, typical acceptance at T = 0), oracle heads that reach depth + 1 tokens per call
(and a commit that reads the wrong feature, which they catch), the law harness with a mutation
control, typical acceptance by enumeration (its deviation from the target's law computed
exactly), the released trees, the published layout both ways against a NumPy forward, errors."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
import pytest
from flax import nnx

import specjax as sj
from specjax.decoding import head_methods
from specjax.heads.medusa import init_medusa, start_from_target
from specjax.models.kv_cache import init_cache
from specjax.models.transformer import NORMED
from specjax.proposers import medusa as medusa_lib
from specjax.verify import typical as typical_lib

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck, test_train_eagle
  from tests.test_laws import LAW_CONFIG, law_transformer, patched
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed,
                                      greedy_reference, random_transformer, truncate_at_eos)
except ImportError:  # pragma: no cover
  import lawcheck
  import test_train_eagle
  from test_laws import LAW_CONFIG, law_transformer, patched
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed, greedy_reference,
                                random_transformer, truncate_at_eos)

S = sj.Sampling
TRAIN_CONFIG = test_train_eagle.CONFIG
train_rows = test_train_eagle.rows
TREE = sj.Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
SMALL_TREE = sj.Tree.from_paths([(0,), (1,), (0, 0)])


def random_heads(config: sj.ModelConfig, seed: int, num_heads: int = 3, scale: float = 8.0,
                 **kwargs):
  """Random Medusa heads whose matrices are x ``scale`` (drafts that depend on the feature)."""
  heads = init_medusa(config, num_heads, key=seed, **kwargs)
  nnx.update(heads, jax.tree.map(lambda x: x * scale if x.ndim == 2 else x,
                                 nnx.state(heads, nnx.Param)))
  return heads


def oracle_pair(seed: int = 0):
  """(target, heads): a one-layer target whose attention output is zero, so its normed state
  and greedy next token at a position depend on that position's token alone (``f``), and Medusa
  heads that guess ``f^(k+2)`` exactly: identity blocks and projections solving
  ``H W = 10 onehot(f^(k+2))`` over the V tokens' states H (hidden size 32 >= V = 16)."""
  config = dataclasses.replace(TF_CONFIG, num_layers=1)
  target = nnx.clone(random_transformer(config, seed))
  o = target.layers[0].attn.o.kernel
  o.set_value(jnp.zeros_like(o.get_value()))
  v = config.vocab_size
  tokens = jnp.arange(v, dtype=jnp.int32)[None]
  _, _, feats = target(tokens, init_cache(config, 1, v), features=(NORMED,))
  states = np.asarray(feats[0, :, 0], np.float64)  # [V, E]
  nxt = np.argmax(states @ np.asarray(target.lm_head.get_value(), np.float64), axis=1)
  heads = start_from_target(init_medusa(config, num_heads=3, key=seed), target)
  ahead = nxt[nxt]  # f(f(x)): head 0's token
  for lm_head in heads.lm_heads:
    w = np.linalg.pinv(states) @ (10.0 * np.eye(v)[ahead])
    lm_head.set_value(jnp.asarray(w, jnp.float32))
    ahead = nxt[ahead]
  return target, heads


class GreedyTest(parameterized.TestCase):
  """At temperature 0 Medusa returns the Autoregressive tokens exactly, whatever the heads."""

  @parameterized.named_parameters(
      ("chain1", dict(gamma=1)), ("chain3", dict(gamma=3)),
      ("tree_sampled", dict(tree=TREE)), ("tree_top_k", dict(tree=TREE, children="top_k")),
      ("typical_chain", dict(verify="typical")), ("typical_tree", dict(tree=TREE, verify="typical")),
      ("shared_lm_head", dict(gamma=2, own_lm_head=False)))
  def test_matches_autoregressive(self, kwargs):
    kwargs = dict(kwargs)
    heads = random_heads(TF_CONFIG, 1, own_lm_head=kwargs.pop("own_lm_head", True))
    target = random_transformer(TF_CONFIG, 0)
    out = sj.generate(target, GREEDY_PROMPTS, sj.Medusa(heads, **kwargs),
                      max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(out.tokens, greedy_reference(TF_CONFIG, GREEDY_NEW))
    self.assertEqual(int(out.stats.draft_calls), int(out.stats.target_calls) - 1)
    self.assertEqual(out.stats.verifier, "exact")

  def test_eos(self):
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    eos = int(expected[2, 1])
    out = sj.generate(target, GREEDY_PROMPTS, sj.Medusa(random_heads(TF_CONFIG, 1), tree=TREE),
                      max_new_tokens=GREEDY_NEW, eos_token_id=eos)
    np.testing.assert_array_equal(out.tokens, truncate_at_eos(expected, eos))

  def test_oracle_heads_accept_everything_and_catch_a_wrong_feature(self):
    """Oracle heads have every draft accepted (chain and tree, ragged batch): depth + 1 tokens
    per call. A commit that keeps the pending token's state instead of the last accepted one's
    (the mutation) stays token-exact but loses acceptance."""
    target, heads = oracle_pair()
    new = 13
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, TF_CONFIG.vocab_size, n)) for n in (1, 5, 9)]
    ar = sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=new)
    methods = (sj.Medusa(heads, gamma=3), sj.Medusa(heads, tree=TREE, children="top_k"))
    for method in methods:
      out = sj.generate(target, prompts, method, max_new_tokens=new)
      np.testing.assert_array_equal(out.tokens, ar.tokens)
      self.assertEqual(int(out.stats.target_calls), 1 + -(-(new - 1) // (method.gamma + 1)))
    # gamma 2: the pending token's state is 3 tokens behind, which this target's greedy 3-cycle
    # would hide at gamma 3 (a row-0 state 4 behind guesses the same tokens there).
    wrong = lambda o: o.features[:, 0]  # always the pending token's row
    with patched(((medusa_lib, "last_feature", wrong),)):
      mutant = sj.generate(target, prompts, sj.Medusa(heads, gamma=2), max_new_tokens=new)
    np.testing.assert_array_equal(mutant.tokens, ar.tokens)
    self.assertGreater(int(mutant.stats.target_calls), 1 + -(-(new - 1) // 3))


class ShiftedQChain(medusa_lib.MedusaChain):
  """A mutant: draft i is drawn from head i's law but verified against head i + 1's."""

  def propose(self, params, state, pending, keys, sampling):
    candidates, state = super().propose(params, state, pending, keys, sampling)
    law = sj.sampling.probabilities(self.logits(params, state), sampling)
    return candidates.replace(q=jnp.roll(law, -1, axis=1)[:, :self.gamma]), state


class LawTest(absltest.TestCase):

  def test_sampled_chain_and_a_shifted_law(self):
    gamma = 2
    law = functools.lru_cache(lawcheck.transformer_law)  # one exact law for both runs
    run = lambda name: lawcheck.check_law(
        law_transformer(), sj.Medusa(random_heads(LAW_CONFIG, 3, num_heads=3), gamma=gamma),
        S(1.0), [(3, 1, 4, 1, 5)], gamma + 3, seed=_seed(name), exact_law=law)
    clean = run("medusa_chain")
    self.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
    counts = np.asarray(clean.out.stats.accepted_length_counts)
    self.assertTrue(np.all(counts > 0), msg=str(counts))
    with patched(((head_methods, "MedusaChain", ShiftedQChain),)):
      mutant = run("medusa_shifted")
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())

  @pytest.mark.slow  # ~16 s; the sampled chain's law stays in the default run
  def test_sampled_tree(self):
    result = lawcheck.check_law(law_transformer(),
                                sj.Medusa(random_heads(LAW_CONFIG, 3, num_heads=2),
                                          tree=SMALL_TREE),
                                S(1.0), [(3, 1, 4, 1, 5)], SMALL_TREE.max_depth + 3,
                                seed=_seed("medusa_tree"), exact_law=lawcheck.transformer_law)
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    counts = np.asarray(result.out.stats.accepted_length_counts)
    self.assertTrue(np.all(counts > 0), msg=str(counts))


def numpy_typical(p: np.ndarray, tokens, tree: sj.Tree, eps: float, delta: float):
  """An independent typical acceptance (the Medusa repository's candidate paths): (accepted
  path as node list, the row of ``p`` the next token is drawn from)."""
  h = -np.sum(p * np.log(p + 1e-5), axis=-1)
  thr = np.minimum(eps, delta * np.exp(-h))
  best, best_key = [], None
  for node in range(tree.num_nodes):
    path = [j for j in range(tree.num_nodes) if tree.ancestor_mask[node, j]]
    rows = [0] + [j + 1 for j in path[:-1]]
    probs = [p[r, tokens[j]] for r, j in zip(rows, path)]
    if all(pr > thr[r] for pr, r in zip(probs, rows)):
      key = (len(path), np.sum(np.log(probs)))
      if best_key is None or key[0] > best_key[0] or (key[0] == best_key[0] and
                                                       key[1] > best_key[1] + 1e-6):
        best, best_key = path, key
  return best, (best[-1] + 1 if best else 0)


def typical_law(table: np.ndarray, prompt_last: int, heads: np.ndarray, gamma: int, n: int,
                typical: typical_lib.Typical) -> np.ndarray:
  """float64[V]*n: the exact law of the first ``n`` tokens of Medusa with typical acceptance on
  the bigram law ``table`` [V, V] (already warped), chain drafts ``heads[k][x]`` (head k's
  deterministic guess from the token ``x`` whose position produced ``pending``), enumerated;
  the acceptance decisions come from ``typical_lib.typical_core``."""
  v = table.shape[0]
  chain = sj.Tree.chains(num=1, depth=gamma)
  core = jax.jit(lambda p, t: typical_lib.typical_core(p, t, chain, typical))
  law = np.zeros((v,) * n)

  def walk(prefix: tuple, prob: float, before: int):  # before: the token before the last
    if len(prefix) >= n:
      law[prefix[:n]] += prob
      return
    pending = prefix[-1]
    drafts = [int(heads[k][before]) for k in range(gamma)]
    p = np.stack([table[t] for t in [pending] + drafts])
    c = core(jnp.asarray(p, jnp.float32), jnp.asarray(drafts, jnp.int32))
    acc = drafts[:int(c.num_accepted)]
    nxt = np.asarray(c.next_dist, np.float64)
    for y in np.flatnonzero(nxt > 0):
      tokens = tuple(acc) + (int(y),)
      seq = prefix + tokens
      walk(seq, prob * nxt[y], seq[-2])

  first = table[prompt_last]
  for x in np.flatnonzero(first > 0):
    walk((int(x),), first[x], prompt_last)
  return law


def target_law(table: np.ndarray, prompt_last: int, n: int) -> np.ndarray:
  v = table.shape[0]
  law = np.zeros((v,) * n)
  for seq in itertools.product(range(v), repeat=n):
    prob, last = 1.0, prompt_last
    for t in seq:
      prob, last = prob * table[last, t], t
    law[seq] = prob
  return law


class TypicalTest(absltest.TestCase):

  def test_rule_matches_an_independent_implementation(self):
    rng = np.random.default_rng(0)
    typical = typical_lib.Typical()
    core = jax.jit(lambda p, t: typical_lib.typical_core(p, t, TREE, typical))
    for _ in range(40):
      p = rng.dirichlet(np.full(6, 0.3), size=TREE.num_nodes + 1)
      tokens = rng.integers(0, 6, TREE.num_nodes)
      path, row = numpy_typical(p, tokens, TREE, typical.epsilon, typical.delta)
      c = core(jnp.asarray(p, jnp.float32), jnp.asarray(tokens, jnp.int32))
      self.assertEqual(int(c.num_accepted), len(path))
      np.testing.assert_array_equal(np.asarray(c.path)[:len(path)], path)
      np.testing.assert_allclose(np.asarray(c.next_dist), p[row], rtol=1e-6)

  def test_output_law_by_enumeration(self):
    """The exact law of 4 tokens on a bigram table: released defaults deviate (lossy, TV
    printed); a threshold above every probability is exact; low temperature approaches the
    target's law (the paper's limit)."""
    rng = np.random.default_rng(1)
    v, gamma, n = 4, 2, 4
    logits = rng.normal(0, 1.5, (v, v))
    heads = rng.integers(0, v, (gamma, v))
    warp = lambda t: np.asarray(jax.nn.softmax(jnp.asarray(logits) / t, axis=-1), np.float64)
    tv = lambda t, typ: 0.5 * np.abs(typical_law(warp(t), 0, heads, gamma, n, typ)
                                     - target_law(warp(t), 0, n)).sum()
    released = tv(1.0, typical_lib.Typical())
    print(f"typical acceptance (epsilon 0.09, delta 0.3), total variation from the target's "
          f"law over {n} tokens, V = {v}: {released:.4f} at T = 1")
    self.assertGreater(released, 0.01)
    self.assertLess(tv(1.0, typical_lib.Typical(epsilon=1.0, delta=1e9)), 1e-12)
    cold = [tv(t, typical_lib.Typical()) for t in (0.3, 0.1)]
    self.assertLess(cold[1], cold[0])
    self.assertLess(cold[1], 1e-3)

  def test_the_loop_labels_a_typical_run_lossy(self):
    target = random_transformer(TF_CONFIG, 0)
    heads = random_heads(TF_CONFIG, 1)
    out = sj.generate(target, GREEDY_PROMPTS, sj.Medusa(heads, tree=TREE, verify="typical"),
                      sampling=S(1.0), key=jax.random.key(0), max_new_tokens=GREEDY_NEW)
    summary = out.stats.summary()
    self.assertFalse(summary["lossless"])
    self.assertIn("lossy", summary["verifier"])
    exact = sj.generate(target, GREEDY_PROMPTS, sj.Medusa(heads, tree=TREE), sampling=S(1.0),
                        key=jax.random.key(0), max_new_tokens=GREEDY_NEW)
    self.assertTrue(exact.stats.summary()["lossless"])


class TreeTest(absltest.TestCase):

  def test_released_trees(self):
    tree = sj.Tree.medusa()
    self.assertEqual((tree.num_nodes, tree.max_depth), (63, 4))
    self.assertEqual(sj.Tree.medusa("vicuna_7b_stage2").num_nodes, 63)
    with self.assertRaisesRegex(ValueError, "unknown Medusa tree 'nope'"):
      sj.Tree.medusa("nope")

  def test_greedy_construction(self):
    acc = [[0.6, 0.1, 0.05], [0.4, 0.1, 0.05], [0.3, 0.1, 0.05]]
    tree = sj.Tree.from_accuracies(acc, 6)  # values .6 .24 .1 .072 .06 .05 (then .04)
    self.assertEqual(tree, sj.Tree.from_paths([(0,), (0, 0), (1,), (0, 0, 0), (0, 1), (2,)]))
    with self.assertRaisesRegex(ValueError, "probabilities in"):
      sj.Tree.from_accuracies([[1.5]], 1)
    with self.assertRaisesRegex(ValueError, "exceeds"):
      sj.Tree.from_accuracies([[0.5, 0.2]], 3)


def published(path: str, config: sj.ModelConfig, heads: int, layers: int, pickled=False):
  """Random heads written in the Medusa repository's layout; returns the tensors."""
  rng = np.random.default_rng(0)
  e, v = config.hidden_size, config.vocab_size
  r = lambda *shape: (0.2 * rng.standard_normal(shape)).astype(np.float32)
  tensors = {}
  for k in range(heads):
    for j in range(layers):
      tensors[f"{k}.{j}.linear.weight"], tensors[f"{k}.{j}.linear.bias"] = r(e, e), r(e)
    tensors[f"{k}.{layers}.weight"] = r(v, e)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"medusa_num_heads": heads, "medusa_num_layers": layers,
               "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}, f)
  if pickled:
    import torch
    torch.save({k: torch.from_numpy(t.copy()) for k, t in tensors.items()},
               os.path.join(path, "medusa_lm_head.pt"))
  else:
    from safetensors.numpy import save_file
    save_file(tensors, os.path.join(path, "medusa_lm_head.safetensors"))
  return tensors


def numpy_medusa(tensors: dict, heads: int, layers: int, x: np.ndarray) -> np.ndarray:
  """[K, V] the heads' logits of one normed state x [E], from the torch-layout tensors."""
  silu = lambda z: z / (1 + np.exp(-z))
  out = []
  for k in range(heads):
    h = np.asarray(x, np.float64)
    for j in range(layers):
      h = h + silu(h @ tensors[f"{k}.{j}.linear.weight"].T + tensors[f"{k}.{j}.linear.bias"])
    out.append(h @ tensors[f"{k}.{layers}.weight"].T)
  return np.stack(out)


class LayoutTest(parameterized.TestCase):

  @parameterized.parameters((False,), (True,))
  def test_load_published_and_round_trip(self, pickled):
    with tempfile.TemporaryDirectory() as tmp:
      tensors = published(os.path.join(tmp, "in"), TF_CONFIG, 3, 2, pickled)
      heads = sj.load_head(os.path.join(tmp, "in"))
      self.assertEqual((heads.config.num_heads, heads.config.num_layers), (3, 2))
      x = np.random.default_rng(1).standard_normal(TF_CONFIG.hidden_size).astype(np.float32)
      target = random_transformer(TF_CONFIG, 0)
      np.testing.assert_allclose(np.asarray(heads.logits(jnp.asarray(x), target)),
                                 numpy_medusa(tensors, 3, 2, x), rtol=1e-4, atol=1e-4)
      sj.save_head(heads, os.path.join(tmp, "out"))
      from safetensors.numpy import load_file
      written = load_file(os.path.join(tmp, "out", "medusa_lm_head.safetensors"))
      self.assertEqual(sorted(written), sorted(tensors))
      for name, value in tensors.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
      with open(os.path.join(tmp, "out", "config.json")) as f:
        config = json.load(f)
      self.assertEqual((config["medusa_num_heads"], config["medusa_num_layers"]), (3, 2))

  def test_errors(self):
    with tempfile.TemporaryDirectory() as tmp:
      tensors = published(tmp, TF_CONFIG, 2, 1)
      from safetensors.numpy import save_file
      del tensors["1.1.weight"]
      save_file(tensors, os.path.join(tmp, "medusa_lm_head.safetensors"))
      with self.assertRaisesRegex(ValueError, "missing tensor '1.1.weight'"):
        sj.load_head(tmp)
      os.remove(os.path.join(tmp, "medusa_lm_head.safetensors"))
      with self.assertRaisesRegex(FileNotFoundError, "medusa_lm_head.safetensors"):
        sj.load_head(tmp)


class TrainTest(parameterized.TestCase):
  """``specjax.training.medusa`` on the tiny target's own answers (``test_train_eagle.rows``)."""

  @parameterized.named_parameters(("soft_shared", "soft", False), ("hard_own", "hard", True))
  def test_loss_falls_and_acceptance_rises(self, labels, own_lm_head):
    from specjax.training import medusa as mt
    prompts, tokens, mask = train_rows()
    target = random_transformer(TRAIN_CONFIG, 0)
    held_out = prompts[-4:]
    untrained = mt.init_medusa_heads(target, num_heads=2, own_lm_head=own_lm_head)
    before = mt.medusa_acceptance(target, untrained, held_out, max_new_tokens=16)
    heads, report = mt.train_medusa(target, untrained, tokens, mask, eval_rows=4, steps=60,
                                    batch_size=8, lr=1e-2, warmup_steps=5, log_every=10,
                                    labels=labels, loss_vocab=12, eval_prompts=held_out,
                                    eval_new_tokens=16)
    first, last = report["history"][0], report["history"][-1]
    self.assertLess(last["loss"], 0.95 * first["loss"])  # soft labels: the target's entropy floor
    self.assertGreater(last["acc"][0], first["acc"][0] + 0.1)
    self.assertLen(report["agreement"], 2)
    # untrained (the target's own next-token guess): 0.22; soft labels 0.28, hard 0.44 (60 steps)
    self.assertGreater(report["acceptance"]["acceptance_rate"], before["acceptance_rate"] + 0.05)
    with tempfile.TemporaryDirectory() as tmp:  # the trained heads in the released layout
      sj.save_head(heads, tmp)
      again = sj.load_head(tmp)
      x = jnp.ones((TRAIN_CONFIG.hidden_size,))
      np.testing.assert_array_equal(again.logits(x, target), heads.logits(x, target))


class ErrorTest(absltest.TestCase):

  def test_bad_methods(self):
    heads = random_heads(TF_CONFIG, 1, num_heads=2)
    target = random_transformer(TF_CONFIG, 0)
    cases = [
        (dict(gamma=3), "gamma 3 exceeds the 2 Medusa heads"),
        (dict(tree=TREE), "depth 3 exceeds the 2 Medusa heads"),
        (dict(verify="loose"), "verify must be one of"),
        (dict(verify="typical", epsilon=-1.0), "epsilon must be a finite number >= 0"),
        (dict(tree=sj.DynamicTree(2, 2, 4)), "static sj.Tree"),
        (dict(gamma=1, tree=SMALL_TREE), "not both"),
    ]
    for kwargs, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        sj.Medusa(heads, **kwargs)
    with self.assertRaisesRegex(ValueError, "heads must be Medusa heads"):
      sj.Medusa(target)
    wide = random_heads(dataclasses.replace(TF_CONFIG, hidden_size=16), 1)
    with self.assertRaisesRegex(ValueError, "hidden size 16 differs from the target's 32"):
      sj.generate(target, GREEDY_PROMPTS, sj.Medusa(wide), max_new_tokens=4)


if __name__ == "__main__":
  absltest.main()
