"""Sharded decoding (``specjax.sharding``, ``sj.generate(..., mesh=)``) on 8 CPU devices.

Run by ``tests/test_sharding.py`` in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (eight fake devices slow every
single-device test of a process by ~1.3x, so the rest of the suite keeps one); runnable alone:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest -o addopts= tests/sharding_cases.py

1. Sharded == unsharded: tokens and statistics of ``Autoregressive`` and ``Speculative`` on the
   meshes 1x8, 2x4 and 8x1 (sampled at T = 1 with the same key, and greedy), with the draft
   sharded and replicated; SpecTr sampled on 2x4; every other method's greedy tokens on 2x4
   equal to unsharded autoregressive decoding's; logits of one forward within 1e-5.
2. Placement: parameters split as ``RULES`` say (``.sharding`` of the placed arrays, by
   ``shard_model`` and by ``sj.load_model(..., mesh=)``), the
   target's KV cache split per device inside the compiled loop, the tensor-parallel collectives
   (one all-reduce after each attention output and MLP down projection per decoding step) and no
   all-gather of a whole weight.
3. Bad meshes, rules and batches: one-line ``ValueError``s before compilation.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl.testing import absltest, parameterized  # noqa: E402
from flax import nnx  # noqa: E402

import specjax as sj  # noqa: E402
from specjax import sharding  # noqa: E402
from specjax.decoding import loop  # noqa: E402
from specjax.heads.eagle import init_head  # noqa: E402
from specjax.heads.eagle3 import init_head3  # noqa: E402
from specjax.models.transformer import forward  # noqa: E402
from specjax.proposers.base import NoProposer  # noqa: E402

V = 256
# Every split dimension divides 8: heads 8 (GQA 8/4 would not split over model=8), mlp 128,
# vocab 256; the draft has 8 heads of 4.
TARGET = sj.ModelConfig(vocab_size=V, hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=8,
                        intermediate_size=128, max_position_embeddings=128)
GQA = sj.ModelConfig(vocab_size=V, hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=4,
                     intermediate_size=128, max_position_embeddings=128)
DRAFT = sj.ModelConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=8, num_kv_heads=8,
                       head_dim=4, intermediate_size=64, max_position_embeddings=128)
NEW = 12
MESHES = ((1, 8), (2, 4), (8, 1))
T1 = sj.Sampling(temperature=1.0)
GREEDY = sj.Sampling(temperature=0.0)


def _prompts(batch: int = 8) -> list[list[int]]:
  """Ragged prompts, some repeating themselves (prompt lookup and retrieval then propose)."""
  rng = np.random.default_rng(0)
  rows = []
  for i in range(batch):
    head = [int(t) for t in rng.integers(0, V, 2 + i)]
    rows.append(head * (1 + i % 3))
  return rows


def _models():
  return sj.init_model(TARGET, 0), sj.init_model(DRAFT, 1)


def _assert_same(test, sharded, reference):
  np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(reference.tokens))
  np.testing.assert_array_equal(np.asarray(sharded.lengths), np.asarray(reference.lengths))
  for name in ("target_calls", "draft_calls", "accepted", "proposed"):
    np.testing.assert_array_equal(np.asarray(getattr(sharded.stats, name)),
                                  np.asarray(getattr(reference.stats, name)), err_msg=name)
  test.assertTrue(sharded.tokens.sharding.is_fully_replicated)


class ShardedEqualsUnshardedTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    assert jax.device_count() == 8, jax.devices()
    cls.target, cls.draft = _models()
    cls.prompts = _prompts()
    cls.key = jax.random.key(7)
    cls.reference = {}

  def _reference(self, name, method, sampling):
    if name not in self.reference:
      self.reference[name] = sj.generate(self.target, self.prompts, method, sampling, NEW,
                                         key=self.key)
    return self.reference[name]

  # Autoregressive decoding on 2x4 only: the speculative runs drive the same target forward on
  # every mesh.
  @parameterized.parameters(((2, 4), "autoregressive"),
                            *(((m, "speculative") for m in MESHES)))
  def test_sampled(self, mesh, method):
    m = sj.Autoregressive() if method == "autoregressive" else sj.Speculative(self.draft, 3)
    out = sj.generate(self.target, self.prompts, m, T1, NEW, key=self.key,
                      mesh=sharding.make_mesh(*mesh))
    _assert_same(self, out, self._reference(method, m, T1))
    if method == "speculative":
      self.assertGreater(int(out.stats.accepted.sum()), 0)  # the draft's law matters here

  def test_greedy_with_a_replicated_draft(self):
    m = sj.Speculative(self.draft, 2)
    out = sj.generate(self.target, self.prompts, m, GREEDY, NEW, mesh=sharding.make_mesh(2, 4),
                      draft_sharding="replicated")
    _assert_same(self, out, self._reference("speculative_greedy", m, GREEDY))
    ar = self._reference("autoregressive_greedy", sj.Autoregressive(), GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))

  def test_every_method(self):
    """Every other method on 2x4, greedy: each must return the unsharded autoregressive tokens
    (one reference for all; the sampled paths are SpecTr's below and the chain's above)."""
    store = sj.Datastore.build([sum(self.prompts, [])], vocab_size=V)
    methods = {
        "self_speculative": sj.SelfSpeculative(skip=(1,), gamma=2),
        "tree": sj.TreeSpeculative(self.draft, sj.Tree.full(depth=2, branching=2)),
        "dynamic_tree": sj.TreeSpeculative(self.draft, sj.DynamicTree(depth=2, width=2,
                                                                       nodes=4)),
        "spectr": sj.SpecTr(self.draft, num_drafts=2, gamma=2),
        "jacobi": sj.Jacobi(block=2),
        "lookahead": sj.Lookahead(window=2, ngram=2, guesses=2),
        "prompt_lookup": sj.PromptLookup(max_ngram=2, num_tokens=2),
        "retrieval": sj.Retrieval(store, num_tokens=3, nodes=4, branches=2),
        "suffix": sj.Retrieval(None, num_tokens=3, nodes=4, branches=2, per_request=True),
        "eagle": sj.Eagle(init_head(TARGET, 1), gamma=2),  # features under the mesh
        "eagle_tree": sj.Eagle(init_head(TARGET, 1), tree=sj.Tree.full(depth=2, branching=2)),
        "eagle3": sj.Eagle(init_head3(TARGET, 1, draft_ids=np.arange(0, V, 2),  # reduced vocab
                                      target_layers=(0, 1, 1)), gamma=2),
    }
    mesh = sharding.make_mesh(2, 4)
    reference = self._reference("autoregressive_greedy", sj.Autoregressive(), GREEDY)
    for name, m in methods.items():
      with self.subTest(name):
        out = sj.generate(self.target, self.prompts, m, GREEDY, NEW, mesh=mesh)
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))
        self.assertTrue(out.tokens.sharding.is_fully_replicated)
        self.assertGreater(int(out.stats.proposed.sum()), 0, name)
        if name == "self_speculative":  # a draft the target agrees with
          self.assertGreater(int(out.stats.accepted.sum()), 0, name)

  def test_sampled_spectr(self):
    m = sj.SpecTr(self.draft, num_drafts=2, gamma=2)
    out = sj.generate(self.target, self.prompts, m, T1, NEW, key=self.key,
                      mesh=sharding.make_mesh(2, 4))
    _assert_same(self, out, self._reference("spectr", m, T1))
    self.assertGreater(int(out.stats.accepted.sum()), 0)

  @parameterized.parameters(*MESHES)
  def test_logits(self, data, model):
    tokens = jnp.asarray(np.array([p[:2] for p in self.prompts], np.int32))
    reference = np.asarray(forward(self.target, tokens))
    placed = sharding.shard_model(nnx.clone(self.target),
                                  sharding.make_mesh(data, model))
    np.testing.assert_allclose(np.asarray(forward(placed, tokens)), reference, atol=1e-5,
                               rtol=0)


def _compiled_loop_text(target, mesh, batch=8):
  placement = sharding.placement(mesh)
  graphdef, state = nnx.split(target)
  state = sharding.place(state, placement.mesh, placement.rules)
  prompt = sharding.put(jnp.zeros((batch, 16), jnp.int32), placement.batch(2))
  lengths = sharding.put(jnp.full((batch,), 5, jnp.int32), placement.batch(1))
  compiled = loop.decode_jit.lower(
      graphdef, state, NoProposer(), None, prompt, lengths, jax.random.key(0), sampling=GREEDY,
      max_new_tokens=8, eos_ids=(), cache_length=40, placement=placement).compile()
  return compiled.as_text()


def _results(text: str, op: str) -> list[str]:
  """Result shapes (``f32[4,1,64]``) of every ``op`` instruction in an HLO text."""
  return re.findall(rf"= (\w+\[[\d,]*\])\S* {op}(?:-start)?\(", text)


class PlacementTest(absltest.TestCase):

  def test_params_follow_the_rules(self):
    target = sharding.shard_model(sj.init_model(GQA, 0), sharding.make_mesh(2, 4))
    specs = {"/".join(map(str, p)): v.get_value().sharding.spec
             for p, v in nnx.to_flat_state(nnx.state(target))}
    P = jax.sharding.PartitionSpec
    self.assertEqual(specs["embed"], P("model", None))
    self.assertEqual(specs["lm_head"], P(None, "model"))
    for i in range(GQA.num_layers):
      for name in ("attn/q", "attn/k", "attn/v", "mlp/gate", "mlp/up"):
        self.assertEqual(specs[f"layers/{i}/{name}/kernel"], P(None, "model"), name)
      for name in ("attn/o", "mlp/down"):
        self.assertEqual(specs[f"layers/{i}/{name}/kernel"], P("model", None), name)
      self.assertEqual(specs[f"layers/{i}/attn_norm/scale"], P(None))
    shard = target.layers[0].attn.k.kernel.get_value().addressable_shards[0].data
    self.assertEqual(shard.shape, (64, GQA.num_kv_heads * GQA.head_dim // 4))

  def test_load_model_onto_a_mesh(self):
    target = sj.init_model(GQA, 0)
    tokens = jnp.asarray(np.array([p[:2] for p in _prompts()], np.int32))
    with tempfile.TemporaryDirectory() as tmp:
      sj.save_model(target, tmp)
      loaded = sj.load_model(tmp, mesh=sharding.make_mesh(2, 4))
    down = loaded.layers[1].mlp.down.kernel.get_value()
    self.assertEqual(down.sharding.spec, jax.sharding.PartitionSpec("model", None))
    self.assertEqual({s.data.shape for s in down.addressable_shards},
                     {(GQA.intermediate_size // 4, GQA.hidden_size)})
    np.testing.assert_allclose(np.asarray(forward(loaded, tokens)),
                               np.asarray(forward(target, tokens)), atol=1e-5, rtol=0)

  def test_bfloat16_halves_the_bytes_per_device(self):
    mesh, prompts = sharding.make_mesh(2, 4), _prompts()
    memory = {}
    for dtype in ("float32", "bfloat16"):
      target = sj.init_model(dataclasses.replace(GQA, dtype=dtype), 0)
      compiled = sj.compile_generate(target, prompts, max_new_tokens=4, mesh=mesh)
      memory[dtype] = compiled.memory_analysis()
      # Each device's cache: 4 rows x 1 kv head, in the model's dtype.
      short = {"float32": "f32", "bfloat16": "bf16"}[dtype]
      self.assertIn(f"{short}[4,1,37,{GQA.head_dim}]", compiled.as_text())
      if dtype == "bfloat16":
        out = sj.generate(target, prompts, max_new_tokens=4, mesh=mesh)
        self.assertTrue(np.all(np.asarray(out.tokens) >= 0))
        self.assertEqual(target.layers[0].attn.q.kernel.get_value().dtype, jnp.bfloat16)
    f32, bf16 = memory["float32"], memory["bfloat16"]
    # Weights in bf16: half the bytes, plus the int32 prompts in both. (Temporaries are not
    # compared: XLA:CPU runs bf16 matmuls on float32 copies of their operands.)
    self.assertBetween(bf16.argument_size_in_bytes / f32.argument_size_in_bytes, 0.5, 0.55)

  def test_replicated_draft(self):
    draft = sharding.shard_model(sj.init_model(DRAFT, 1), sharding.make_mesh(2, 4),
                                 sharding.REPLICATED)
    for leaf in jax.tree.leaves(nnx.state(draft)):
      self.assertTrue(leaf.sharding.is_fully_replicated)

  def test_cache_and_collectives_in_the_compiled_loop(self):
    target = sj.init_model(GQA, 0)
    text = _compiled_loop_text(target, sharding.make_mesh(2, 4))
    c = GQA
    # The cache: each device holds 4 of the 8 rows and 1 of the 4 kv heads.
    self.assertIn(f"f32[4,1,40,{c.head_dim}]", text)
    self.assertNotIn(f"f32[8,{c.num_kv_heads},40,{c.head_dim}]", text)
    # One all-reduce per attention output and MLP down projection of a one-token step, and one
    # for the lookup in the vocabulary-split embedding.
    step = f"f32[4,1,{c.hidden_size}]"
    self.assertEqual(_results(text, "all-reduce").count(step), 2 * c.num_layers + 1)
    weights = {f"f32[{','.join(map(str, np.shape(leaf)))}]"
               for leaf in jax.tree.leaves(nnx.state(target, nnx.Param))}
    gathered = set(_results(text, "all-gather"))
    self.assertTrue(gathered)  # (new cache entries and token ids travel across the batch)
    self.assertFalse(gathered & weights, gathered & weights)

  def test_data_parallel_needs_no_model_collectives(self):
    text = _compiled_loop_text(sj.init_model(TARGET, 0), sharding.make_mesh(8, 1))
    self.assertNotIn(f"f32[1,1,{TARGET.hidden_size}]", _results(text, "all-reduce"))


class ErrorsTest(absltest.TestCase):

  def _run(self, **kwargs):
    target = sj.init_model(kwargs.pop("config", TARGET), 0)
    kwargs.setdefault("mesh", sharding.make_mesh(2, 4))
    return sj.generate(target, kwargs.pop("prompts", _prompts()), max_new_tokens=4, **kwargs)

  def test_heads_that_do_not_split(self):
    three = sj.ModelConfig(vocab_size=V, hidden_size=64, num_layers=1, num_heads=6,
                           num_kv_heads=3, head_dim=16, intermediate_size=128,
                           max_position_embeddings=64)
    with self.assertRaisesRegex(ValueError, r"^target tensor layers/0/attn/k/kernel: its "
                                r"'kv_heads' dimension \(3 kv heads\) does not divide the mesh "
                                r"axis 'model' of size 4; try specjax.sharding.make_mesh\("
                                r"data=8, model=1\), or map 'kv_heads' to None in the rules$"):
      self._run(config=three)
    with self.assertRaisesRegex(ValueError, r"attn/\w/kernel: its 'heads' dimension \(6 attention "
                                r"heads\) does not divide the mesh axis 'model' of size 4; try "
                                r".*make_mesh\(data=4, model=2\)"):
      self._run(config=three, sharding_rules=(("heads", "model"), ("kv_heads", None)))
    with self.assertRaisesRegex(ValueError, r"^model tensor .*3 kv heads"):
      sharding.shard_model(sj.init_model(three, 0), sharding.make_mesh(4, 2))
    with self.assertRaisesRegex(ValueError, r"^draft tensor .*kv heads"):
      self._run(method=sj.Speculative(sj.init_model(three, 1), 2),
                config=TARGET)

  def test_batch_and_mesh(self):
    with self.assertRaisesRegex(ValueError, r"3 prompts do not divide the mesh's data axis of "
                                r"size 2"):
      self._run(prompts=_prompts()[:3])
    with self.assertRaisesRegex(ValueError, r"mesh axes must be \('data', 'model'\)"):
      self._run(mesh=jax.make_mesh((2, 4), ("batch", "tensor")))
    with self.assertRaisesRegex(ValueError, r"mesh must be a jax.sharding.Mesh"):
      self._run(mesh=(2, 4))
    with self.assertRaisesRegex(ValueError, r"mesh data=3 x model=2 = 6 devices, but there are "
                                r"8; try"):
      sharding.make_mesh(3, 2)
    with self.assertRaisesRegex(ValueError, r"mesh model size must be an integer >= 1, got 0"):
      sharding.make_mesh(1, 0)

  def test_rules_and_options(self):
    with self.assertRaisesRegex(ValueError, r"sharding rule \('heads', 'tensor'\)"):
      self._run(sharding_rules=(("heads", "tensor"),))
    with self.assertRaisesRegex(ValueError, r"rules map 'heads' twice"):
      self._run(sharding_rules=(("heads", "model"), ("heads", None)))
    with self.assertRaisesRegex(ValueError, r"draft_sharding must be one of"):
      self._run(draft_sharding="half")
    with self.assertRaisesRegex(ValueError, r"need a mesh="):
      self._run(mesh=None, sharding_rules=sharding.RULES)

  def test_errors_come_before_compiling(self):
    before = loop.decode_jit._cache_size()
    for kwargs in (dict(prompts=_prompts()[:3]), dict(draft_sharding="x")):
      with self.assertRaises(ValueError):
        self._run(**kwargs)
    self.assertEqual(loop.decode_jit._cache_size(), before)


if __name__ == "__main__":
  absltest.main()
