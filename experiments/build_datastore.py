r"""Builds a retrieval datastore (``sj.Datastore``, for ``sj.Retrieval``) from text files.

    python -m experiments.build_datastore --out=/tmp/stdlib_store  # the stdlib, SmolLM2's tokenizer
    python -m experiments.build_datastore --out=my_store --files='docs/**/*.md,src/**/*.py' \
        --tokenizer=smollm2-135m --max_bytes=20000000

Each file is one document, tokenized with the model's tokenizer (a checkpoint name such as
``smollm2-135m``, a ``.gguf`` file or a Hugging Face directory: ``sj.load_tokenizer``); the token
ids, one document after another, and their suffix array are saved as ``datastore.npz`` +
``datastore.json`` under ``--out``. Without ``--files`` the source is the Python standard
library's ``*.py`` files (``experiments/corpus.py``: no network, a seeded file order, so a byte cap
samples the whole library), up to ``--max_bytes`` of source.

``ensure_datastore()`` is the cached version that configs use (``configs/retrieval.py``): built
once per (tokenizer, byte cap, stdlib) under ``specjax.cache.cache_root()/datastores``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pathlib
import sys
import sysconfig
import time
from typing import Sequence

import numpy as np
from absl import app, flags

from specjax.cache import cache_root

DEFAULT_TOKENIZER = "smollm2-135m"
DEFAULT_MAX_BYTES = 4_000_000
VERSION = "datastores-v1"


def _log(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def stdlib_texts(max_bytes: int) -> tuple[list[str], list[str]]:
  """(texts, relative paths) of the standard library's source files, up to ``max_bytes``
  (``experiments.corpus.load_corpus``'s training split: seeded order, tests and codecs left out)."""
  from experiments import corpus
  stdlib = corpus.load_corpus(max_train_bytes=max_bytes)
  return stdlib.train, stdlib.train_files


def file_texts(patterns: Sequence[str], max_bytes: int) -> tuple[list[str], list[str]]:
  """(texts, paths) of the UTF-8 files matching the glob ``patterns`` (``**`` recurses), sorted,
  up to ``max_bytes``; files that are not UTF-8 are skipped."""
  paths = sorted({p for pattern in patterns for p in glob.glob(pattern, recursive=True)
                  if os.path.isfile(p)})
  if not paths:
    raise ValueError(f"no files match {list(patterns)}")
  texts, used, total = [], [], 0
  for path in paths:
    try:
      data = pathlib.Path(path).read_bytes()
      text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
      continue
    if total + len(data) > max_bytes:
      break
    total += len(data)
    texts.append(text)
    used.append(path)
  if not texts:
    raise ValueError(f"no UTF-8 file under the {max_bytes}-byte cap matches {list(patterns)}")
  return texts, used


def build(texts: Sequence[str], tokenizer, tokenizer_name: str, metadata: dict | None = None):
  """An ``sj.Datastore`` of ``texts`` (one document each) tokenized with ``tokenizer`` (no
  special tokens added)."""
  import specjax as sj
  from experiments.corpus import encode_stream
  stream = encode_stream(tokenizer, texts)  # each document followed by EOS
  ends = np.flatnonzero(stream == tokenizer.eos_token_id)
  documents = [doc[:-1] for doc in np.split(stream, ends + 1)]
  return sj.Datastore.build(documents, vocab_size=_vocab_size(tokenizer),
                            tokenizer=tokenizer_name, metadata=metadata)


def _vocab_size(tokenizer) -> int:
  """The model's vocabulary size as the tokenizer knows it (added tokens included)."""
  return int(len(tokenizer))


def build_and_save(out: str | os.PathLike, tokenizer_name: str = DEFAULT_TOKENIZER,
                   files: Sequence[str] = (), max_bytes: int = DEFAULT_MAX_BYTES,
                   verbose: bool = True) -> pathlib.Path:
  """Builds the datastore of ``files`` (globs; the stdlib when empty) and saves it at ``out``."""
  import specjax as sj
  t0 = time.perf_counter()
  texts, paths = file_texts(files, max_bytes) if files else stdlib_texts(max_bytes)
  tokenizer = sj.load_tokenizer(tokenizer_name)
  meta = {"source": list(files) if files else f"stdlib {sysconfig.get_paths()['stdlib']}",
          "files": len(paths), "bytes": sum(len(t.encode()) for t in texts),
          "max_bytes": int(max_bytes)}
  store = build(texts, tokenizer, tokenizer_name, meta)
  path = store.save(out)
  if verbose:
    _log(f"[datastore] {store} from {meta['files']} files ({meta['bytes'] / 1e6:.1f} MB) -> "
         f"{path} ({time.perf_counter() - t0:.1f}s)")
  return path


def default_datastore_dir(tokenizer_name: str = DEFAULT_TOKENIZER,
                          max_bytes: int = DEFAULT_MAX_BYTES) -> pathlib.Path:
  """Where ``ensure_datastore`` keeps the stdlib datastore of this tokenizer and byte cap (keyed
  by both, the stdlib's location and Python version, and the datastore format)."""
  from specjax.retrieval import FORMAT
  key = json.dumps([tokenizer_name, int(max_bytes), sysconfig.get_paths()["stdlib"],
                    sys.version_info[:3], FORMAT])
  digest = hashlib.sha256(key.encode()).hexdigest()[:12]
  name = "".join(c if c.isalnum() or c in "-_." else "_" for c in pathlib.Path(
      tokenizer_name).name)
  return cache_root() / VERSION / f"stdlib-{name}-{max_bytes}-{digest}"


def ensure_datastore(tokenizer_name: str = DEFAULT_TOKENIZER, max_bytes: int = DEFAULT_MAX_BYTES,
                     verbose: bool = True) -> pathlib.Path:
  """The stdlib datastore of ``tokenizer_name`` (a checkpoint name, ``.gguf`` file or directory)
  capped at ``max_bytes`` of source: built and saved on the first call (seconds to a minute),
  returned at once afterwards. The directory appears atomically, complete or not at all."""
  from specjax.retrieval import METADATA
  path = default_datastore_dir(tokenizer_name, max_bytes)
  if (path / METADATA).is_file():
    return path
  if verbose:
    _log(f"[datastore] building the stdlib datastore for {tokenizer_name} (first use) at {path}")
  return build_and_save(path, tokenizer_name, max_bytes=max_bytes, verbose=verbose)


FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "output directory of the datastore")
flags.DEFINE_string("tokenizer", DEFAULT_TOKENIZER,
                    "the model's tokenizer: a checkpoint name, a .gguf file or an HF directory")
flags.DEFINE_list("files", [], "glob patterns of text files, one document each ('**' recurses); "
                  "default: the Python standard library's sources")
flags.DEFINE_integer("max_bytes", DEFAULT_MAX_BYTES, "cap on the source bytes read")


def main(argv):
  del argv
  if not FLAGS.out:
    raise app.UsageError("--out is required (the datastore directory to write)")
  if FLAGS.max_bytes < 1:
    raise app.UsageError(f"--max_bytes must be >= 1, got {FLAGS.max_bytes}")
  try:
    build_and_save(FLAGS.out, FLAGS.tokenizer, FLAGS.files, FLAGS.max_bytes)
  except ValueError as e:
    raise app.UsageError(str(e)) from None


if __name__ == "__main__":
  app.run(main)
