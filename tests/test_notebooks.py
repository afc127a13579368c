"""Executes the notebooks end to end on tiny settings (SPECJAX_NOTEBOOK_TINY=1), as CI does.

The kernel is the ``python3`` kernelspec; jupyter_client launches it with this interpreter
(``sys.executable``), so it sees the same virtual environment. The repository root goes on the
kernel's PYTHONPATH and is its working directory's parent, which the notebooks' setup cell detects
(and then skips the pip install).
"""

from __future__ import annotations

import os
import pathlib
import sys
import unittest

import pytest
from absl.testing import absltest, parameterized

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
TIMEOUT_PER_CELL = 600


def _execute(path: pathlib.Path):
  import nbclient
  import nbformat

  nb = nbformat.read(path, as_version=4)
  # An extra last cell (in memory only) reports the kernel's interpreter.
  nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL_PYTHON=' + sys.executable)"))
  env_keys = {"SPECJAX_NOTEBOOK_TINY": "1",
              "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                          os.environ.get("PYTHONPATH")]))}
  old = {k: os.environ.get(k) for k in env_keys}
  os.environ.update(env_keys)  # the kernel process inherits this environment
  try:
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_PER_CELL, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  return nb


def _kernel_python(nb) -> str:
  for out in nb.cells[-1].outputs:
    if out.get("output_type") == "stream" and "KERNEL_PYTHON=" in out.get("text", ""):
      return out["text"].split("KERNEL_PYTHON=", 1)[1].strip()
  raise AssertionError("the kernel did not report its interpreter")


def _same_python(testcase, nb):
  testcase.assertEqual(os.path.realpath(_kernel_python(nb)), os.path.realpath(sys.executable),
                       "the notebook kernel runs another Python than the tests")


def _outputs(nb) -> str:
  text = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      if out.get("output_type") == "stream":
        text.append(out.get("text", ""))
      elif "data" in out and "text/plain" in out["data"]:
        text.append(out["data"]["text/plain"])
  return "\n".join(text)


class NotebookFormatTest(parameterized.TestCase):

  @parameterized.parameters("quickstart", "lossless")
  def test_badge_install_cell_and_no_outputs(self, name):
    import nbformat
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    first = nb.cells[0]
    self.assertEqual(first.cell_type, "markdown")
    self.assertIn("https://colab.research.google.com/github/specjax/specjax/blob/main/notebooks/"
                  f"{name}.ipynb", first.source)
    install = nb.cells[1]
    self.assertEqual(install.cell_type, "code")
    self.assertIn("pip", install.source)
    self.assertIn("git+https://github.com/specjax/specjax", install.source)
    for cell in nb.cells:  # notebooks are stored without outputs
      if cell.cell_type == "code":
        self.assertEqual(cell.outputs, [], f"{name}: a code cell has stored outputs")
        self.assertIsNone(cell.execution_count)


@unittest.skipIf(sys.platform == "win32", "kernels are not tested on Windows")
class NotebookExecutionTest(absltest.TestCase):

  @pytest.mark.slow  # ~45 s: the quickstart notebook's kernel end to end
  def test_quickstart(self):
    nb = _execute(NOTEBOOKS / "quickstart.ipynb")
    _same_python(self, nb)
    text = _outputs(nb)
    self.assertIn("using the specjax checkout", text)  # the install was skipped
    self.assertIn("identical to autoregressive: True", text)
    self.assertIn("acceptance_by_position", text)
    self.assertTrue(any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
                        for c in nb.cells for o in c.get("outputs", [])), "no plot was drawn")

  def test_lossless(self):
    nb = _execute(NOTEBOOKS / "lossless.ipynb")
    _same_python(self, nb)
    text = _outputs(nb)
    self.assertIn("speculative: chi2", text)
    self.assertTrue(any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
                        for c in nb.cells for o in c.get("outputs", [])), "no histogram was drawn")


if __name__ == "__main__":
  absltest.main()
