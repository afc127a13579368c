"""A trained model as a checkpoint others can load: Hugging Face layout (``specjax.load_model``
and ``transformers`` both read it), its tokenizer, and a reduced head's vocabulary ids."""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np

from specjax.models.transformer import Transformer


def export_model(model: Transformer, tokenizer, path: str | os.PathLike,
                 vocab_ids: np.ndarray | None = None) -> None:
  """Writes ``model`` (HF layout via ``specjax.models.hf.save_model``), ``tokenizer`` and, for a
  reduced-vocabulary draft, its ``vocab_ids`` (``reduced_vocab.VOCAB_FILE``) to ``path``,
  atomically (a temporary dir renamed into place)."""
  from specjax.models.hf import save_model
  from specjax.models.reduced_vocab import save_vocab_ids

  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  save_model(model, str(tmp))
  tokenizer.save_pretrained(str(tmp))
  if vocab_ids is not None:
    save_vocab_ids(tmp, vocab_ids)
  shutil.rmtree(path, ignore_errors=True)
  os.replace(tmp, path)


def load_exported(path: str | os.PathLike) -> Transformer:
  """An exported model read back in float32 (the dtype it is trained in)."""
  from specjax.models.hf import load_model
  return load_model(str(path), dtype="float32")
