"""The embedded default target/draft pair: trained locally on first use, cached, reused.

``ensure_default_pair()`` returns ``(target_dir, draft_dir)``, two Hugging Face-layout checkpoint
directories (config.json, model.safetensors, tokenizer files) that ``specjax.load_model`` and
``transformers`` load. The first call trains them with ``configs/train_default.py`` (tokenizer +
target + draft on the Python standard library's source; no network; about 8-9 minutes on 2 CPU
cores) into ``default_pair_dir()``; later calls return the cached directories at once.

Crash safety: the build happens in ``<dir>.partial`` under an exclusive file lock, the marker file
``COMPLETE.json`` is written last, and only then is the directory renamed into place. A directory
without the marker (or missing a model file) is treated as garbage and rebuilt, never used.

Cache location: ``$SPECJAX_CACHE/default-pair-v1``, else ``$XDG_CACHE_HOME/specjax/...``, else
``~/.cache/specjax/default-pair-v1``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import time

from specjax.cache import cache_root

VERSION = "default-pair-v1"
MARKER = "COMPLETE.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "train_default.py"


def default_pair_dir() -> pathlib.Path:
  """Where the default pair lives (it may not be built yet; see ``ensure_default_pair``)."""
  return cache_root() / VERSION


def is_complete(path: str | os.PathLike, models: tuple[str, ...] = ("target", "draft"),
                files: tuple[str, ...] = REQUIRED_FILES) -> bool:
  """True when ``path`` holds a finished build: the marker and every model's ``files``."""
  path = pathlib.Path(path)
  if not (path / MARKER).is_file():
    return False
  try:
    json.loads((path / MARKER).read_text())
  except (OSError, ValueError):
    return False
  return all((path / m / f).is_file() for m in models for f in files)


def finish_build(partial: pathlib.Path, dest: pathlib.Path, marker: dict,
                 scratch: tuple[str, ...] = ("checkpoints", "data")) -> None:
  """Completes a build made in ``partial``: its ``scratch`` directories removed, the ``MARKER``
  file written last, then ``partial`` renamed to ``dest`` (replacing it)."""
  for name in scratch:
    shutil.rmtree(partial / name, ignore_errors=True)
  marker = dict(marker, created=time.time(), python=sys.version.split()[0])
  (partial / MARKER).write_text(json.dumps(marker, indent=1, default=str))  # written last
  shutil.rmtree(dest, ignore_errors=True)
  os.replace(partial, dest)


def load_config(file: str | os.PathLike):
  """The ``ml_collections`` config of a config file (its ``get_config()``)."""
  spec = importlib.util.spec_from_file_location(f"specjax_config_{pathlib.Path(file).stem}", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def default_train_config():
  """The ``ml_collections`` config of ``configs/train_default.py``."""
  return load_config(_CONFIG_FILE)


@contextlib.contextmanager
def _exclusive_lock(path: pathlib.Path):
  import fcntl
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def build_pair(dest: str | os.PathLike, config=None, verbose: bool = True,
               version: str = VERSION) -> dict:
  """Trains the pair described by ``config`` (default: ``configs/train_default.py``) into
  ``dest`` (replaced), returns the training report. ``dest/draft`` is ``config.default_draft``;
  another trained draft is kept as ``dest/draft_data`` or ``dest/draft_distill``. A config with
  a ``teacher`` builds the draft alone (``dest/draft``). ``version`` goes into the marker."""
  from experiments import train
  from specjax.training import set_verbose

  config = default_train_config() if config is None else config
  dest = pathlib.Path(dest)
  partial = dest.with_name(dest.name + ".partial")
  shutil.rmtree(partial, ignore_errors=True)
  old_verbose = set_verbose(verbose)
  try:
    t0 = time.time()
    report = train.run(config, partial)
    chosen = str(config.default_draft)
    if not (partial / chosen / "config.json").exists():
      raise RuntimeError(f"default_draft {chosen!r} was not trained (phases: {config.phases})")
    os.replace(partial / chosen, partial / "draft.tmp")
    if (partial / "draft").exists():  # the data-trained draft, when the distilled one is chosen
      os.replace(partial / "draft", partial / "draft_data")
    os.replace(partial / "draft.tmp", partial / "draft")
    report["default_draft"] = chosen
    report["build_seconds"] = time.time() - t0
    (partial / train.REPORT_FILE).write_text(json.dumps(report, indent=1))
    finish_build(partial, dest, {"version": version, "default_draft": chosen,
                                 "build_seconds": report["build_seconds"],
                                 "config": config.to_dict()})
  finally:
    set_verbose(old_verbose)
  return report


def ensure_built(dest: pathlib.Path, models: tuple[str, ...], build, verbose: bool = True,
                 what: str = "the default target/draft pair",
                 duration: str = "about 8-9 minutes on 2 CPU cores",
                 files: tuple[str, ...] = REQUIRED_FILES) -> bool:
  """Runs ``build(dest)`` unless ``dest`` is complete (``is_complete(dest, models, files)``),
  under an exclusive lock beside ``dest`` so that concurrent callers build once; an incomplete
  ``dest`` (an interrupted build) is removed first. Returns True if this call built it."""
  if is_complete(dest, models, files):
    return False
  with _exclusive_lock(dest.with_name(dest.name + ".lock")):
    if is_complete(dest, models, files):  # another process may have finished it meanwhile
      return False
    if dest.exists():
      if verbose:
        print(f"[specjax] {dest} is incomplete (an interrupted build?); rebuilding it",
              file=sys.stderr, flush=True)
      shutil.rmtree(dest)
    if verbose:
      print(f"[specjax] training {what} into {dest} (first use only; {duration}; set "
            "$SPECJAX_CACHE to move it)", file=sys.stderr, flush=True)
    build(dest)
  return True


def ensure_default_pair(verbose: bool = True) -> tuple[pathlib.Path, pathlib.Path]:
  """``(target_dir, draft_dir)`` of the default pair, training it first if it is not cached."""
  dest = default_pair_dir()

  def build(dest):
    t0 = time.time()
    report = build_pair(dest, verbose=verbose)
    if verbose:
      agreement = report.get("agreement", {}).get(report["default_draft"], {})
      print(f"[specjax] default pair ready in {time.time() - t0:.0f}s: target val loss "
            f"{report['phases']['target']['val_loss']:.3f}, draft val loss "
            f"{report['phases'][report['default_draft']]['val_loss']:.3f}, greedy agreement "
            f"{agreement.get('greedy_agreement', float('nan')):.3f}", file=sys.stderr, flush=True)

  ensure_built(dest, ("target", "draft"), build, verbose)
  return dest / "target", dest / "draft"


if __name__ == "__main__":
  print(*ensure_default_pair(), sep="\n")
