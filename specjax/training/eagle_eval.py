"""How well an EAGLE head will draft: its top-1 agreement with the target per training-time-test
step on held-out rows (the repository's per-position ``acc``), and its greedy acceptance per draft
position through ``sj.generate`` (``sj.Eagle``), which is what decoding gets."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.heads.eagle3 import Eagle3Head
from specjax.training.eagle_forward import (Spec, head_logits, predicted, step_head,
                                            step_inputs, step_mask, ttt_forward)


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _agreement(graphdef, params, rest, batch, consts, spec: Spec, steps: int):
  """int32[steps] positions where the head's greedy draft at TTT step k equals the target's
  argmax, and int32[steps] positions counted (the predicted token is an answer token)."""
  head = nnx.merge(graphdef, params, rest)
  spec = dataclasses.replace(spec, steps=steps, noise=0.0)
  tokens, hidden, _ = step_inputs(head, batch, spec, None)
  t = hidden.shape[1]
  outs = ttt_forward(head, consts["embed"], tokens, hidden, steps, spec.compute_dtype)
  hits, counts = [], []
  for k, out in enumerate(outs):
    mask = step_mask(batch, {}, spec, k, t)  # every answer position counts
    draft = jnp.argmax(head_logits(step_head(head, k), consts["label_w"], out,
                                   spec.compute_dtype), -1)
    if isinstance(head, Eagle3Head):
      draft = head.draft_ids[...][draft]
    hits.append(jnp.sum((draft == predicted(batch, steps, k, t)) * mask))
    counts.append(jnp.sum(mask))
  return jnp.stack(hits).astype(jnp.int32), jnp.stack(counts).astype(jnp.int32)


def ttt_agreement(head, graph, data: dict, consts: dict, spec: Spec, steps: int,
                  batch_size: int = 8) -> list[float]:
  """Per TTT step k: the fraction of held-out positions where the head's greedy draft, ``k``
  steps into a chain on its own features (the true tokens fed), is the target's argmax."""
  graphdef, params, rest = graph
  n = len(data["tokens"])
  hits, counts = np.zeros(steps), np.zeros(steps)
  for i in range(0, n, batch_size):
    batch = {k: jnp.asarray(v[i:i + batch_size]) for k, v in data.items()}
    h, c = _agreement(graphdef, params, rest, batch, consts, spec, steps)
    hits += np.asarray(h)
    counts += np.asarray(c)
  return [float(h / c) if c else float("nan") for h, c in zip(hits, counts)]


def eagle_acceptance(target, head, prompts, gamma: int = 4, max_new_tokens: int = 64,
                     eos_token_id=None) -> dict:
  """Greedy ``sj.Eagle(head, gamma)`` (an ``MTPStack``: ``sj.MTP(head, min(gamma, D))``) on
  ``prompts`` (one batch): ``per_position``, draft
  position i's acceptance (``stats.accepted_per_position / proposed_per_position``: the chance
  that the first i + 1 drafts all pass), ``conditional`` (position i's given position i - 1's:
  the EAGLE papers' n-alpha), the overall acceptance rate and tokens per target call. An EAGLE-3
  head also gets ``vocab_coverage``: the share of the emitted tokens (the target's own greedy
  text) inside its draft vocabulary, the ceiling of any position's acceptance."""
  from specjax.decoding.head_methods import MTP, Eagle
  from specjax.heads.mtp import MTPStack

  if isinstance(head, MTPStack):  # a stack drafts at most one token per module
    method = MTP(head, gamma=min(gamma, head.num_modules))
  else:
    method = Eagle(head, gamma=gamma)
  ids = np.asarray(head.draft_ids[...]) if isinstance(head, Eagle3Head) else None
  return method_acceptance(target, method, prompts, max_new_tokens, eos_token_id, ids)


def describe_acceptance(acceptance: dict) -> str:
  """``eagle_acceptance``'s report as a log line: acceptance per draft position, and the draft
  vocabulary's coverage when the report has it."""
  line = " ".join(f"{a:.3f}" for a in acceptance["per_position"])
  if "vocab_coverage" in acceptance:
    line += f" (draft vocabulary holds {acceptance['vocab_coverage']:.3f} of the target's tokens)"
  return line


def method_acceptance(target, method, prompts, max_new_tokens: int = 64,
                      eos_token_id=None, vocab_ids=None) -> dict:
  """Greedy ``method`` (a chain of ``method.gamma``) on ``prompts`` in one batch: the figures
  ``eagle_acceptance`` describes; with ``vocab_ids`` (a draft vocabulary), ``vocab_coverage``."""
  from specjax.decoding.generate import generate

  out = generate(target, [list(p) for p in prompts], method, max_new_tokens=max_new_tokens,
                 eos_token_id=eos_token_id)
  s = out.stats
  per = [float(a) for a in s.acceptance_by_position]
  cond = [a / b if b > 0 else float("nan") for a, b in zip(per, [1.0] + per[:-1])]
  report = {"gamma": int(method.gamma), "per_position": per, "conditional": cond,
            "acceptance_rate": float(s.acceptance_rate),
            "tokens_per_call": float(s.tokens_per_target_call)}
  if vocab_ids is not None:
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    emitted = np.concatenate([tokens[b, :lengths[b]] for b in range(len(lengths))])
    report["vocab_coverage"] = float(np.isin(emitted, vocab_ids).mean()) if emitted.size else (
        float("nan"))
  return report
