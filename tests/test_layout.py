"""The house rules of the code base, checked: no import circles in ``specjax/`` or
``experiments/`` (module-level and function-level imports alike), no module over ~500 lines, and
the light modules (``import specjax``, the runner's config checks and method table) import no
JAX, so that bad configs are refused in well under a second."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

from absl.testing import absltest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("specjax", "experiments")
MAX_LINES = 520  # "no module over ~500 lines"


def _modules() -> dict[str, str]:
  """{dotted module name: file} for every module of PACKAGES."""
  out = {}
  for package in PACKAGES:
    for root, _, files in os.walk(os.path.join(REPO, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(root, name)
          dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
          out[dotted.removesuffix(".__init__")] = path
  return out


def _imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
  """The project modules ``name`` imports anywhere in its file (``from p import m`` counts as
  importing ``p.m`` when that is a module, else ``p``). TYPE_CHECKING blocks count too."""
  package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name in modules)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      for alias in node.names:
        full = f"{base}.{alias.name}"
        found.add(full if full in modules else base)
  return (found & set(modules)) - {name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  for v in graph:
    if v not in index:
      visit(v)
  return cycles


class LayoutTest(absltest.TestCase):

  def test_no_import_cycles(self):
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    self.assertIn("specjax.models.hf_layout", graph["specjax.models.gguf"])
    self.assertEqual(import_cycles(graph), [])

  def test_cycle_finder_finds_a_cycle(self):
    self.assertEqual(import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}),
                     [["a", "b", "c"]])

  def test_modules_stay_small(self):
    long = {name: n for name, path in _modules().items()
            if (n := sum(1 for _ in open(path, encoding="utf-8"))) > MAX_LINES}
    self.assertEqual(long, {})

  def test_lazy_exports_match_their_type_checking_imports(self):
    """``specjax/__init__.py`` names each public name twice (the lazy table and the block type
    checkers read): the two say the same, and every name resolves."""
    import specjax

    path = os.path.join(REPO, "specjax", "__init__.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", "") == "TYPE_CHECKING")
    imported = {}
    for node in block.body:
      for alias in node.names:
        imported[alias.name] = (f"{node.module}.{alias.name}" if node.module == "specjax"
                                else node.module)
    self.assertEqual(imported, specjax._EXPORTS)
    for name in specjax.__all__:
      self.assertIsNotNone(getattr(specjax, name), name)

  def test_light_modules_import_no_jax(self):
    script = ("import sys\nimport specjax, specjax.options\n"
              "from experiments import methods, runconfig\n"
              "assert runconfig.METHODS == tuple(methods.METHODS)\n"
              "print(sorted(m for m in ('jax', 'flax', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertNotIn("jax", result.stdout)
    self.assertNotIn("flax", result.stdout)


if __name__ == "__main__":
  absltest.main()
