"""Prompt sets for experiments: built-in Python-code prompts, or a file of your own.

The default pair is trained on the Python standard library's source, so the built-in prompts are
beginnings of stdlib-style Python code: imports, class and function headers, docstrings, loops.

``load_prompts(spec)`` takes a built-in set name (``python``, ``python-small``, ``python-tiny``)
or a path: ``*.jsonl`` (one JSON object per line with a ``"prompt"`` or ``"text"`` field, or one
JSON string per line), ``*.json`` (a list of strings), anything else one prompt per line (empty
lines skipped; write ``\\n`` for a newline inside a prompt).
"""

from __future__ import annotations

import json
import os

PYTHON = [
    'import os\nimport sys\n\n\ndef main(argv):\n    """',
    "class Node:\n    def __init__(self, value, next=None):\n        self.value = value\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    'def read_lines(path, encoding="utf-8"):\n    with open(path',
    "    for key, value in sorted(mapping.items()):\n        if ",
    'class TestParser(unittest.TestCase):\n\n    def setUp(self):\n        ',
    "    def __repr__(self):\n        return '%s(%r)' % (",
    "try:\n    import threading\nexcept ImportError:\n    ",
    '"""Utilities for working with\n',
    "    if not isinstance(name, str):\n        raise TypeError(",
    "def _check_arg(arg, name):\n    ",
    "import re\n\n_pattern = re.compile(r'",
    "        result = []\n        for item in self.",
    "    @property\n    def name(self):\n        ",
    "def join(a, *p):\n    \"\"\"Join two or more pathname components",
    "    except (OSError, ValueError) as exc:\n        ",
]

PROMPT_SETS = {
    "python": PYTHON,          # 16 prompts
    "python-small": PYTHON[:8],
    "python-tiny": PYTHON[:4],
}


def is_builtin(spec: str) -> bool:
  return spec in PROMPT_SETS


def check_source(spec: str) -> None:
  """Raises ``ValueError`` (one line) unless ``spec`` names a built-in set or a readable file."""
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"prompts must be a built-in set ({', '.join(PROMPT_SETS)}) or a file path, "
                     f"got {spec!r}")
  if spec in PROMPT_SETS:
    return
  if not os.path.isfile(spec):
    raise ValueError(f"prompts {spec!r} is neither a built-in set ({', '.join(PROMPT_SETS)}) nor an "
                     f"existing file")


def load_prompts(spec: str) -> list[str]:
  """The prompts of a built-in set or a file (see the module docstring)."""
  check_source(spec)
  if spec in PROMPT_SETS:
    return list(PROMPT_SETS[spec])
  with open(spec, encoding="utf-8") as f:
    text = f.read()
  prompts: list[str] = []
  if spec.endswith(".json"):
    data = json.loads(text)
    if not isinstance(data, list) or not all(isinstance(p, str) for p in data):
      raise ValueError(f"{spec}: expected a JSON list of strings")
    prompts = list(data)
  elif spec.endswith(".jsonl"):
    for n, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        item = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{spec}:{n}: not valid JSON ({e})") from None
      if isinstance(item, dict):
        item = item.get("prompt", item.get("text"))
      if not isinstance(item, str):
        raise ValueError(f"{spec}:{n}: expected a string or an object with a 'prompt' field")
      prompts.append(item)
  else:
    prompts = [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]
  if not prompts:
    raise ValueError(f"{spec}: no prompts in the file")
  return prompts
