"""Model hyper-parameters: one frozen, hashable ``ModelConfig`` describes every decoder we
support, so that it can be a static argument under ``jit``. Its mapping to and from Hugging Face
``config.json`` is ``specjax.models.hf_config``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

# Families sharing the Llama decoder layer (RMSNorm, rotary, gated MLP); what differs is named by
# ModelConfig's properties (qk_norm, fused_projections) and fields, not by model_type checks.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "phi3")
# Gemma 2 and 3 (text): the same decoder with (1 + w) RMSNorms, four norms per block, embeddings
# scaled by sqrt(hidden), soft-capping, and local (sliding-window) / global layers. Not in
# LLAMA_FAMILY, whose members the EAGLE/MTP heads and the training fast path accept: those read
# the embedding, norms and head without Gemma's scaling and offsets.
GEMMA_FAMILY = ("gemma2", "gemma3_text")
SUPPORTED_MODEL_TYPES = LLAMA_FAMILY + GEMMA_FAMILY + ("gpt2",)
# Per-layer attention kinds (transformers' ``layer_types``): every key of the cache (global) or
# only those within ``sliding_window`` positions (local).
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION)
SUPPORTED_DTYPES = ("float32", "bfloat16")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# The keys each rope_scaling type reads (rope_inverse_frequencies): a missing one is a config error
# at construction, not a KeyError when the model is built.
ROPE_KEYS = {"default": (), "linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings")}
# transformers' Phi3Config accepts only these; its LongRoPE ("longrope", formerly "su"/"yarn")
# switches between two frequency sets by the current sequence length, a data-dependent choice
# the static-shape loop does not make.
PHI3_ROPE_TYPES = ("default",)
# Gemma 3 4B+ scales its global layers' rotary linearly (factor 8); nothing else is checked.
GEMMA_ROPE_TYPES = ("default", "linear")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_new", "gelu_pytorch_tanh", "gelu")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a decoder-only transformer (Llama/Mistral/Qwen2/Qwen3/Phi-3, Gemma 2/3 or
  GPT-2 family).

  ``rope_scaling`` is a sorted tuple of ``(key, value)`` pairs (hashable); build it with
  ``rope_scaling=dict(...)`` and it is converted on construction; ``layer_types`` likewise from a
  list. ``sliding_window`` applies to every layer (Mistral, Phi-3) unless ``layer_types`` names
  each layer's kind (Gemma: ``"sliding_attention"`` layers windowed, ``"full_attention"`` not).
  """

  model_type: str = "llama"
  vocab_size: int = 32000
  hidden_size: int = 512
  num_layers: int = 8
  num_heads: int = 8
  num_kv_heads: int | None = None  # None -> num_heads (multi-head attention)
  head_dim: int | None = None  # None -> hidden_size // num_heads
  intermediate_size: int | None = None  # None -> 4 * hidden_size (GPT-2) or required (Llama)
  max_position_embeddings: int = 2048
  norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: Any = None
  partial_rotary_factor: float = 1.0  # rotary on the first int(head_dim * factor) dims (Phi-3)
  tie_word_embeddings: bool = False
  attention_bias: bool = False  # bias on q/k/v projections
  attention_out_bias: bool = False  # bias on the output projection
  mlp_bias: bool = False
  hidden_act: str = "silu"
  sliding_window: int | None = None
  layer_types: tuple[str, ...] | None = None  # per layer, one of LAYER_KINDS (Gemma)
  rope_local_theta: float | None = None  # rotary base of sliding layers (Gemma 3); None: rope_theta
  query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power; None: head_dim
  attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
  final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  dtype: str = "float32"

  def __post_init__(self):
    set_ = lambda k, v: object.__setattr__(self, k, v)
    if isinstance(self.rope_scaling, Mapping):
      set_("rope_scaling", tuple(sorted(self.rope_scaling.items())))
    if isinstance(self.eos_token_id, list):
      set_("eos_token_id", tuple(self.eos_token_id))
    if isinstance(self.layer_types, list):
      set_("layer_types", tuple(self.layer_types))
    if self.num_kv_heads is None:
      set_("num_kv_heads", self.num_heads)
    if self.head_dim is None:  # HF's default; one that does not divide would fail later
      if (isinstance(self.hidden_size, int) and isinstance(self.num_heads, int)
          and self.num_heads > 0 and self.hidden_size % self.num_heads):
        raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads "
                         f"{self.num_heads}; give head_dim explicitly")
      set_("head_dim", self.hidden_size // max(self.num_heads, 1))
    if self.intermediate_size is None:
      if self.model_type != "gpt2":
        raise ValueError(f"intermediate_size is required for model_type {self.model_type!r}")
      set_("intermediate_size", 4 * self.hidden_size)
    self.validate()

  def validate(self) -> None:
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(
          f"unsupported model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if self.dtype not in SUPPORTED_DTYPES:
      raise ValueError(f"unsupported dtype {self.dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "max_position_embeddings"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                       f"({self.num_kv_heads})")
    if self.hidden_act not in SUPPORTED_ACTIVATIONS:
      raise ValueError(f"unsupported hidden_act {self.hidden_act!r}; supported: "
                       f"{', '.join(SUPPORTED_ACTIVATIONS)}")
    if self.partial_rotary_factor != 1.0 and self.model_type != "phi3":
      raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor!r} is only supported "
                       f"for model_type 'phi3' (transformers' {self.model_type} rotates the whole "
                       f"head)")
    if self.llama_like:
      self._validate_rotary()
      self._validate_biases()
    if self.sliding_window is not None and (isinstance(self.sliding_window, bool) or not isinstance(
        self.sliding_window, int) or self.sliding_window < 1):
      raise ValueError(f"sliding_window must be an integer >= 1 or None, got "
                       f"{self.sliding_window!r}")
    self._validate_gemma()

  def _validate_gemma(self) -> None:
    """Gemma's fields: per-layer kinds (each known, one per layer, a window for sliding ones),
    positive scalars, and only on the families whose HF modules read them (a field HF ignores
    would be lost by ``to_hf_dict`` or computed differently by transformers)."""
    if self.layer_types is not None:
      if self.model_type not in GEMMA_FAMILY:
        raise ValueError(f"layer_types is only supported for model_types "
                         f"{', '.join(GEMMA_FAMILY)}, got {self.model_type!r}")
      if len(self.layer_types) != self.num_layers:
        raise ValueError(f"layer_types has {len(self.layer_types)} entries for num_layers "
                         f"{self.num_layers}")
      for i, kind in enumerate(self.layer_types):
        if kind not in LAYER_KINDS:
          raise ValueError(f"unknown layer_types entry {kind!r} at layer {i}; known: "
                           f"{', '.join(LAYER_KINDS)}")
      if SLIDING_ATTENTION in self.layer_types and self.sliding_window is None:
        raise ValueError("layer_types has sliding_attention layers but sliding_window is None")
    for name in ("rope_local_theta", "query_pre_attn_scalar", "attn_logit_softcapping",
                 "final_logit_softcapping"):
      value = getattr(self, name)
      if value is None:
        continue
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")
      if self.model_type not in GEMMA_FAMILY:
        raise ValueError(f"{name} is only supported for model_types {', '.join(GEMMA_FAMILY)}, "
                         f"got {self.model_type!r}")
    if self.model_type == "gemma2" and self.rope_local_theta is not None:
      raise ValueError("rope_local_theta is Gemma 3's (rope_local_base_freq); gemma2 has one "
                       "rope_theta")
    if self.model_type == "gemma3_text" and self.attn_logit_softcapping is not None:
      raise ValueError(f"attn_logit_softcapping {self.attn_logit_softcapping!r} is not applied "
                       f"by transformers' Gemma 3 attention; gemma3_text needs None")
    if self.is_gemma and self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads "
                       f"{self.num_heads} (transformers' {self.model_type} config requires it)")

  def _validate_rotary(self) -> None:
    """The rotary settings of a Llama-family config: an even rotated width within head_dim, and a
    rope_scaling type (with its keys) that ``rope_inverse_frequencies`` computes as HF does."""
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    factor = self.partial_rotary_factor
    if not (isinstance(factor, (int, float)) and 0 < factor <= 1) or self.rotary_dim % 2 or (
        self.rotary_dim < 2):
      raise ValueError(f"partial_rotary_factor {factor!r} must be in (0, 1] and rotate an even "
                       f"number >= 2 of head_dim {self.head_dim}'s dims")
    rope_type = self.rope_type
    supported = (PHI3_ROPE_TYPES if self.model_type == "phi3" else
                 GEMMA_ROPE_TYPES if self.is_gemma else SUPPORTED_ROPE_TYPES)
    if rope_type not in supported:
      raise ValueError(f"unsupported rope_scaling type {rope_type!r} for model_type "
                       f"{self.model_type!r}; supported: {', '.join(supported)}")
    missing = [k for k in ROPE_KEYS[rope_type] if k not in self.rope_scaling_dict]
    if missing:
      raise ValueError(f"rope_scaling type {rope_type!r} needs {missing[0]!r}; got "
                       f"{self.rope_scaling_dict}")

  def _validate_biases(self) -> None:
    """Biases the family's HF modules have: Phi-3 none; Qwen3 and Gemma one attention_bias for
    q/k/v/o and no MLP bias (other combinations could be built but never saved as that family)."""
    if self.model_type == "phi3" and (self.attention_bias or self.attention_out_bias
                                      or self.mlp_bias):
      raise ValueError("model_type 'phi3' has no biases: attention_bias, attention_out_bias and "
                       "mlp_bias must be False")
    if self.model_type in ("qwen3",) + GEMMA_FAMILY and (
        self.mlp_bias or self.attention_bias != self.attention_out_bias):
      raise ValueError(f"model_type {self.model_type!r} has one attention_bias for q/k/v/o and "
                       f"no MLP bias; got attention_bias={self.attention_bias}, attention_out_bias="
                       f"{self.attention_out_bias}, mlp_bias={self.mlp_bias}")

  @property
  def is_llama_family(self) -> bool:
    return self.model_type in LLAMA_FAMILY

  @property
  def is_gemma(self) -> bool:
    return self.model_type in GEMMA_FAMILY

  @property
  def llama_like(self) -> bool:
    """RMSNorm, rotary positions, gated MLP: the Llama family and Gemma (not GPT-2)."""
    return self.is_llama_family or self.is_gemma

  @property
  def qk_norm(self) -> bool:
    """Per-head RMSNorm (weight [head_dim]) on queries and keys before rotary (Qwen3, Gemma 3)."""
    return self.model_type in ("qwen3", "gemma3_text")

  @property
  def norm_offset(self) -> float:
    """What RMSNorm adds to its stored weight: Gemma scales by ``1 + w`` (weights stored around
    0, HF's ``Gemma3RMSNorm``), the others by ``w``."""
    return 1.0 if self.is_gemma else 0.0

  @property
  def sandwich_norms(self) -> bool:
    """Gemma 2/3 blocks also normalise the attention and MLP outputs before each residual add
    (``post_attention_layernorm``, ``post_feedforward_layernorm``)."""
    return self.is_gemma

  @property
  def embed_scale(self) -> float | None:
    """Gemma multiplies token embeddings by sqrt(hidden_size) (in the embedding's dtype)."""
    return self.hidden_size ** 0.5 if self.is_gemma else None

  @property
  def attention_scale(self) -> float:
    """The factor on q.k: ``query_pre_attn_scalar ** -0.5`` (Gemma), else ``head_dim ** -0.5``."""
    scalar = self.head_dim if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar
    return scalar ** -0.5

  @property
  def layer_kinds(self) -> tuple[str, ...]:
    """Each layer's attention kind (``LAYER_KINDS``): ``layer_types``, else every layer sliding
    when a model-wide ``sliding_window`` is set (Mistral, Phi-3), else every layer full."""
    if self.layer_types is not None:
      return self.layer_types
    kind = FULL_ATTENTION if self.sliding_window is None else SLIDING_ATTENTION
    return (kind,) * self.num_layers

  def keep_layers(self, layers: Sequence[int]) -> "ModelConfig":
    """The config of a model made of this one's ``layers`` (in that order): a layer-skipping
    view or a draft cut from a teacher; Gemma's layers keep their kinds."""
    kinds = None if self.layer_types is None else tuple(self.layer_types[i] for i in layers)
    return dataclasses.replace(self, num_layers=len(layers), layer_types=kinds)

  def window_of(self, kind: str) -> int | None:
    """The sliding window of layers of ``kind`` (None: they see every committed key)."""
    return self.sliding_window if kind == SLIDING_ATTENTION else None

  @property
  def fused_projections(self) -> bool:
    """The HF checkpoint packs q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj`` (Phi-3);
    our modules keep them apart, so only the checkpoint layout (``hf_layout``) differs."""
    return self.model_type == "phi3"

  @property
  def rotary_dim(self) -> int:
    """How many leading dims of each head rotate (transformers: ``int(head_dim * factor)``)."""
    return int(self.head_dim * self.partial_rotary_factor)

  @property
  def rope_scaling_dict(self) -> dict[str, Any]:
    return dict(self.rope_scaling or ())

  @property
  def rope_type(self) -> str:
    d = self.rope_scaling_dict
    return d.get("rope_type", d.get("type", "default"))

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    if self.eos_token_id is None:
      return ()
    if isinstance(self.eos_token_id, int):
      return (self.eos_token_id,)
    return tuple(self.eos_token_id)

  def num_params(self) -> int:
    """Parameter count (embeddings included, tied head counted once)."""
    e, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    attn = e * q + 2 * e * kv + q * e
    if self.model_type == "gpt2":
      layer = attn + 2 * e * i + 4 * e + (q + 2 * kv + e) + i + e
      extra = self.max_position_embeddings * e + 2 * e
    else:
      layer = attn + 3 * e * i + (4 if self.sandwich_norms else 2) * e
      layer += 2 * self.head_dim * self.qk_norm
      layer += (q + 2 * kv) * self.attention_bias + e * self.attention_out_bias
      layer += (2 * i + e) * self.mlp_bias
      extra = e
    head = 0 if self.tie_word_embeddings else v * e
    return v * e + self.num_layers * layer + extra + head


def rope_inverse_frequencies(config: ModelConfig, kind: str = FULL_ATTENTION) -> "np.ndarray":
  """float32[rotary_dim // 2] rotary inverse frequencies, with Llama-3 / linear scaling applied
  (``rotary_dim``: head_dim, or Phi-3's partial share of it), for layers of ``kind``: Gemma 3's
  sliding layers (``rope_local_theta`` set) use plain rotary at their own base.

  Llama 3.1 (``rope_type='llama3'``) rescales low frequencies by ``factor`` and interpolates in
  between (Meta's ``apply_scaling``, transformers ``_compute_llama3_parameters``).
  """
  import numpy as np

  dim = config.rotary_dim
  local = kind == SLIDING_ATTENTION and config.rope_local_theta is not None
  theta = config.rope_local_theta if local else config.rope_theta
  inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
  inv_freq = inv_freq.astype(np.float32)
  d = config.rope_scaling_dict
  rope_type = "default" if local else config.rope_type
  if rope_type == "linear":
    inv_freq = inv_freq / np.float32(d["factor"])
  elif rope_type == "llama3":
    factor, low, high = d["factor"], d["low_freq_factor"], d["high_freq_factor"]
    old_len = d["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    inv_freq = np.where(medium, smoothed, scaled).astype(np.float32)
  return inv_freq
