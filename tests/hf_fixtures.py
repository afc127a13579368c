"""Tiny random Hugging Face checkpoints, written by ``save_pretrained`` (safetensors), for tests.

``make_hf_checkpoint(name, path)`` builds one of ``CONFIGS`` with torch, re-randomises every weight
with a large spread (matrices std 0.2, norm weights 1 +- 0.3, biases std 0.2) so that logits are
far from zero and a parity check means something, saves it to ``path`` and returns the torch model
in eval mode. ``cached_checkpoint(name)`` does it once per process, in a temp dir removed at exit.
All models use eager attention, the plainest reference.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile

import torch
import transformers

VOCAB = 128
HIDDEN = 64
LAYERS = 2
MAX_POSITIONS = 128

_LLAMA_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                     max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6,
                     bos_token_id=1, eos_token_id=2)

_GEMMA_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=96, sliding_window=6,
                     max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, bos_token_id=1,
                     eos_token_id=2, pad_token_id=0)

# Gemma 2 (query_pre_attn_scalar aside): alternating local (window 6) / global layers,
# attention-score and final-logit soft-capping at 5 (small enough to bend this model's scores and
# logits).
_GEMMA2 = dict(**_GEMMA_COMMON, num_hidden_layers=LAYERS, head_dim=16, attn_logit_softcapping=5.0,
               final_logit_softcapping=5.0,
               rope_parameters=dict(rope_type="default", rope_theta=10000.0))

CONFIGS = {
    # Llama with grouped-query attention (4 heads, 2 kv heads), untied head.
    "llama": lambda: transformers.LlamaConfig(**_LLAMA_COMMON, tie_word_embeddings=False),
    # Llama 3.1 rope scaling: with original context 32 and head_dim 16 the inverse frequencies fall
    # in all three bands (kept, smoothed, divided by 8); tied embeddings.
    "llama3_rope": lambda: transformers.LlamaConfig(
        **_LLAMA_COMMON, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=32)),
    # Qwen2: biases on q/k/v (not o), a large rope theta.
    "qwen2": lambda: transformers.Qwen2Config(
        **_LLAMA_COMMON, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    # Mistral with a sliding window of 8: it matters within a 24-token sequence.
    "mistral": lambda: transformers.MistralConfig(**_LLAMA_COMMON, sliding_window=8,
                                                  tie_word_embeddings=False),
    # Qwen3: per-head q/k RMSNorm (random weights, see _randomise) and head_dim 24, not
    # hidden / heads = 16; no biases.
    "qwen3": lambda: transformers.Qwen3Config(
        **_LLAMA_COMMON, head_dim=24, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    # Phi-3: fused qkv_proj / gate_up_proj, rotary on half of each head, a sliding window of 8; its
    # pad id defaults to 32000, outside the tiny vocabulary.
    "phi3": lambda: transformers.Phi3Config(
        **_LLAMA_COMMON, pad_token_id=0, partial_rotary_factor=0.5, sliding_window=8,
        tie_word_embeddings=False),
    # Gemma 3 (text): local layers 0 and 2 with a window of 6 (crossed within a 24-token
    # sequence), global layer 1; local rotary base 500, global 1e4 with linear scaling (factor
    # 2); query_pre_attn_scalar 20 (not head_dim 24); per-head q/k norms, four (1 + w) norms per
    # block, embeddings times sqrt(64), tied head.
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **_GEMMA_COMMON, num_hidden_layers=3, head_dim=24, query_pre_attn_scalar=20,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=10000.0),
            "sliding_attention": dict(rope_type="default", rope_theta=500.0)}),
    # Gemma 2 with query_pre_attn_scalar 32 (not head_dim 16).
    "gemma2": lambda: transformers.Gemma2Config(**_GEMMA2, query_pre_attn_scalar=32),
    # GPT-2 (learned positions, LayerNorm, Conv1D with packed q/k/v, tied head).
    "gpt2": lambda: transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS,
                                            n_head=4, n_positions=MAX_POSITIONS,
                                            bos_token_id=1, eos_token_id=2),
}

# Not in CONFIGS (the families every test module runs): a Gemma 2 and a Gemma 3 that llama.cpp's
# GGUF can describe. What its metadata leaves out llama.cpp fixes in code (gguf.py): scores scaled
# by head_dim ** -0.5; Gemma 3: every 6th layer global (layers 0-4 local here, layer 5 global),
# local rotary base 10000, the global layers' rotary 1e6 with linear factor 8, as Gemma 3 4B's.
GGUF_CONFIGS = {
    # CONFIGS' Gemma 2 (layer 0 local with window 6, layer 1 global; soft-caps 5) scaled as
    # llama.cpp scales Gemma 2 below 27B: query_pre_attn_scalar = head_dim.
    "gemma2_gguf": lambda: transformers.Gemma2Config(**_GEMMA2, query_pre_attn_scalar=16),
    "gemma3_gguf": lambda: transformers.Gemma3TextConfig(
        **_GEMMA_COMMON, num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16,
        rope_parameters={
            "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
            "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}),
}


def _randomise(model: torch.nn.Module, seed: int) -> None:
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():  # tied weights appear once
      noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
      if p.ndim == 1 and name.endswith("weight"):  # norm scales
        p.copy_(1.0 + 0.3 * noise)
      else:
        p.copy_(0.2 * noise)


def make_hf_checkpoint(name: str, path: str, dtype: str = "float32", seed: int = 0):
  """Writes the tiny random checkpoint ``name`` to ``path``; returns the torch model (eval mode),
  in ``dtype`` ("float32" or "bfloat16", which is also the dtype of the saved tensors)."""
  config = {**CONFIGS, **GGUF_CONFIGS}[name]()
  model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
  _randomise(model, seed)
  model = model.to(getattr(torch, dtype)).eval()
  model.save_pretrained(path)
  return model


_CACHE: dict[tuple[str, str], tuple[str, torch.nn.Module]] = {}
_ROOT: list[str] = []


def cached_checkpoint(name: str, dtype: str = "float32"):
  """(path, torch model) for ``make_hf_checkpoint(name, ...)``, built once per process."""
  key = (name, dtype)
  if key not in _CACHE:
    if not _ROOT:
      _ROOT.append(tempfile.mkdtemp(prefix="specjax_hf_"))
      atexit.register(shutil.rmtree, _ROOT[0], True)
    path = f"{_ROOT[0]}/{name}_{dtype}"
    _CACHE[key] = (path, make_hf_checkpoint(name, path, dtype))
  return _CACHE[key]


def hf_logits(model, tokens) -> "np.ndarray":
  """float32 numpy logits of a torch causal LM on int tokens [B, T] (no padding)."""
  import numpy as np

  with torch.no_grad():
    out = model(input_ids=torch.as_tensor(np.asarray(tokens), dtype=torch.long))
  return out.logits.float().numpy()
