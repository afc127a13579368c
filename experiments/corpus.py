"""A corpus that needs no network: the Python standard library's own source.

Files are listed in sorted order, then put in a fixed pseudo-random order (a seeded permutation of the
sorted list) so that a byte cap samples the whole library instead of its alphabetical head. Each file
goes to the validation split or the training split by a checksum of its relative path, so the split
does not move when the cap changes. Everything here is deterministic for a given stdlib.

The tokenizer is a byte-level BPE trained with ``tokenizers`` and saved as a
``transformers.PreTrainedTokenizerFast``, so ``transformers.AutoTokenizer.from_pretrained`` loads it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import sysconfig
import textwrap
import zlib
from typing import Sequence

import numpy as np

EOS_TOKEN = "<|endoftext|>"

# Directories skipped: installed packages, test suites (huge data literals, odd encodings) and the
# codec tables in encodings/ (pages of hex literals, which teach a model nothing about code).
DEFAULT_EXCLUDE_DIRS = ("site-packages", "dist-packages", "test", "tests", "idle_test", "encodings",
                        "__pycache__")


@dataclasses.dataclass
class Corpus:
  train: list[str]  # file contents
  val: list[str]
  train_files: list[str]  # paths relative to the root
  val_files: list[str]

  @property
  def train_bytes(self) -> int:
    return sum(len(t.encode()) for t in self.train)

  @property
  def val_bytes(self) -> int:
    return sum(len(t.encode()) for t in self.val)


def stdlib_root() -> pathlib.Path:
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def list_source_files(root: str | os.PathLike, exclude_dirs: Sequence[str] = DEFAULT_EXCLUDE_DIRS
                      ) -> list[str]:
  """Sorted relative paths of ``*.py`` files under ``root``, skipping ``exclude_dirs`` by name."""
  root = pathlib.Path(root)
  exclude = set(exclude_dirs)
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in exclude)
    for name in filenames:
      if name.endswith(".py"):
        out.append(str(pathlib.Path(dirpath, name).relative_to(root)))
  return sorted(out)


def is_val_file(relpath: str, val_percent: float) -> bool:
  return zlib.crc32(relpath.encode()) % 10_000 < val_percent * 100


def load_corpus(root: str | os.PathLike | None = None, max_train_bytes: int = 4_000_000,
                max_val_bytes: int = 200_000, val_percent: float = 5.0, seed: int = 0,
                exclude_dirs: Sequence[str] = DEFAULT_EXCLUDE_DIRS,
                max_file_bytes: int = 200_000) -> Corpus:
  """Reads ``*.py`` files under ``root`` (default: the stdlib) up to the byte caps, split by file.

  Files that are not UTF-8, or larger than ``max_file_bytes``, are skipped. A file that would
  overflow a split's cap is skipped and later (smaller) files may still fill it.
  """
  root = pathlib.Path(root) if root is not None else stdlib_root()
  files = list_source_files(root, exclude_dirs)
  if not files:
    raise ValueError(f"no *.py files under {root}")
  order = np.random.default_rng(seed).permutation(len(files))
  corpus = Corpus([], [], [], [])
  sizes = {"train": 0, "val": 0}
  caps = {"train": max_train_bytes, "val": max_val_bytes}
  for i in order:
    rel = files[i]
    split = "val" if is_val_file(rel, val_percent) else "train"
    if sizes[split] >= caps[split]:
      if all(sizes[s] >= caps[s] for s in sizes):
        break
      continue
    try:
      data = (root / rel).read_bytes()
      text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
      continue
    if not text.strip() or len(data) > max_file_bytes or sizes[split] + len(data) > caps[split]:
      continue
    sizes[split] += len(data)
    getattr(corpus, split).append(text)
    getattr(corpus, f"{split}_files").append(rel)
  if not corpus.train or not corpus.val:
    raise ValueError(f"corpus under {root} gave {len(corpus.train)} training and "
                     f"{len(corpus.val)} validation files; raise the byte caps or val_percent")
  return corpus


def train_tokenizer(texts: Sequence[str], vocab_size: int, min_frequency: int = 2):
  """A byte-level BPE ``transformers.PreTrainedTokenizerFast`` with ``<|endoftext|>`` as BOS/EOS/pad
  (id 0)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  from transformers import PreTrainedTokenizerFast

  if vocab_size < 257:
    raise ValueError(f"vocab_size must be >= 257 (256 bytes + <|endoftext|>), got {vocab_size}")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                special_tokens=[EOS_TOKEN], show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer=trainer)
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN,
                                 pad_token=EOS_TOKEN, model_max_length=1 << 30)


def encode_stream(tokenizer, texts: Sequence[str]) -> np.ndarray:
  """int32[N]: each text's ids followed by EOS, concatenated (documents separated by EOS)."""
  eos = tokenizer.eos_token_id
  backend = getattr(tokenizer, "backend_tokenizer", None) or tokenizer._tokenizer
  encodings = backend.encode_batch(list(texts), add_special_tokens=False)
  parts = []
  for enc in encodings:
    parts.append(np.asarray(enc.ids, np.int32))
    parts.append(np.asarray([eos], np.int32))
  return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


# ------------------------------------------------------------------------------- chat slice

# Questions that open the conversations of ``chat_corpus`` (cycled through the sections).
CHAT_QUESTIONS = ("Explain {} in Python.", "What is {}?", "Tell me about {}.",
                  "How does {} work in Python?", "Can you describe {}?",
                  "I'm learning Python. What should I know about {}?")
_HEADING = re.compile(r"^([*=\-^~])\1{2,}$")


def python_docs() -> list[tuple[str, str]]:
  """(title, markdown text) sections of the Python language reference that ships with the
  standard library (``pydoc_data.topics``, what ``help("class")`` prints), split at its underlined
  headings; hard-wrapped paragraphs are joined and indented blocks become fenced code, as a chat
  model writes them."""
  from pydoc_data import topics

  sections = []
  for key in sorted(topics.topics):
    lines = topics.topics[key].splitlines()
    title, body = key.replace("-", " "), []
    for i, line in enumerate(lines):
      if _HEADING.match(line.strip()) and i and len(line.strip()) >= len(lines[i - 1].strip()):
        continue  # the underline of the heading handled below
      if i + 1 < len(lines) and line.strip() and _HEADING.match(lines[i + 1].strip()) and \
          len(lines[i + 1].strip()) >= len(line.strip()):
        if body and any(b.strip() for b in body):
          sections.append((title, _markdown(body)))
        title, body = line.strip(), []
        continue
      body.append(line)
    if any(b.strip() for b in body):
      sections.append((title, _markdown(body)))
  return sections


def _markdown(lines: Sequence[str]) -> str:
  """Hard-wrapped reference text -> paragraphs on one line each, indented blocks fenced."""
  out, para, code = [], [], []

  def flush():
    if para:
      out.append(" ".join(para))
      para.clear()
    if code:
      out.append("```\n" + textwrap.dedent("\n".join(code)).strip("\n") + "\n```")
      code.clear()

  for line in lines:
    if not line.strip():
      if code:
        code.append("")
      else:
        flush()
    elif line.startswith("   "):
      if para:
        flush()
      code.append(line)
    else:
      if code:
        flush()
      para.append(line.strip())
  flush()
  return "\n\n".join(out)


def chat_corpus(tokenizer, max_train_bytes: int = 400_000, max_val_bytes: int = 20_000,
                val_percent: float = 5.0, max_chars: int = 3000) -> Corpus:
  """The Python reference (``python_docs``) as one-turn conversations in ``tokenizer``'s chat
  template: a question about each section's title, the section (cut at ``max_chars``) as the
  answer. English prose and the chat template's tokens, for a draft that must follow a chat
  model on chat prompts; split by a checksum of the title like the files of ``load_corpus``.
  The texts hold the template's special tokens: encode them with ``encode_stream``."""
  corpus = Corpus([], [], [], [])
  caps = {"train": max_train_bytes, "val": max_val_bytes}
  sizes = {"train": 0, "val": 0}
  for n, (title, text) in enumerate(python_docs()):
    if len(text) > max_chars:
      text = text[:text.rfind("\n\n", 0, max_chars)] if "\n\n" in text[:max_chars] else \
          text[:max_chars]
    question = CHAT_QUESTIONS[n % len(CHAT_QUESTIONS)].format(title)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}, {"role": "assistant", "content": text}],
        tokenize=False)
    split = "val" if is_val_file(f"{n}:{title}", val_percent) else "train"
    size = len(chat.encode())
    if sizes[split] + size > caps[split]:
      continue
    sizes[split] += size
    getattr(corpus, split).append(chat)
    getattr(corpus, f"{split}_files").append(title)
  return corpus


# Instructions of ``chat_prompts``: coding tasks from the stdlib's own docstrings, questions about
# the Python reference, and everyday prose requests over a small built-in list of subjects.
_CODE_TASKS = ("Write a Python function to {}.", "How can I {} in Python?",
               "Show me Python code to {}.")
_PROSE_TASKS = ("Write a short paragraph about {}.", "Give me three facts about {}.",
                "Explain {} to a child.", "Write a short poem about {}.",
                "What are the advantages and disadvantages of {}?",
                "Describe {} in a few sentences.", "Give me some tips about {}.",
                "Why is {} important?")
_SUBJECTS = ("the moon", "coffee", "friendship", "rain forests", "the ocean tides", "volcanoes",
             "learning a new language", "bicycles", "the human heart", "honey bees",
             "electric cars", "the printing press", "chess", "mountains", "photosynthesis",
             "the internet", "healthy breakfasts", "public libraries", "winter", "trains",
             "recycling", "the Roman Empire", "music lessons", "deserts", "sleep",
             "computer viruses", "gardening", "the stock market", "earthquakes", "teamwork",
             "the solar wind", "bread baking", "time management", "whales", "mathematics",
             "city parks", "renewable energy", "the Olympic Games", "birds migrating",
             "writing a resume")
_VERB = re.compile(r"^(Return|Compute|Convert|Create|Check|Find|Get|Parse|Read|Write|Split|Join|"
                   r"Remove|Add|Encode|Decode|Format|Make|Build|Count|Test|Determine|Generate)s?\b")


def code_tasks(texts: Sequence[str]) -> list[str]:
  """Task phrases ("return the path of a file") from the first docstring lines of the public
  functions in ``texts`` (Python sources) that start with a common verb."""
  import ast

  tasks = []
  for _, node in _functions(texts):
    if not node.name.startswith("_"):
      doc = ast.get_docstring(node)
      line = doc.strip().splitlines()[0].strip().rstrip(".") if doc and doc.strip() else ""
      match = _VERB.match(line)
      if match and 15 < len(line) < 90 and not line.endswith((",", " the", " or", " and")):
        tasks.append(match.group(1).lower() + line[match.end():])
  return sorted(set(tasks))


def _functions(texts: Sequence[str]):
  """(text, ``ast.FunctionDef``) for every function of the parseable Python ``texts``."""
  import ast

  for text in texts:
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError):
      continue
    for node in ast.walk(tree):
      if isinstance(node, ast.FunctionDef):
        yield text, node


def chat_prompts(code_texts: Sequence[str], n: int, seed: int = 0) -> list[str]:
  """``n`` user instructions for a chat model, a third each: coding tasks (``code_tasks`` of
  ``code_texts``), questions about the Python reference's sections and everyday prose requests
  (deterministic for a given seed and stdlib)."""
  rng = np.random.default_rng(seed)
  tasks = code_tasks(code_texts)
  titles = [title for title, _ in python_docs()]
  prompts = []
  for i in range(n):
    kind = i % 3
    if kind == 0 and tasks:
      prompts.append(_CODE_TASKS[i % len(_CODE_TASKS)].format(tasks[rng.integers(len(tasks))]))
    elif kind == 1:
      prompts.append(CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)].format(
          titles[rng.integers(len(titles))]))
    else:
      prompts.append(_PROSE_TASKS[rng.integers(len(_PROSE_TASKS))].format(
          _SUBJECTS[rng.integers(len(_SUBJECTS))]))
  return prompts


# Changes asked of a function by ``edit_prompts`` ({name}: the function's, {arg}: its first
# parameter); the answer is mostly the function copied back from the prompt.
_EDITS = ("Add type hints.", "Add a docstring.", "Rename the function to {name}_v2.",
          "Rename the parameter {arg} to {arg}_value.", "Add a comment to each line.",
          "Raise a ValueError when {arg} is None.", "Log each call with print.",
          "Make {arg} optional, defaulting to None.", "Remove the docstring.",
          "Use early returns where possible.")


def edit_prompts(code_texts: Sequence[str], n: int, seed: int = 0, max_lines: int = 10,
                 max_chars: int = 240) -> list[str]:
  """``n`` code-editing instructions for a chat model: a short function of ``code_texts``
  (Python sources, at most ``max_lines`` lines and ``max_chars`` characters: the whole prompt
  fits a training row's prompt tail) asked back with a change of ``_EDITS``, in the shape of
  ``experiments.prompts.CODE_EDIT`` (whose hand-written functions are not among them). Their
  answers copy spans of the prompt, what a head learns to draft on code edits only from such
  examples (deterministic for a given seed and stdlib)."""
  import ast

  functions = []
  for text, node in _functions(code_texts):
    if node.args.args and node.col_offset == 0:
      source = ast.get_source_segment(text, node)
      if source and 3 <= source.count("\n") + 1 <= max_lines and len(source) <= max_chars:
        functions.append((source, node.name, node.args.args[0].arg))
  if n and not functions:
    raise ValueError(f"no function of <= {max_lines} lines in the {len(code_texts)} code texts")
  rng = np.random.default_rng([seed, 13])
  prompts = []
  for i in rng.permutation(max(len(functions), n))[:n] % max(len(functions), 1):
    source, name, arg = functions[int(i)]
    change = _EDITS[int(rng.integers(len(_EDITS)))].format(name=name, arg=arg)
    prompts.append(f"{change} Return the whole function.\n\n```python\n{source}\n```")
  return prompts
