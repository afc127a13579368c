"""Training EAGLE heads on a target's own answers: EAGLE-1's feature regression and EAGLE-3's
training-time test, resumable, with a held-out evaluation of what drafting will see.

  import specjax as sj
  from specjax.training import eagle as et
  tokens, mask = et.eagle_rows(target, prompts, max_new_tokens=128, eos_token_id=2, seq_len=192)
  head = et.init_eagle_head(target, "eagle3", et.draft_vocabulary(tokens, mask, 8192, V))
  head, report = et.train_eagle(target, head, tokens, mask, steps=300, eval_rows=8,
                                eval_prompts=held_out, checkpoint_dir="/tmp/ckpt",
                                cache_dir="/tmp/features")
  sj.save_head(head, "/tmp/head")

**EAGLE-1** (Li et al. 2024, arXiv 2401.15077 §4; the repository's ``eagle/train/main.py``):
position ``t`` reads ``(token t + 1, the target's normed feature at t + noise)`` and regresses
the feature at ``t + 1``: ``v_weight`` x smooth-L1 + ``p_weight`` x CE of its logits (through the
target's frozen LM head) against the target's softmax there (soft labels), 1.0 and 0.1 as in the
repository. The noise is uniform, ``U(-noise/2, noise/2)`` (the repository's ``(rand - 0.5) *
0.2 * 512 / T``: width 0.2 at its 512-token rows), added to the input features only: the head
learns to draft from its own imperfect features.

**EAGLE-3** (Li et al. 2025, arXiv 2503.01840 §3; ``eagle/traineagle3``): no regression, only
the soft-label CE, over the draft vocabulary (the target's logits restricted to it, softmaxed;
positions whose target argmax is outside it are left out, the repository's ``position_mask``),
at each of ``ttt_steps`` training-time-test steps (``eagle_forward.ttt_forward``; the
repository's ``length`` = 7), step ``k`` weighted ``ttt_decay ** k`` (0.8).

**MTP** (DeepSeek-V3's multi-token-prediction module, arXiv 2412.19437 §2.2;
``specjax.heads.mtp``): the same CE-only loss over ``ttt_steps`` chained steps (soft labels over
the full vocabulary, no feature regression): step ``k`` is the module run on its own step-(k - 1)
output, as drafting chains it. DeepSeek-V3 trains its modules jointly with the model on hard
labels (its ``lambda`` weighted MTP loss); here the target is frozen and its soft labels teach
the module, as for EAGLE-3. The output head is the target's, frozen (the module's own
``lm_head``, when it has one, is trained). An ``MTPStack`` of ``D`` modules trains DeepSeek's
way: its ``D`` modules are the steps (``ttt_steps`` = D), module ``k`` at ``t`` reading module
``k - 1``'s output at ``t`` and the true token ``t + k``, a plain causal pass each
(``eagle_forward.stack_forward``), its CE against the target's law of token ``t + k + 1``
weighted ``ttt_decay ** (k - 1)``.

Both: AdamW (``optim.make_optimizer``: b2 0.95, clipping 0.5 and no weight decay as in the
repository), warmup then cosine decay to a fixed step count, so every machine trains the same head;
batch ``s`` is a pure function of ``(seed, s)``, the noise too, so a run resumed from its orbax
checkpoint (``checkpoint.py``) ends bit-identical to an uninterrupted one. Soft labels are the
target's LM head applied to its cached normed features inside the step (no [N, L, V] label
store); the rows are the target's own greedy text, so the token after a position is the target's
argmax there (the draft-vocabulary mask and the agreement use it). The repository's 40 epochs
of ShareGPT do not fit a CPU: on 2 cores a SmolLM2 EAGLE-1 step (8 rows of 160) took 0.5 s and an
EAGLE-3 step with 3 TTT steps 1.3 s (configs/train_eagle*_smollm2.py give what a few minutes buy).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from specjax.heads.eagle import init_head
from specjax.heads.eagle3 import Eagle3Head, init_head3
from specjax.heads.mtp import MTPHead, MTPStack, init_mtp
from specjax.training.eagle_data import (answer_rows, draft_vocabulary, eagle_rows,  # noqa: F401
                                         extract_features, feature_layers_of)
from specjax.training.eagle_eval import describe_acceptance, eagle_acceptance, ttt_agreement
from specjax.training.eagle_forward import (Spec, head_logits, smooth_l1, soft_cross_entropy,
                                            step_head, step_inputs, step_mask, ttt_forward)
from specjax.training.forward import mm, split
from specjax.training.head_loop import log_times, loop_defaults, row_weights, train_head_steps
from specjax.training.losses import top1_agreement
from specjax.training.optim import make_optimizer
from specjax.training.progress import log


def eagle_defaults(**overrides):
  """The hyper-parameters ``train_eagle`` reads (an ``ml_collections.ConfigDict``): the shared
  loop's (``head_loop.loop_defaults``) and the EAGLE losses'."""
  return loop_defaults(**{**dict(
      ttt_steps=7,          # EAGLE-3 training-time-test steps (the repository's length); EAGLE-1: 1
      ttt_decay=0.8,        # step k's loss weight: ttt_decay ** k
      p_weight=0.1,         # EAGLE-1: weight of the soft-label CE
      v_weight=1.0,         # EAGLE-1: weight of the smooth-L1 feature regression
      noise=0.2,            # EAGLE-1: width of the uniform noise on the input features
      loss_vocab=0,         # EAGLE-1: >0: its CE over that many most frequent answer ids only
                            # (restricted soft labels, as EAGLE-3's), not all V: cheaper steps
      eval_steps=4,         # TTT steps of the held-out top-1 agreement
  ), **overrides})


def init_eagle_head(target, kind: str = "eagle3", draft_ids=None, key: int = 0,
                    num_layers: int = 1, from_target: bool = True, num_modules: int = 1,
                    layer_from_target: bool = False):
  """An untrained float32 head for ``target``: ``"eagle"`` (EAGLE-1/2, ``num_layers`` layers),
  ``"eagle3"`` (``draft_ids``: its draft vocabulary, ``draft_vocabulary``; None: all) or
  ``"mtp"`` (a DeepSeek-V3 MTP module on the target's LM head, ``specjax.heads.mtp``; an
  ``MTPStack`` of ``num_modules`` when > 1).

  ``from_target``: the head starts as a pass-through of the target's top feature, its
  attention and MLP outputs (``o``, ``down``) zero and ``fc`` an identity on that feature (EAGLE-1:
  the normed feature at t; EAGLE-3: the highest fused layer), and EAGLE-3's ``lm_head`` and
  ``norm`` as the target's LM head columns of the draft ids and final norm. Its first guess is
  then the target's own next-token law at t (a logit lens, one token behind), in the target's
  geometry, rather than noise through a random 8192-row head learned from a few thousand
  tokens. Our choice for short CPU runs (the repository starts at random; held-out top-1 agreement
  after 100 SmolLM2 steps: 0.257 against 0.23 with the target's head alone); the layers' other
  weights are random unless ``layer_from_target``.

  ``layer_from_target`` (EAGLE-3): the midlayer starts as the target layer that reads the fused
  high feature (q/k/v on the hidden half, the embedding half zero; its norms, ``o`` and MLP), so
  with ``fc`` passing that feature the head's first pass is exactly that layer of the target:
  attention and MLP weights that already work in the target's geometry, where random ones must
  be learnt. On SmolLM2 (750 steps, configs/train_eagle3_smollm2.py) held-out top-1 agreement per
  TTT step 0.63 0.60 0.54 against 0.57 0.53 0.48 from the pass-through start.

  MTP, ``from_target``: block ``o``/``down`` zero, ``eh_proj`` passing the hidden (the embedding
  half zero), ``hnorm`` = 1 / the target's final-norm scale and ``shared_head.norm`` = that
  scale. The first step's hidden is the target's normed state ``g * x / rms(x)``; ``hnorm``
  undoes ``g`` (to ``x / rms(x)`` times a constant: the pre-norm residual direction, the geometry
  the target's blocks work in) and ``shared_head.norm`` redoes the target's final norm, so the
  module's first guess is exactly the target's law at t (the temperature too, which ones in both
  norms would not keep). A channel with ``|g| < 1e-6`` gets ``hnorm`` 0. ``enorm`` stays at 1.
  A stack's later modules read a module's output (already the normalised residual direction):
  their ``hnorm`` stays at 1, so each starts as the target's law at t too."""
  config = dataclasses.replace(target.config, dtype="float32")
  if kind == "eagle":
    head = init_head(config, key, num_layers)
    layers = list(head.layers)
  elif kind == "eagle3":
    head = init_head3(config, key, draft_ids)
    layers = [head.midlayer]
  elif kind == "mtp":
    head = init_mtp(config, key, num_modules=num_modules)
    modules = list(head.modules) if isinstance(head, MTPStack) else [head]
    layers = [layer for module in modules for layer in module.layers]
  else:
    raise ValueError(f"head kind must be 'eagle', 'eagle3' or 'mtp', got {kind!r}")
  if not from_target:
    return head
  e = config.hidden_size
  for layer in layers:
    for dense in (layer.attn.o, layer.mlp.down):
      dense.kernel[...] = jnp.zeros_like(dense.kernel[...])
  for module in modules if kind == "mtp" else [head]:
    module.fc.kernel[...] = jnp.zeros_like(module.fc.kernel[...]).at[-e:].set(jnp.eye(e))
  if kind == "eagle3":
    w = target.embed[...].T if target.lm_head is None else target.lm_head[...]
    head.lm_head[...] = jnp.take(w, head.draft_ids[...], axis=1).astype(jnp.float32)
    head.norm.scale[...] = target.final_norm.scale[...].astype(jnp.float32)
  if layer_from_target:
    _copy_target_layer(target, head)
  if kind == "mtp":
    g = target.final_norm.scale[...].astype(jnp.float32)
    modules[0].hnorm.scale[...] = jnp.where(jnp.abs(g) > 1e-6,
                                            1.0 / jnp.where(g == 0, 1.0, g), 0.0)
    for module in modules:
      module.norm.scale[...] = g
  return head


def _copy_target_layer(target, head) -> None:
  """EAGLE-3's midlayer set to the target layer its fused input enters (the one after the high
  feature): attention over the hidden half with that layer's q/k/v (the embedding half zero),
  its norms, ``o``, MLP and any biases or q/k norms, so that the head (with ``from_target``'s
  ``fc``) starts as that layer run on the target's own features."""
  if not isinstance(head, Eagle3Head):
    raise ValueError("layer_from_target is an EAGLE-3 initialisation")
  index = head.target_features(target.config)[-1] + 1  # a block's output: the next one reads it
  if index >= target.config.num_layers:
    raise ValueError(f"layer_from_target: the head's high feature is the output of the "
                     f"target's last layer ({index - 1}), which no layer reads")
  source, layer = target.layers[index], head.midlayer
  e = target.config.hidden_size
  f32 = lambda x: jnp.asarray(x[...], jnp.float32)

  def copy(dst, src, pad: bool = False):
    w = f32(src.kernel)
    dst.kernel[...] = jnp.zeros_like(dst.kernel[...]).at[e:].set(w) if pad else w
    if src.bias is not None:
      dst.bias[...] = f32(src.bias)

  for name in ("q", "k", "v"):
    copy(getattr(layer.attn, name), getattr(source.attn, name), pad=True)
  copy(layer.attn.o, source.attn.o)
  for name in ("gate", "up", "down"):
    copy(getattr(layer.mlp, name), getattr(source.mlp, name))
  norms = [(layer.hidden_norm, source.attn_norm), (layer.mlp_norm, source.mlp_norm),
           (layer.attn.q_norm, source.attn.q_norm), (layer.attn.k_norm, source.attn.k_norm)]
  for dst, src in norms:
    if src is not None:
      dst.scale[...] = f32(src.scale)


def _loss(params, graphdef, rest, batch, consts, key, spec: Spec):
  head = nnx.merge(graphdef, params, rest)
  tokens, hidden, normed = step_inputs(head, batch, spec, key)
  t = hidden.shape[1]
  outs = ttt_forward(head, consts["embed"], tokens, hidden, spec.steps, spec.compute_dtype)
  labels = mm(normed[:, 1:], consts["label_w"], spec.compute_dtype)  # positions 1..L-1
  labels = jnp.pad(labels, ((0, 0), (0, spec.steps), (0, 0)))
  loss, ces, accs = 0.0, [], []
  for k, out in enumerate(outs):
    mask = step_mask(batch, consts, spec, k, t)
    label = labels[:, k:k + t]
    logits = head_logits(step_head(head, k), consts["label_w"], out, spec.compute_dtype)
    ce = soft_cross_entropy(label, logits, mask)
    hit = top1_agreement(logits, label)
    accs.append(jnp.sum(hit * mask) / jnp.maximum(jnp.sum(mask), 1.0))
    ces.append(ce)
    loss = loss + spec.decay ** k * ce
  metrics = {"ce": jnp.stack(ces), "acc": jnp.stack(accs)}
  if not spec.ce_only:
    plain = {key: v for key, v in consts.items() if key != "in_vocab"}
    vloss = smooth_l1(outs[0], normed[:, 1:], step_mask(batch, plain, spec, 0, t))
    metrics["vloss"] = vloss
    loss = spec.v_weight * vloss + spec.p_weight * loss
  metrics["loss"] = loss
  return loss, metrics


def make_eagle_step(tx: optax.GradientTransformation, spec: Spec):
  """A jitted ``step(graphdef, params, rest, opt_state, batch, lr, consts, key) -> (params,
  opt_state, metrics)``; ``batch``: ``tokens`` int32[B, L] (the target's greedy text),
  ``mask`` bool[B, L] (answer tokens), ``features`` [B, L, F, E]; ``consts``: the
  target's ``embed`` [V, E], ``label_w`` [E, V'] (its LM head, over the draft vocabulary for
  EAGLE-3) and, EAGLE-3, ``in_vocab`` bool[V]."""

  @functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(1, 3))
  def step(graphdef, params, rest, opt_state, batch, lr, consts, key):
    grads, metrics = jax.grad(_loss, has_aux=True)(params, graphdef, rest, batch, consts, key,
                                                   spec)
    updates, opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates)
    metrics["grad_norm"] = optax.global_norm(grads)
    return optax.apply_updates(params, updates), opt_state, metrics

  return step


@functools.lru_cache(maxsize=None)
def _cached_step(grad_clip: float, b2: float, weight_decay: float, spec: Spec):
  """(optimizer, jitted step) per hyper-parameter set: repeated runs reuse the compilation."""
  import ml_collections
  tx = make_optimizer(ml_collections.ConfigDict(
      dict(grad_clip=grad_clip, b2=b2, weight_decay=weight_decay)))
  return tx, make_eagle_step(tx, spec)


def _consts(target, head, loss_ids=None) -> dict:
  """The step's constants: the target's embedding and its LM head over the loss vocabulary
  (EAGLE-3: the draft vocabulary; EAGLE-1: ``loss_ids``, or all of it), ``in_vocab`` when that
  is a subset."""
  w = target.embed[...].T if target.lm_head is None else target.lm_head[...]
  consts = {"embed": jnp.asarray(target.embed[...], jnp.float32)}
  ids = head.draft_ids[...] if isinstance(head, Eagle3Head) else loss_ids
  if ids is None:
    consts["label_w"] = jnp.asarray(w, jnp.float32)
    return consts
  ids = jnp.asarray(ids, jnp.int32)
  consts["label_w"] = jnp.take(w, ids, axis=1).astype(jnp.float32)
  consts["in_vocab"] = jnp.zeros((target.config.vocab_size,), bool).at[ids].set(True)
  return consts


def _check(cfg, tokens, mask, eval_rows: int, ce_only: bool) -> tuple[int, int]:
  steps, k = int(cfg.steps), int(cfg.ttt_steps) if ce_only else 1
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  if int(cfg.ttt_steps) < 1:
    raise ValueError(f"ttt_steps must be >= 1, got {cfg.ttt_steps}")
  if tokens.ndim != 2 or (mask is not None and mask.shape != tokens.shape):
    raise ValueError(f"tokens must be [rows, length] with a mask of the same shape, got "
                     f"{tokens.shape} and {None if mask is None else mask.shape}")
  if tokens.shape[1] < k + 2:
    raise ValueError(f"rows of {tokens.shape[1]} tokens are too short for {k} TTT step(s): "
                     f"need >= {k + 2}")
  if not 0 <= eval_rows < len(tokens):
    raise ValueError(f"eval_rows {eval_rows} must leave training rows of the {len(tokens)}")
  return steps, k


def train_eagle(target, head, tokens: np.ndarray, mask: np.ndarray | None = None, *,
                eval_rows: int = 0, eval_prompts=None, eval_gamma: int = 4,
                eval_new_tokens: int = 64, eos_token_id=None, weights=None,
                feature_dtype: str | None = None,
                checkpoint_dir: str | os.PathLike | None = None,
                cache_dir: str | os.PathLike | None = None, name: str = "eagle", **hparams):
  """Trains ``head`` (``EagleHead``: EAGLE-1's loss; ``Eagle3Head`` or ``MTPHead``: CE-only
  training-time test; ``MTPStack``: DeepSeek's D-depth loss, its modules the steps) on the
  rows ``tokens`` int[N, L] with answer ``mask`` bool[N, L] (``eagle_rows``; None: every token)
  for ``target``; returns (trained head, report).

  The last ``eval_rows`` rows are held out: the report's ``agreement`` is the head's top-1
  agreement with the target per TTT step on them (``ttt_agreement``). ``eval_prompts`` (token
  lists): ``acceptance``, greedy ``sj.Eagle(head, eval_gamma)`` on them (``eagle_acceptance``).
  ``weights``: the training rows' sampling weights (e.g. to make the target's answers a set
  share of the batches beside plain-text rows; default uniform). ``hparams``: ``eagle_defaults``
  fields. ``feature_dtype``: the target's dtype for the feature pass (``extract_features``,
  cached under ``cache_dir``). With ``checkpoint_dir`` the run saves there every ``ckpt_every``
  steps and resumes from the latest checkpoint.
  """
  cfg = eagle_defaults(**hparams)
  tokens = np.asarray(tokens, np.int32)
  mask = np.ones(tokens.shape, bool) if mask is None else np.asarray(mask, bool)
  kind = "eagle3" if isinstance(head, Eagle3Head) else "mtp" if isinstance(
      head, (MTPHead, MTPStack)) else "eagle"
  ce_only = kind != "eagle"
  if isinstance(head, MTPStack):  # a stack's steps are its modules (DeepSeek's D-depth MTP loss)
    cfg.ttt_steps = head.num_modules
    cfg.eval_steps = min(int(cfg.eval_steps), head.num_modules)
  steps, k = _check(cfg, tokens, mask, eval_rows, ce_only)
  n_train = len(tokens) - eval_rows
  p = row_weights(weights, n_train)
  report = {"kind": kind, "rows": int(len(tokens)),
            "seq_len": int(tokens.shape[1]), "loss_tokens": int(mask[:n_train].sum()),
            "seconds": {}}
  t0 = time.time()
  layers, inputs, normed = feature_layers_of(head, target.config)
  feats = extract_features(target, tokens, layers, dtype=feature_dtype, cache_dir=cache_dir)
  report["seconds"]["features"] = time.time() - t0
  data = {"tokens": tokens, "mask": mask, "features": feats}
  spec = Spec(ce_only, inputs, normed, k, float(cfg.ttt_decay), float(cfg.p_weight),
              float(cfg.v_weight), 0.0 if ce_only else float(cfg.noise),
               cfg.compute_dtype or None)
  tx, step_fn = _cached_step(float(cfg.grad_clip), float(cfg.b2), float(cfg.weight_decay), spec)
  loss_ids = None
  if not ce_only and int(cfg.loss_vocab):
    loss_ids = draft_vocabulary(tokens[:n_train], mask[:n_train], int(cfg.loss_vocab),
                                target.config.vocab_size)
  consts = _consts(target, head, loss_ids)
  log(f"{name}: {sum(x.size for x in jax.tree.leaves(split(head, cfg.frozen)[1])) / 1e6:.2f}M "
      f"params, {report['loss_tokens']:,} loss tokens in {n_train} rows of {tokens.shape[1]}, "
      f"{steps} steps of {cfg.batch_size} rows, {k} TTT step(s)")
  head, run = train_head_steps(
      name, head, step_fn, tx, data, consts, cfg, n_train, p, checkpoint_dir,
      postfix=lambda entry: f"loss {entry['loss']:.3f} acc0 {entry['acc'][0]:.3f}")
  stop = run["steps"]
  report["seconds"]["train"] = run.pop("seconds")
  report.update(run, config=cfg.to_dict())
  graphdef, params, rest = split(head, cfg.frozen)
  t2 = time.time()
  if eval_rows and stop == steps:
    held = {key: v[n_train:] for key, v in data.items()}
    report["agreement"] = ttt_agreement(head, (graphdef, params, rest), held,
                                        _consts(target, head), spec, int(cfg.eval_steps))
    log(f"{name}: held-out top-1 agreement per TTT step "
        + " ".join(f"{a:.3f}" for a in report["agreement"]))
  if eval_prompts and stop == steps:
    report["acceptance"] = eagle_acceptance(target, head, eval_prompts, eval_gamma,
                                            eval_new_tokens, eos_token_id)
    log(f"{name}: greedy acceptance per position at gamma {eval_gamma}: "
        + describe_acceptance(report["acceptance"]))
  report["seconds"]["eval"] = time.time() - t2
  log_times(name, report["seconds"])
  return head, report


__all__ = ["answer_rows", "draft_vocabulary", "eagle_acceptance", "eagle_defaults",
           "eagle_rows", "extract_features", "init_eagle_head", "make_eagle_step",
           "train_eagle", "ttt_agreement"]
