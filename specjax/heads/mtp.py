"""DeepSeek-V3's multi-token-prediction (MTP) module as a draft head (DeepSeek-AI 2024,
"DeepSeek-V3 Technical Report", arXiv 2412.19437 §2.2; inference as in vLLM's
``vllm/model_executor/models/deepseek_mtp.py``).

The module at position ``t`` reads the embedding of token ``t + 1`` and a hidden state at ``t``:

  h' = eh_proj(cat(enorm(embedding), hnorm(hidden)))          # eh_proj: 2E -> E, no bias
  h_out = one decoder block over h' (causal, RoPE, its own KV cache, WITH its input norm)
  logits = head(norm(h_out))                                   # shared_head: its own RMSNorm

The first hidden is the target's final-norm state (``NORMED``: what vLLM hands the module, the
target's returned hidden states); later draft steps chain the module on its own ``h_out`` (one
module reused ``gamma`` times, vLLM's ``num_nextn_predict_layers = 1`` path). The output head is
the module's own ``[E, V]`` matrix when its checkpoint carries ``shared_head.head``, else the
target's LM head (DeepSeek-V3 shares it with the main model).

Structurally this is an EAGLE-1 head (``specjax.heads.eagle``: ``fc`` over ``[embedding ; hidden]``
and decoder layers with a KV cache on the target's features) plus the two input norms, an input
norm on its block and its own final norm, so ``MTPHead`` *is* an ``EagleHead``: the EAGLE
proposers (``EagleChain`` / ``EagleTree`` / ``EagleDynamicTree``) and the EAGLE trainer
(``specjax.training.eagle``, kind ``"mtp"``) drive it unchanged.

On disk (``sj.load_head`` / ``sj.save_head``): DeepSeek-V3's and GLM-4.5's layout, the module as
an extra decoder layer ``N = num_hidden_layers`` of the model checkpoint: ``model.layers.{N}.``
``enorm.weight``, ``hnorm.weight``, ``eh_proj.weight`` [E, 2E], ``shared_head.norm.weight``,
optional ``shared_head.head.weight`` [V, E] (absent: the target's LM head) and
``embed_tokens.weight`` (checked equal to the target's embedding, like EAGLE's), and the Llama
decoder layer's ``self_attn.*``, ``mlp.*``, ``input_layernorm`` and ``post_attention_layernorm``.
config.json is the target's Llama config plus ``num_nextn_predict_layers = D``; with ``D > 1``
the modules are layers ``N .. N + D - 1`` (each with the tensors above) and load as an
``MTPStack``, DeepSeek-V3's sequential modules: module ``k`` at ``t`` reads module ``k - 1``'s
``h_out`` at ``t`` and the embedding of token ``t + k`` (``sj.MTP(stack, gamma <= D)`` drafts
token ``k`` with module ``k``, ``specjax.proposers.mtp``). The modules' tensors are read out
of ``model.safetensors`` (or the shards its index names; else ``pytorch_model.bin`` or its
shards, through ``torch.load(weights_only=True)`` when torch is installed: each pickled shard
loads whole) and the main model's tensors beside them are ignored.

Scope: the block is a dense Llama-family decoder layer; DeepSeek's own MLA attention and MoE MLP
are not implemented (a DeepSeek-V3 checkpoint does not load). vLLM zeroes the embedding at
position 0; here every position embeds its token (it only touches the prompt's first pair).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.heads.eagle import EagleHead, head_config
from specjax.models.config import ModelConfig, rope_inverse_frequencies
from specjax.models.hf_config import from_hf_dict, to_hf_dict
from specjax.models.hf_layout import (COPY, TRANSPOSE, Entry, _iter_hf_tensors, _SafetensorsReader,
                                      fill_from_hf, linear, llama_layer, read_pickled)
from specjax.models.transformer import NORMED, Norm, _param


class MTPHead(EagleHead):
  """``config``: the module's (the target's sizes, ``num_layers=1``, Llama family);
  ``layer_index``: its index in the published checkpoint, ``N + depth - 1`` (N: the target's
  ``num_hidden_layers``); ``own_head``: whether it has its own ``[E, V]`` output matrix (else the
  target's LM head); ``depth``: k, its place in a stack of modules (``MTPStack``; 1 alone)."""

  FIRST_INPUT_NORM = True  # the block keeps its input norm: DeepSeek's mtp_block is a full layer

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, layer_index: int,
               own_head: bool = False, depth: int = 1):
    if config.num_layers != 1:
      raise ValueError(f"an MTP module has one decoder block, got num_layers={config.num_layers}")
    for name, value, least in (("depth", depth, 1), ("layer_index", layer_index, depth)):
      if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    super().__init__(config, rngs, fc_bias=False)
    dtype = jnp.dtype(config.dtype)
    self.enorm = Norm(config, dtype)
    self.hnorm = Norm(config, dtype)
    self.norm = Norm(config, dtype)  # shared_head.norm
    self.lm_head = nnx.data(None if not own_head else _param(
        rngs, (config.hidden_size, config.vocab_size), ("embed", "vocab"), dtype))
    self.layer_index = layer_index
    self.depth = depth  # k: module k predicts the token k + 1 positions ahead

  def fc_input(self, embeds: jax.Array, features: jax.Array) -> jax.Array:
    """``cat(enorm(embedding), hnorm(hidden))``, what ``eh_proj`` (our ``fc``) mixes."""
    return jnp.concatenate([self.enorm(embeds), self.hnorm(features)], axis=-1)

  def target_features(self, target_config: ModelConfig) -> tuple[str, ...]:
    """The target's final-norm state; the module must sit after the target's last layer."""
    layers = self.layer_index - self.depth + 1  # N: module k is layer N + k - 1
    if target_config.num_layers != layers:
      raise ValueError(f"the MTP module is layer {self.layer_index} of a {layers}-layer model, "
                       f"the target has {target_config.num_layers} layers")
    return (NORMED,)

  def output_matrix(self, target_head: jax.Array | None) -> jax.Array:
    """[E, V] the module's output head: its own, else ``target_head`` (the target's)."""
    return target_head if self.lm_head is None else self.lm_head[...]

  def draft_logits(self, hidden: jax.Array, target) -> jax.Array:
    """float32[..., V]: ``head(norm(h_out))``, the target's LM head unless the module has one."""
    normed = self.norm(hidden)
    if self.lm_head is None:
      return target.project(normed)
    return jnp.dot(normed, self.lm_head[...], preferred_element_type=jnp.float32)


class MTPStack(nnx.Module):
  """DeepSeek-V3's sequential stack of ``D >= 2`` MTP modules (arXiv 2412.19437 §2.2): module
  ``k`` (``modules[k - 1]``, ``depth`` k, checkpoint layer ``N + k - 1``) at position ``i`` reads
  module ``k - 1``'s output at ``i`` (the target's final-norm state for k = 1) and the embedding of
  token ``i + k``, and predicts token ``i + k + 1``; each has its own weights and KV cache, all
  share the target's embedding (and its LM head unless they carry ``shared_head.head``).
  ``sj.MTP(stack, gamma <= D)`` drafts a chain with modules ``1..gamma``
  (``specjax.proposers.mtp``)."""

  def __init__(self, modules):
    modules = list(modules)
    if len(modules) < 2:
      raise ValueError(f"an MTP stack has at least 2 modules (one module drafts alone as an "
                       f"MTPHead), got {len(modules)}")
    first = modules[0]
    for k, module in enumerate(modules, 1):
      if not isinstance(module, MTPHead):
        raise ValueError(f"module {k} of the stack must be an MTPHead, got "
                         f"{type(module).__name__}")
      if (module.depth, module.layer_index) != (k, first.layer_index + k - 1):
        raise ValueError(f"module {k} of the stack must have depth {k} and layer_index "
                         f"{first.layer_index + k - 1}, got depth {module.depth} and layer_index "
                         f"{module.layer_index}")
      if module.config != first.config:
        raise ValueError(f"module {k} of the stack has another config than module 1")
    self.modules = nnx.List(modules)

  @property
  def config(self) -> ModelConfig:
    return self.modules[0].config

  @property
  def num_modules(self) -> int:
    return len(self.modules)

  def target_features(self, target_config: ModelConfig) -> tuple[str, ...]:
    """The target's final-norm state (module 1's input); every module must fit the target."""
    for module in self.modules:
      module.target_features(target_config)
    return (NORMED,)


def init_mtp(target_config: ModelConfig, key: jax.Array | int = 0,
             own_head: bool = False, num_modules: int = 1) -> MTPHead | MTPStack:
  """An untrained MTP module (normal std 0.02 weights, norms at 1) for a target of
  ``target_config`` (its layer count is the module's ``layer_index``), or a stack of
  ``num_modules`` of them (``MTPStack``, independent weights) when ``num_modules > 1``."""
  n = target_config.num_layers
  if num_modules == 1:
    return MTPHead(head_config(target_config, 1), nnx.Rngs(params=key), n, own_head)
  keys = jax.random.split(jax.random.key(key) if isinstance(key, int) else key, num_modules)
  return MTPStack([MTPHead(head_config(target_config, 1), nnx.Rngs(params=keys[k]), n + k,
                           own_head, depth=k + 1) for k in range(num_modules)])


def _check_count(hf: dict, source: str) -> int:
  """config.json's ``num_nextn_predict_layers``: the number of MTP modules (an integer >= 1)."""
  n = hf.get("num_nextn_predict_layers")
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise ValueError(f"{source}: num_nextn_predict_layers must be an integer >= 1, got {n!r}")
  return n


def is_mtp_config(hf: dict) -> bool:
  return "num_nextn_predict_layers" in hf and hf["num_nextn_predict_layers"] not in (0, None)


_EMBED = "embed_tokens.weight"
_BIN_NAME = "pytorch_model.bin"
_OWN_HEAD = "shared_head.head.weight"


def mtp_layout(config: ModelConfig, layer_index: int, own_head: bool) -> list[Entry]:
  """Every tensor of the MTP module at ``model.layers.{layer_index}.`` but the optional
  embedding, with our param paths."""
  p = f"model.layers.{layer_index}."
  norm = lambda name, *path: Entry(p + name, COPY, (path + ("scale",),))
  table = ([norm("enorm.weight", "enorm"), norm("hnorm.weight", "hnorm")]
           + linear(p + "eh_proj", ("fc",), False)
           + llama_layer(config, p, ("layers", 0), input_norm=True)
           + [norm("shared_head.norm.weight", "norm")])
  if own_head:
    table.append(Entry(p + _OWN_HEAD, TRANSPOSE, (("lm_head",),)))
  return table


def _shards(path: str, file_name: str) -> list[str] | None:
  """Checkpoint ``path``'s ``file_name`` or the shards its ``.index.json`` names (None: neither)."""
  single = os.path.join(path, file_name)
  if os.path.isfile(single):
    return [single]
  index = single + ".index.json"
  if not os.path.isfile(index):
    return None
  with open(index) as f:
    return [os.path.join(path, name) for name in sorted(set(json.load(f)["weight_map"].values()))]


def _module_tensors(path: str, safetensors_name: str, prefix: str | tuple[str, ...]) -> dict:
  """The tensors named ``prefix*`` (or any of a tuple of prefixes) in checkpoint ``path``: from
  ``safetensors_name`` (or its index's shards), else from ``pytorch_model.bin`` (or its shards)
  through ``torch.load``."""
  files = _shards(path, safetensors_name)
  if files is not None:
    with _SafetensorsReader(files) as reader:
      return {name: reader[name] for name in reader if name.startswith(prefix)}
  pickled = _shards(path, _BIN_NAME)
  if pickled is None:
    raise FileNotFoundError(f"no MTP weights in {path}: none of {safetensors_name}, "
                            f"{_BIN_NAME} or their .index.json exists")
  tensors = {}
  for file in pickled:  # a pickled shard loads whole; only the module's tensors are kept
    tensors.update(read_pickled(file, lambda name: name.startswith(prefix)))
  return tensors


def load_mtp(hf: dict, path: str, safetensors_name: str, dtype: str | None = None
             ) -> MTPHead | MTPStack:
  """The MTP module(s) of the checkpoint in directory ``path`` (config.json's dict ``hf``): one
  ``MTPHead``, or an ``MTPStack`` when ``num_nextn_predict_layers = D > 1`` (layers N..N+D-1)."""
  count = _check_count(hf, path)
  config = from_hf_dict({"model_type": "llama", **hf}, dtype=dtype)
  if not config.is_llama_family:
    raise ValueError(f"{path}: model_type {config.model_type!r}: MTP modules here are dense "
                     f"Llama-family layers")
  n = config.num_layers
  prefixes = [f"model.layers.{n + k}." for k in range(count)]
  found = _module_tensors(path, safetensors_name, tuple(prefixes))
  head_cfg = head_config(config, 1)
  dtype_ = jnp.dtype(head_cfg.dtype)
  modules = []
  for k, prefix in enumerate(prefixes, 1):
    tensors = {name: t for name, t in found.items() if name.startswith(prefix)}
    if not tensors:
      raise ValueError(f"{path}: no tensor named {prefix}*: MTP module {k} of {count} "
                       f"(num_nextn_predict_layers) is layer {n + k - 1} (num_hidden_layers + "
                       f"{k - 1})")
    embed = tensors.pop(prefix + _EMBED, None)
    own_head = prefix + _OWN_HEAD in tensors
    what = f"an MTP module at layer {n + k - 1}"
    head = fill_from_hf(lambda: MTPHead(head_cfg, nnx.Rngs(0), n + k - 1, own_head, depth=k),
                        mtp_layout(head_cfg, n + k - 1, own_head), tensors,
                        {t: t for t in tensors}, path, dtype_, missing_note=f"of {what}",
                        unexpected_note=f"not in {what}",
                        derived={("inv_freq",): jnp.asarray(rope_inverse_frequencies(head_cfg))})
    if embed is not None:
      if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
        raise ValueError(f"{path}: {prefix}{_EMBED} has shape {tuple(embed.shape)}, expected "
                         f"{(config.vocab_size, config.hidden_size)}")
      head.embed = nnx.Param(jnp.asarray(embed).astype(dtype_))
    modules.append(head)
  return modules[0] if count == 1 else MTPStack(modules)


def mtp_files(head: MTPHead | MTPStack, embed=None) -> tuple[dict, dict]:
  """(config.json's dict, the tensors by name) of ``head`` (a module or a stack) in the published
  layout; ``embed`` [V, E] (the target's) is written as every module's ``embed_tokens.weight``
  when given."""
  modules = list(head.modules) if isinstance(head, MTPStack) else [head]
  n = modules[0].layer_index - modules[0].depth + 1
  hf = dict(to_hf_dict(dataclasses.replace(modules[0].config, num_layers=n)),
            num_nextn_predict_layers=len(modules))
  tensors = {}
  for module in modules:
    index = module.layer_index
    tensors.update(_iter_hf_tensors(module, mtp_layout(module.config, index,
                                                       module.lm_head is not None)))
    if embed is not None:
      tensors[f"model.layers.{index}.{_EMBED}"] = np.asarray(embed)
  return hf, tensors
