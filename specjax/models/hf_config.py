"""``ModelConfig`` to and from a Hugging Face ``config.json`` dict: ``from_hf_dict`` reads what
transformers 4.x (``rope_theta``, ``rope_scaling``, ``torch_dtype``) and 5.x (``rope_parameters``,
``dtype``) write; ``to_hf_dict`` writes the 4.x spelling, which both major versions load."""

from __future__ import annotations

from typing import Any, Mapping

from specjax.models.config import (FULL_ATTENTION, SLIDING_ATTENTION, SUPPORTED_DTYPES,
                                   SUPPORTED_MODEL_TYPES, ModelConfig)


def _dtype_name(value: Any) -> str | None:
  if value is None:
    return None
  name = str(value).replace("torch.", "")
  return {"float": "float32", "fp32": "float32", "bf16": "bfloat16"}.get(name, name)


def from_hf_dict(hf: Mapping[str, Any], dtype: str | None = None) -> ModelConfig:
  """Maps a Hugging Face ``config.json`` dict (transformers 4.x or 5.x spelling) to ``ModelConfig``.

  ``dtype`` overrides the checkpoint's own (``torch_dtype`` / ``dtype``); float16 checkpoints are
  loaded as float32 unless a dtype is given, since CPU float16 matmuls are slow and imprecise.
  """
  hf = language_model_dict(hf)
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"unsupported model_type {model_type!r} in config.json; supported: "
                     f"{', '.join(SUPPORTED_MODEL_TYPES)}")
  if dtype is None:
    dtype = _dtype_name(hf.get("dtype", hf.get("torch_dtype"))) or "float32"
    if dtype not in SUPPORTED_DTYPES:
      dtype = "float32"
  common = dict(
      model_type=model_type,
      vocab_size=hf["vocab_size"],
      bos_token_id=hf.get("bos_token_id"),
      eos_token_id=hf.get("eos_token_id"),
      pad_token_id=hf.get("pad_token_id"),
      dtype=dtype,
  )
  if model_type == "gpt2":
    # Options that change GPT-2's attention scores; reorder_and_upcast_attn only changes precision
    # (our scores are float32 anyway).
    for key, plain in (("scale_attn_by_inverse_layer_idx", False), ("scale_attn_weights", True)):
      if hf.get(key, plain) != plain:
        raise ValueError(f"GPT-2 checkpoints with {key}={hf[key]!r} are not supported")
    act = hf.get("activation_function", "gelu_new")
    return ModelConfig(
        **common,
        hidden_size=hf["n_embd"],
        num_layers=hf["n_layer"],
        num_heads=hf["n_head"],
        intermediate_size=hf.get("n_inner") or 4 * hf["n_embd"],
        max_position_embeddings=hf.get("n_positions", 1024),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_word_embeddings=hf.get("tie_word_embeddings", True),
        attention_bias=True,
        attention_out_bias=True,
        mlp_bias=True,
        hidden_act=act,
    )
  # Llama family and Gemma. transformers 5.x folds rope_theta (and Phi-3's partial_rotary_factor)
  # into rope_parameters; Gemma 3's holds one dict per layer kind.
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  if model_type == "gemma3_text":
    return _gemma_config(hf, common, *_gemma3_ropes(hf))
  rope_theta, rope_scaling, partial_rotary_factor = _rope_fields(
      rope, hf.get("rope_theta", 10000.0), hf.get("partial_rotary_factor", 1.0))
  if model_type == "gemma2":
    return _gemma_config(hf, common, rope_theta, rope_scaling, None)
  if model_type in ("qwen2", "qwen3") and hf.get("use_sliding_window", False):
    raise ValueError(f"{model_type} checkpoints with use_sliding_window=true are not supported")
  # Mistral and Phi-3 apply sliding_window in every layer; Qwen ignores it without
  # use_sliding_window.
  sliding_window = hf.get("sliding_window") if model_type in ("mistral", "phi3") else None
  attention_bias = hf.get("attention_bias", False)
  attention_bias, attention_out_bias = _BIASES.get(model_type, (attention_bias, attention_bias))
  return ModelConfig(
      **common,
      # head_dim None: hidden // heads, checked
      **_decoder_fields(hf, hf.get("head_dim"), 2048, False, rope_theta, rope_scaling),
      partial_rotary_factor=partial_rotary_factor,
      attention_bias=attention_bias,
      attention_out_bias=attention_out_bias,
      mlp_bias=hf.get("mlp_bias", False) if model_type == "llama" else False,  # HF: Llama's only
      hidden_act=hf.get("hidden_act", "silu"),
      sliding_window=sliding_window,
  )


def _decoder_fields(hf: Mapping[str, Any], head_dim: int | None, max_positions: int, tied: bool,
                    rope_theta: float, rope_scaling: dict[str, Any] | None) -> dict[str, Any]:
  """What every rotary decoder's ``config.json`` spells the same way (the sizes, the head's
  tying); ``max_positions`` and ``tied``: the family's defaults."""
  heads = hf["num_attention_heads"]
  return dict(hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
              num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
              head_dim=head_dim, intermediate_size=hf["intermediate_size"],
              max_position_embeddings=hf.get("max_position_embeddings", max_positions),
              norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=rope_theta,
              rope_scaling=rope_scaling, tie_word_embeddings=hf.get("tie_word_embeddings", tied))


def _rope_fields(rope: Mapping[str, Any], theta: float, partial: float,
                 ) -> tuple[float, dict[str, Any] | None, float]:
  """(rope_theta, rope_scaling or None, partial_rotary_factor) of one rope dict (4.x
  ``rope_scaling`` or 5.x ``rope_parameters``); ``theta``/``partial``: the top-level values."""
  rope = dict(rope)
  theta = rope.pop("rope_theta", theta)
  partial = rope.pop("partial_rotary_factor", partial)
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  rope.pop("type", None)
  return float(theta), None if rope_type == "default" else dict(rope, rope_type=rope_type), partial


# transformers' Gemma3TextConfig defaults: the text_config of a multimodal (gemma3) config.json
# written by transformers 4.x (the released checkpoints') spells out only what differs.
GEMMA3_TEXT_DEFAULTS = dict(
    vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=131072,
    rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=4096, bos_token_id=2,
    eos_token_id=1, pad_token_id=0)


def language_model_dict(hf: Mapping[str, Any]) -> Mapping[str, Any]:
  """The ``config.json`` dict of the language model a checkpoint holds: ``hf`` itself, or for a
  multimodal ``gemma3`` one (Gemma3ForConditionalGeneration) the gemma3_text dict of its
  ``text_config`` over transformers' defaults, the top level's dtype and head tying where it has
  none."""
  if hf.get("model_type") != "gemma3":
    return hf
  text = dict(GEMMA3_TEXT_DEFAULTS)
  text.update({k: hf[k] for k in ("dtype", "torch_dtype", "tie_word_embeddings") if k in hf})
  text.update(hf.get("text_config") or {})
  return dict(text, model_type="gemma3_text")


def _gemma3_ropes(hf: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
  """(global theta, global rope_scaling, local theta) of a Gemma 3 config: 5.x's
  ``rope_parameters`` per layer kind, or 4.x's ``rope_theta`` / ``rope_scaling`` (global) and
  ``rope_local_base_freq``. Local layers use plain rotary (transformers' default for them)."""
  params = hf.get("rope_parameters") or {}
  if FULL_ATTENTION in params or SLIDING_ATTENTION in params:
    full, local = params.get(FULL_ATTENTION) or {}, params.get(SLIDING_ATTENTION) or {}
  else:
    full = dict(hf.get("rope_scaling") or {}, rope_theta=hf.get("rope_theta", 1e6))
    local = dict(rope_theta=hf.get("rope_local_base_freq", 1e4))
  theta, scaling, _ = _rope_fields(full, 1e6, 1.0)
  local_theta, local_scaling, _ = _rope_fields(local, 1e4, 1.0)
  if local_scaling is not None:
    raise ValueError(f"gemma3_text sliding_attention rope {local_scaling['rope_type']!r} is not "
                     f"supported; local layers take plain rotary (rope_type 'default')")
  return theta, scaling, local_theta


def _gemma_config(hf: Mapping[str, Any], common: dict[str, Any], rope_theta: float,
                  rope_scaling: dict[str, Any] | None, rope_local_theta: float | None
                  ) -> ModelConfig:
  """A Gemma 2 / Gemma 3 text config; missing keys take transformers' class defaults."""
  gemma2 = common["model_type"] == "gemma2"
  if hf.get("use_bidirectional_attention"):
    raise ValueError(f"{common['model_type']} checkpoints with use_bidirectional_attention=true "
                     f"are not supported (decoding is causal)")
  num_layers = hf["num_hidden_layers"]
  layer_types = hf.get("layer_types")
  if layer_types is None:  # 4.x: Gemma 2 alternates; Gemma 3 repeats sliding_window_pattern
    pattern = 2 if gemma2 else hf.get("sliding_window_pattern", 6)
    layer_types = [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION
                   for i in range(num_layers)]
  caps = (50.0, 30.0) if gemma2 else (None, None)  # transformers' defaults
  attention_bias = hf.get("attention_bias", False)
  return ModelConfig(
      **common,
      **_decoder_fields(hf, hf.get("head_dim", 256), 8192 if gemma2 else 131072, True,
                        rope_theta, rope_scaling),
      rope_local_theta=rope_local_theta,
      attention_bias=attention_bias,
      attention_out_bias=attention_bias,
      hidden_act=hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh",
      sliding_window=hf.get("sliding_window", 4096),
      layer_types=layer_types,
      query_pre_attn_scalar=hf.get("query_pre_attn_scalar", 256),
      attn_logit_softcapping=hf.get("attn_logit_softcapping", caps[0]),
      final_logit_softcapping=hf.get("final_logit_softcapping", caps[1]),
  )


# (q/k/v bias, o bias) of families whose HF modules fix them whatever config.json says; the
# others (Llama, Mistral, Qwen3) read attention_bias for both.
_BIASES = {"qwen2": (True, False), "phi3": (False, False)}



def to_hf_dict(config: ModelConfig) -> dict[str, Any]:
  """The ``config.json`` dict for ``config`` (transformers 4.x spelling; 5.x reads it too)."""
  c = config
  common = dict(model_type=c.model_type, vocab_size=c.vocab_size, bos_token_id=c.bos_token_id,
                eos_token_id=list(c.eos_token_id) if isinstance(c.eos_token_id, tuple)
                else c.eos_token_id,
                pad_token_id=c.pad_token_id, torch_dtype=c.dtype,
                tie_word_embeddings=c.tie_word_embeddings)
  if c.model_type == "gpt2":
    if c.num_kv_heads != c.num_heads or c.head_dim * c.num_heads != c.hidden_size:
      raise ValueError("GPT-2 configs need num_kv_heads == num_heads and head_dim * num_heads == "
                       "hidden_size")
    return dict(common, architectures=["GPT2LMHeadModel"], n_embd=c.hidden_size,
                n_layer=c.num_layers, n_head=c.num_heads, n_inner=c.intermediate_size,
                n_positions=c.max_position_embeddings, layer_norm_epsilon=c.norm_eps,
                activation_function=c.hidden_act)
  arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
          "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
          "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
          "gemma3_text": "Gemma3ForCausalLM"}[c.model_type]
  out = dict(common, architectures=[arch], hidden_size=c.hidden_size,
             num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
             num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
             intermediate_size=c.intermediate_size,
             max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.norm_eps,
             rope_theta=c.rope_theta, rope_scaling=c.rope_scaling_dict or None,
             hidden_act=c.hidden_act)
  if c.model_type == "llama":
    if c.attention_bias != c.attention_out_bias:
      raise ValueError("Llama's attention_bias covers q/k/v and o alike")
    out.update(attention_bias=c.attention_bias, mlp_bias=c.mlp_bias)
  elif c.model_type == "qwen3":
    out.update(attention_bias=c.attention_bias, use_sliding_window=False)
  elif c.model_type == "phi3":
    out.update(sliding_window=c.sliding_window, partial_rotary_factor=c.partial_rotary_factor)
  elif c.model_type == "mistral":
    out.update(sliding_window=c.sliding_window)
  elif c.is_gemma:
    out.update(_gemma_hf_fields(c))
    del out["hidden_act"]
  else:
    out.update(use_sliding_window=False)
  return out


def _gemma_hf_fields(c: ModelConfig) -> dict[str, Any]:
  """Gemma's own ``config.json`` keys (every layer's kind spelled out)."""
  out = dict(hidden_activation=c.hidden_act, attention_bias=c.attention_bias,
             sliding_window=c.sliding_window, layer_types=list(c.layer_kinds),
             query_pre_attn_scalar=(c.head_dim if c.query_pre_attn_scalar is None
                                    else c.query_pre_attn_scalar),
             attn_logit_softcapping=c.attn_logit_softcapping,
             final_logit_softcapping=c.final_logit_softcapping)
  if c.model_type == "gemma3_text":
    out["rope_local_base_freq"] = c.rope_theta if c.rope_local_theta is None else c.rope_local_theta
  return out
