"""Progress lines of the training mechanisms (stderr), switchable as a whole.

A library cannot know whether its caller wants a live log (a run by hand) or silence (a first-use
build inside a test): ``set_verbose`` decides for every module of ``specjax.training``.
"""

from __future__ import annotations

import math
import sys
import time

_VERBOSE = True


def set_verbose(verbose: bool) -> bool:
  """Turns progress lines (stderr) on or off; returns the previous setting."""
  global _VERBOSE
  old, _VERBOSE = _VERBOSE, bool(verbose)
  return old


def log(msg: str) -> None:
  """One timestamped progress line on stderr, unless ``set_verbose(False)``."""
  if not _VERBOSE:
    return
  print(f"[specjax.train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt_seconds(s: float) -> str:
  """``75.2`` -> ``"1m15s"``; ``"?"`` for an unknown (non-finite) time."""
  if not math.isfinite(s):
    return "?"
  s = int(round(s))
  return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def bar(total: int, initial: int = 0, desc: str = ""):
  """A tqdm progress bar on stderr (``update(n)``, ``set_postfix_str``, ``close``), or None when
  progress is off (``set_verbose(False)``) or tqdm is not installed."""
  if not _VERBOSE:
    return None
  try:
    from tqdm.auto import tqdm
  except ImportError:
    return None
  return tqdm(total=total, initial=initial, desc=desc, unit="step", file=sys.stderr,
              dynamic_ncols=True, leave=True)
