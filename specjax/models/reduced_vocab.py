"""Drafts whose head covers a subset of the vocabulary (ALGORITHMS.md §13).

A small draft's vocabulary projection dominates its cost at V ~ 50k (SmolLM2: 576 x 49152 = 28M
multiply-adds per token against 3.5M per layer). ``reduce_vocab(model, ids)`` is a view of
``model`` whose head keeps only the K rows ``ids``: one [E, K] matmul, then the K logits are
scattered into a V-wide row of ``-inf``, so the decoding loop and every verifier still see a
V-sized distribution, with q = 0 outside ``ids`` (exact: rules 1-4 hold for any q; a token never
proposed is still emitted through the residual ``norm((p - q)+)``). Everything but the head is
``model``'s own arrays (a view, as ``skip_layers`` is), plus one gathered [E, K] copy of the kept
head rows.

On disk the draft is a plain checkpoint with its full head (what ``transformers`` loads for
assisted generation) and ``VOCAB_FILE`` beside it listing the kept ids;
``sj.load_model(path, head="auto")`` reads both.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.models.config import ModelConfig
from specjax.models.transformer import Transformer, softcap

VOCAB_FILE = "draft_vocab.json"  # {"ids": [...]}: the kept vocabulary ids, ascending


class ReducedVocabTransformer(Transformer):
  """A ``Transformer`` whose logits are ``-inf`` outside the ``num_kept`` ids ``kept_ids``."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, num_kept: int):
    super().__init__(config, rngs)
    self.kept_ids = nnx.Variable(jnp.zeros((num_kept,), jnp.int32))
    self.kept_head = nnx.Param(jnp.zeros((config.hidden_size, num_kept), jnp.dtype(config.dtype)))

  def project(self, x: jax.Array) -> jax.Array:
    return scatter_to_vocab(self.project_kept(x), self.kept_ids[...], self.config.vocab_size)

  def project_kept(self, x: jax.Array) -> jax.Array:
    """float32[..., K] logits of the kept ids only (soft-capped as the full head's are)."""
    return softcap(jnp.dot(x, self.kept_head[...], preferred_element_type=jnp.float32),
                   self.config.final_logit_softcapping)

  def greedy_draft(self, x: jax.Array) -> jax.Array:
    """int32[...]: ``greedy(project(x))`` for final-norm features ``x`` without the V-wide row
    (``kept_argmax``). SmolLM2's 8192-id draft on XLA:CPU, a one-token step: 2.17 -> 1.96 ms
    at batch 1, 4.07 -> 3.43 at batch 4; a look's 12-token pass at batch 8: 34.7 -> 19.8 ms."""
    return kept_argmax(self.project_kept(x), self.kept_ids[...])


def kept_argmax(logits: jax.Array, ids: jax.Array) -> jax.Array:
  """int32[...]: the vocabulary id ``ids[argmax(logits)]`` of the largest of ``logits`` [..., K]
  over the ascending ids ``ids`` int32[K]: the argmax of ``scatter_to_vocab(logits, ids, V)``,
  ties to the lowest id as there, without building that row."""
  return jnp.take(ids, jnp.argmax(logits, axis=-1).astype(jnp.int32))


def scatter_to_vocab(logits: jax.Array, ids: jax.Array, vocab_size: int) -> jax.Array:
  """float32[..., V]: ``logits`` [..., K] of the ascending vocabulary ids ``ids`` int32[K] at
  those ids, ``-inf`` elsewhere (a reduced head's law is exactly 0 outside its ids).

  The logits pass an optimization barrier first: XLA:CPU otherwise fuses the head's matmul into
  the scatter and whatever reads the row (an argmax, a softmax), and that fused kernel is slow
  from two rows on: SmolLM2's 4096-id EAGLE-3 head, matmul + scatter + argmax, 5.5 ms at batch 4
  against 0.8 ms with the barrier (0.35 ms at batch 1 either way)."""
  logits = jax.lax.optimization_barrier(logits)
  full = jnp.full(logits.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
  return full.at[..., ids].set(logits, unique_indices=True, indices_are_sorted=True)


def check_vocab_ids(ids, vocab_size: int) -> np.ndarray:
  """``ids`` as sorted int32[K]; raises unless they are distinct ids in ``[0, vocab_size)``."""
  arr = np.asarray(ids)
  if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"vocabulary ids must be a non-empty list of integers, got shape {arr.shape}")
  arr = np.sort(arr.astype(np.int64))
  if arr[0] < 0 or arr[-1] >= vocab_size:
    raise ValueError(f"vocabulary id {int(arr[0] if arr[0] < 0 else arr[-1])} is outside "
                     f"[0, {vocab_size})")
  if np.any(arr[1:] == arr[:-1]):
    raise ValueError(f"vocabulary id {int(arr[1:][arr[1:] == arr[:-1]][0])} is listed twice")
  return arr.astype(np.int32)


def reduce_vocab(model: Transformer, ids) -> ReducedVocabTransformer:
  """A view of ``model`` predicting only the vocabulary ids ``ids`` (q = 0 elsewhere).

  Its logits equal ``model``'s on ``ids`` and are ``-inf`` elsewhere; ``config.vocab_size``
  stays V, so it drafts for any target of ``model``'s vocabulary.
  """
  if isinstance(model, ReducedVocabTransformer):
    raise ValueError("the model already has a reduced vocabulary")
  ids = check_vocab_ids(ids, model.config.vocab_size)
  view = nnx.eval_shape(lambda: ReducedVocabTransformer(model.config, nnx.Rngs(0), len(ids)))
  nnx.update(view, nnx.state(model))
  head = model.embed[...] if model.lm_head is None else model.lm_head[...].T  # [V, E]
  view.kept_ids.set_value(jnp.asarray(ids))
  view.kept_head.set_value(jnp.take(head, jnp.asarray(ids), axis=0).T)
  return view


def save_vocab_ids(path: str | os.PathLike, ids) -> None:
  """Writes ``VOCAB_FILE`` (the kept ids) into the checkpoint directory ``path``."""
  ids = np.asarray(ids, np.int64)
  with open(os.path.join(path, VOCAB_FILE), "w") as f:
    json.dump({"ids": sorted(int(i) for i in ids)}, f)
    f.write("\n")


def load_vocab_ids(path: str | os.PathLike) -> np.ndarray | None:
  """The kept ids saved in the checkpoint directory ``path``, or None if it has none."""
  file = os.path.join(path, VOCAB_FILE)
  if not os.path.isfile(file):
    return None
  with open(file) as f:
    data = json.load(f)
  if not isinstance(data, dict) or not isinstance(data.get("ids"), list):
    raise ValueError(f"{file}: expected an object with an 'ids' list")
  return np.asarray(data["ids"], np.int64)
