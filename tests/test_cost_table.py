"""specjax.costs.CostTable: the measured cost model as a library object (its checks, chain costs,
JSON round trip and one-line errors), and ``measure`` / ``measure_step_costs`` timing tiny random
models into one (the runner's dict and the table from the same timing)."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile

from absl.testing import absltest

import specjax as sj
from specjax import costs
from specjax.costs import CostTable
from specjax.heads.eagle import init_head

CONFIG = sj.ModelConfig(model_type="llama", vocab_size=16, hidden_size=32, num_layers=2,
                        num_heads=4, num_kv_heads=2, intermediate_size=64,
                        max_position_embeddings=64)
FAST = dict(steps_per_call=2, min_seconds=0.0, max_iters=5)  # timings unused beyond "> 0"


def _table(**overrides) -> CostTable:
  fields = dict(verify={1: 1.0, 3: 1.25, 4: 1.5}, draft_step=0.1, iteration={2: 1.6},
                head_step={"eagle": 0.2}, batch=4, context=100, target_step_ms=2.5,
                device="cpu (cpu)")
  return CostTable(**{**fields, **overrides})


class CostTableTest(absltest.TestCase):

  def test_pass_cost(self):
    table = _table()
    self.assertEqual(table.pass_cost(1), 1.0)
    self.assertEqual(table.pass_cost(4), 1.5)
    with self.assertRaisesRegex(ValueError, r"^no measured pass over 2 tokens \(widths measured: "
                                r"\[1, 3, 4\]\)$"):
      table.pass_cost(2)

  def test_chain_cost(self):
    table = _table()
    self.assertEqual(table.chain_cost(0), 1.0)  # plain decoding
    self.assertEqual(table.chain_cost(2), 1.6)  # the measured bare iteration
    self.assertAlmostEqual(table.chain_cost(3), 3 * 0.1 + 1.5)  # gamma c + v(gamma + 1)
    with self.assertRaisesRegex(ValueError, r"no measured pass over 2 tokens"):
      table.chain_cost(1)  # neither measured nor its pass
    with self.assertRaisesRegex(ValueError, r"^gamma = -1 must be an int >= 0$"):
      table.chain_cost(-1)
    draft_free = _table(draft_step=0.0, iteration={})
    self.assertEqual(draft_free.chain_cost(2), 1.25)

  def test_entry_and_menu_cost(self):
    """An adaptive menu's entries: a chain's ``chain_cost``; a draft-free tree of N nodes, its
    one pass over N + 1 tokens whatever its depth; plain decoding 1.0. A run's iterations: the
    entries' costs times their counts, an entry never chosen needing no pass."""
    table = _table()
    self.assertEqual(table.entry_cost(2), 1.6)
    self.assertEqual(table.entry_cost(1, tree_nodes=3), 1.5)  # v(4), not a chain's c + v(2)
    self.assertEqual(table.entry_cost(0, tree_nodes=0), 1.0)
    with self.assertRaisesRegex(ValueError, r"no measured pass over 6 tokens"):
      table.entry_cost(2, tree_nodes=5)
    self.assertAlmostEqual(table.menu_cost((0, 2, 3), (5, 2, 0)), 5 + 2 * 1.6)
    self.assertAlmostEqual(table.menu_cost((0, 1, 2, 3), (5, 1, 2, 0), (0, 2, 3, 5)),
                           5 + 1.25 + 2 * 1.5)  # the 3-deep tree's 6-token pass: never run

  def test_a_draft_trees_entry_cost(self):
    """A tree drafted by a model: its draft passes (c for a one-token pass, else the measured
    ``draft_pass`` over that many tokens) and its target pass; a width never measured is an
    error naming it and the widths there are."""
    table = _table(draft_pass={3: 0.15, 4: 0.18})
    self.assertEqual(table.draft_pass_cost(1), 0.1)
    self.assertEqual(table.draft_pass_cost(3), 0.15)
    self.assertAlmostEqual(table.entry_cost(2, tree_nodes=3, draft_widths=(1, 3, 4)),
                           0.1 + 0.15 + 0.18 + 1.5)
    with self.assertRaisesRegex(ValueError, r"^no measured draft pass over 5 tokens \(widths "
                                            r"measured: \[3, 4\], and 1\)$"):
      table.entry_cost(2, tree_nodes=3, draft_widths=(1, 5))
    self.assertAlmostEqual(
        table.menu_cost((0, 1, 2), (4, 2, 1), (0, 2, 3), ((), (1, 3), (1, 3, 4))),
        4 + 2 * (0.1 + 0.15 + 1.25) + (0.1 + 0.15 + 0.18 + 1.5))
    again = CostTable.from_json(table.to_json())
    self.assertEqual(again.draft_pass, {3: 0.15, 4: 0.18})
    self.assertEqual(CostTable.from_dict({k: v for k, v in table.to_dict().items()
                                          if k != "draft_pass"}).draft_pass, {})  # older tables

  def test_normalised_and_frozen(self):
    verify = {1: 1, 3: 1.25}
    table = _table(verify=verify, iteration={})
    verify[5] = 2.0  # the caller's dict stays theirs
    self.assertEqual(table.verify, {1: 1.0, 3: 1.25})
    self.assertIsInstance(table.verify[1], float)
    with self.assertRaises(AttributeError):
      table.batch = 2  # frozen

  def test_invalid_fields(self):
    for overrides, message in (
        (dict(verify={3: 1.25}), r"^verify has no 1-token pass \(widths \[3\]\): v\(1\) is the "
                                 r"unit$"),
        (dict(verify={1: 1.1}), r"^verify\[1\] = 1\.1 must be 1\.0 \(costs are in target steps\)$"),
        (dict(verify={1: 1.0, 3: math.nan}), r"^verify\[3\] = nan must be finite and > 0$"),
        (dict(verify={1: 1.0, 3: 0.0}), r"^verify\[3\] = 0\.0 must be finite and > 0$"),
        (dict(verify={1: 1.0, 0: 0.5}), r"^verify key = 0 must be an int >= 1$"),
        (dict(verify={1: 1.0, 3: "1.2"}), r"^verify\[3\] = '1\.2' must be a number$"),
        (dict(draft_step=-0.1), r"^draft_step = -0\.1 must be finite and >= 0$"),
        (dict(iteration={2: math.inf}), r"^iteration\[2\] = inf must be finite and > 0$"),
        (dict(head_step={"eagle": -1.0}), r"^head_step\['eagle'\] = -1\.0 must be finite and > 0$"),
        (dict(batch=0), r"^batch = 0 must be an int >= 1$"),
        (dict(context=-1), r"^context = -1 must be an int >= 0$"),
        (dict(target_step_ms=0), r"^target_step_ms = 0\.0 must be finite and > 0$"),
    ):
      with self.subTest(overrides=overrides):
        with self.assertRaisesRegex(ValueError, message):
          _table(**overrides)

  def test_json_round_trip(self):
    table = _table(verify={1: 1.0, 3: 1.0 / 3.0 + 1, 17: math.pi}, draft_step=0.1 + 0.2)
    again = CostTable.from_json(table.to_json())
    self.assertEqual(again, table)
    self.assertEqual(again.verify, table.verify)
    self.assertEqual(list(again.verify), [1, 3, 17])  # int keys back
    data = json.loads(table.to_json())
    self.assertEqual(data["format"], "specjax.cost_table/1")
    self.assertEqual(data["verify"], {"1": 1.0, "3": 1.0 / 3.0 + 1, "17": math.pi})
    self.assertEqual(data["iteration"], {"2": 1.6})
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "costs.json")
      table.save(path)
      self.assertEqual(CostTable.load(path), table)

  def test_a_calibrated_loop_prices_the_entries(self):
    """``loop`` (``sj.Adaptive.calibrated``: each menu entry's iteration timed in its own loop,
    0 = plain decoding) replaces the passes' prices, travels through JSON, and names what it
    lacks; a table without it (or saved before it) prices by the passes."""
    table = _table(loop={0: 1.05, 2: 1.9})
    self.assertEqual(table.entry_cost(0), 1.05)
    self.assertEqual(table.entry_cost(2), 1.9)  # not iteration[2] = 1.6
    self.assertEqual(table.menu_cost((0, 2), (10, 5)), 10 * 1.05 + 5 * 1.9)
    self.assertEqual(table.entry_costs((0, 2)), (1.05, 1.9))  # what the cost rule prices by
    self.assertEqual(_table().entry_costs((0, 2)), (1.0, 1.6))
    with self.assertRaisesRegex(ValueError, r"no calibrated loop iteration at 1 drafts "
                                r"\(calibrated: \[0, 2\]\)"):
      table.entry_cost(1)
    self.assertEqual(_table().entry_cost(2), 1.6)
    again = CostTable.from_json(table.to_json())
    self.assertEqual(again, table)
    self.assertEqual(list(again.loop), [0, 2])
    self.assertEqual(json.loads(table.to_json())["loop"], {"0": 1.05, "2": 1.9})
    old = {k: v for k, v in _table().to_dict().items() if k != "loop"}
    self.assertEqual(CostTable.from_dict(old).loop, {})
    for loop, message in (({-1: 1.0}, r"^loop key = -1 must be an int >= 0$"),
                          ({0: 0.0}, r"^loop\[0\] = 0.0 must be finite and > 0$")):
      with self.assertRaisesRegex(ValueError, message):
        _table(loop=loop)

  def test_a_skipped_calls_step(self):
    """``autoregressive`` (the bare autoregressive loop's iteration, timed by a calibration of
    a method that skips its draft for whole calls) is what ``skipped_step`` prices a skipped
    call's iteration at, at most the menu's plain entry (the same step and more); untimed (0,
    or a table saved before the field), the plain entry: the calibrated loop's, else the bare
    step 1.0."""
    self.assertEqual(_table().skipped_step(), 1.0)
    self.assertEqual(_table(loop={0: 1.05, 2: 1.9}).skipped_step(), 1.05)
    self.assertEqual(_table(loop={0: 1.05, 2: 1.9}, autoregressive=1.2).skipped_step(), 1.05)
    self.assertEqual(_table(autoregressive=1.2).skipped_step(), 1.0)
    table = _table(loop={0: 1.05, 2: 1.9}, autoregressive=0.98)
    self.assertEqual(table.skipped_step(), 0.98)
    self.assertEqual(table.entry_cost(0), 1.05)  # the menu's own plain entry unchanged
    self.assertEqual(CostTable.from_json(table.to_json()), table)
    self.assertEqual(json.loads(table.to_json())["autoregressive"], 0.98)
    old = {k: v for k, v in table.to_dict().items() if k != "autoregressive"}
    self.assertEqual(CostTable.from_dict(old).autoregressive, 0.0)
    for value, message in ((-0.5, r"^autoregressive = -0\.5 must be finite and >= 0$"),
                           (math.nan, r"^autoregressive = nan must be finite and >= 0$"),
                           (True, r"^autoregressive = True must be a number$")):
      with self.assertRaisesRegex(ValueError, message):
        _table(autoregressive=value)

  def test_sampling_round_trip(self):
    """The sampling a table was timed at travels with it; a table saved before the field (no
    ``sampling`` key) was timed greedy."""
    table = _table(sampling=sj.Sampling(temperature=0.7, top_k=5, top_p=0.9))
    data = json.loads(table.to_json())
    self.assertEqual(data["sampling"], {"temperature": 0.7, "top_k": 5, "top_p": 0.9})
    self.assertEqual(CostTable.from_dict(data), table)
    self.assertNotEqual(table, _table())
    old = {k: v for k, v in _table().to_dict().items() if k != "sampling"}
    self.assertEqual(CostTable.from_dict(old).sampling, sj.Sampling(temperature=0.0))
    with self.assertRaisesRegex(ValueError, r"^sampling = 1\.0 must be an sj\.Sampling$"):
      _table(sampling=1.0)
    for bad, message in (({"temperature": -1.0}, r"temperature must be >= 0, got -1\.0"),
                         ({"temp": 1.0}, r"sampling = \{'temp': 1\.0\} must be an object of "
                                         r"temperature, top_k, top_p")):
      with self.subTest(bad=bad):
        with self.assertRaisesRegex(ValueError, message):
          CostTable.from_dict({**_table().to_dict(), "sampling": bad})

  def test_load_errors(self):
    good = _table().to_dict()
    cases = (
        ({**good, "format": "specjax.cost_table/0"},
         r"format 'specjax\.cost_table/0' is not 'specjax\.cost_table/1'"),
        ({**good, "verify": {"3": 1.25}},
         r"verify has no 1-token pass \(widths \[3\]\): v\(1\) is the unit"),
        ({**good, "verify": {"1": 1.0, "3": -2.0}}, r"verify\[3\] = -2\.0 must be finite and > 0"),
        ({**good, "draft_step": float("nan")}, r"draft_step = nan must be finite and >= 0"),
        ({**good, "iteration": {"two": 1.5}}, r"iteration key 'two' is not an int"),
        ({k: v for k, v in good.items() if k != "device"}, r"cost table keys \['device'\] missing"),
        ({**good, "speed": 3}, r"unknown cost table keys \['speed'\]"),
        ([1, 2], r"a cost table is a JSON object, not list"),
    )
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "bad.json")
      for data, message in cases:
        with self.subTest(message=message):
          with open(path, "w") as f:
            json.dump(data, f)  # NaN written as the bare token: Python's json reads it back
          with self.assertRaisesRegex(ValueError, f"^{re.escape(path)}: {message}$"):
            CostTable.load(path)
      with open(path, "w") as f:
        f.write("{not json")
      with self.assertRaisesRegex(ValueError, f"^{re.escape(path)}: not JSON \\(Expecting"):
        CostTable.load(path)
      missing = os.path.join(tmp, "absent.json")
      with self.assertRaisesRegex(FileNotFoundError,
                                  f"^{re.escape(missing)}: no cost table file$"):
        CostTable.load(missing)

  def test_exported(self):
    self.assertIs(sj.CostTable, CostTable)


class SharedTest(absltest.TestCase):

  def test_shared_in_one_process(self):
    """One process: ``costs.shared`` hands the table back as it is (two processes:
    tests/test_multihost.py)."""
    table = CostTable(verify={1: 1.0, 2: 1.3}, draft_step=0.1, batch=1, context=8,
                      target_step_ms=1.0, device="by hand")
    self.assertIs(costs.shared(table), table)


class MeasureTest(absltest.TestCase):
  """The timing on tiny random models: small loops, so only the shape of the answer is checked."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.target = sj.init_model(CONFIG, 0)
    cls.draft = sj.init_model(CONFIG, 1)

  def test_measure_table(self):
    table = CostTable.measure(self.target, self.draft, batch=2, context=5, cache_length=16,
                              widths=(1, 3), gammas=(2,), heads={"eagle": init_head(CONFIG, 2)},
                              **FAST)
    self.assertEqual(table.verify[1], 1.0)
    self.assertEqual(sorted(table.verify), [1, 3])
    self.assertGreater(table.verify[3], 0)
    self.assertGreater(table.draft_step, 0)
    self.assertEqual(sorted(table.iteration), [2])
    self.assertGreater(table.iteration[2], 0)
    self.assertEqual(table.chain_cost(2), table.iteration[2])
    self.assertEqual(table.draft_pass, {})
    trees = CostTable.measure(self.target, self.draft, batch=2, context=5, cache_length=16,
                              draft_widths=(3, 7), **FAST)
    self.assertEqual(sorted(trees.draft_pass), [3, 7])
    self.assertGreater(min(trees.draft_pass.values()), 0)
    self.assertEqual(sorted(table.head_step), ["eagle"])
    self.assertGreater(table.head_step["eagle"], 0)
    self.assertEqual((table.batch, table.context), (2, 5))
    self.assertGreater(table.target_step_ms, 0)
    self.assertIn("cpu", table.device.lower())

  def test_measured_at_the_runs_sampling(self):
    """A table timed at T > 0 says so, and its jobs really sample: a bare iteration's token
    (rejection sampling's) and a step's (a draw) differ from the greedy ones on a random model
    with a near-flat law, while greedy runs give the argmax."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from specjax import cost_timing
    from specjax.models.kv_cache import init_cache
    hot = sj.Sampling(temperature=1.0)
    table = CostTable.measure(self.target, self.draft, batch=2, context=5, cache_length=16,
                              gammas=(2,), sampling=hot, **FAST)
    self.assertEqual(table.sampling, hot)
    self.assertEqual(sorted(table.iteration), [2])
    self.assertEqual(CostTable.measure(self.target, batch=1, context=3, cache_length=8,
                                       **FAST).sampling, sj.Sampling(temperature=0.0))
    batch = 16
    cache = lambda: init_cache(CONFIG, batch, 16).with_lengths(jnp.full((batch,), 5, jnp.int32))
    splits = (*nnx.split(self.target), *nnx.split(self.draft))
    iterations = cost_timing._bare_iterations_fn()
    steps = cost_timing._steps_fn()
    tokens = jnp.ones((batch, 1), jnp.int32)
    out = {}
    for name, sampling in (("greedy", sj.Sampling(temperature=0.0)), ("hot", hot)):
      out[name] = (iterations(*splits[:2], *splits[2:], cache(), cache(), 2, 1, sampling)[0],
                   steps(*nnx.split(self.target), tokens, cache(), 1, sampling)[0][:, 0])
    logits, _ = self.target(tokens, cache())
    argmax = jnp.argmax(logits[:, -1], axis=-1)
    self.assertTrue(bool(jnp.all(out["greedy"][1] == argmax)))
    self.assertFalse(bool(jnp.all(out["hot"][1] == argmax)))  # 16 rows of a ~flat law
    self.assertFalse(bool(jnp.all(out["hot"][0] == out["greedy"][0])))
    jax.block_until_ready(out)

  def test_measure_step_costs_carries_its_table(self):
    cost = costs.measure_step_costs({"target": self.target, "draft": self.draft}, 2, 5, 16,
                                    widths=(1, 3), gammas=(2,), **FAST)
    table = CostTable.from_dict(cost["table"])
    self.assertEqual(table.draft_step, cost["cost_ratio"])
    self.assertAlmostEqual(table.verify[3], cost["target_verify_ms"]["2"] / cost["target_step_ms"])
    self.assertAlmostEqual(table.iteration[2], cost["iteration_ms"]["2"] / cost["target_step_ms"])
    self.assertEqual(table.target_step_ms, cost["target_step_ms"])
    self.assertEqual((table.batch, table.context), (cost["batch"], cost["context"]))
    self.assertEqual(table.head_step, {})
    json.dumps(cost)  # results.json carries it

  def test_target_alone(self):
    table, raw = costs.measure({"target": self.target}, 1, 3, 8, widths=(2,), **FAST)
    self.assertEqual(sorted(table.verify), [1, 2])  # the unit is always measured
    self.assertEqual((table.draft_step, table.iteration), (0.0, {}))
    self.assertNotIn("cost_ratio", raw)
    self.assertEqual(raw["table"], table.to_dict())

  def test_bad_arguments(self):
    target = {"target": self.target}
    for kwargs, message in (
        (dict(models={"draft": self.draft}), r"^models \['draft'\] must be 'target' and "
                                             r"optionally 'draft'$"),
        (dict(gammas=(2,)), r"^gammas \[2\] need a draft: a bare iteration runs one$"),
        (dict(widths=(0,)), r"^width = 0 must be an int >= 1$"),
        (dict(batch=0), r"^batch = 0 must be an int >= 1$"),
        (dict(widths=(8,)), r"^cache_length 10 holds no 8-token pass after context 5$"),
        (dict(draft_widths=(3,)), r"^draft_widths \[3\] need a draft$"),
        (dict(models={"target": self.target, "draft": self.draft}, draft_widths=(1,)),
         r"^draft width = 1 must be an int >= 2$"),
        (dict(models={"target": self.target, "draft": self.draft}, draft_widths=(6,)),
         r"^cache_length 10 holds no 6-token pass after context 5$"),
    ):
      with self.subTest(message=message):
        args = {"models": target, "batch": 1, "context": 5, "cache_length": 10, **kwargs}
        with self.assertRaisesRegex(ValueError, message):
          costs.measure(**args)


if __name__ == "__main__":
  absltest.main()
