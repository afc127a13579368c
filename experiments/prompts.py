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

# Longer functions (10-20 lines) asked back with a change of a line or two, as most real edits
# are: the answer is mostly the prompt's own code.
_LONG_FUNCTIONS = [
    ('''import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Serve files over HTTP.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    parser.add_argument("--root", default=".", help="directory to serve")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    if args.port < 1 or args.port > 65535:
        parser.error("port must be between 1 and 65535")
    return args
''', "Change the default port from 8080 to 9000."),
    ('''class BankAccount:
    def __init__(self, owner, balance=0.0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        self.balance -= amount
        self.history.append(("withdraw", amount))

    def statement(self):
        return "\\n".join(f"{kind}: {amount:.2f}" for kind, amount in self.history)
''', "Make withdraw raise ValueError when the amount is larger than the balance."),
    ('''def merge_sorted(a, b):
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result
''', "Rename the arguments a and b to left and right."),
    ('''import csv


def load_users(path):
    users = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            user = {
                "name": row["name"].strip(),
                "email": row["email"].strip().lower(),
                "age": int(row["age"]),
            }
            users.append(user)
    return users
''', "Skip rows whose email is empty."),
    ('''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        if not self.items:
            raise IndexError("peek at an empty stack")
        return self.items[-1]

    def __len__(self):
        return len(self.items)
''', "Add an is_empty method."),
    ('''def binary_search(items, target):
    low, high = 0, len(items) - 1
    while low <= high:
        middle = (low + high) // 2
        if items[middle] == target:
            return middle
        if items[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return None
''', "Return -1 instead of None when the target is missing."),
    ('''def format_report(rows):
    lines = ["Name       Score  Grade"]
    for row in rows:
        score = row["score"]
        if score >= 90:
            grade = "A"
        elif score >= 80:
            grade = "B"
        elif score >= 70:
            grade = "C"
        else:
            grade = "F"
        lines.append(f"{row['name']:<10} {score:>5}  {grade}")
    return "\\n".join(lines)
''', "Add a grade D for scores from 60 to 69."),
    ('''import time


def retry(func, attempts=3, delay=1.0):
    last_error = None
    for attempt in range(attempts):
        try:
            return func()
        except Exception as error:
            last_error = error
            time.sleep(delay)
    raise RuntimeError(f"failed after {attempts} attempts") from last_error
''', "Double the delay after each failed attempt."),
]
CODE_EDIT_LONG = [f"{change} Return the whole code.\n\n```python\n{code}```"
                  for code, change in _LONG_FUNCTIONS]

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
    "code-edit-long": CODE_EDIT_LONG,  # 8 edits of longer functions (chat_template=True)
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
