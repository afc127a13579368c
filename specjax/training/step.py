"""The jitted training step: loss (cross-entropy, or KL to a teacher computed inside the step),
gradient, optimiser update with a host-computed learning rate, optionally several updates per
batch ("echo")."""

from __future__ import annotations

import functools

import jax
import optax

from specjax.training.forward import logits as _logits
from specjax.training.losses import cross_entropy, kl_divergence
from specjax.training.optim import make_optimizer


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
  ``compute_dtype`` is the draft's matmul operand dtype (``forward.causal_logits``); the teacher
  computes in its weights' dtype. ``echo`` > 1 makes that many optimizer updates on each batch, the
  teacher's forward done once for all of them ("data echoing", Choi et al. 2019, arXiv
  1907.05550): worth it when the teacher costs several times the draft's update.
  """

  def loss_fn(params, graphdef, rest, inputs, labels, t_logits, head_ids):
    logits = _logits(graphdef, params, rest, inputs, compute_dtype, head_ids)
    if not distill:
      ce = cross_entropy(logits, labels)
      return ce, {"loss": ce, "ce": ce}
    if head_ids is not None:
      kl = kl_divergence(t_logits, logits)
      return kl, {"loss": kl, "kl": kl}
    ce = cross_entropy(logits, labels)
    kl = kl_divergence(t_logits, logits)
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


@functools.lru_cache(maxsize=None)
def cached_train_step(grad_clip: float, b2: float, weight_decay: float, distill: bool,
                      alpha: float, compute_dtype: str | None = None, echo: int = 1):
  """(optimizer, jitted step) per hyper-parameter set, so that repeated runs reuse compilations."""
  import ml_collections
  tx = make_optimizer(ml_collections.ConfigDict(
      dict(grad_clip=grad_clip, b2=b2, weight_decay=weight_decay)))
  return tx, make_train_step(tx, distill=distill, alpha=alpha, compute_dtype=compute_dtype,
                             echo=echo)
