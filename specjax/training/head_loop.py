"""The optimisation loop every trained head shares (EAGLE's, Medusa's): fixed-size batches of
rows drawn as a pure function of ``(seed, step)``, warmup-then-cosine learning rate, resumable
orbax checkpoints, a progress bar and a loss history, so that a run resumed from its checkpoint
ends bit-identical to an uninterrupted one and every machine trains the same head."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.training.checkpoint import checkpoint_manager, restore_checkpoint, save_checkpoint
from specjax.training.forward import split
from specjax.training.optim import learning_rate
from specjax.training.progress import bar, fmt_seconds, log


def loop_defaults(**fields):
  """An ``ml_collections.ConfigDict`` of the hyper-parameters ``train_head_steps`` and
  ``make_optimizer`` read (steps, batches, AdamW's schedule, checkpoints, logging), with a head
  kind's own ``fields`` (its loss) after them; the kinds' ``*_defaults`` functions build on it."""
  import ml_collections
  d = dict(
      steps=200,            # optimizer steps (fixed: the same head on every machine)
      batch_size=8,         # rows per step
      lr=1e-3,              # peak learning rate (warmup, then cosine to min_lr_ratio * lr)
      warmup_steps=20,
      min_lr_ratio=0.1,
      weight_decay=0.0,     # the EAGLE and Medusa repositories' AdamW: none
      b2=0.95,
      grad_clip=0.5,        # global norm
      frozen="",            # comma-separated parameter names left as initialised (e.g. "lm_head")
      compute_dtype="",     # matmul operands ("bfloat16": the CPU's fast kernels); "" = float32
      ckpt_every=50,
      keep_checkpoints=2,
      max_steps_per_run=0,  # >0: stop (and save) after this many steps of this run; resumable
      log_every=25,
      seed=0,
  )
  d.update(fields)
  return ml_collections.ConfigDict(d)


def log_times(name: str, seconds: dict) -> None:
  """The closing log line of a head's training: train, feature and evaluation times."""
  log(f"{name}: trained in {fmt_seconds(seconds['train'])} (features "
      f"{fmt_seconds(seconds['features'])}, evaluation {fmt_seconds(seconds['eval'])})")


def batch_rows(seed: int, step: int, n: int, batch_size: int, p=None) -> np.ndarray:
  """The rows of batch ``step`` (distinct when there are enough; ``p``: sampling weights): a
  pure function of ``(seed, step)``."""
  rng = np.random.default_rng([seed, step])
  return np.sort(rng.choice(n, batch_size, replace=batch_size > n, p=p))


def row_weights(weights, n_train: int) -> np.ndarray | None:
  """The training rows' sampling probabilities from ``weights`` (None: uniform), checked."""
  if weights is None:
    return None
  w = np.asarray(weights, np.float64)
  if w.shape != (n_train,) or np.any(w < 0) or not w.sum() > 0:
    raise ValueError(f"weights must be {n_train} non-negative numbers (one per training row) "
                     f"with a positive sum, got shape {w.shape}")
  return w / w.sum()


def train_head_steps(name: str, head, step_fn: Callable, tx, data: dict, consts, cfg,
                     n_train: int, p=None,
                     checkpoint_dir: str | os.PathLike | None = None,
                     postfix: Callable[[dict], str] = lambda entry: f"loss {entry['loss']:.3f}"):
  """Runs ``cfg.steps`` optimizer steps of ``step_fn(graphdef, params, rest, opt_state, batch,
  lr, consts, key) -> (params, opt_state, metrics)`` on ``head`` (its ``cfg.frozen`` parameters
  left out), each batch ``cfg.batch_size`` of the first ``n_train`` rows of every array in
  ``data``. Returns (trained head, report: ``steps``, ``start_step``, ``stopped_early``,
  ``history`` (metric means every ``log_every`` steps), ``seconds``)."""
  steps = int(cfg.steps)
  graphdef, params, rest = split(head, cfg.frozen)
  params = jax.tree.map(jnp.array, params)  # copies: the step donates its parameters
  opt_state = tx.init(params)
  mngr = checkpoint_manager(pathlib.Path(checkpoint_dir), cfg) if checkpoint_dir else None
  start, prior = 0, 0.0
  if mngr is not None and mngr.latest_step() is not None:
    start, params, opt_state, prior = restore_checkpoint(mngr, params, opt_state)
    log(f"{name}: resumed from checkpoint at step {start}")
  t1, history, pending = time.time(), [], []
  progress = bar(steps, start, name)
  base_key = jax.random.key(int(cfg.seed))
  stop = steps if not cfg.max_steps_per_run else min(steps, start + int(cfg.max_steps_per_run))
  for step in range(start, stop):
    rows = batch_rows(int(cfg.seed), step, n_train, int(cfg.batch_size), p)
    batch = {key: jnp.asarray(v[rows]) for key, v in data.items()}
    params, opt_state, metrics = step_fn(graphdef, params, rest, opt_state, batch,
                                         jnp.float32(learning_rate(cfg, step)), consts,
                                         jax.random.fold_in(base_key, step))
    pending.append(metrics)
    done = step + 1
    if done % int(cfg.log_every) == 0 or done == stop:
      host = jax.device_get(pending)
      pending = []
      entry = {"step": done, "time": time.time() - t1, "lr": learning_rate(cfg, step)}
      for key in host[0]:
        entry[key] = np.mean([h[key] for h in host], axis=0).tolist()
      history.append(entry)
      if progress is not None:
        progress.set_postfix_str(postfix(entry))
    if progress is not None:
      progress.update(1)
    if mngr is not None:
      save_checkpoint(mngr, done, params, opt_state, prior + time.time() - t1,
                      force=done == stop)
  if progress is not None:
    progress.close()
  if mngr is not None:
    mngr.wait_until_finished()
    mngr.close()
  report = {"steps": stop, "start_step": start, "stopped_early": stop < steps,
            "history": history, "seconds": time.time() - t1}
  return nnx.merge(graphdef, params, rest), report
