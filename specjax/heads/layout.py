"""Heads on disk in their published layouts, both ways: ``sj.load_head`` / ``sj.save_head``.
Medusa's, Hydra's and DeepSeek-V3 MTP modules' layouts live with their heads
(``specjax.heads.medusa`` / ``hydra`` / ``mtp``);
EAGLE's, below. One table mechanism (``hf_layout.fill_from_hf`` / ``_iter_hf_tensors``) for
both kinds of head; ``load_head`` tells them apart by the file.

A head directory holds ``config.json`` (a Llama config of the head: the target's sizes,
``num_hidden_layers`` head layers; ``qkv_bias``: q/k/v biases without an o bias) and its
tensors, in ``model.safetensors`` or, when torch is installed, ``pytorch_model.bin`` (read
through ``torch.load(weights_only=True)``). ``embed_tokens.weight``, the target's embedding, is
in some released files: it is kept on the head (``head.embed``) and checked against the target's
(``check_head``); drafting always embeds with the target's. ``save_head`` writes it from
``target`` when given, else the head's own if it has one.

**EAGLE-1/2** (SafeAILab/EAGLE ``eagle/model/cnets1.py`` ``Model``, loaded by ``ea_model.py``
with ``load_state_dict(strict=True)``): ``fc.weight`` [E, 2E] (a torch Linear over
``cat(embedding, feature)``), ``fc.bias`` (config ``bias``, default true) and per layer
``layers.{i}.*`` with the Llama decoder layer's names, without ``layers.0.input_layernorm``.

**EAGLE-3** (``eagle/model/cnets.py`` ``Model``; also what vLLM's and SGLang's
``models/llama_eagle3.py`` load): ``fc.weight`` [E, 3E] (no bias), ``midlayer.*`` (a Llama layer's
names, q/k/v over [2E]; ``input_layernorm`` normalises the embedding, ``hidden_norm`` the hidden),
``norm.weight``, ``lm_head.weight`` [V_draft, E] and two buffers: ``d2t`` (int64 [V_draft]: draft
id ``d`` is target id ``d + d2t[d]``) and ``t2d`` (bool [V]: the target ids in the draft
vocabulary). config.json has ``draft_vocab_size``; ``load_head`` takes a directory as EAGLE-3
when it has that or ``midlayer.*`` tensors. ``d2t`` may be absent only for a full vocabulary
(the repository then drops both buffers); the target ids must be ascending and distinct, ``t2d``
(optional) must mark exactly them. ``save_head`` writes ``architectures:
["LlamaForCausalLMEagle3"]`` (SGLang's class name; vLLM maps it to its ``Eagle3LlamaForCausalLM``),
``tie_word_embeddings: false`` (SGLang would take the embedding as LM head) and no ``bias`` key
(vLLM would read it as attention biases).

EAGLE-3 feature layers: ours (``Eagle3Head.target_layers``, ``feature_layers``) number the
*outputs* of blocks, 0-based. The EAGLE repository (hard-coded 2, N // 2, N - 3) and vLLM's
config key ``eagle_aux_hidden_state_layer_ids`` name the *input* of layer ``j``: ours ``j - 1``,
and ``j = 0`` (the embedding) is refused. SGLang reads ``eagle_config:
{eagle_aux_hidden_state_layer_ids}`` as outputs of layers (it adds 1 before capturing): ours
as they are. ``load_head`` reads either (both: they must agree; neither: the default
``aux_layers``); ``save_head`` writes both when the layers are known (the head's, or the
default for ``target``), so each engine reads the ones it numbers its way.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.heads.eagle import EagleHead
from specjax.heads.eagle3 import Eagle3Head
from specjax.heads.hydra import HYDRA_FILE, HydraHead, hydra_files, is_hydra_config, load_hydra
from specjax.heads.medusa import MEDUSA_FILE, MedusaHead, is_medusa_config, load_medusa, medusa_files
from specjax.heads.mtp import MTPHead, MTPStack, is_mtp_config, load_mtp, mtp_files
from specjax.models.config import ModelConfig, rope_inverse_frequencies
from specjax.models.hf_config import from_hf_dict, to_hf_dict
from specjax.models.hf_layout import (COPY, TRANSPOSE, Entry, _iter_hf_tensors, _SafetensorsReader,
                                      fill_from_hf, linear, llama_layer, read_pickled)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
BIN_NAME = "pytorch_model.bin"
EMBED_NAME = "embed_tokens.weight"
_BUFFER_SUFFIX = "rotary_emb.inv_freq"  # a non-parameter buffer some files carry
_VOCAB_MAPS = ("d2t", "t2d")  # EAGLE-3's integer / boolean buffers, read exactly
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
_AUX_IDS = "eagle_aux_hidden_state_layer_ids"


def eagle_layout(config: ModelConfig, fc_bias: bool) -> list[Entry]:
  """Every tensor of an EAGLE-1/2 head but the optional embedding, with our param paths."""
  table = linear("fc", ("fc",), fc_bias)
  for i in range(config.num_layers):
    table += llama_layer(config, f"layers.{i}.", ("layers", i), input_norm=i > 0)
  return table


def eagle3_layout(config: ModelConfig) -> list[Entry]:
  """Every parameter tensor of an EAGLE-3 head (not the embedding, d2t, t2d), with our paths."""
  norm = lambda name, *path: Entry(name, COPY, (path + ("scale",),))
  return (linear("fc", ("fc",), False)
          + [norm("midlayer.input_layernorm.weight", "midlayer", "input_norm"),
             norm("midlayer.hidden_norm.weight", "midlayer", "hidden_norm")]
          + llama_layer(config, "midlayer.", ("midlayer",), input_norm=False)
          + [norm("norm.weight", "norm"), Entry("lm_head.weight", TRANSPOSE, (("lm_head",),))])


def _read_tensors(path: str, safetensors_name: str = SAFETENSORS_NAME,
                  bin_name: str = BIN_NAME) -> dict:
  safetensors = os.path.join(path, safetensors_name)
  if os.path.isfile(safetensors):
    with _SafetensorsReader([safetensors]) as reader:
      tensors = {name: reader[name] for name in reader if name not in _VOCAB_MAPS}
    from safetensors import safe_open
    with safe_open(safetensors, "numpy") as f:  # jax would narrow int64 to int32
      tensors.update({name: f.get_tensor(name) for name in _VOCAB_MAPS if name in f.keys()})
    return tensors
  pickled = os.path.join(path, bin_name)
  if not os.path.isfile(pickled):
    raise FileNotFoundError(f"no head weights in {path}: neither {safetensors_name} nor "
                            f"{bin_name} exists")
  return read_pickled(pickled)


def load_head(path: str | os.PathLike, dtype: str | None = None,
              target_config: ModelConfig | None = None) -> EagleHead | Eagle3Head | MedusaHead:
  """The EAGLE-1/2, EAGLE-3, Medusa or Hydra head(s) or the MTP module(s) (``MTPStack`` when
  ``num_nextn_predict_layers > 1``) in directory ``path``
  (the published layouts above; Medusa's, Hydra's and MTP's: ``specjax.heads.medusa`` /
  ``hydra`` / ``mtp``), told apart by config.json (``num_nextn_predict_layers``: MTP) and the
  tensors. ``target_config``: the target's, for a Hydra++ prefix layer whose config.json lacks
  its config (the Hydra repository's files)."""
  path = os.fspath(path)
  config_file = os.path.join(path, CONFIG_NAME)
  if not os.path.isfile(config_file):
    raise FileNotFoundError(f"no {CONFIG_NAME} in {path}: a head directory holds {CONFIG_NAME} "
                            f"and {SAFETENSORS_NAME} or {BIN_NAME} ({MEDUSA_FILE}.safetensors or "
                            f".pt for Medusa heads)")
  with open(config_file) as f:
    hf = json.load(f)
  if is_mtp_config(hf):
    return load_mtp(hf, path, SAFETENSORS_NAME, dtype)
  if is_hydra_config(hf):
    return load_hydra(hf, _read_tensors(path, f"{HYDRA_FILE}.safetensors", f"{HYDRA_FILE}.pt"),
                      path, dtype, target_config)
  if is_medusa_config(hf):
    return load_medusa(hf, _read_tensors(path, f"{MEDUSA_FILE}.safetensors",
                                         f"{MEDUSA_FILE}.pt"), path, dtype)
  config = from_hf_dict({"model_type": "llama", **hf}, dtype=dtype)
  if hf.get("qkv_bias"):
    config = dataclasses.replace(config, attention_bias=True, attention_out_bias=False)
  tensors = {n: t for n, t in _read_tensors(path).items() if not n.endswith(_BUFFER_SUFFIX)}
  embed = tensors.pop(EMBED_NAME, None)
  derived = {("inv_freq",): jnp.asarray(rope_inverse_frequencies(config))}
  if "draft_vocab_size" in hf or any(name.startswith("midlayer.") for name in tensors):
    build, table, extra = _eagle3_parts(hf, config, tensors, path)
    derived.update(extra)
    what = "an EAGLE-3 head"
  else:
    fc_bias = bool(hf.get("bias", True))
    build = lambda: EagleHead(config, nnx.Rngs(0), fc_bias)
    table = eagle_layout(config, fc_bias)
    what = f"an EAGLE head with {config.num_layers} layer(s)"
  dtype_ = jnp.dtype(config.dtype)
  head = fill_from_hf(build, table, tensors, {name: name for name in tensors}, path, dtype_,
                      missing_note=f"of {what}", unexpected_note=f"not in {what}",
                      derived=derived)
  if embed is not None:
    if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
      raise ValueError(f"{path}: {EMBED_NAME} has shape {tuple(embed.shape)}, expected "
                       f"{(config.vocab_size, config.hidden_size)}")
    head.embed = nnx.Param(jnp.asarray(embed).astype(dtype_))
  return head


def _eagle3_parts(hf: dict, config: ModelConfig, tensors: dict, path: str):
  """(build, table, derived values) of the EAGLE-3 head in ``path``; pops d2t and t2d."""
  if config.num_layers != 1:
    raise ValueError(f"{path}: an EAGLE-3 head has one decoder layer (midlayer), config.json "
                     f"has num_hidden_layers={config.num_layers}")
  e = config.hidden_size
  if hf.get("target_hidden_size", e) != e:
    raise ValueError(f"{path}: target_hidden_size {hf['target_hidden_size']} differs from the "
                     f"head's hidden_size {e}: heads over another width are not supported")
  if hf.get("norm_before_residual"):
    raise ValueError(f"{path}: norm_before_residual=true (the normed hidden as the residual) is "
                     f"not the EAGLE-3 layer supported here")
  draft_vocab = hf.get("draft_vocab_size") or config.vocab_size  # vLLM's default
  ids = draft_ids(tensors.pop("d2t", None), tensors.pop("t2d", None), draft_vocab,
                  config.vocab_size, path)
  layers = _feature_layers(hf, path)
  return (lambda: Eagle3Head(config, nnx.Rngs(0), ids, layers), eagle3_layout(config),
          {("draft_ids",): jnp.asarray(ids, jnp.int32)})


def draft_ids(d2t, t2d, draft_vocab: int, vocab: int, source: str = "head") -> np.ndarray:
  """int64[V_draft] the target id of each draft id, from the EAGLE-3 buffers (checked)."""
  if not isinstance(draft_vocab, int) or not 0 < draft_vocab <= vocab:
    raise ValueError(f"{source}: draft_vocab_size {draft_vocab!r} is not in 1..{vocab} (the "
                     f"vocab_size)")
  if d2t is None:
    if draft_vocab != vocab:
      raise ValueError(f"{source}: no d2t tensor, so draft_vocab_size {draft_vocab} must equal "
                       f"vocab_size {vocab} (which target id each draft id is is unknown)")
    ids = np.arange(vocab)
  else:
    d2t = np.asarray(d2t)
    if d2t.shape != (draft_vocab,) or not np.issubdtype(d2t.dtype, np.integer):
      raise ValueError(f"{source}: d2t is {d2t.dtype}{list(d2t.shape)}, expected integers of "
                       f"shape ({draft_vocab},) (draft_vocab_size)")
    ids = np.arange(draft_vocab) + d2t.astype(np.int64)
    outside = np.flatnonzero((ids < 0) | (ids >= vocab))
    if outside.size:
      d = outside[0]
      raise ValueError(f"{source}: d2t[{d}] = {d2t[d]} maps draft id {d} to target id {ids[d]}, "
                       f"outside the {vocab}-token vocabulary")
    unordered = np.flatnonzero(np.diff(ids) <= 0)
    if unordered.size:
      d = unordered[0]
      raise ValueError(f"{source}: d2t maps draft ids {d} and {d + 1} to target ids {ids[d]} and "
                       f"{ids[d + 1]}: target ids must be ascending and distinct")
  if t2d is not None:
    t2d = np.asarray(t2d)
    if t2d.shape != (vocab,):
      raise ValueError(f"{source}: t2d has shape {tuple(t2d.shape)}, expected ({vocab},) "
                       f"(vocab_size)")
    expected = np.zeros(vocab, bool)
    expected[ids] = True
    wrong = np.flatnonzero(t2d.astype(bool) != expected)
    if wrong.size:
      t = wrong[0]
      raise ValueError(f"{source}: t2d[{t}] is {bool(t2d[t])} but d2t "
                       f"{'maps a' if expected[t] else 'maps no'} draft id to target id {t}")
  return ids


def _feature_layers(hf: dict, path: str) -> tuple[int, ...] | None:
  """The head's target layers (our numbering: block outputs) from config.json, or None."""
  nested = hf.get("eagle_config") or {}
  if not nested.get("use_aux_hidden_state", True):
    raise ValueError(f"{path}: eagle_config.use_aux_hidden_state is false (a head on the last "
                     f"hidden state alone); EAGLE-3 heads here fuse three target layers")
  inputs, outputs = hf.get(_AUX_IDS), nested.get(_AUX_IDS)
  for ids, least, what in ((inputs, 1, f"{_AUX_IDS} (inputs of layers; 0 is the embedding)"),
                           (outputs, 0, f"eagle_config.{_AUX_IDS} (outputs of layers)")):
    if ids is not None and (not isinstance(ids, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or i < least for i in ids)):
      raise ValueError(f"{path}: {what} must be a list of integers >= {least}, got {ids!r}")
  ours = None if inputs is None else tuple(i - 1 for i in inputs)
  if outputs is not None:
    if ours is not None and ours != tuple(outputs):
      raise ValueError(f"{path}: {_AUX_IDS} {inputs} (inputs of layers, vLLM) and eagle_config's "
                       f"{outputs} (outputs of layers, SGLang) name different layers")
    ours = tuple(outputs)
  if ours is not None and len(ours) != 3:
    raise ValueError(f"{path}: an EAGLE-3 head fuses 3 target layers, config.json names "
                     f"{len(ours)}: {list(ours)}")
  return ours


def save_head(head: EagleHead | Eagle3Head | MedusaHead, path: str | os.PathLike,
              target=None) -> None:
  """Writes ``head`` in its published layout (``config.json``, and ``model.safetensors`` for
  EAGLE heads and MTP modules (the module's tensors only, its embedding from ``target`` or its
  own), ``medusa_lm_head.safetensors`` for Medusa's), an EAGLE head with
  ``embed_tokens.weight`` from ``target`` when given, else the head's own if it has one (the
  repository's strict EAGLE-1 load wants it)."""
  path = os.fspath(path)
  if isinstance(head, (MTPHead, MTPStack)):
    own = head.modules[0] if isinstance(head, MTPStack) else head
    embed = target.embed if target is not None else own.embed
    _write_head(path, *mtp_files(head, None if embed is None else embed.get_value()),
                SAFETENSORS_NAME)
    return
  if isinstance(head, HydraHead):  # a prefix layer's file carries target's embedding
    _write_head(path, *hydra_files(head, target=target), f"{HYDRA_FILE}.safetensors")
    return
  if isinstance(head, MedusaHead):
    _write_head(path, *medusa_files(head), f"{MEDUSA_FILE}.safetensors")
    return
  config = head.config if isinstance(head, (EagleHead, Eagle3Head)) else None
  if config is None:
    raise ValueError(f"head must be an EAGLE-1/2, EAGLE-3, Medusa or Hydra head, got "
                     f"{type(head).__name__}")
  qkv_bias = config.attention_bias and not config.attention_out_bias
  plain = dataclasses.replace(config, attention_bias=config.attention_bias and not qkv_bias)
  hf = dict(to_hf_dict(plain), qkv_bias=qkv_bias)
  if isinstance(head, Eagle3Head):
    table = eagle3_layout(config)
    hf.update(architectures=[EAGLE3_ARCHITECTURE], draft_vocab_size=head.draft_vocab_size,
              tie_word_embeddings=False, **_saved_feature_layers(head, target))
  else:
    fc_bias = head.fc.bias is not None
    table = eagle_layout(config, fc_bias)
    hf.update(bias=fc_bias)
  tensors = dict(_iter_hf_tensors(head, table))
  if isinstance(head, Eagle3Head):
    ids = np.asarray(head.draft_ids.get_value(), np.int64)
    tensors["d2t"] = ids - np.arange(len(ids))
    tensors["t2d"] = np.zeros(config.vocab_size, bool)
    tensors["t2d"][ids] = True
  embed = target.embed if target is not None else head.embed
  if embed is not None:
    tensors[EMBED_NAME] = np.asarray(embed.get_value())
  _write_head(path, hf, tensors, SAFETENSORS_NAME)


def _write_head(path: str, hf: dict, tensors: dict, file_name: str) -> None:
  from safetensors.numpy import save_file

  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, CONFIG_NAME), "w") as f:
    json.dump(hf, f, indent=2, sort_keys=True)
    f.write("\n")
  save_file(tensors, os.path.join(path, file_name), metadata={"format": "pt"})


def _saved_feature_layers(head: Eagle3Head, target) -> dict:
  """config.json's feature-layer keys (both numberings, module docstring) for ``head``."""
  layers = head.target_layers
  if target is not None:
    layers = head.target_features(target.config)  # checked, counted from the start
  elif layers is None:
    return {}  # the engines' default, which is ours
  elif min(layers) < 0:
    raise ValueError(f"the head's target_layers {layers} count from the end: give target= to "
                     f"save them as layer numbers")
  return {_AUX_IDS: [i + 1 for i in layers],
          "eagle_config": {"use_aux_hidden_state": True, _AUX_IDS: list(layers)}}


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
