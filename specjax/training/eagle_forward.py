"""The EAGLE heads' training forward: the head over all ``T`` positions of a sequence at once,
with no KV cache, for one step (EAGLE-1) or several steps of training-time test (EAGLE-3).

**Training-time test** (Li et al. 2025, "EAGLE-3", arXiv 2503.01840, §3.2; the EAGLE repository's
``eagle/traineagle3/cnets.py``). Step 0 is the head's ordinary pass: position ``t`` reads
``(token t + 1, the target's feature at t)`` and predicts the feature at ``t + 1``. Step ``k``
re-runs the head with position ``t`` reading ``(token t + k + 1, its own step-(k - 1) output at
t)``: what drafting feeds it ``k`` drafts into a chain that started after position ``t``. Its
attention sees what drafting's KV cache would hold at that point: the step-0 keys/values of
positions ``<= t`` (the committed pairs, built from the target's features) and, at position ``t``
only, the keys/values of steps ``1..k`` (the chain's own entries, itself included). As in the
repository (``apply_rotary_pos_emb(..., position_ids + lck)`` with ``lck`` the earlier steps),
step ``k``'s queries and keys sit at position ``t + k``: exactly the positions drafting gives the
chain's entries, so a TTT step equals the inference path run autoregressively on its own
predictions (``tests/test_train_eagle.py`` checks both, to 1e-5).

The heads (``EagleHead``'s ``fc`` + decoder layers, ``MTPHead``'s the same over its normed
inputs (``fc_input``), ``Eagle3Head``'s midlayer over ``[norm(embedding) ; norm(hidden)]``) run
here with their own parameters and norms; only the attention is written out (``_attend``), the
matmuls in ``compute_dtype`` with float32 accumulation (``forward.mm``: bfloat16 operands use the
CPU's fast kernels, and the gradient keeps that form). ``Spec``, ``step_inputs``, ``step_mask``
and ``predicted`` lay a batch of rows out for the steps (the loss in ``eagle``, the agreement in
``eagle_eval``): row token ``t + k + 2`` is what step ``k`` predicts at position ``t``, with the
target's normed feature at ``t + k + 1`` as its soft label.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.heads.eagle3 import Eagle3Head
from specjax.heads.mtp import MTPHead, MTPStack
from specjax.models.transformer import _rotate
from specjax.training.forward import _dense, mm

_MASKED = -1e30


def _rope(inv_freq: jax.Array, t: int, offset: int):
  """(cos, sin) [1, T, 1, D] float32 at positions ``offset + arange(T)``."""
  freqs = (jnp.arange(t, dtype=jnp.float32) + offset)[:, None] * inv_freq[None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[None, :, None, :]
  return jnp.cos(emb), jnp.sin(emb)


def _attend(attn, x, rope, past, compute_dtype):
  """One attention of a head layer over ``T`` positions at TTT step ``k = len(past)``.

  x: [B, T, d_in] float32; rope: (cos, sin) at positions ``t + k``; past: the (keys, values)
  [B, T, KVH, D] of steps ``0..k - 1`` (step 0's roped at ``t``, step ``j``'s at ``t + j``).
  Returns (out [B, T, E] float32, this step's (keys, values)). Query ``t`` sees step 0's keys at
  positions ``<= t`` and every later step's key at ``t`` (the diagonal), itself included.
  """
  b, t, _ = x.shape
  kvh, d = attn.num_kv_heads, attn.head_dim
  q = _dense(attn.q, x, compute_dtype).reshape(b, t, kvh, attn.num_heads // kvh, d)
  k = _dense(attn.k, x, compute_dtype).reshape(b, t, kvh, d)
  v = _dense(attn.v, x, compute_dtype).reshape(b, t, kvh, d)
  cos, sin = rope
  q, k = attn.normalize_qk(q, k)
  q, k = _rotate(q, cos[..., None, :], sin[..., None, :]), _rotate(k, cos, sin)
  od = jnp.dtype(compute_dtype or attn.q.kernel.dtype)
  k0, v0 = past[0] if past else (k, v)
  scores = jnp.einsum("btkgd,bskd->bkgts", q.astype(od), k0.astype(od),
                      preferred_element_type=jnp.float32)
  causal = jnp.tril(jnp.ones((t, t), bool))
  scores = jnp.where(causal, scores, _MASKED)
  diag = list(past[1:]) + [(k, v)] if past else []
  if diag:
    dk = jnp.stack([kk for kk, _ in diag], axis=2).astype(od)  # [B, T, J, KVH, D]
    dv = jnp.stack([vv for _, vv in diag], axis=2).astype(od)
    scores = jnp.concatenate(
        [scores, jnp.einsum("btkgd,btjkd->bkgtj", q.astype(od), dk,
                            preferred_element_type=jnp.float32)], axis=-1)
  probs = jax.nn.softmax(scores * (d ** -0.5), axis=-1)
  out = jnp.einsum("bkgts,bskd->btkgd", probs[..., :t].astype(od), v0.astype(od),
                   preferred_element_type=jnp.float32)
  if diag:
    out = out + jnp.einsum("bkgtj,btjkd->btkgd", probs[..., t:].astype(od), dv,
                           preferred_element_type=jnp.float32)
  return _dense(attn.o, out.reshape(b, t, -1), compute_dtype), (k, v)


def _mlp(layer, x, compute_dtype):
  h = layer.mlp_norm(x)
  mlp = layer.mlp
  return _dense(mlp.down, mlp.act(_dense(mlp.gate, h, compute_dtype))
                * _dense(mlp.up, h, compute_dtype), compute_dtype)


def head_step(head, embeds: jax.Array, hidden: jax.Array, past: list, step: int,
              compute_dtype=None) -> tuple[jax.Array, list]:
  """One TTT step of ``head`` (``EagleHead``, ``MTPHead`` or ``Eagle3Head``) over ``T``
  positions: predicted features [B, T, E] float32 of the pairs (``embeds`` [B, T, E], the head's
  input ``hidden`` [B, T, E]: ``from_target``'s output at step 0, the previous step's output
  later), and each layer's (keys, values). ``past``: per head layer, the earlier steps' (keys,
  values)."""
  embeds, hidden = embeds.astype(jnp.float32), hidden.astype(jnp.float32)
  rope = _rope(head.inv_freq[...], embeds.shape[1], step)
  if isinstance(head, Eagle3Head):
    layer = head.midlayer
    x = jnp.concatenate([layer.input_norm(embeds), layer.hidden_norm(hidden)], axis=-1)
    h, kv = _attend(layer.attn, x, rope, past[0], compute_dtype)
    x = hidden + h
    return x + _mlp(layer, x, compute_dtype), [kv]
  x = _dense(head.fc, head.fc_input(embeds, hidden), compute_dtype)
  kvs = []
  for layer, layer_past in zip(head.layers, past):
    normed = x if layer.attn_norm is None else layer.attn_norm(x)
    h, kv = _attend(layer.attn, normed, rope, layer_past, compute_dtype)
    x = x + h
    x = x + _mlp(layer, x, compute_dtype)
    kvs.append(kv)
  return x, kvs


def head_input(head, features: jax.Array, compute_dtype=None) -> jax.Array:
  """[..., E] float32: the head's input from the target's [..., F, E] features (its
  ``from_target``, ``fc`` through ``mm`` for EAGLE-3)."""
  if isinstance(head, Eagle3Head):
    flat = features.reshape(features.shape[:-2] + (-1,)).astype(jnp.float32)
    return mm(flat, head.fc.kernel[...], compute_dtype)
  return features[..., 0, :].astype(jnp.float32)


def ttt_forward(head, embed: jax.Array, tokens: jax.Array, hidden: jax.Array, steps: int,
                compute_dtype=None) -> list[jax.Array]:
  """The head's predicted features [B, T, E] at TTT steps ``0..steps - 1``.

  embed: the target's embedding [V, E]; tokens: int32[B, T + steps], the row's tokens from
  position 1 on (step ``k`` reads ``tokens[:, k : k + T]``, i.e. token ``t + k + 1`` at position
  ``t``); hidden: [B, T, E] the head's input from the target's features at positions ``0..T-1``
  (``head_input``). Step ``k``'s output at ``t`` is the head's guess of the target's feature at
  ``t + k + 1``, whose logits predict token ``t + k + 2``.
  """
  t = hidden.shape[1]
  if tokens.shape[1] < t + steps - 1:
    raise ValueError(f"tokens of width {tokens.shape[1]} cannot feed {steps} TTT steps over "
                     f"{t} positions (need {t + steps - 1})")
  if isinstance(head, MTPStack):
    return stack_forward(head, embed, tokens, hidden, steps, compute_dtype)
  past = [[] for _ in range(_num_layers(head))]
  outs = []
  for k in range(steps):
    embeds = jnp.take(embed, tokens[:, k:k + t], axis=0)
    hidden, kvs = head_step(head, embeds, hidden, past, k, compute_dtype)
    for layer_past, kv in zip(past, kvs):
      layer_past.append(kv)
    outs.append(hidden)
  return outs


def stack_forward(stack, embed: jax.Array, tokens: jax.Array, hidden: jax.Array, steps: int,
                  compute_dtype=None) -> list[jax.Array]:
  """DeepSeek-V3's MTP modules 1..``steps`` of ``stack`` (an ``MTPStack``; arXiv 2412.19437
  §2.2), ``ttt_forward``'s arguments and outputs: module ``k + 1`` at position ``t`` reads token
  ``t + k + 1`` (teacher forced) and module ``k``'s output at ``t`` (the target's feature for the
  first), each a plain causal pass over its own positions at their own RoPE positions (its own
  KV cache when drafting, ``specjax.proposers.mtp``)."""
  t = hidden.shape[1]
  outs = []
  for k, module in enumerate(stack.modules[:steps]):
    embeds = jnp.take(embed, tokens[:, k:k + t], axis=0)
    hidden, _ = head_step(module, embeds, hidden, [[] for _ in module.layers], 0, compute_dtype)
    outs.append(hidden)
  return outs


def step_head(head, k: int):
  """The head whose output is step ``k``'s: a stack's module ``k + 1``, else the head itself."""
  return head.modules[k] if isinstance(head, MTPStack) else head


def _num_layers(head) -> int:
  return 1 if isinstance(head, Eagle3Head) else len(head.layers)


@dataclasses.dataclass(frozen=True)
class Spec:
  """What the step's trace depends on (static)."""
  ce_only: bool  # EAGLE-3 and MTP: the soft-label CE alone (EAGLE-1: + feature regression)
  inputs: tuple  # indices of the head's features among the stored ones
  normed: int  # index of NORMED among them
  steps: int
  decay: float
  p_weight: float
  v_weight: float
  noise: float
  compute_dtype: str | None


def step_inputs(head, batch, spec: Spec, key):
  """(tokens shifted for the TTT steps, the head's step-0 input [B, T, E], the normed features)."""
  feats = batch["features"]
  t = feats.shape[1] - 1
  hidden = head_input(head, feats[:, :t][:, :, spec.inputs], spec.compute_dtype)
  if spec.noise:
    hidden = hidden + spec.noise * (jax.random.uniform(key, hidden.shape) - 0.5)
  tokens = jnp.pad(batch["tokens"][:, 1:], ((0, 0), (0, spec.steps)))
  return tokens, hidden, feats[:, :, spec.normed].astype(jnp.float32)


def predicted(batch, steps: int, k: int, t: int) -> jax.Array:
  """int32[B, T]: the token step ``k`` predicts at each position (``t + k + 2``; 0 past the row):
  in the target's own greedy answers, the target's argmax there."""
  return jnp.pad(batch["tokens"], ((0, 0), (0, steps + 2)))[:, k + 2:k + 2 + t]


def step_mask(batch, consts, spec: Spec, k: int, t: int) -> jax.Array:
  """float[B, T]: step ``k``'s positions in the loss: the token predicted (``t + k + 2``) is an
  answer token and, with a reduced loss vocabulary (EAGLE-3's draft vocabulary), in it."""
  answer = jnp.pad(batch["mask"], ((0, 0), (0, spec.steps + 2)))[:, k + 2:k + 2 + t]
  if "in_vocab" in consts:
    answer = answer & consts["in_vocab"][predicted(batch, spec.steps, k, t)]
  return answer.astype(jnp.float32)


def head_logits(head, target_head: jax.Array | None, hidden: jax.Array,
                compute_dtype=None) -> jax.Array:
  """float32[..., V'] training logits of predicted features: EAGLE-3 over its draft vocabulary
  (its ``norm`` and ``lm_head``), MTP through its ``norm`` (``shared_head.norm``) and its own
  output matrix or ``target_head``, EAGLE-1/2 through ``target_head`` [E, V'] (the target's
  frozen LM head, or some of its columns)."""
  if isinstance(head, Eagle3Head):
    return mm(head.norm(hidden), head.lm_head[...], compute_dtype)
  if isinstance(head, MTPHead):
    return mm(head.norm(hidden), head.output_matrix(target_head), compute_dtype)
  return mm(hidden, target_head, compute_dtype)


def soft_cross_entropy(label_logits: jax.Array, logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Masked mean over positions of CE(softmax(label_logits), softmax(logits)) in nats: the
  EAGLE losses' ``-sum(p * log q)`` against the target's soft labels (its full law, not its
  argmax). ``mask``: float [...] weights of the positions."""
  p = jax.nn.softmax(label_logits.astype(jnp.float32), axis=-1)
  logq = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  ce = -jnp.sum(p * logq, axis=-1)
  return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def smooth_l1(pred: jax.Array, target: jax.Array, mask: jax.Array) -> jax.Array:
  """Masked mean over positions of the mean over features of smooth-L1 (Huber, beta 1): EAGLE-1's
  feature regression loss (``nn.SmoothL1Loss``)."""
  diff = jnp.abs(pred.astype(jnp.float32) - target.astype(jnp.float32))
  per = jnp.mean(jnp.where(diff < 1.0, 0.5 * diff * diff, diff - 0.5), axis=-1)
  return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)
