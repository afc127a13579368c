"""The training loop: resumable, time-limited training of one model, by next-token cross-entropy
or by distillation from a teacher, with its hyper-parameters in one ``ml_collections`` block
(``train_defaults``); ``fit`` and ``distill`` wrap it for callers holding a token stream.

The batch for step ``s`` is a pure function of ``(data seed, s)`` (``data.Batches``) and the
learning rate of ``(s, steps)`` (``optim.learning_rate``), so without a time budget a run
resumed from its checkpoint ends bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import os
import pathlib
import time
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.transformer import Transformer
from specjax.training.checkpoint import checkpoint_manager, restore_checkpoint, save_checkpoint
from specjax.training.data import Batches, eval_windows
from specjax.training.evaluation import evaluate
from specjax.training.forward import split
from specjax.training.optim import learning_rate
from specjax.training.progress import fmt_seconds as _fmt_seconds
from specjax.training.progress import log as _log
from specjax.training.step import cached_train_step

if TYPE_CHECKING:
  import ml_collections


def train_defaults(**overrides) -> ml_collections.ConfigDict:
  """The hyper-parameters ``train_model`` reads (an ``ml_collections.ConfigDict``: optimisation,
  limits, checkpointing, logging), with ``overrides`` applied; the comments name each field."""
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
  ``train_cfg``: ``train_defaults(...)`` (any object with attribute access and ``get`` will do);
  ``batches``: the batch of each step (``data.Batches``); ``val_windows``: ``data.eval_windows``
  for the validation loss (None: none).

  The report: ``steps``, ``start_step``, ``ended_by`` ("steps", "time_budget" or "max_seconds"),
  ``stopped_early``, timings, ``history`` (one entry per logged step: mean ``loss``, ``ce`` /
  ``kl``, ``grad_norm``, ``lr``), ``final_train_loss`` and ``val_loss``.
  """
  if head_ids is not None and (teacher is None or alpha != 1.0):
    raise ValueError("head_ids (a reduced-vocabulary head) needs a teacher and alpha = 1")
  steps = int(train_cfg.steps)
  max_seconds = float(train_cfg.get("max_seconds", 0) or 0)
  max_steps_per_run = int(train_cfg.get("max_steps_per_run", 0) or 0)
  time_budget = float(train_cfg.get("time_budget", 0) or 0)
  log_every = max(1, int(train_cfg.get("log_every", 50)))
  eval_every = int(train_cfg.get("eval_every", 0) or 0)
  tx, step_fn = cached_train_step(float(train_cfg.grad_clip), float(train_cfg.get("b2", 0.95)),
                                  float(train_cfg.weight_decay), teacher is not None, float(alpha),
                                  train_cfg.get("compute_dtype") or None,
                                  int(train_cfg.get("echo", 1) or 1))
  graphdef, params, rest = split(model, train_cfg.get("frozen", ()))
  ids = None if head_ids is None else jnp.asarray(head_ids, jnp.int32)
  opt_state = tx.init(params)
  teacher_split = split(teacher) if teacher is not None else None

  mngr = checkpoint_manager(pathlib.Path(ckpt_dir), train_cfg) if ckpt_dir else None
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


def _train_on_stream(model, teacher, train_stream, alpha, head_ids, seq_len, val_stream,
                     eval_tokens, checkpoint_dir, data_seed, name, hparams):
  unknown = sorted(set(hparams) - set(train_defaults()))
  if unknown:
    raise TypeError(f"unknown training hyper-parameters {unknown}; see train_defaults()")
  cfg = train_defaults(**hparams)
  batches = Batches(train_stream, int(cfg.batch_size), seq_len, seed=data_seed)
  val = None if val_stream is None else eval_windows(val_stream, seq_len, eval_tokens)
  return train_model(model, cfg, batches, val, checkpoint_dir, teacher=teacher, alpha=alpha,
                     name=name, head_ids=head_ids)


def fit(model: Transformer, train_stream: np.ndarray, *, seq_len: int = 128,
        val_stream: np.ndarray | None = None, eval_tokens: int = 32768,
        checkpoint_dir: str | os.PathLike | None = None, data_seed: int = 0,
        name: str = "model", **hparams) -> tuple[Transformer, dict]:
  """Trains ``model`` by next-token cross-entropy on random ``seq_len``-token windows of the int
  token stream ``train_stream``; returns (trained model, report of ``train_model``).

  ``hparams`` are ``train_defaults`` fields (``steps``, ``batch_size``, ``lr``, ...).
  ``val_stream``: the validation loss on up to ``eval_tokens`` of it at the end. With
  ``checkpoint_dir`` the run saves there and resumes from there.
  """
  return _train_on_stream(model, None, train_stream, 1.0, None, seq_len, val_stream, eval_tokens,
                          checkpoint_dir, data_seed, name, hparams)


def distill(teacher: Transformer, draft: Transformer, train_stream: np.ndarray, *,
            alpha: float = 1.0, head_ids: np.ndarray | None = None, seq_len: int = 128,
            val_stream: np.ndarray | None = None, eval_tokens: int = 32768,
            checkpoint_dir: str | os.PathLike | None = None, data_seed: int = 0,
            name: str = "draft", **hparams) -> tuple[Transformer, dict]:
  """Trains ``draft`` towards ``teacher``'s next-token distributions on windows of
  ``train_stream``: ``alpha`` KL(teacher || draft) + ``(1 - alpha)`` cross-entropy on the data;
  returns (trained draft, report of ``train_model``).

  The teacher runs inside the step without gradient, in its weights' dtype (a bfloat16 teacher is
  ~2x faster on AMX CPUs). ``head_ids`` (int[K], e.g. ``data.frequent_ids``; ``alpha`` = 1)
  trains a reduced-vocabulary head; ``draft`` may start as ``models.draft_from_teacher``.
  Other arguments as in ``fit``.
  """
  return _train_on_stream(draft, teacher, train_stream, float(alpha), head_ids, seq_len,
                          val_stream, eval_tokens, checkpoint_dir, data_seed, name, hparams)
