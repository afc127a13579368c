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
import sysconfig
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
