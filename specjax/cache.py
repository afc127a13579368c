"""Where specjax keeps files it derives once and reuses (converted checkpoints, the default pair).

``cache_root()`` is ``$SPECJAX_CACHE`` if set, else ``$XDG_CACHE_HOME/specjax``, else
``~/.cache/specjax``. Entries are written with ``atomic_path`` so that a crash or a concurrent
writer never leaves a half-written file under its final name: readers see the old state or the new.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import shutil
import tempfile
from typing import Iterator

_CHUNK = 1 << 20


def cache_root() -> pathlib.Path:
  """The specjax cache directory (it may not exist yet)."""
  if os.environ.get("SPECJAX_CACHE"):
    return pathlib.Path(os.environ["SPECJAX_CACHE"]).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  return pathlib.Path(base).expanduser() / "specjax"


def file_sha256(path: str | os.PathLike) -> str:
  """Hex sha256 of a file's bytes, streamed in 1 MiB chunks (constant memory).

  Cache keys hash the whole content rather than size/mtime or sampled blocks: a key that misses an
  edit would silently serve stale weights, and hashing (~1 GB/s) costs less than reading and
  dequantizing the file, which a miss needs anyway.
  """
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(_CHUNK), b""):
      digest.update(chunk)
  return digest.hexdigest()


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[pathlib.Path]:
  """Yields a fresh temporary path next to ``dest``; on success renames it onto ``dest``.

  The body writes a file or a directory at the yielded path. On an exception the temporary is
  removed and ``dest`` is left as it was. The rename is atomic (same filesystem); if ``dest`` is a
  directory that appeared meanwhile (a concurrent writer), the other writer's copy is kept.
  """
  dest = pathlib.Path(dest)
  dest.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
  target = tmp / dest.name
  try:
    yield target
    try:
      os.replace(target, dest)
    except OSError:
      if not (target.is_dir() and dest.is_dir()):  # os.replace cannot replace a non-empty dir
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
