"""Multi-process runs: ``experiments.launch_local`` + ``experiments.run --multihost``.

Two processes x 4 CPU devices (``jax.distributed.initialize`` with an explicit coordinator, CPU
collectives over gloo) run ``configs/sharded.py:tiny`` over one global 4 x 2 mesh; they must
produce the very tokens of one process with 8 devices, setting by setting (the runner records a
hash of every setting's outputs), and only process 0 writes the report. The launcher itself:
its flags reach every process, and one failing process stops the others with its status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
from absl.testing import absltest

from experiments import launch_local

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Autoregressive decoding and prompt lookup (a proposer, with no draft to load or cost to
# measure: the run stays short), sampled.
RUN = [sys.executable, "-m", "experiments.run", "--config=configs/sharded.py:tiny",
       "--config.temperatures=1", "--config.methods=autoregressive,prompt_lookup",
       "--config.gammas=2"]


def _env() -> dict:
  env = dict(os.environ)
  for name in ("PYTEST_XDIST_WORKER", "JAX_NUM_CPU_DEVICES"):
    env.pop(name, None)
  # The runner sets its own device count (cpu_devices); conftest's other flags are kept.
  flags = env.pop("XLA_FLAGS", "").split()
  flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
  if flags:
    env["XLA_FLAGS"] = " ".join(flags)
  return env


def _settings(out_dir: str) -> dict:
  with open(os.path.join(out_dir, "results.json")) as f:
    results = json.load(f)
  return results, {(e["method"], e["mesh"]): e for e in results["settings"]}


@pytest.mark.slow  # ~1.5 min: two JAX processes and a reference
class MultiProcessTest(absltest.TestCase):

  def test_two_processes_equal_one(self):
    with tempfile.TemporaryDirectory() as tmp:
      one, two = os.path.join(tmp, "one"), os.path.join(tmp, "two")
      # The reference: one process, 8 devices, the mesh rows only (the multi-process run's own
      # one-device rows give the unsharded tokens).
      single = subprocess.run(RUN + ["--config.cpu_devices=8", f"--config.output_dir={one}",
                                     "--config.meshes=4x2"],
                              cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
      self.assertEqual(single.returncode, 0, single.stderr[-5000:])
      multi = subprocess.run(
          [sys.executable, "-m", "experiments.launch_local", "--processes=2", "--"] + RUN
          + ["--config.cpu_devices=4", f"--config.output_dir={two}", "--multihost"],
          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
      self.assertEqual(multi.returncode, 0, multi.stderr[-5000:])
      self.assertEqual(multi.stdout.count("[run] wrote"), 1)  # process 0 alone reports

      results_one, by_one = _settings(one)
      results_two, by_two = _settings(two)
      self.assertEqual((results_one["machine"]["device_count"],
                        results_one["machine"]["process_count"]), (8, 1))
      self.assertEqual((results_two["machine"]["device_count"],
                        results_two["machine"]["process_count"]), (8, 2))
      # autoregressive and prompt lookup, on 4x2 (and on one device in the multi-process run)
      self.assertEqual(sorted(by_one), [("autoregressive", "4x2"), ("prompt_lookup", "4x2")])
      self.assertEqual(sorted(by_two), sorted([*by_one, ("autoregressive", ""),
                                               ("prompt_lookup", "")]))
      for key, e in by_one.items():
        self.assertEqual(by_two[key]["outputs_sha256"], e["outputs_sha256"], key)
        alone = by_two[(key[0], "")]
        self.assertEqual(e["outputs_sha256"], alone["outputs_sha256"], key)
        self.assertEqual(by_two[key]["same_as_one_device"], 1.0, key)
        self.assertLess(by_two[key]["memory"]["argument_bytes"],
                        alone["memory"]["argument_bytes"], key)  # each device: its shards only
    self.assertGreater(by_one[("prompt_lookup", "4x2")]["proposed"], 0)


class LauncherTest(absltest.TestCase):

  def test_flags_reach_every_process(self):
    with tempfile.TemporaryDirectory() as tmp:
      script = textwrap.dedent(f"""
          import sys
          flags = dict(a[2:].split("=", 1) for a in sys.argv[1:])
          open(f"{tmp}/p" + flags["process_id"], "w").write(
              flags["num_processes"] + " " + flags["coordinator_address"])
          """)
      self.assertEqual(launch_local.launch([sys.executable, "-c", script], 3), 0)
      seen = [open(os.path.join(tmp, f"p{i}")).read().split() for i in range(3)]
    self.assertEqual({s[0] for s in seen}, {"3"})
    self.assertLen({s[1] for s in seen}, 1)  # one coordinator
    self.assertRegex(seen[0][1], r"^localhost:\d+$")

  def test_a_failure_stops_the_others(self):
    script = ("import sys, time\n"
              "if sys.argv[-1] == '--process_id=1': sys.exit(3)\n"
              "time.sleep(600)\n")
    self.assertEqual(launch_local.launch([sys.executable, "-c", script], 2), 3)

  def test_cost_tables_agree_across_processes(self):
    """``costs.shared``: each process times its own devices; all take process 0's table (a
    cost rule choosing from it on every device then picks the same entry everywhere)."""
    with tempfile.TemporaryDirectory() as tmp:
      script = textwrap.dedent(f"""
          import json, sys
          import jax
          flags = dict(a[2:].split("=", 1) for a in sys.argv[1:])
          pid = int(flags["process_id"])
          jax.config.update("jax_cpu_collectives_implementation", "gloo")
          jax.distributed.initialize(coordinator_address=flags["coordinator_address"],
                                     num_processes=int(flags["num_processes"]), process_id=pid)
          import specjax as sj
          from specjax import costs
          own = sj.CostTable(verify={{1: 1.0, 2: 1.25 + pid}}, draft_step=0.125 * (pid + 1),
                             loop={{0: 1.0, 3: 2.5 + pid}}, head_step={{"h": 0.5 + pid}},
                             batch=2, context=8, target_step_ms=1.5 + pid, device=f"p{{pid}}")
          open(f"{tmp}/p{{pid}}", "w").write(costs.shared(own).to_json())
          """)
      self.assertEqual(launch_local.launch([sys.executable, "-c", script], 2), 0)
      tables = [json.load(open(os.path.join(tmp, f"p{i}"))) for i in range(2)]
    for table in tables:
      self.assertEqual(table["verify"], {"1": 1.0, "2": 1.25})
      self.assertEqual((table["draft_step"], table["loop"], table["head_step"]),
                       (0.125, {"0": 1.0, "3": 2.5}, {"h": 0.5}))
      self.assertEqual(table["target_step_ms"], 1.5)
    self.assertEqual([t["device"] for t in tables], ["p0", "p1"])  # where each was timed

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, r"processes must be >= 1, got 0"):
      launch_local.launch(["true"], 0)
    with self.assertRaisesRegex(ValueError, r"no command given"):
      launch_local.launch([], 2)


if __name__ == "__main__":
  absltest.main()
