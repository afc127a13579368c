"""EAGLE heads on disk in the EAGLE repository's published layout (SafeAILab/EAGLE,
``eagle/model/cnets1.py`` / ``cnets.py`` ``Model``; ``ea_model.py`` loads it with
``load_state_dict(strict=True)``), both ways: ``sj.load_head`` / ``sj.save_head``.

A head directory holds ``config.json`` (a Llama config of the head: the target's sizes,
``num_hidden_layers`` head layers; ``bias``: whether ``fc`` has one, default true; ``qkv_bias``)
and its tensors: ``fc.weight`` [E, 2E] (a torch Linear over ``cat(embedding, feature)``),
``fc.bias``, and per layer ``layers.{i}.*`` with the Llama decoder layer's names, without
``layers.0.input_layernorm`` (the first layer has none). ``embed_tokens.weight``, the target's
embedding, is in some released files: it is kept on the head and checked against the target's
(``check_head``), drafting always embeds with the target's. Weights come from
``model.safetensors`` or, when torch is installed, ``pytorch_model.bin`` through
``torch.load(weights_only=True)``. The layout table is ``hf_layout``'s (one mechanism).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.heads.eagle import EagleHead
from specjax.models.config import ModelConfig, from_hf_dict, rope_inverse_frequencies, to_hf_dict
from specjax.models.hf_layout import (Entry, _iter_hf_tensors, _SafetensorsReader, fill_from_hf,
                                      linear, llama_layer)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
BIN_NAME = "pytorch_model.bin"
EMBED_NAME = "embed_tokens.weight"
_BUFFER_SUFFIX = "rotary_emb.inv_freq"  # a non-parameter buffer some files carry


def eagle_layout(config: ModelConfig, fc_bias: bool) -> list[Entry]:
  """Every tensor of an EAGLE-1/2 head but the optional embedding, with our param paths."""
  table = linear("fc", ("fc",), fc_bias)
  for i in range(config.num_layers):
    table += llama_layer(config, f"layers.{i}.", ("layers", i), input_norm=i > 0)
  return table


def _read_tensors(path: str) -> dict:
  safetensors = os.path.join(path, SAFETENSORS_NAME)
  if os.path.isfile(safetensors):
    with _SafetensorsReader([safetensors]) as reader:
      return {name: reader[name] for name in reader}
  pickled = os.path.join(path, BIN_NAME)
  if not os.path.isfile(pickled):
    raise FileNotFoundError(f"no head weights in {path}: neither {SAFETENSORS_NAME} nor "
                            f"{BIN_NAME} exists")
  try:
    import torch
  except ImportError:
    raise ValueError(f"reading {pickled} needs torch (torch.load(weights_only=True)); install "
                     f"torch or convert the file to {SAFETENSORS_NAME}") from None
  state = torch.load(pickled, map_location="cpu", weights_only=True)
  return {name: jnp.asarray(t.float().numpy()) for name, t in state.items()}


def load_head(path: str | os.PathLike, dtype: str | None = None) -> EagleHead:
  """The EAGLE-1/2 head in directory ``path`` (the published layout above)."""
  path = os.fspath(path)
  config_file = os.path.join(path, CONFIG_NAME)
  if not os.path.isfile(config_file):
    raise FileNotFoundError(f"no {CONFIG_NAME} in {path}: an EAGLE head directory holds "
                            f"{CONFIG_NAME} and {SAFETENSORS_NAME} or {BIN_NAME}")
  with open(config_file) as f:
    hf = json.load(f)
  config = from_hf_dict({"model_type": "llama", **hf}, dtype=dtype)
  if hf.get("qkv_bias"):
    config = dataclasses.replace(config, attention_bias=True, attention_out_bias=False)
  fc_bias = bool(hf.get("bias", True))
  tensors = {n: t for n, t in _read_tensors(path).items() if not n.endswith(_BUFFER_SUFFIX)}
  embed = tensors.pop(EMBED_NAME, None)
  dtype_ = jnp.dtype(config.dtype)
  head = fill_from_hf(
      lambda: EagleHead(config, nnx.Rngs(0), fc_bias), eagle_layout(config, fc_bias), tensors,
      {name: name for name in tensors}, path, dtype_, missing_note="of an EAGLE head",
      unexpected_note=f"not in an EAGLE head with {config.num_layers} layer(s)",
      derived={("inv_freq",): jnp.asarray(rope_inverse_frequencies(config))})
  if embed is not None:
    if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
      raise ValueError(f"{path}: {EMBED_NAME} has shape {tuple(embed.shape)}, expected "
                       f"{(config.vocab_size, config.hidden_size)}")
    head.embed = nnx.Param(jnp.asarray(embed).astype(dtype_))
  return head


def save_head(head: EagleHead, path: str | os.PathLike, target=None) -> None:
  """Writes ``head`` in the published layout (``config.json``, ``model.safetensors``), with
  ``embed_tokens.weight`` from ``target`` when given, else the head's own if it has one (the
  repository's strict load wants it)."""
  from safetensors.numpy import save_file

  if not isinstance(head, EagleHead):
    raise ValueError(f"head must be an EAGLE head, got {type(head).__name__}")
  path = os.fspath(path)
  config = head.config
  fc_bias = head.fc.bias is not None
  qkv_bias = config.attention_bias and not config.attention_out_bias
  plain = dataclasses.replace(config, attention_bias=config.attention_bias and not qkv_bias)
  hf = dict(to_hf_dict(plain), bias=fc_bias, qkv_bias=qkv_bias)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, CONFIG_NAME), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)
    f.write("\n")
  tensors = dict(_iter_hf_tensors(head, eagle_layout(config, fc_bias)))
  embed = target.embed if target is not None else head.embed
  if embed is not None:
    tensors[EMBED_NAME] = np.asarray(embed.get_value())
  save_file(tensors, os.path.join(path, SAFETENSORS_NAME), metadata={"format": "pt"})


def check_head(head, target) -> None:
  """Raises unless ``head`` can draft for ``target``: same hidden size and vocabulary, and an
  embedding carried by the head file equal to the target's."""
  c, t = head.config, target.config
  if c.hidden_size != t.hidden_size:
    raise ValueError(f"the head's hidden size {c.hidden_size} differs from the target's "
                     f"{t.hidden_size}")
  if c.vocab_size != t.vocab_size:
    raise ValueError(f"the head's vocabulary of {c.vocab_size} tokens differs from the target's "
                     f"{t.vocab_size}")
  head.target_features(t)  # the layers it reads exist in the target
  if head.embed is not None:
    embed = np.asarray(head.embed.get_value(), np.float32)
    if embed.shape != (t.vocab_size, t.hidden_size) or not np.allclose(
        embed, np.asarray(target.embed.get_value(), np.float32), atol=1e-6):
      raise ValueError("the head file's embed_tokens.weight differs from the target's embedding: "
                       "the head was trained for another target")
