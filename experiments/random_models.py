"""Tiny random target/draft pairs and a byte tokenizer, for tests, notebooks and ``configs/tiny.py``.

No training and no files: ``random_pair()`` builds both models in-process in a second or two.
The experiment runner names them ``"random:<name>"`` (see ``RANDOM_MODELS``).

A random transformer initialised with std 0.02 has nearly uniform next-token laws, which makes
acceptance statistics dull. So the target's output head is scaled up (``LOGIT_SCALE``: peaked,
non-trivial laws), and the draft is the target *truncated to its first layer(s)*, sharing its
embeddings, final norm and head: a cheap model that agrees with the target often but not always,
like a real draft. The residual contributions of the target's later layers are scaled down
(``LATER_LAYER_SCALE``) so that the one-layer draft's greedy agreement is about 0.65 and its
acceptance rate at temperature 1 about 0.8, values typical of a real pair.

The vocabulary is 256 so that ``ByteTokenizer`` (UTF-8 bytes) encodes any text, prompts included.
"""

from __future__ import annotations

import dataclasses

VOCAB = 256
LOGIT_SCALE = 12.0  # multiplies the target's head: logits std ~2 instead of ~0.15
LATER_LAYER_SCALE = 0.3  # multiplies the output projections of layers >= 1 (see below)

# The target's ModelConfig fields (a dict, so that importing this module does not import jax).
TARGET_FIELDS = dict(
    model_type="llama", vocab_size=VOCAB, hidden_size=64, num_layers=4, num_heads=4,
    num_kv_heads=2, intermediate_size=128, max_position_embeddings=512, tie_word_embeddings=False,
    bos_token_id=0, eos_token_id=0)

# Families of targets: "tiny" for tests and notebooks; "wide" (8 x 1024, GQA 16/8, 113M
# parameters) for configs/sharded.py, whose heads, kv heads, MLP units and vocabulary split over
# 1, 2, 4 or 8 devices.
FAMILIES = {
    "tiny": TARGET_FIELDS,
    "wide": dict(TARGET_FIELDS, hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8,
                 intermediate_size=2816),
}

# name -> (family, layers of the family's target kept by the model; None: the target itself)
RANDOM_MODELS = {
    "tiny-target": ("tiny", None),
    "tiny-draft": ("tiny", 1),   # the target's first layer only
    "tiny-draft2": ("tiny", 2),  # first two layers (higher acceptance, more expensive)
    "wide-target": ("wide", None),
    "wide-draft": ("wide", 1),
}


def target_config(family: str = "tiny", **overrides):
  """A family's target ``ModelConfig``; ``overrides`` replace fields (e.g. ``vocab_size=16``)."""
  from specjax.models.config import ModelConfig
  return ModelConfig(**{**FAMILIES[family], **overrides})


def _scaled_target(seed: int, family: str = "tiny", **overrides):
  import jax

  import specjax as sj
  model = sj.init_model(target_config(family, **overrides), jax.random.key(seed))
  model.lm_head.set_value(model.lm_head.get_value() * LOGIT_SCALE)
  for layer in list(model.layers)[1:]:
    for kernel in (layer.attn.o.kernel, layer.mlp.down.kernel):
      kernel.set_value(kernel.get_value() * LATER_LAYER_SCALE)
  return model


def truncate(target, num_layers: int):
  """A draft made of ``target``'s first ``num_layers`` layers (weights shared by value)."""
  import jax
  from flax import nnx

  import specjax as sj
  if not 1 <= num_layers <= target.config.num_layers:
    raise ValueError(f"num_layers must be in [1, {target.config.num_layers}], got {num_layers}")
  config = dataclasses.replace(target.config, num_layers=num_layers)
  draft = sj.init_model(config, jax.random.key(0))
  src = dict(nnx.to_flat_state(nnx.state(target)))
  dst_state = nnx.state(draft)
  for path, var in nnx.to_flat_state(dst_state):
    var.set_value(src[path].get_value())
  nnx.update(draft, dst_state)
  return draft


def model_config(name: str):
  """The ``ModelConfig`` of ``random:<name>`` without building it (for validation)."""
  if name not in RANDOM_MODELS:
    raise ValueError(f"unknown random model {name!r}; known: {', '.join(RANDOM_MODELS)}")
  family, layers = RANDOM_MODELS[name]
  config = target_config(family)
  return config if layers is None else dataclasses.replace(config, num_layers=layers)


def build(name: str, seed: int = 0):
  """The model ``random:<name>``; every draft derives from the target of the same ``seed``."""
  if name not in RANDOM_MODELS:
    raise ValueError(f"unknown random model {name!r}; known: {', '.join(RANDOM_MODELS)}")
  family, layers = RANDOM_MODELS[name]
  target = _scaled_target(seed, family)
  return target if layers is None else truncate(target, layers)


def random_pair(seed: int = 0, draft_layers: int = 1, **overrides):
  """(target, draft): the tiny random target and its truncated draft. ``overrides`` change the
  target's config (``vocab_size=16`` for exact-law checks; the byte tokenizer then no longer fits)."""
  target = _scaled_target(seed, **overrides)
  return target, truncate(target, draft_layers)


class ByteTokenizer:
  """UTF-8 bytes as token ids 0..255 (enough of the ``transformers`` tokenizer API for us)."""

  vocab_size = VOCAB
  eos_token_id = None

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    del add_special_tokens
    return list(text.encode("utf-8"))

  def decode(self, ids, skip_special_tokens: bool = False) -> str:
    del skip_special_tokens
    import numpy as np
    ids = [int(i) for i in np.asarray(ids).reshape(-1) if 0 <= int(i) < 256]
    return bytes(ids).decode("utf-8", errors="replace")

  def __len__(self) -> int:
    return VOCAB
