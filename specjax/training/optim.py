"""The optimiser (AdamW, optax) and its learning-rate schedule (warmup, cosine decay).

The learning rate is computed on the host and passed to the step as a scalar, so that it can
follow a time budget (``progress``) and not only the step count.
"""

from __future__ import annotations

import math

import jax
import optax


def make_optimizer(train_cfg) -> optax.GradientTransformation:
  """AdamW without its learning rate (global-norm clipping, Adam, decoupled weight decay on
  matrices); the step multiplies by ``-learning_rate(...)``, computed on the host.

  Reads ``train_cfg.grad_clip``, ``train_cfg.b2`` (default 0.95) and ``train_cfg.weight_decay``.
  """
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
