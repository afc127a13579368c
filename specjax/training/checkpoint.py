"""Resumable training state on disk: an orbax ``CheckpointManager`` holding
``{params, opt_state, meta: {train_seconds}}`` per saved step.

The training time spent is saved too, so that a time-budgeted schedule resumes where it stood.
orbax is imported inside the functions (it adds ~0.5 s to ``import specjax`` otherwise).
"""

from __future__ import annotations

import os
import pathlib

import jax
import numpy as np


def checkpoint_manager(directory: str | os.PathLike, train_cfg):
  """An orbax ``CheckpointManager`` at ``directory`` (created), keeping ``keep_checkpoints``
  (default 2) checkpoints, one every ``ckpt_every`` (default 100) steps; close it after use."""
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(
      max_to_keep=int(train_cfg.get("keep_checkpoints", 2)),
      save_interval_steps=max(1, int(train_cfg.get("ckpt_every", 100))), create=True)
  return ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)


def _ckpt_tree(params, opt_state, train_seconds: float):
  return {"params": params, "opt_state": opt_state,
          "meta": {"train_seconds": np.asarray(train_seconds, np.float64)}}


def has_checkpoint(directory: str | os.PathLike, train_cfg) -> bool:
  """Whether ``directory`` holds a checkpoint to resume from."""
  if not pathlib.Path(directory).exists():
    return False
  mngr = checkpoint_manager(directory, train_cfg)
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
