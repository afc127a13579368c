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

# Instructions for a chat model (SmolLM2-135M-Instruct, the default target): the runner wraps each
# in the model's chat template (config.chat_template). Code, explanation, lists, short prose.
CHAT = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the capital of France? Answer in one sentence.",
    "Explain in two sentences what a hash table is.",
    "Give me three tips for writing readable code.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarise the water cycle in a few sentences.",
    "List five fruits and their colours.",
    "Write a short poem about the sea.",
    "How do I reverse a list in Python?",
    "What is the difference between a list and a tuple in Python?",
    "Write a haiku about autumn.",
    "Explain what recursion is, with a small example.",
    "Give a one-paragraph description of the solar system.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "What are the benefits of regular exercise?",
    "Translate 'good morning, how are you?' into French and Spanish.",
]

_FUNCTIONS = [
    ("def total_price(items):\n    total = 0\n    for item in items:\n        total += "
     "item.price * item.quantity\n    return total\n", "Rename the variable total to acc."),
    ("def read_config(path):\n    with open(path) as f:\n        lines = f.readlines()\n    "
     "config = {}\n    for line in lines:\n        key, value = line.split('=')\n        "
     "config[key.strip()] = value.strip()\n    return config\n",
     "Skip lines that start with '#'."),
    ("class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):"
     "\n        self.count += 1\n\n    def reset(self):\n        self.count = 0\n",
     "Add a decrement method."),
    ("def find_max(values):\n    best = values[0]\n    for value in values[1:]:\n        if value"
     " > best:\n            best = value\n    return best\n",
     "Make it return None for an empty list."),
    ("def greet(name, greeting='Hello'):\n    message = greeting + ', ' + name + '!'\n    "
     "print(message)\n    return message\n", "Use an f-string instead of concatenation."),
    ("def average(numbers):\n    if not numbers:\n        return 0\n    return sum(numbers) / "
     "len(numbers)\n", "Add type hints."),
    ("def is_prime(n):\n    if n < 2:\n        return False\n    for i in range(2, n):\n        "
     "if n % i == 0:\n            return False\n    return True\n",
     "Only test divisors up to the square root of n."),
    ("def word_counts(text):\n    counts = {}\n    for word in text.split():\n        counts[word]"
     " = counts.get(word, 0) + 1\n    return counts\n", "Make it case-insensitive."),
]
# Code editing: a function given in the prompt and asked back with a change (chat-style), where
# copying from the prompt pays (prompt lookup, retrieval).
CODE_EDIT = [f"{change} Return the whole function.\n\n```python\n{code}```"
             for code, change in _FUNCTIONS]

_PASSAGE = ("The Apollo 11 mission launched on July 16, 1969, from Kennedy Space Center. Neil "
            "Armstrong and Buzz Aldrin landed the lunar module Eagle on the Moon on July 20, while "
            "Michael Collins stayed in orbit aboard the command module Columbia. The crew returned "
            "to Earth on July 24, splashing down in the Pacific Ocean.")
# Extraction: answers that quote the prompt.
EXTRACT = [f"{_PASSAGE}\n\n{question}" for question in (
    "Copy the sentence that says when the mission launched.",
    "List the names of the three astronauts.",
    "Quote the sentence about Michael Collins.",
    "Repeat the passage word for word.",
)]

PROMPT_SETS = {
    "chat": CHAT,              # 16 instructions (use with chat_template=True)
    "code-edit": CODE_EDIT,    # 8 code-editing instructions (chat_template=True)
    "extract": EXTRACT,        # 4 extraction questions on one passage (chat_template=True)
    "chat-small": CHAT[:4],
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
