r"""Trains a target/draft pair from scratch on the Python standard library's source.

Run:

  python -m experiments.train --config=configs/train_default.py
  python -m experiments.train --config=configs/train_default.py --config.out_dir=/tmp/pair

Phases (``config.phases``, comma-separated, run in order):

* ``tokenizer``      byte-level BPE on the training split (always done first if missing);
* ``target``         the target model, next-token cross-entropy (optionally trained shallow first
                     and grown to full depth: ``target.grow_from_layers``);
* ``draft``          a small draft trained on the data alone;
* ``draft_distill``  the same draft shape trained by KL(target || draft) on the target's full
                     next-token distributions (target forward inside the step, no gradient),
                     mixed with the data loss by ``alpha`` (1.0 = pure KL).

With ``config.teacher`` (a path or checkpoint name, e.g. ``smollm2-135m``) the target is that model
instead, its tokenizer encodes the data and ``draft_distill`` is the only phase; the draft may start
as some of the teacher's layers (``draft_distill.init_layers``, ``draft_from_teacher``), keep
parameters frozen (``train.frozen``), predict a reduced vocabulary (``draft_distill.vocab_size``,
ALGORITHMS.md §13), and the data may add the Python reference as chat conversations and the
teacher's own answers (``corpus.chat_train_bytes``, ``corpus.teacher_chat_prompts``). See
configs/train_smollm2_draft.py.

Each model phase is resumable: an orbax ``CheckpointManager`` under ``out_dir/checkpoints/<phase>``
holds ``{params, opt_state, meta}`` every ``ckpt_every`` steps and at the end; on restart the latest
one is restored and training continues; finished phases are skipped. The batch for step ``s`` is a
pure function of ``(data seed, s)`` and the learning rate of ``(s, steps)``, so without a time budget
a resumed run ends bit-identical to an uninterrupted one.

Limits: ``steps``; ``time_budget`` (seconds per stage; the learning-rate schedule runs on
max(step / steps, time spent / time_budget), so a slow machine ends on time with a decayed schedule;
the time spent is checkpointed too); ``max_seconds`` / ``max_steps_per_run`` (hard caps for one run:
checkpoint, export, stop the run there; rerun to continue).

Outputs (``out_dir``): ``<phase>/`` in Hugging Face layout (config.json, model.safetensors and the
tokenizer, loadable by ``transformers`` and ``specjax.load_model``), ``tokenizer/``, ``data/``
(token streams), ``train_report.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments import corpus as corpus_lib
from specjax.models.config import ModelConfig
from specjax.models.kv_cache import init_cache
from specjax.models.transformer import Transformer, init_model

PHASES = ("target", "draft", "draft_distill")
REPORT_FILE = "train_report.json"


_VERBOSE = True


def set_verbose(verbose: bool) -> bool:
  """Turns progress lines (stderr) on or off; returns the previous setting."""
  global _VERBOSE
  old, _VERBOSE = _VERBOSE, bool(verbose)
  return old


def _log(msg: str) -> None:
  if not _VERBOSE:
    return
  print(f"[specjax.train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _fmt_seconds(s: float) -> str:
  if not math.isfinite(s):
    return "?"
  s = int(round(s))
  return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# ----------------------------------------------------------------------------------------- data


class Batches:
  """Training windows: batch ``step`` is ``batch_size`` random windows of ``seq_len + 1`` tokens,
  drawn by a generator seeded with ``(seed, step)``; resuming at any step is exact."""

  def __init__(self, stream: np.ndarray, batch_size: int, seq_len: int, seed: int = 0):
    if len(stream) < seq_len + 2:
      raise ValueError(f"token stream of {len(stream)} tokens is shorter than seq_len + 2 = "
                       f"{seq_len + 2}")
    self.stream = np.asarray(stream, np.int32)
    self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
    self._offsets = np.arange(seq_len + 1)[None, :]

  def __call__(self, step: int) -> np.ndarray:
    rng = np.random.default_rng([self.seed, step])
    starts = rng.integers(0, len(self.stream) - self.seq_len - 1, size=self.batch_size)
    return self.stream[starts[:, None] + self._offsets]  # int32[B, T + 1]


def eval_windows(stream: np.ndarray, seq_len: int, max_tokens: int) -> np.ndarray:
  """int32[N, seq_len + 1] non-overlapping windows from the start of ``stream``."""
  n = min((len(stream) - 1) // seq_len, max(1, max_tokens // seq_len))
  if n < 1:
    raise ValueError(f"validation stream of {len(stream)} tokens is shorter than seq_len + 1")
  idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
  return np.asarray(stream, np.int32)[idx]


# --------------------------------------------------------------------------------------- config


def train_defaults(**overrides):
  """The ``train`` block of a phase: optimisation, limits, checkpointing, logging."""
  import ml_collections
  d = dict(
      steps=1000,           # optimizer steps (the schedule's length)
      batch_size=16,        # windows of data.seq_len tokens per step
      lr=3e-3,              # peak learning rate
      warmup_steps=50,
      min_lr_ratio=0.1,     # final lr = min_lr_ratio * lr (cosine decay)
      weight_decay=0.1,     # on matrices only
      b2=0.95,
      grad_clip=1.0,
      time_budget=0.0,      # >0: seconds for the phase (compile included); the lr schedule runs on
                            # max(step / steps, time spent / time_budget) and ends at either limit
      budget_clock="wall",  # "wall", or "cpu" (process CPU time: load-independent comparisons)
      max_seconds=0.0,      # >0: hard wall-clock cap for this run; stops and saves, resumable
      max_steps_per_run=0,  # >0: stop (and save) after this many steps of this run; resumable
      ckpt_every=200,       # orbax checkpoint interval (steps); also saved at the end
      keep_checkpoints=2,
      log_every=50,
      eval_every=0,         # 0: validation loss at the end only
      seed=0,               # parameter initialisation
      zero_init_residual=True,  # zero the attention-output and MLP-down kernels at init
      zero_init_head=False,     # zero the (untied) output head at init
      frozen="",            # comma-separated parameter names not trained (e.g. "embed")
      compute_dtype="",     # matmul operand dtype ("bfloat16": ~2x faster on AMX CPUs); ""
                            # = the weights' dtype
      echo=1,               # optimizer updates per batch (distillation: one teacher forward)
  )
  d.update(overrides)
  return ml_collections.ConfigDict(d)


def base_config():
  """Every field ``run`` reads, with defaults; config files start from this and override."""
  import ml_collections
  c = ml_collections.ConfigDict()
  c.out_dir = "runs/train"
  c.phases = "target,draft,draft_distill"  # any of target, draft, draft_distill, in order
  c.default_draft = "draft_distill"  # the draft the default pair uses
  # A model to distil draft_distill from instead of a target trained here: a path or checkpoint
  # name for specjax.load_model (e.g. "smollm2-135m"); its tokenizer replaces the trained one and
  # the only phase is draft_distill. Loaded in teacher_dtype (bfloat16: ~2x faster, _mm).
  c.teacher = ""
  c.teacher_dtype = "bfloat16"
  c.corpus = ml_collections.ConfigDict(dict(
      root="",                  # "" -> the Python standard library (sysconfig stdlib path)
      max_train_bytes=4_000_000,
      max_val_bytes=200_000,
      val_percent=5.0,          # share of files (by path checksum) held out for validation
      seed=0,
      chat_train_bytes=0,       # >0 (with a teacher): corpus.chat_corpus, the Python reference as
      chat_val_bytes=20_000,    # conversations in the teacher's chat template, added to the data
      teacher_chat_prompts=0,   # >0 (with a teacher): teacher_samples, the teacher's greedy
      teacher_code_prompts=0,   # answers to corpus.chat_prompts and to stdlib code windows (up
      teacher_tokens=128,       # to teacher_tokens each), repeated to make about
      teacher_share=0.5))       # teacher_share of the training windows
  c.tokenizer = ml_collections.ConfigDict(dict(vocab_size=2048, min_frequency=2))
  c.data = ml_collections.ConfigDict(dict(seq_len=128, seed=0, eval_tokens=32768))
  # Greedy agreement and KL of each draft with the target on the validation windows, after
  # training (report["agreement"]); a first-use build skips it (the run measures acceptance).
  c.agreement = True
  c.target = ml_collections.ConfigDict()
  c.target.model = ml_collections.ConfigDict(dict(
      hidden_size=256, num_layers=4, num_heads=4, intermediate_size=768,
      tie_word_embeddings=False))
  c.target.train = train_defaults()
  # >0: first train a model of this many layers (same width) with `grow_train`, then grow it into
  # target.model (see grow_model) and train that with `train`.
  c.target.grow_from_layers = 0
  c.target.grow_train = train_defaults(min_lr_ratio=0.3)
  c.draft = ml_collections.ConfigDict()
  c.draft.model = ml_collections.ConfigDict(dict(
      hidden_size=128, num_layers=1, num_heads=2, intermediate_size=384,
      tie_word_embeddings=False))
  c.draft.train = train_defaults(seed=1)
  c.draft_distill = ml_collections.ConfigDict()  # same shape as draft.model
  c.draft_distill.alpha = 1.0  # weight of KL(target || draft); 1 - alpha goes to the data loss
  # Teacher layers (e.g. "0,1") that start the draft: draft_from_teacher, the teacher's width and
  # embedding/head (draft.model is then unused); "" = draft.model, initialised at random.
  c.draft_distill.init_layers = ""
  # K > 0: the draft's head covers the K token ids most frequent in the training data (ties: the
  # lower id, i.e. the earlier BPE merge); q = 0 elsewhere (ALGORITHMS.md §13). The exported
  # draft keeps its full head, with the ids in reduced_vocab.VOCAB_FILE beside it.
  c.draft_distill.vocab_size = 0
  c.draft_distill.train = train_defaults(seed=1)
  return c


# --------------------------------------------------------------------------------------- models


def model_config(model_cfg, vocab_size: int, seq_len: int, eos_id: int = 0) -> ModelConfig:
  """``ModelConfig`` (Llama family) from a config's ``model`` block."""
  m = dict(model_cfg)
  m.setdefault("model_type", "llama")
  m.setdefault("max_position_embeddings", max(seq_len, 512))
  return ModelConfig(vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id, **m)


def initial_model(config: ModelConfig, train_cfg) -> Transformer:
  """A fresh model for training: ``init_model`` (normal, std 0.02), then the residual branches'
  output kernels (attention ``o``, MLP ``down``) zeroed when ``zero_init_residual``.

  Zeroed branch outputs make a deep model start as embedding -> head (a bigram model) that learns
  as fast as a one-layer model, its layers joining in as their output kernels grow (as in
  modded-nanogpt's recipe). With the default std-0.02 init a 4-layer model learned several times
  slower per step than a 1-layer one in the first ~1000 steps that a CPU budget allows (measured;
  see configs/train_default.py).
  """
  model = init_model(config, jax.random.key(int(train_cfg.get("seed", 0))))
  if train_cfg.get("zero_init_residual", False):
    for layer in model.layers:
      for dense in (layer.attn.o, layer.mlp.down):
        dense.kernel[...] = jnp.zeros_like(dense.kernel[...])
  if train_cfg.get("zero_init_head", False) and model.lm_head is not None:
    model.lm_head[...] = jnp.zeros_like(model.lm_head[...])
  return model


def grow_model(small: Transformer, config: ModelConfig, train_cfg) -> Transformer:
  """``small``'s function in a deeper model of the same width: its embedding, head, final norm and
  layers become the bottom layers of ``initial_model(config, train_cfg)``, whose extra layers have
  zeroed output kernels (attention ``o``, MLP ``down``), so the grown model computes exactly what
  ``small`` did and its new layers start learning from there.

  Training a 1-layer model first and growing it reached a lower validation loss in the same CPU time
  than training the deep model from the start (the shallow model takes several times more steps per
  second and, early on, learns at least as much per step).
  """
  k = small.config.num_layers
  if config.hidden_size != small.config.hidden_size or config.num_layers < k:
    raise ValueError(f"cannot grow a {k}x{small.config.hidden_size} model into "
                     f"{config.num_layers}x{config.hidden_size}")
  big = initial_model(config, train_cfg)
  for i, layer in enumerate(big.layers):
    if i < k:
      nnx.update(layer, nnx.state(small.layers[i], nnx.Param))
    else:
      for dense in (layer.attn.o, layer.mlp.down):
        dense.kernel[...] = jnp.zeros_like(dense.kernel[...])
  big.embed[...] = small.embed[...]
  nnx.update(big.final_norm, nnx.state(small.final_norm, nnx.Param))
  if big.lm_head is not None:
    big.lm_head[...] = small.lm_head[...]
  return big


def _frozen_names(frozen) -> tuple[str, ...]:
  """``train.frozen`` (a comma-separated string or a sequence of names) as a tuple."""
  if isinstance(frozen, str):
    return tuple(f.strip() for f in frozen.split(",") if f.strip())
  return tuple(frozen or ())


def draft_from_teacher(teacher: Transformer, layers, dtype: str = "float32") -> Transformer:
  """A draft made of ``teacher``'s embedding (and tied or untied head), final norm and the
  layers ``layers`` (in that order), in ``dtype``: the teacher's own function when ``layers``
  is all of them, and otherwise a starting point that shares its vocabulary geometry."""
  layers = [int(i) for i in layers]
  n = teacher.config.num_layers
  if not layers or any(not 0 <= i < n for i in layers):
    raise ValueError(f"draft layers {layers} must be a non-empty list of teacher layers 0..{n - 1}")
  config = dataclasses.replace(teacher.config, num_layers=len(layers), dtype=dtype)
  draft = nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0)))
  source = nnx.merge(*nnx.split(teacher))
  source.layers = nnx.List([teacher.layers[i] for i in layers])
  # Copies (jnp.array copies), never the teacher's own buffers: the training step donates the
  # draft's parameters while it reads the teacher's.
  copy = lambda x: jnp.array(x, jnp.dtype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else None)
  nnx.update(draft, jax.tree.map(copy, nnx.state(source)))
  return draft


def _int_list(value) -> list[int]:
  """``"0,1"`` / ``(0, 1)`` / ``""`` -> a list of ints."""
  if isinstance(value, str):
    return [int(v) for v in value.split(",") if v.strip()]
  return [int(v) for v in (value or ())]


def frequent_ids(stream: np.ndarray, k: int, vocab_size: int) -> np.ndarray:
  """int32[k], ascending: the ``k`` ids most frequent in ``stream``; ties (unseen ids included)
  go to the lower id, which in a BPE vocabulary is the earlier, more frequent merge."""
  if not 0 < k <= vocab_size:
    raise ValueError(f"vocab_size {k} must be in 1..{vocab_size}")
  counts = np.bincount(np.asarray(stream, np.int64), minlength=vocab_size)[:vocab_size]
  return np.sort(np.argsort(-counts, kind="stable")[:k]).astype(np.int32)


def _split(model: Transformer, frozen: str | tuple[str, ...] = ()):
  """(graphdef, params, rest): trainable ``nnx.Param`` state apart from constant buffers and from
  the parameters under the attribute names ``frozen`` (e.g. ``"embed"``), which stay in ``rest``."""
  frozen = _frozen_names(frozen)
  if not frozen:
    return nnx.split(model, nnx.Param, ...)
  return nnx.split(model, nnx.All(nnx.Param, *(nnx.Not(nnx.PathContains(f)) for f in frozen)), ...)


def _logits(graphdef, params, rest, inputs, compute_dtype=None, head_ids=None):
  """float32[B, T, V] logits of a full causal pass (inside jit); float32[B, T, K] for the K
  vocabulary ids ``head_ids`` only. See ``_causal_logits`` for ``compute_dtype``."""
  model = nnx.merge(graphdef, params, rest)
  if _fast_path_ok(model.config):
    return _causal_logits(model, inputs, compute_dtype, head_ids)
  cache = init_cache(model.config, inputs.shape[0], inputs.shape[1])
  logits, _ = model(inputs, cache)
  return logits if head_ids is None else jnp.take(logits, head_ids, axis=-1)


def _fast_path_ok(config: ModelConfig) -> bool:
  return config.is_llama_family and config.sliding_window is None


def _mm(x: jax.Array, w: jax.Array, compute_dtype=None) -> jax.Array:
  """``x @ w`` (contracting x's last axis with w's first) with float32 accumulation and result,
  the operands cast to ``compute_dtype`` (default: ``w``'s dtype).

  bfloat16 operands with a float32 result run on oneDNN's AMX/AVX-512 kernels on recent Intel
  CPUs: 470-600 GFLOP/s against 80-100 in float32 for SmolLM2's [1024, 576] x [576, 1536] on a
  2-core Sapphire Rapids slice, while a bfloat16 *result* stays on the slow path (84 GFLOP/s).
  The gradient (``_mm_low``) keeps that form: bfloat16 operands, float32 accumulation, as in
  mixed-precision training; autodiff's own transpose mixes a float32 cotangent with a bfloat16
  operand and ran slower than float32.
  """
  cd = jnp.dtype(compute_dtype or w.dtype)
  if cd.itemsize < 4:
    return _mm_low(x, w, cd)
  return jnp.dot(x.astype(cd), w.astype(cd), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mm_low(x, w, cd):
  return jnp.dot(x.astype(cd), w.astype(cd), preferred_element_type=jnp.float32)


def _mm_low_fwd(x, w, cd):
  return _mm_low(x, w, cd), (x, w)


def _mm_low_bwd(cd, res, g):
  x, w = res
  g = g.astype(cd)
  dx = jnp.dot(g, w.astype(cd).T, preferred_element_type=jnp.float32)
  dw = jnp.dot(x.reshape(-1, x.shape[-1]).astype(cd).T, g.reshape(-1, g.shape[-1]),
               preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(w.dtype)


_mm_low.defvjp(_mm_low_fwd, _mm_low_bwd)


def _dense(dense, x: jax.Array, compute_dtype=None) -> jax.Array:
  y = _mm(x, dense.kernel[...], compute_dtype)
  return y if dense.bias is None else y + dense.bias[...].astype(jnp.float32)


def _causal_logits(model: Transformer, inputs: jax.Array, compute_dtype=None,
                   head_ids: jax.Array | None = None) -> jax.Array:
  """The Llama-family ``Transformer`` forward specialised to a full causal pass with no cache.

  Training only: the module's general call builds a cache, scatters keys/values into it and masks
  against cache slots, which costs ~30% of a small model's training step on CPU. This reuses the
  module's own norms, weights and rotary helper and only writes plain causal attention itself;
  ``tests/test_train.py`` checks it against ``specjax.forward``.

  Matmuls take their operands in ``compute_dtype`` (default: each weight's own dtype) and
  accumulate in float32 (``_mm``); the residual stream is float32. A bfloat16 model (e.g. the
  distillation teacher loaded in bfloat16) or ``compute_dtype="bfloat16"`` runs ~2x faster on
  CPUs with AMX (SmolLM2-135M, [8, 128] tokens: 1.8 s vs 4.2 s, KL to the float32 logits
  0.0006 nats). ``head_ids`` (int32[K]): logits of those vocabulary ids only, [B, T, K]: the
  head's K rows, not all V (a reduced-vocabulary draft, ALGORITHMS.md §13).
  """
  from specjax.models.transformer import _rotate

  cd = None if compute_dtype is None else jnp.dtype(compute_dtype)
  b, t = inputs.shape
  x = jnp.take(model.embed[...], inputs, axis=0).astype(jnp.float32)
  freqs = jnp.arange(t, dtype=jnp.float32)[:, None] * model.inv_freq[...][None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[None, :, None, :]  # [1, T, 1, D]
  cos, sin = jnp.cos(emb), jnp.sin(emb)
  causal = jnp.tril(jnp.ones((t, t), bool))
  for layer in model.layers:
    attn, mlp = layer.attn, layer.mlp
    h = layer.attn_norm(x)
    q = _dense(attn.q, h, cd).reshape(b, t, attn.num_kv_heads, -1, attn.head_dim)
    k = _dense(attn.k, h, cd).reshape(b, t, attn.num_kv_heads, attn.head_dim)
    v = _dense(attn.v, h, cd).reshape(b, t, attn.num_kv_heads, attn.head_dim)
    q, k = _rotate(q, cos[..., None, :], sin[..., None, :]), _rotate(k, cos, sin)
    qk_dtype = cd or attn.q.kernel.dtype
    scores = jnp.einsum("btkgd,bskd->bkgts", q.astype(qk_dtype), k.astype(qk_dtype),
                        preferred_element_type=jnp.float32)
    scores = jnp.where(causal, scores * (attn.head_dim ** -0.5), -1e30)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(qk_dtype), v.astype(qk_dtype),
                     preferred_element_type=jnp.float32).reshape(b, t, -1)
    x = x + _dense(attn.o, out, cd)
    h = layer.mlp_norm(x)
    x = x + _dense(mlp.down, mlp.act(_dense(mlp.gate, h, cd)) * _dense(mlp.up, h, cd), cd)
  x = model.final_norm(x)
  if head_ids is None and cd is None:
    return model.project(x)  # the model's own head (a reduced-vocabulary view's too)
  head = model.embed[...].T if model.lm_head is None else model.lm_head[...]
  if head_ids is not None:
    head = jnp.take(head, head_ids, axis=1)
  return _mm(x, head, cd)


def _ce(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _kl(teacher_logits, student_logits):
  """Mean over positions of KL(teacher || student), in nats."""
  logp_t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32), axis=-1)
  logp_s = jax.nn.log_softmax(student_logits.astype(jnp.float32), axis=-1)
  return jnp.mean(jnp.sum(jnp.exp(logp_t) * (logp_t - logp_s), axis=-1))


def make_optimizer(train_cfg) -> optax.GradientTransformation:
  """AdamW without its learning rate (global-norm clipping, Adam, decoupled weight decay on
  matrices); the step multiplies by ``-learning_rate(...)``, computed on the host."""
  return optax.chain(
      optax.clip_by_global_norm(float(train_cfg.grad_clip)),
      optax.scale_by_adam(b1=0.9, b2=float(train_cfg.get("b2", 0.95))),
      optax.add_decayed_weights(float(train_cfg.weight_decay),
                                mask=lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)))


def learning_rate(train_cfg, step: int, progress: float | None = None) -> float:
  """Linear warmup over ``warmup_steps``, then cosine decay to ``min_lr_ratio * lr`` as training
  progress goes from ``warmup_steps / steps`` to 1.

  ``progress`` defaults to ``step / steps``; with a ``time_budget`` it is the larger of that and the
  fraction of the budget spent, so the schedule ends decayed at whichever limit comes first.
  """
  steps, peak = int(train_cfg.steps), float(train_cfg.lr)
  warmup = max(1, min(int(train_cfg.warmup_steps), steps))
  low = peak * float(train_cfg.min_lr_ratio)
  p = step / steps if progress is None else progress
  p0 = warmup / steps
  frac = 0.0 if p <= p0 else min(1.0, (p - p0) / max(1.0 - p0, 1e-9))
  cosine = low + (peak - low) * 0.5 * (1.0 + math.cos(math.pi * frac))
  return min(peak * min(1.0, (step + 1) / warmup), cosine)


def make_train_step(tx: optax.GradientTransformation, distill: bool, alpha: float = 1.0,
                    compute_dtype: str | None = None, echo: int = 1):
  """A jitted ``step(graphdef, params, rest, opt_state, batch, lr, teacher, head_ids=None) ->
  (params, opt_state, metrics)``; ``teacher`` is ``(graphdef, params, rest)`` of the target when
  distilling, else None.

  With ``distill`` the loss is ``alpha * KL(target || draft) + (1 - alpha) * CE``. ``head_ids``
  (int32[K], distillation with alpha = 1 only) trains a draft whose head covers those vocabulary
  ids only (q = 0 elsewhere, ALGORITHMS.md §13) towards p_K, the teacher's law restricted to them
  and renormalised (the best such a draft can do): KL(p_K || q). Neither model computes the
  head's other rows, nor softmaxes over all V (at V = 49152 the full-vocabulary loss alone took
  0.5 s of a 3.5 s SmolLM2 step).
  ``compute_dtype`` is the draft's matmul operand dtype (``_causal_logits``); the teacher computes
  in its weights' dtype. ``echo`` > 1 makes that many optimizer updates on each batch, the
  teacher's forward done once for all of them ("data echoing", Choi et al. 2019, arXiv
  1907.05550): worth it when the teacher costs several times the draft's update.
  """

  def loss_fn(params, graphdef, rest, inputs, labels, t_logits, head_ids):
    logits = _logits(graphdef, params, rest, inputs, compute_dtype, head_ids)
    if not distill:
      ce = _ce(logits, labels)
      return ce, {"loss": ce, "ce": ce}
    if head_ids is not None:
      kl = _kl(t_logits, logits)
      return kl, {"loss": kl, "kl": kl}
    ce = _ce(logits, labels)
    kl = _kl(t_logits, logits)
    loss = alpha * kl + (1.0 - alpha) * ce if alpha < 1.0 else kl
    return loss, {"loss": loss, "ce": ce, "kl": kl}

  def update(graphdef, params, rest, opt_state, inputs, labels, lr, t_logits, head_ids):
    grads, metrics = jax.grad(loss_fn, has_aux=True)(params, graphdef, rest, inputs, labels,
                                                     t_logits, head_ids)
    updates, opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates)
    params = optax.apply_updates(params, updates)
    metrics["grad_norm"] = optax.global_norm(grads)
    return params, opt_state, metrics

  @functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(1, 3))
  def step(graphdef, params, rest, opt_state, batch, lr, teacher, head_ids=None):
    inputs, labels = batch[:, :-1], batch[:, 1:]
    t_logits = None
    if distill:
      t_logits = jax.lax.stop_gradient(_logits(*teacher, inputs, None, head_ids))
    params, opt_state, metrics = update(graphdef, params, rest, opt_state, inputs, labels, lr,
                                        t_logits, head_ids)  # metrics: of the unseen batch
    if echo > 1:
      def body(carry, _):
        p, o, _ = update(graphdef, carry[0], rest, carry[1], inputs, labels, lr, t_logits,
                         head_ids)
        return (p, o), None
      (params, opt_state), _ = jax.lax.scan(body, (params, opt_state), None, length=echo - 1)
    return params, opt_state, metrics

  return step


@functools.partial(jax.jit, static_argnums=(0,))
def _eval_batch(graphdef, params, rest, batch):
  logits = _logits(graphdef, params, rest, batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).sum()


def evaluate(model: Transformer, windows: np.ndarray, batch_size: int = 16) -> float:
  """Mean next-token cross-entropy (nats/token) of ``model`` over ``windows`` int[N, T + 1]."""
  graphdef, params, rest = _split(model)
  total, count = 0.0, 0
  for i in range(0, len(windows), batch_size):
    batch = jnp.asarray(windows[i:i + batch_size])
    total += float(_eval_batch(graphdef, params, rest, batch))
    count += batch.shape[0] * (batch.shape[1] - 1)
  return total / count


_jit_logits = jax.jit(_logits, static_argnums=0)


def _full_logits(model: Transformer, batch) -> jax.Array:
  """float32[B, T, V]: a full causal pass, jitted (``_logits``; ``forward``'s result)."""
  return _jit_logits(*_split(model), jnp.asarray(batch, jnp.int32))


def greedy_agreement(target: Transformer, draft: Transformer, tokens, batch_size: int = 16) -> float:
  """Fraction of positions where ``argmax draft == argmax target`` on ``tokens`` int[N, T] (each
  model sees the same prefix: a full causal pass of each)."""
  tokens = np.asarray(tokens)
  agree, count = 0, 0
  for i in range(0, len(tokens), batch_size):
    batch = tokens[i:i + batch_size]
    t = np.asarray(jnp.argmax(_full_logits(target, batch), axis=-1))
    d = np.asarray(jnp.argmax(_full_logits(draft, batch), axis=-1))
    agree += int((t == d).sum())
    count += t.size
  return agree / count


def mean_kl(target: Transformer, draft: Transformer, tokens, batch_size: int = 16) -> float:
  """Mean over positions of KL(target || draft) in nats on ``tokens`` int[N, T]."""
  tokens = np.asarray(tokens)
  total, count = 0.0, 0
  for i in range(0, len(tokens), batch_size):
    batch = tokens[i:i + batch_size]
    total += float(_kl(_full_logits(target, batch), _full_logits(draft, batch))) * batch.size
    count += batch.size
  return total / count


@functools.lru_cache(maxsize=None)
def _cached_train_step(grad_clip, b2, weight_decay, distill, alpha, compute_dtype=None, echo=1):
  """(optimizer, jitted step) per hyper-parameter set, so that repeated runs reuse compilations."""
  import ml_collections
  tx = make_optimizer(ml_collections.ConfigDict(
      dict(grad_clip=grad_clip, b2=b2, weight_decay=weight_decay)))
  return tx, make_train_step(tx, distill=distill, alpha=alpha, compute_dtype=compute_dtype,
                             echo=echo)


# --------------------------------------------------------------------------------- checkpoints


def _checkpoint_manager(directory: pathlib.Path, train_cfg):
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(
      max_to_keep=int(train_cfg.get("keep_checkpoints", 2)),
      save_interval_steps=max(1, int(train_cfg.get("ckpt_every", 100))), create=True)
  return ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)


def _ckpt_tree(params, opt_state, train_seconds: float):
  return {"params": params, "opt_state": opt_state,
          "meta": {"train_seconds": np.asarray(train_seconds, np.float64)}}


def _has_checkpoint(directory: pathlib.Path, train_cfg) -> bool:
  if not pathlib.Path(directory).exists():
    return False
  mngr = _checkpoint_manager(directory, train_cfg)
  try:
    return mngr.latest_step() is not None
  finally:
    mngr.close()


def save_checkpoint(mngr, step: int, params, opt_state, train_seconds: float = 0.0,
                    force: bool = False) -> None:
  """Saves ``{params, opt_state, meta}`` at ``step`` (subject to the manager's save interval unless
  ``force``); asynchronous: call ``mngr.wait_until_finished()`` before reading it back."""
  import orbax.checkpoint as ocp
  mngr.save(step, args=ocp.args.StandardSave(_ckpt_tree(params, opt_state, train_seconds)),
            force=force)


def restore_checkpoint(mngr, params, opt_state, step: int | None = None):
  """(step, params, opt_state, train_seconds) from ``mngr`` (latest step by default), restored into
  the structure of the given ``params`` / ``opt_state``."""
  import orbax.checkpoint as ocp
  step = mngr.latest_step() if step is None else step
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _ckpt_tree(params, opt_state, 0.0))
  restored = mngr.restore(step, args=ocp.args.StandardRestore(abstract))
  return (step, restored["params"], restored["opt_state"],
          float(restored["meta"]["train_seconds"]))


# ----------------------------------------------------------------------------------------- train


def train_model(model: Transformer, train_cfg, batches: Batches, val_windows: np.ndarray | None,
                ckpt_dir: str | os.PathLike | None, teacher: Transformer | None = None,
                alpha: float = 1.0, name: str = "model", head_ids: np.ndarray | None = None,
                ) -> tuple[Transformer, dict]:
  """Trains ``model`` (resuming from the latest checkpoint in ``ckpt_dir`` if there is one);
  returns (trained model, report dict).

  Stops at ``train_cfg.steps``; or when ``train_cfg.time_budget`` seconds (compilation included)
  are spent, in which case the learning-rate schedule was already run to its end on the time axis
  (see ``learning_rate``); or, as a hard cap, after ``max_seconds`` or ``max_steps_per_run`` of
  this run, with the schedule cut short (``stopped_early``; rerun to continue: without a time
  budget the resumed run ends bit-identical to an uninterrupted one). A checkpoint is saved every
  ``ckpt_every`` steps and at the end. ``teacher`` switches to distillation: ``alpha``
  KL(teacher || model) + ``(1 - alpha)`` cross-entropy; with ``head_ids`` (int[K]) the model's
  head is trained over those vocabulary ids only (``make_train_step``; alpha must be 1).
  ``train_cfg.frozen`` names parameters left as they are (e.g. ``"embed"``: a draft keeping its
  teacher's embedding and tied head); ``train_cfg.compute_dtype`` the matmul operand dtype.
  """
  if head_ids is not None and (teacher is None or alpha != 1.0):
    raise ValueError("head_ids (a reduced-vocabulary head) needs a teacher and alpha = 1")
  steps = int(train_cfg.steps)
  max_seconds = float(train_cfg.get("max_seconds", 0) or 0)
  max_steps_per_run = int(train_cfg.get("max_steps_per_run", 0) or 0)
  time_budget = float(train_cfg.get("time_budget", 0) or 0)
  log_every = max(1, int(train_cfg.get("log_every", 50)))
  eval_every = int(train_cfg.get("eval_every", 0) or 0)
  tx, step_fn = _cached_train_step(float(train_cfg.grad_clip), float(train_cfg.get("b2", 0.95)),
                                   float(train_cfg.weight_decay), teacher is not None, float(alpha),
                                   train_cfg.get("compute_dtype") or None,
                                   int(train_cfg.get("echo", 1) or 1))
  graphdef, params, rest = _split(model, train_cfg.get("frozen", ()))
  ids = None if head_ids is None else jnp.asarray(head_ids, jnp.int32)
  opt_state = tx.init(params)
  teacher_split = _split(teacher) if teacher is not None else None

  mngr = _checkpoint_manager(pathlib.Path(ckpt_dir), train_cfg) if ckpt_dir else None
  start, prior_seconds = 0, 0.0  # prior_seconds: training time spent by earlier runs
  if mngr is not None and mngr.latest_step() is not None:
    start, params, opt_state, prior_seconds = restore_checkpoint(mngr, params, opt_state)
    _log(f"{name}: resumed from checkpoint at step {start}")
  tokens_per_step = batches.batch_size * batches.seq_len
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  _log(f"{name}: {n_params / 1e6:.2f}M params, steps {start}->{steps}, batch {batches.batch_size}"
       f"x{batches.seq_len}" + (f", distilling (alpha={alpha})" if teacher is not None else "")
       + (f", time budget {_fmt_seconds(time_budget)}" if time_budget else "")
       + (f", max {_fmt_seconds(max_seconds)}" if max_seconds else ""))

  history, pending = [], []
  t0, cpu0 = time.time(), time.process_time()
  t_compiled = None  # wall clock once the first step (with compilation) has finished
  step, ended_by = start, "steps"

  clock = time.process_time if train_cfg.get("budget_clock", "wall") == "cpu" else time.time
  c0 = clock()

  def spent():  # training seconds so far (all runs), on the budget's clock
    return prior_seconds + clock() - c0

  def progress():
    p = step / steps
    if time_budget:
      p = max(p, spent() / time_budget)
    return p

  last_log_time, last_log_step = t0, start
  while step < steps:
    lr = learning_rate(train_cfg, step, progress())
    batch = jnp.asarray(batches(step))
    params, opt_state, metrics = step_fn(graphdef, params, rest, opt_state, batch,
                                         jnp.float32(lr), teacher_split, ids)
    metrics["lr"] = lr
    step += 1
    pending.append(metrics)
    if time_budget or max_seconds or t_compiled is None:
      # A clock limit must see finished steps (JAX's asynchronous dispatch runs steps ahead of
      # them); the first step's wait times its compilation.
      jax.block_until_ready(metrics["loss"])
    if t_compiled is None:
      t_compiled = time.time()
      last_log_time, last_log_step = t_compiled, step
      _log(f"{name}: first step (with compilation) took {t_compiled - t0:.1f}s")
    done = step >= steps
    if not done and time_budget and progress() >= 1.0:
      done, ended_by = True, "time_budget"
    out_of_time = not done and (
        (max_seconds and time.time() - t0 >= max_seconds)
        or (max_steps_per_run and step - start >= max_steps_per_run))
    if step % log_every == 0 or done or out_of_time:
      host = jax.device_get(pending)
      pending = []
      now = time.time()
      rate = (step - last_log_step) / max(now - last_log_time, 1e-9)
      eta = (steps - step) / rate if rate > 0 else float("nan")
      if time_budget:
        eta = min(eta, max(0.0, time_budget - spent()))
      if max_seconds:
        eta = min(eta, max(0.0, max_seconds - (now - t0)))
      entry = {"step": step, "time": now - t0}
      for k in host[0]:
        entry[k] = float(np.mean([h[k] for h in host]))
      if eval_every and val_windows is not None and (step % eval_every == 0 or done):
        entry["val_loss"] = evaluate(nnx.merge(graphdef, params, rest), val_windows)
      history.append(entry)
      extra = "".join(f" {k} {entry[k]:.3f}" for k in ("kl", "ce", "val_loss") if k in entry)
      _log(f"{name}: step {step}/{steps} loss {entry['loss']:.3f}{extra} lr {lr:.2e} "
           f"{f'{rate * tokens_per_step:,.0f}' if rate > 0 else '?'} tok/s, "
           f"{_fmt_seconds(now - t0)} elapsed, "
           f"ETA {_fmt_seconds(eta)}")
      last_log_time, last_log_step = time.time(), step
    if mngr is not None:
      save_checkpoint(mngr, step, params, opt_state, spent(), force=bool(done or out_of_time))
    if out_of_time:
      ended_by = "max_seconds"
      _log(f"{name}: stopping at step {step} (max_seconds / max_steps_per_run reached); rerun "
           "to continue from the checkpoint")
      break
    if done:
      break
  if mngr is not None:
    mngr.wait_until_finished()
    mngr.close()
  wall = time.time() - t0
  model = nnx.merge(graphdef, params, rest)
  timed = step - start - 1  # steps after the compiled one
  report = {
      "name": name, "params": n_params, "start_step": start, "steps": step,
      "configured_steps": steps, "ended_by": ended_by, "stopped_early": ended_by == "max_seconds",
      "wall_seconds": wall, "cpu_seconds": time.process_time() - cpu0,
      "train_seconds_total": spent(),
      "compile_seconds": (t_compiled - t0) if t_compiled else 0.0,
      "tokens_per_second": timed * tokens_per_step / max(time.time() - t_compiled, 1e-9)
      if t_compiled and timed > 0 else None,
      "tokens_seen": step * tokens_per_step,
      "final_train_loss": history[-1]["loss"] if history else None,
      "history": history,
  }
  if val_windows is not None:
    report["val_loss"] = evaluate(model, val_windows)
    _log(f"{name}: val loss {report['val_loss']:.4f} after {step} steps, {_fmt_seconds(wall)}")
  return model, report


# -------------------------------------------------------------------------------------- pipeline


def teacher_samples(teacher: str, tokenizer, instructions, code_texts, n_code: int,
                    max_new_tokens: int, seed: int = 0, prompt_tokens: int = 48) -> np.ndarray:
  """int32 token stream of the teacher's greedy continuations (each prompt + its continuation +
  EOS) of the chat ``instructions`` (in its chat template) and of ``n_code`` windows of
  ``prompt_tokens`` tokens cut from ``code_texts``.

  What a draft meets at decoding time is the target's own output, and the teacher's greedy text is
  far easier to predict than human text: a 2-layer SmolLM2 draft agreed with it on 0.65 of the
  positions of such samples against 0.36 on the stdlib's own code. On-policy data, as in
  DistillSpec (Zhou et al. 2023, arXiv 2310.08461). The teacher decodes in float32, the target's
  own dtype in the runs the draft serves: its greedy text is that model's (in bfloat16, with the
  products on the CPU's fast kernels, the 96 chats took as long end to end).
  """
  from specjax.decoding.generate import generate
  from specjax.models.hf import load_model

  model = load_model(teacher)
  rng = np.random.default_rng([seed, 7])
  chat = [tokenizer.encode(tokenizer.apply_chat_template(
      [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True),
      add_special_tokens=False) for text in instructions]
  code = []
  for i in rng.permutation(len(code_texts))[:n_code]:
    ids = tokenizer.encode(code_texts[i], add_special_tokens=False)
    start = int(rng.integers(0, max(1, len(ids) - prompt_tokens)))
    code.append(ids[start:start + prompt_tokens])
  eos = tokenizer.eos_token_id
  prompts = chat + code  # one batch: one compilation and one loop (greedy rows are independent)
  out = generate(model, prompts, max_new_tokens=max_new_tokens, eos_token_id=eos)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  return np.concatenate([np.asarray(list(prompt) + row[:length].tolist() + [eos], np.int32)
                         for prompt, row, length in zip(prompts, tokens, lengths)])


def prepare_data(config, out_dir: pathlib.Path):
  """(tokenizer, train stream, val stream), built once and cached under ``out_dir``."""
  from transformers import AutoTokenizer

  tok_dir, data_dir = out_dir / "tokenizer", out_dir / "data"
  have_tokenizer = (tok_dir / "tokenizer.json").exists()
  if have_tokenizer and (data_dir / "val.npy").exists():
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    return tokenizer, np.load(data_dir / "train.npy"), np.load(data_dir / "val.npy")
  t0 = time.time()
  c = config.corpus
  corpus = corpus_lib.load_corpus(
      root=c.get("root") or None, max_train_bytes=int(c.max_train_bytes),
      max_val_bytes=int(c.max_val_bytes), val_percent=float(c.val_percent), seed=int(c.seed))
  _log(f"corpus: {len(corpus.train)} training files ({corpus.train_bytes / 1e6:.2f} MB), "
       f"{len(corpus.val)} validation files ({corpus.val_bytes / 1e6:.2f} MB) from "
       f"{c.get('root') or corpus_lib.stdlib_root()}")
  teacher = config.get("teacher", "")
  if have_tokenizer:  # keep the tokenizer the saved models were trained with; re-encode only
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
  elif teacher:
    from specjax.models.hf import load_tokenizer
    tokenizer = load_tokenizer(teacher)
  else:
    tokenizer = corpus_lib.train_tokenizer(corpus.train, int(config.tokenizer.vocab_size),
                                           int(config.tokenizer.get("min_frequency", 2)))
  train_texts, val_texts = list(corpus.train), list(corpus.val)
  if int(c.get("chat_train_bytes", 0) or 0):
    if not teacher:
      raise ValueError("corpus.chat_train_bytes needs a teacher (its tokenizer's chat template)")
    chat = corpus_lib.chat_corpus(tokenizer, int(c.chat_train_bytes), int(c.chat_val_bytes),
                                  float(c.val_percent))
    train_texts += chat.train
    val_texts += chat.val
    _log(f"chat slice: {len(chat.train)} training / {len(chat.val)} validation conversations "
         f"({chat.train_bytes / 1e6:.2f} MB) from the Python reference")
  train = corpus_lib.encode_stream(tokenizer, train_texts)
  val = corpus_lib.encode_stream(tokenizer, val_texts)
  train_bytes = sum(len(t.encode()) for t in train_texts)
  _log(f"tokenizer: {teacher + chr(39) + 's' if teacher else 'byte-level BPE'}, "
       f"{len(tokenizer)} tokens; {len(train):,} training / {len(val):,} validation tokens "
       f"({train_bytes / max(len(train), 1):.2f} bytes/token), {time.time() - t0:.1f}s")
  n_chat, n_code = (int(c.get(k, 0) or 0) for k in ("teacher_chat_prompts",
                                                        "teacher_code_prompts"))
  if n_chat or n_code:
    if not teacher:
      raise ValueError("corpus.teacher_chat_prompts / teacher_code_prompts need a teacher")
    t1 = time.time()
    instructions = corpus_lib.chat_prompts(corpus.train, n_chat, int(c.seed))
    samples = teacher_samples(teacher, tokenizer, instructions, corpus.train, n_code,
                              int(c.teacher_tokens), int(c.seed))
    share = float(c.teacher_share)
    reps = max(1, round(len(train) * share / (1.0 - share) / len(samples)))
    train = np.concatenate([train, np.tile(samples, reps)])
    _log(f"teacher samples: {len(samples):,} tokens, the teacher's greedy answers to {n_chat} "
         f"chat and {n_code} code prompts (x{reps}: ~{share:.0%} of the "
         f"training windows), "
         f"{time.time() - t1:.1f}s")
  data_dir.mkdir(parents=True, exist_ok=True)
  np.save(data_dir / "train.npy", train)
  np.save(data_dir / "val.npy", val)
  if not have_tokenizer:
    tmp = out_dir / "tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(tok_dir, ignore_errors=True)
    os.replace(tmp, tok_dir)
  return tokenizer, train, val


def export_model(model: Transformer, tokenizer, path: pathlib.Path,
                 vocab_ids: np.ndarray | None = None) -> None:
  """Writes ``model`` (HF layout via ``specjax.models.hf.save_model``), ``tokenizer`` and, for a
  reduced-vocabulary draft, its ``vocab_ids`` (``reduced_vocab.VOCAB_FILE``) to ``path``,
  atomically (a temporary dir renamed into place)."""
  from specjax.models.hf import save_model
  from specjax.models.reduced_vocab import save_vocab_ids

  tmp = path.with_name(path.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  save_model(model, str(tmp))
  tokenizer.save_pretrained(str(tmp))
  if vocab_ids is not None:
    save_vocab_ids(tmp, vocab_ids)
  shutil.rmtree(path, ignore_errors=True)
  os.replace(tmp, path)


def _load_exported(path: pathlib.Path) -> Transformer:
  from specjax.models.hf import load_model
  return load_model(str(path), dtype="float32")


def run(config, out_dir: str | os.PathLike | None = None) -> dict:
  """Runs ``config.phases`` (see the module docstring); returns the report (also written to
  ``out_dir/train_report.json``). Phases already exported (``<phase>/config.json``) are skipped."""
  out_dir = pathlib.Path(out_dir or config.out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  t_start = time.time()
  phases = [p.strip() for p in str(config.phases).split(",") if p.strip()]
  for p in phases:
    if p not in PHASES + ("tokenizer",):
      raise ValueError(f"unknown phase {p!r}; known: tokenizer, {', '.join(PHASES)}")
  teacher_name = str(config.get("teacher", "") or "")
  others = [p for p in phases if p not in ("tokenizer", "draft_distill")]
  if teacher_name and others:
    raise ValueError(f"with a teacher the only phase is draft_distill, got {others[0]!r}")
  report_path = out_dir / REPORT_FILE
  report = json.loads(report_path.read_text()) if report_path.exists() else {}
  report.setdefault("phases", {})

  t0 = time.time()
  tokenizer, train_stream, val_stream = prepare_data(config, out_dir)
  report["data"] = {"vocab_size": len(tokenizer), "train_tokens": int(len(train_stream)),
                    "val_tokens": int(len(val_stream)), "seconds": time.time() - t0}
  seq_len = int(config.data.seq_len)
  val_windows = eval_windows(val_stream, seq_len, int(config.data.eval_tokens))
  vocab = len(tokenizer)

  models: dict[str, Transformer] = {}
  if teacher_name:  # the target is given: distil from it
    from specjax.models.hf import load_model
    models["target"] = load_model(teacher_name, dtype=config.get("teacher_dtype") or None)
    vocab = models["target"].config.vocab_size

  def get_model(phase):
    if phase not in models:
      models[phase] = _load_exported(out_dir / phase)
    return models[phase]

  for phase in phases:
    if phase == "tokenizer":
      continue
    dest = out_dir / phase
    if (dest / "config.json").exists() and phase in report["phases"] and \
        not report["phases"][phase].get("stopped_early"):
      _log(f"{phase}: already trained ({dest}), skipping")
      continue
    spec = config[phase]
    model_cfg = config.draft.model if phase == "draft_distill" else spec.model
    mc = model_config(model_cfg, vocab, seq_len, eos_id=tokenizer.eos_token_id)
    train_cfg = spec.train
    ckpt_dir = out_dir / "checkpoints" / phase
    grow_from = int(spec.get("grow_from_layers", 0) or 0)
    init_layers = _int_list(spec.get("init_layers", "")) if phase == "draft_distill" else []
    k = int(spec.get("vocab_size", 0) or 0) if phase == "draft_distill" else 0
    head_ids = frequent_ids(train_stream, k, vocab) if k else None
    stage1_report = None
    if init_layers:  # also when resuming: the frozen parameters come from the teacher again
      model = draft_from_teacher(get_model("target"), init_layers)
      mc = model.config
    elif grow_from and not _has_checkpoint(ckpt_dir, train_cfg):
      # Stage 1: a shallow model of the same width, grown below into the full depth.
      stage_cfg = spec.grow_train
      small_mc = model_config(dict(model_cfg, num_layers=grow_from), vocab, seq_len,
                              eos_id=tokenizer.eos_token_id)
      small, stage1_report = train_model(
          initial_model(small_mc, stage_cfg), stage_cfg,
          Batches(train_stream, int(stage_cfg.batch_size), seq_len,
                  seed=int(config.data.seed) + 1000),
          val_windows, out_dir / "checkpoints" / f"{phase}_stage1", name=f"{phase}_stage1")
      if stage1_report["stopped_early"]:
        report["phases"][f"{phase}_stage1"] = stage1_report
        report_path.write_text(json.dumps(report, indent=1))
        _log(f"{phase}_stage1 stopped early; rerun to continue it")
        break
      model = grow_model(small, mc, train_cfg)
    else:
      model = initial_model(mc, train_cfg)  # replaced by the checkpoint when resuming
    teacher = get_model("target") if phase == "draft_distill" else None
    batches = Batches(train_stream, int(train_cfg.batch_size), seq_len,
                      seed=int(config.data.seed))
    model, rep = train_model(model, train_cfg, batches, val_windows, ckpt_dir, teacher=teacher,
                             alpha=float(spec.get("alpha", 1.0)), name=phase, head_ids=head_ids)
    if stage1_report is not None:
      rep["stage1"] = stage1_report
    rep["model"] = {k: getattr(mc, k) for k in ("vocab_size", "hidden_size", "num_layers",
                                                 "num_heads", "num_kv_heads", "intermediate_size")}
    if init_layers:
      rep["model"]["init_layers"] = init_layers
    if head_ids is not None:
      rep["model"]["head_vocab_size"] = len(head_ids)
    export_model(model, tokenizer, dest, vocab_ids=head_ids)
    models[phase] = model
    report["phases"][phase] = rep
    report_path.write_text(json.dumps(report, indent=1))
    if rep["stopped_early"]:
      _log(f"{phase} stopped early; later phases wait for it (rerun to continue)")
      break

  # Comparisons on the validation windows (inputs only).
  inputs = val_windows[:, :-1]
  summary = {}
  if config.get("agreement", True) and (teacher_name or
                                        (out_dir / "target" / "config.json").exists()):
    from specjax.models.reduced_vocab import load_vocab_ids, reduce_vocab
    for d in ("draft", "draft_distill"):
      if d in report["phases"] and (out_dir / d / "config.json").exists():
        target, draft = get_model("target"), get_model(d)
        summary[d] = {"greedy_agreement": greedy_agreement(target, draft, inputs),
                      "kl_target_draft": mean_kl(target, draft, inputs),
                      "val_loss": report["phases"][d].get("val_loss")}
        ids = load_vocab_ids(out_dir / d)
        if ids is not None:  # what the reduced head proposes (the KL is infinite there)
          summary[d]["greedy_agreement_reduced"] = greedy_agreement(
              target, reduce_vocab(draft, ids), inputs)
        _log(f"{d}: greedy agreement with target {summary[d]['greedy_agreement']:.3f}"
             + (f" ({summary[d]['greedy_agreement_reduced']:.3f} with its {len(ids)}-token head)"
                if ids is not None else "")
             + f", KL(target||{d}) {summary[d]['kl_target_draft']:.3f}")
  report["agreement"] = summary
  report["wall_seconds_this_run"] = time.time() - t_start
  report_path.write_text(json.dumps(report, indent=1))
  return report


def main(argv):
  del argv
  from absl import flags, logging
  if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  report = run(config)
  brief = {p: {k: r.get(k) for k in ("steps", "wall_seconds", "val_loss", "tokens_per_second")}
           for p, r in report["phases"].items()}
  print(json.dumps({"phases": brief, "agreement": report.get("agreement")}, indent=1))


if __name__ == "__main__":
  from absl import app
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.",
                                            lock_config=True)
  app.run(main)
