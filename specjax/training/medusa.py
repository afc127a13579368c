"""Training Medusa heads on a frozen target (Medusa-1, Cai et al. 2024, arXiv 2401.10774 §2.2.1)
and Hydra heads (Ankner et al. 2024, arXiv 2402.05109, teacher-forced: head k's path inputs are
the row's own next tokens) from the target's own answers and their cached features, with the loop
every head shares (``head_loop``: fixed steps, resumable orbax checkpoints, the same heads on
every machine).

  from specjax.training import medusa as mt
  tokens, mask = sj.training.eagle_rows(target, prompts, 96, eos_id, seq_len=160)
  heads = mt.init_medusa_heads(target, num_heads=4)
  heads, report = mt.train_medusa(target, heads, tokens, mask, steps=300, eval_rows=8)
  sj.save_head(heads, "/tmp/medusa")

Loss: head ``k`` (0-based) at position ``t`` reads the target's normed state there and is scored
on the token at ``t + k + 2``, the paper's ``sum_k lambda_k CE_k`` with ``lambda_k =
decay ** (k + 1)`` (its 0.8 ** k for heads k = 1..K). Labels: the target's soft law at ``t + k +
1`` (its LM head on the cached normed state there: the token after it is what the target would
say, the Medusa-2 paper's self-distillation, §2.3.2, which the rows being the target's own greedy
text makes the same argmax), or ``labels="hard"``: the row's next token itself. Only answer
tokens (``mask``) count. ``loss_vocab`` > 0 restricts the CE to that many most frequent answer
ids (cheaper steps, drafting still uses every id). Initialisation: the repository's (identity
blocks, projections copied from the target's LM head), ``start_from_target``.

Hydra++'s prefix layer (``init_hydra_heads(prefix_layer=True)``): the layer runs causally over
each row's cached normed states (teacher forcing: the whole row at once, as the repository's
training does) and its output at ``t`` is the heads' state there; the soft labels stay the
target's own law.
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

from specjax.heads.hydra import HydraHead, init_hydra, start_hydra_from_target
from specjax.heads.medusa import init_medusa, start_from_target
from specjax.models.kv_cache import init_cache
from specjax.models.transformer import NORMED
from specjax.training.eagle_data import draft_vocabulary, extract_features
from specjax.training.eagle_eval import describe_acceptance, method_acceptance
from specjax.training.eagle_forward import soft_cross_entropy
from specjax.training.forward import mm, split
from specjax.training.head_loop import log_times, loop_defaults, row_weights, train_head_steps
from specjax.training.optim import make_optimizer
from specjax.training.progress import log

LABELS = ("soft", "hard")


def medusa_defaults(**overrides):
  """The hyper-parameters ``train_medusa`` reads (an ``ml_collections.ConfigDict``): the shared
  loop's (``head_loop.loop_defaults``) and the Medusa loss's."""
  return loop_defaults(**{**dict(
      decay=0.8,            # head k's loss weight: decay ** (k + 1) (the paper's lambda_k)
      labels="soft",        # "soft": the target's law at t + k + 1; "hard": the row's token
      loss_vocab=0,         # >0: the CE over that many most frequent answer ids only
  ), **overrides})


def init_medusa_heads(target, num_heads: int = 4, num_layers: int = 1, own_lm_head: bool = False,
                      key: int = 0, from_target: bool = True):
  """Untrained float32 heads for ``target`` (``from_target``: Medusa's initialisation, so head k
  starts as the target's own next-token guess). ``own_lm_head=False`` (default here) shares
  the target's LM head: K x [E, V] fewer parameters to train (SmolLM2: 28M a head)."""
  heads = init_medusa(target.config, num_heads, num_layers, key, own_lm_head)
  return start_from_target(heads, target) if from_target else heads


def init_hydra_heads(target, num_heads: int = 4, num_layers: int = 1, key: int = 0,
                     from_target: bool = True, prefix_layer: bool = False):
  """Untrained float32 Hydra heads for ``target`` (``from_target``: ``start_hydra_from_target``,
  each head first the target's next-token guess from the state, its path inputs at zero;
  ``prefix_layer``: Hydra++'s, started from the target's last layer)."""
  heads = init_hydra(target.config, num_heads, num_layers, key, prefix_layer=prefix_layer)
  return start_hydra_from_target(heads, target) if from_target else heads


@dataclasses.dataclass(frozen=True)
class Spec:
  """The static part of a step: loss weights, labels, matmul dtype."""

  decay: float
  hard: bool
  compute_dtype: str | None


def _loss(params, graphdef, rest, batch, consts, spec: Spec):
  heads = nnx.merge(graphdef, params, rest)
  normed = batch["features"][:, :, 0].astype(jnp.float32)  # [B, L, E]
  tokens, mask = batch["tokens"], batch["mask"].astype(jnp.float32)
  length = normed.shape[1]
  hidden = None if isinstance(heads, HydraHead) else heads.hidden(normed)  # [B, L, K, E]
  h = normed
  if hidden is None and heads.has_prefix:  # Hydra++: the prefix layer over the whole row
    h = heads.prefix_pass(normed, init_cache(heads.config.prefix, *normed.shape[:2]))[0]
    h = h.astype(jnp.float32)
  loss, ces, accs = 0.0, [], []
  for k in range(heads.num_heads):
    shift = k + 2  # head k at t is scored on the token at t + shift
    if hidden is None:  # Hydra, teacher-forced: the path is the row's tokens t + 1 .. t + k + 1
      path = jnp.stack([tokens[:, 1 + j:length - shift + 1 + j] for j in range(k + 1)], axis=2)
      state = heads.state(k, h[:, :length - shift], jnp.take(consts["embed"], path, axis=0))
      logits = heads.project(k, state, consts["ids"])
    else:
      w = consts["label_w"] if heads.lm_heads is None else jnp.take(
          heads.lm_heads[k][...], consts["ids"], axis=1)
      logits = mm(hidden[:, :length - shift, k], w, spec.compute_dtype)  # [B, L - shift, V']
    label = tokens[:, shift:]
    weight = mask[:, shift:]
    if spec.hard:  # the row's token, over the loss vocabulary (other ids weigh 0)
      local = consts["local"][label]
      weight = weight * (local >= 0)
      logq = jax.nn.log_softmax(logits, axis=-1)
      picked = jnp.take_along_axis(logq, jnp.maximum(local, 0)[..., None], axis=-1)[..., 0]
      ce = -jnp.sum(picked * weight) / jnp.maximum(jnp.sum(weight), 1.0)
    else:
      label_logits = mm(normed[:, shift - 1:length - 1], consts["label_w"], spec.compute_dtype)
      ce = soft_cross_entropy(label_logits, logits, weight)
    hit = (consts["ids"][jnp.argmax(logits, -1)] == label).astype(jnp.float32)
    accs.append(jnp.sum(hit * weight) / jnp.maximum(jnp.sum(weight), 1.0))
    ces.append(ce)
    loss = loss + spec.decay ** (k + 1) * ce
  return loss, {"loss": loss, "ce": jnp.stack(ces), "acc": jnp.stack(accs)}


@functools.lru_cache(maxsize=None)
def _cached_step(grad_clip: float, b2: float, weight_decay: float, spec: Spec):
  """(optimizer, jitted step) per hyper-parameter set: repeated runs reuse the compilation."""
  import ml_collections
  tx = make_optimizer(ml_collections.ConfigDict(
      dict(grad_clip=grad_clip, b2=b2, weight_decay=weight_decay)))

  @functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(1, 3))
  def step(graphdef, params, rest, opt_state, batch, lr, consts, key):
    del key  # deterministic loss
    grads, metrics = jax.grad(_loss, has_aux=True)(params, graphdef, rest, batch, consts, spec)
    updates, opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates)
    metrics["grad_norm"] = optax.global_norm(grads)
    return optax.apply_updates(params, updates), opt_state, metrics

  return tx, step


def _consts(target, ids: np.ndarray) -> dict:
  """The target's LM head over the loss ids ``label_w`` [E, V'], the ids, and each target id's
  place among them (``local``, -1 outside)."""
  w = target.embed[...].T if target.lm_head is None else target.lm_head[...]
  ids = jnp.asarray(ids, jnp.int32)
  local = jnp.full((target.config.vocab_size,), -1, jnp.int32).at[ids].set(
      jnp.arange(ids.shape[0], dtype=jnp.int32))
  return {"label_w": jnp.take(w, ids, axis=1).astype(jnp.float32), "ids": ids, "local": local,
          # Hydra's path embeddings: the target's input embeddings (Gemma: times sqrt(hidden))
          "embed": jnp.asarray(target.embed_tokens(jnp.arange(target.config.vocab_size)),
                               jnp.float32)}


def head_agreement(heads, graph, data: dict, consts: dict, spec: Spec) -> list[float]:
  """Held-out top-1 agreement of each head with the row's token ``k + 2`` ahead (answer tokens)."""
  graphdef, params, rest = graph
  metrics = jax.jit(_loss, static_argnums=(1, 5))(params, graphdef, rest,
                                                  {k: jnp.asarray(v) for k, v in data.items()},
                                                  consts, spec)[1]
  return [float(a) for a in np.asarray(metrics["acc"])]


def medusa_acceptance(target, heads, prompts, gamma: int | None = None,
                      max_new_tokens: int = 64, eos_token_id=None) -> dict:
  """Greedy ``sj.Medusa(heads, gamma)`` / ``sj.Hydra`` (default: every head) on ``prompts``
  (one batch): the
  acceptance per draft position (the chance that the first i + 1 drafts all pass), the
  acceptance rate and tokens per target call."""
  from specjax.decoding.head_methods import Hydra, Medusa

  method = (Hydra if isinstance(heads, HydraHead) else Medusa)(heads, gamma=gamma)
  return method_acceptance(target, method, prompts, max_new_tokens, eos_token_id)


def train_medusa(target, heads, tokens: np.ndarray, mask: np.ndarray | None = None, *,
                 eval_rows: int = 0, eval_prompts=None, eval_new_tokens: int = 64,
                 eos_token_id=None, weights=None, feature_dtype: str | None = None,
                 checkpoint_dir: str | os.PathLike | None = None,
                 cache_dir: str | os.PathLike | None = None, name: str = "medusa", **hparams):
  """Trains Medusa ``heads`` on the rows ``tokens`` int[N, L] with answer ``mask`` (None: every
  token) for ``target``; returns (trained heads, report). The last ``eval_rows`` rows are held
  out (``agreement``: each head's top-1 agreement there); ``eval_prompts``: greedy acceptance
  (``medusa_acceptance``). ``weights``: the training rows' sampling weights. ``hparams``:
  ``medusa_defaults`` fields. Features: the target's normed states, one batched pass, cached
  under ``cache_dir`` (``extract_features``)."""
  cfg = medusa_defaults(**hparams)
  tokens = np.asarray(tokens, np.int32)
  mask = np.ones(tokens.shape, bool) if mask is None else np.asarray(mask, bool)
  k = heads.num_heads
  if int(cfg.steps) < 1:
    raise ValueError(f"steps must be >= 1, got {cfg.steps}")
  if cfg.labels not in LABELS:
    raise ValueError(f"labels must be one of {LABELS}, got {cfg.labels!r}")
  if tokens.ndim != 2 or mask.shape != tokens.shape:
    raise ValueError(f"tokens must be [rows, length] with a mask of the same shape, got "
                     f"{tokens.shape} and {mask.shape}")
  if tokens.shape[1] < k + 3:
    raise ValueError(f"rows of {tokens.shape[1]} tokens are too short for {k} heads: need "
                     f">= {k + 3}")
  if not 0 <= eval_rows < len(tokens):
    raise ValueError(f"eval_rows {eval_rows} must leave training rows of the {len(tokens)}")
  n_train = len(tokens) - eval_rows
  p = row_weights(weights, n_train)
  vocab = target.config.vocab_size
  ids = (draft_vocabulary(tokens[:n_train], mask[:n_train], int(cfg.loss_vocab), vocab)
         if int(cfg.loss_vocab) else np.arange(vocab))
  report = {"kind": "hydra" if isinstance(heads, HydraHead) else "medusa", "heads": k,
            "rows": int(len(tokens)), "seq_len": int(tokens.shape[1]),
            "loss_tokens": int(mask[:n_train].sum()), "seconds": {}}
  t0 = time.time()
  feats = extract_features(target, tokens, (NORMED,), dtype=feature_dtype, cache_dir=cache_dir)
  report["seconds"]["features"] = time.time() - t0
  data = {"tokens": tokens, "mask": mask, "features": feats}
  spec = Spec(float(cfg.decay), cfg.labels == "hard", cfg.compute_dtype or None)
  tx, step_fn = _cached_step(float(cfg.grad_clip), float(cfg.b2), float(cfg.weight_decay), spec)
  consts = _consts(target, ids)
  size = sum(x.size for x in jax.tree.leaves(split(heads, cfg.frozen)[1]))
  log(f"{name}: {k} heads, {size / 1e6:.2f}M params, {report['loss_tokens']:,} loss tokens in {n_train} rows of {tokens.shape[1]}, "
      f"{cfg.steps} steps of {cfg.batch_size} rows")
  heads, run = train_head_steps(
      name, heads, step_fn, tx, data, consts, cfg, n_train, p, checkpoint_dir,
      postfix=lambda e: f"loss {e['loss']:.3f} acc " + " ".join(f"{a:.2f}" for a in e["acc"]))
  report["seconds"]["train"] = run.pop("seconds")
  report.update(run, config=cfg.to_dict())
  t1 = time.time()
  if eval_rows and not run["stopped_early"]:
    held = {key: v[n_train:] for key, v in data.items()}
    report["agreement"] = head_agreement(heads, split(heads, cfg.frozen), held, consts, spec)
    log(f"{name}: held-out top-1 agreement per head "
        + " ".join(f"{a:.3f}" for a in report["agreement"]))
  if eval_prompts and not run["stopped_early"]:
    report["acceptance"] = medusa_acceptance(target, heads, eval_prompts,
                                             max_new_tokens=eval_new_tokens,
                                             eos_token_id=eos_token_id)
    log(f"{name}: greedy acceptance per position: " + describe_acceptance(report["acceptance"]))
  report["seconds"]["eval"] = time.time() - t1
  log_times(name, report["seconds"])
  return heads, report


__all__ = ["head_agreement", "init_hydra_heads", "init_medusa_heads", "medusa_acceptance",
           "medusa_defaults", "train_medusa"]
