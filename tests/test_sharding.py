"""Runs ``tests/sharding_cases.py`` (sharded decoding on 8 fake CPU devices) in a subprocess.

Eight host devices must be requested before JAX starts, and they make every single-device
computation of that process ~1.3x slower, so the cases get a process of their own rather than
the flag being set for the whole suite. The subprocess's pytest report (one line per case, the
failures in full) is this test's failure message.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from absl.testing import absltest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # ~3 min: every sharding case in a pytest subprocess on eight fake devices
class ShardingCasesTest(absltest.TestCase):

  def test_sharding_cases_on_eight_devices(self):
    flags = os.environ.get("XLA_FLAGS", "")  # conftest's quick compilation, kept
    env = dict(os.environ, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=8".strip())
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-o", "addopts=", "-p", "no:cacheprovider",
         os.path.join(ROOT, "tests", "sharding_cases.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    report = proc.stdout[-20000:] + proc.stderr[-5000:]
    self.assertEqual(proc.returncode, 0, report)
    self.assertIn(" passed", proc.stdout)
    self.assertNotIn("skipped", proc.stdout.splitlines()[-1])


if __name__ == "__main__":
  absltest.main()
