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
from specjax.models.transformer import Transformer, forward, init_model

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
  c.corpus = ml_collections.ConfigDict(dict(
      root="",                  # "" -> the Python standard library (sysconfig stdlib path)
      max_train_bytes=4_000_000,
      max_val_bytes=200_000,
      val_percent=5.0,          # share of files (by path checksum) held out for validation
      seed=0))
  c.tokenizer = ml_collections.ConfigDict(dict(vocab_size=2048, min_frequency=2))
  c.data = ml_collections.ConfigDict(dict(seq_len=128, seed=0, eval_tokens=32768))
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


def _split(model: Transformer):
  """(graphdef, params, rest): trainable ``nnx.Param`` state apart from constant buffers."""
  return nnx.split(model, nnx.Param, ...)


def _logits(graphdef, params, rest, inputs):
  """float32[B, T, V] logits of a full causal pass (inside jit)."""
  model = nnx.merge(graphdef, params, rest)
  if _fast_path_ok(model.config):
    return _causal_logits(model, inputs)
  cache = init_cache(model.config, inputs.shape[0], inputs.shape[1])
  logits, _ = model(inputs, cache)
  return logits


def _fast_path_ok(config: ModelConfig) -> bool:
  return config.is_llama_family and config.sliding_window is None


def _causal_logits(model: Transformer, inputs: jax.Array) -> jax.Array:
  """The Llama-family ``Transformer`` forward specialised to a full causal pass with no cache.

  Training only: the module's general call builds a cache, scatters keys/values into it and masks
  against cache slots, which costs ~30% of a small model's training step on CPU. This reuses the
  module's own sub-layers (norms, projections, MLP, rotary helper) and only writes plain causal
  attention itself; ``tests/test_train.py`` checks it against ``specjax.forward``.
  """
  from specjax.models.transformer import _rotate

  b, t = inputs.shape
  x = jnp.take(model.embed[...], inputs, axis=0)
  freqs = jnp.arange(t, dtype=jnp.float32)[:, None] * model.inv_freq[...][None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[None, :, None, :]  # [1, T, 1, D]
  cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
  causal = jnp.tril(jnp.ones((t, t), bool))
  for layer in model.layers:
    attn = layer.attn
    h = layer.attn_norm(x)
    q = attn.q(h).reshape(b, t, attn.num_heads, attn.head_dim)
    k = attn.k(h).reshape(b, t, attn.num_kv_heads, attn.head_dim)
    v = attn.v(h).reshape(b, t, attn.num_kv_heads, attn.head_dim)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    groups = attn.num_heads // attn.num_kv_heads
    if groups > 1:
      k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(causal, scores * (attn.head_dim ** -0.5), -1e30)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = jnp.einsum("bhts,bshd->bthd", probs, v).reshape(b, t, -1)
    x = x + attn.o(out)
    x = x + layer.mlp(layer.mlp_norm(x))
  x = model.final_norm(x)
  head = model.embed[...].T if model.lm_head is None else model.lm_head[...]
  return jnp.dot(x, head, preferred_element_type=jnp.float32)


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


def make_train_step(tx: optax.GradientTransformation, distill: bool, alpha: float = 1.0):
  """A jitted ``step(graphdef, params, rest, opt_state, batch, lr, teacher) -> (params, opt_state,
  metrics)``; ``teacher`` is ``(graphdef, params, rest)`` of the target when distilling, else None.

  With ``distill`` the loss is ``alpha * KL(target || draft) + (1 - alpha) * CE``.
  """

  def loss_fn(params, graphdef, rest, inputs, labels, teacher):
    logits = _logits(graphdef, params, rest, inputs)
    ce = _ce(logits, labels)
    if not distill:
      return ce, {"loss": ce, "ce": ce}
    t_graphdef, t_params, t_rest = teacher
    t_logits = jax.lax.stop_gradient(_logits(t_graphdef, t_params, t_rest, inputs))
    kl = _kl(t_logits, logits)
    loss = alpha * kl + (1.0 - alpha) * ce if alpha < 1.0 else kl
    return loss, {"loss": loss, "ce": ce, "kl": kl}

  @functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(1, 3))
  def step(graphdef, params, rest, opt_state, batch, lr, teacher):
    inputs, labels = batch[:, :-1], batch[:, 1:]
    grads, metrics = jax.grad(loss_fn, has_aux=True)(params, graphdef, rest, inputs, labels, teacher)
    updates, opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates)
    params = optax.apply_updates(params, updates)
    metrics["grad_norm"] = optax.global_norm(grads)
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


def greedy_agreement(target: Transformer, draft: Transformer, tokens, batch_size: int = 16) -> float:
  """Fraction of positions where ``argmax draft == argmax target`` on ``tokens`` int[N, T] (each
  model sees the same prefix: a full causal pass of each with ``forward``)."""
  tokens = np.asarray(tokens)
  agree, count = 0, 0
  for i in range(0, len(tokens), batch_size):
    batch = tokens[i:i + batch_size]
    t = np.asarray(jnp.argmax(forward(target, batch), axis=-1))
    d = np.asarray(jnp.argmax(forward(draft, batch), axis=-1))
    agree += int((t == d).sum())
    count += t.size
  return agree / count


def mean_kl(target: Transformer, draft: Transformer, tokens, batch_size: int = 16) -> float:
  """Mean over positions of KL(target || draft) in nats on ``tokens`` int[N, T]."""
  tokens = np.asarray(tokens)
  total, count = 0.0, 0
  for i in range(0, len(tokens), batch_size):
    batch = tokens[i:i + batch_size]
    total += float(_kl(forward(target, batch), forward(draft, batch))) * batch.size
    count += batch.size
  return total / count


@functools.lru_cache(maxsize=None)
def _cached_train_step(grad_clip, b2, weight_decay, distill, alpha):
  """(optimizer, jitted step) per hyper-parameter set, so that repeated runs reuse compilations."""
  import ml_collections
  tx = make_optimizer(ml_collections.ConfigDict(
      dict(grad_clip=grad_clip, b2=b2, weight_decay=weight_decay)))
  return tx, make_train_step(tx, distill=distill, alpha=alpha)


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
                alpha: float = 1.0, name: str = "model") -> tuple[Transformer, dict]:
  """Trains ``model`` (resuming from the latest checkpoint in ``ckpt_dir`` if there is one);
  returns (trained model, report dict).

  Stops at ``train_cfg.steps``; or when ``train_cfg.time_budget`` seconds (compilation included)
  are spent, in which case the learning-rate schedule was already run to its end on the time axis
  (see ``learning_rate``); or, as a hard cap, after ``max_seconds`` or ``max_steps_per_run`` of
  this run, with the schedule cut short (``stopped_early``; rerun to continue: without a time
  budget the resumed run ends bit-identical to an uninterrupted one). A checkpoint is saved every
  ``ckpt_every`` steps and at the end. ``teacher`` switches to distillation: ``alpha``
  KL(teacher || model) + ``(1 - alpha)`` cross-entropy.
  """
  steps = int(train_cfg.steps)
  max_seconds = float(train_cfg.get("max_seconds", 0) or 0)
  max_steps_per_run = int(train_cfg.get("max_steps_per_run", 0) or 0)
  time_budget = float(train_cfg.get("time_budget", 0) or 0)
  log_every = max(1, int(train_cfg.get("log_every", 50)))
  eval_every = int(train_cfg.get("eval_every", 0) or 0)
  tx, step_fn = _cached_train_step(float(train_cfg.grad_clip), float(train_cfg.get("b2", 0.95)),
                                   float(train_cfg.weight_decay), teacher is not None, float(alpha))
  graphdef, params, rest = _split(model)
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
                                         jnp.float32(lr), teacher_split)
    metrics["lr"] = lr
    step += 1
    pending.append(metrics)
    if t_compiled is None:
      jax.block_until_ready(metrics["loss"])
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
  if have_tokenizer:  # keep the tokenizer the saved models were trained with; re-encode only
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
  else:
    tokenizer = corpus_lib.train_tokenizer(corpus.train, int(config.tokenizer.vocab_size),
                                           int(config.tokenizer.get("min_frequency", 2)))
  train = corpus_lib.encode_stream(tokenizer, corpus.train)
  val = corpus_lib.encode_stream(tokenizer, corpus.val)
  _log(f"tokenizer: byte-level BPE, {len(tokenizer)} tokens; {len(train):,} training / "
       f"{len(val):,} validation tokens ({corpus.train_bytes / max(len(train), 1):.2f} bytes/token)"
       f", {time.time() - t0:.1f}s")
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


def export_model(model: Transformer, tokenizer, path: pathlib.Path) -> None:
  """Writes ``model`` (HF layout via ``specjax.models.hf.save_model``) and ``tokenizer`` to
  ``path``, atomically (a temporary dir renamed into place)."""
  from specjax.models.hf import save_model

  tmp = path.with_name(path.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  save_model(model, str(tmp))
  tokenizer.save_pretrained(str(tmp))
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
    stage1_report = None
    if grow_from and not _has_checkpoint(ckpt_dir, train_cfg):
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
                             alpha=float(spec.get("alpha", 1.0)), name=phase)
    if stage1_report is not None:
      rep["stage1"] = stage1_report
    rep["model"] = {k: getattr(mc, k) for k in ("vocab_size", "hidden_size", "num_layers",
                                                 "num_heads", "num_kv_heads", "intermediate_size")}
    export_model(model, tokenizer, dest)
    models[phase] = model
    report["phases"][phase] = rep
    report_path.write_text(json.dumps(report, indent=1))
    if rep["stopped_early"]:
      _log(f"{phase} stopped early; later phases wait for it (rerun to continue)")
      break

  # Comparisons on the validation windows (inputs only).
  inputs = val_windows[:, :-1]
  summary = {}
  if (out_dir / "target" / "config.json").exists():
    for d in ("draft", "draft_distill"):
      if d in report["phases"] and (out_dir / d / "config.json").exists():
        target, draft = get_model("target"), get_model(d)
        summary[d] = {"greedy_agreement": greedy_agreement(target, draft, inputs),
                      "kl_target_draft": mean_kl(target, draft, inputs),
                      "val_loss": report["phases"][d].get("val_loss")}
        _log(f"{d}: greedy agreement with target {summary[d]['greedy_agreement']:.3f}, "
             f"KL(target||{d}) {summary[d]['kl_target_draft']:.3f}")
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
