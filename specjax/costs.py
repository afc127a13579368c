"""Measured pass costs: what one decoding step, one verification pass over T tokens and one bare
speculative iteration cost on the running device, batch and context, and the cost model built on
them.

Leviathan et al. 2023 (arXiv 2211.17192) model an iteration as gamma draft steps of cost c plus
one target pass of cost 1 (Thm 3.8). On real hardware a pass over T tokens costs v(T) target steps
(v > 1 on a CPU, ~1 on an accelerator at small batch) and the two models share caches and
threads, so the runner times them: ``measure_step_costs`` runs many steps inside one jitted
``fori_loop`` (as the decoding loop does: dispatch is spread over the steps) and alternates the
jobs so that machine noise hits all alike. ``modelled_speedup`` is Eq. 1 over those measured
costs. The adaptive-speculation work builds its cost table on this module.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from specjax import metrics
from specjax.models.kv_cache import init_cache
from specjax.proposers import draft_chain
from specjax.proposers import eagle as eagle_lib
from specjax.sampling import Sampling


def _steps_fn():
  @functools.partial(jax.jit, static_argnums=(0, 4), donate_argnums=3)
  def steps(graphdef, state, tokens, cache, k):
    """``k`` forward steps in one ``fori_loop``, each writing at the same cache slots and feeding
    its argmax to the next (a data dependence, as in decoding): per-step cost without dispatch."""
    model = nnx.merge(graphdef, state)
    lengths = cache.lengths

    def body(_, carry):
      tokens, cache = carry
      logits, cache = model(tokens, cache.with_lengths(lengths))
      nxt = jnp.argmax(logits[:, -1], axis=-1).astype(tokens.dtype)
      return jnp.broadcast_to(nxt[:, None], tokens.shape), cache

    tokens, cache = jax.lax.fori_loop(0, k, body, (tokens, cache))
    return tokens, cache

  return steps


def _bare_iterations_fn():
  @functools.partial(jax.jit, static_argnums=(0, 2, 6, 7), donate_argnums=(4, 5))
  def iterations(target_graphdef, target_state, draft_graphdef, draft_state, target_cache,
                 draft_cache, gamma, k):
    """``k`` bare speculative iterations in one ``fori_loop``: the draft proposes ``gamma`` greedy
    tokens (``draft_chain.propose``, the decoding loop's own proposer), then the target runs one
    ``gamma + 1``-token pass, whose last argmax feeds the next iteration; no verification,
    rollback or bookkeeping, and both caches write at the same slots every time. The two models'
    work per iteration as the decoding loop runs it, one after the other."""
    target = nnx.merge(target_graphdef, target_state)
    draft = nnx.merge(draft_graphdef, draft_state)
    batch = target_cache.lengths.shape[0]
    keys = jnp.broadcast_to(jax.random.key(0), (batch, gamma))  # greedy: never drawn from
    t_len, d_len = target_cache.lengths, draft_cache.lengths

    def body(_, carry):
      pending, target_cache, draft_cache = carry
      state = draft_chain.DraftChainState(draft_cache.with_lengths(d_len),
                                          behind=jnp.zeros((batch,), bool),
                                          last_draft=jnp.zeros((batch,), jnp.int32))
      drafts, _, state = draft_chain.propose(draft, state, pending, keys,
                                             Sampling(temperature=0.0), gamma)
      tokens = jnp.concatenate([pending[:, None], drafts], axis=1)
      logits, target_cache = target(tokens, target_cache.with_lengths(t_len))
      pending = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
      return pending, target_cache, state.cache

    return jax.lax.fori_loop(0, k, body, (jnp.ones((batch,), jnp.int32), target_cache,
                                          draft_cache))

  return iterations


def _head_steps_fn():
  @functools.partial(jax.jit, static_argnums=(0, 1, 7), donate_argnums=6)
  def head_steps(head_graphdef, target_graphdef, head_state, target_state, tokens, hidden, cache,
                 k):
    """``k`` greedy drafting steps of an EAGLE head in one ``fori_loop`` (one head pass and its
    draft logits each, what a chain's step costs; ``proposers.eagle``), the argmax and the
    predicted feature feeding the next, writing at the same cache slots every time."""
    models = eagle_lib.Models(head_graphdef, target_graphdef, (head_state, target_state))
    lengths = cache.lengths

    def body(_, carry):
      tokens, hidden, cache = carry
      out, cache = models.step(tokens[:, None], hidden[:, None], cache.with_lengths(lengths))
      hidden = out[:, 0]
      return jnp.argmax(models.logits(hidden), axis=-1).astype(tokens.dtype), hidden, cache

    return jax.lax.fori_loop(0, k, body, (tokens, hidden, cache))

  return head_steps


def measure_step_costs(models: dict, batch: int, context: int, cache_length: int,
                       widths=(1,), gammas=(), steps_per_call: int = 16,
                       min_seconds: float = 0.3, max_iters: int = 100,
                       heads: dict | None = None) -> dict:
  """Median seconds of one decoding step of each model (``models``: ``{"target": ...}`` or
  ``{"target": ..., "draft": ...}``; target at every width in ``widths``, draft at width 1) at
  ``batch`` rows, with ``context`` tokens already in a cache of ``cache_length`` slots; and, for
  each ``gammas`` entry, of one bare speculative iteration (``_bare_iterations_fn``: gamma draft
  steps, then a gamma + 1 token target pass).

  Each call runs ``steps_per_call`` steps inside one jitted ``fori_loop``, as the decoding loop
  does, so the per-call dispatch cost (which dwarfs a tiny draft's step when timed one jitted call
  at a time, and so overstated c) is spread over the steps. The calls alternate between the jobs
  so noise hits all alike. A bare iteration can cost more than gamma draft steps plus a
  verification pass timed apart (the default pair on a 2-core CPU at gamma 1: 1.77 target steps
  against c + v = 1.31): run in turn, the two models share caches and threads.

  ``heads``: name -> an EAGLE head drafting for the target; each one's drafting step (a head pass
  and its draft logits, ``_head_steps_fn``) is timed too: ``head_step_ms[name]`` and its ratio
  to a target step, ``head_cost_ratio[name]`` (the c of an EAGLE chain)."""
  steps, iterations, head_steps = _steps_fn(), _bare_iterations_fn(), _head_steps_fn()
  k = int(steps_per_call)
  sj_models = dict(models)

  def cache_for(model):
    return init_cache(model.config, batch, cache_length).with_lengths(
        jnp.full((batch,), context, jnp.int32))

  def step_job(model, w):
    graphdef, state = nnx.split(model)
    carry = {"cache": cache_for(model)}
    tokens = jnp.ones((batch, w), jnp.int32)

    def run():
      out, carry["cache"] = steps(graphdef, state, tokens, carry["cache"], k)
      return out
    return run

  def iteration_job(gamma, target_split, draft_split):
    carry = {"caches": (cache_for(sj_models["target"]), cache_for(sj_models["draft"]))}

    def run():
      out, *carry["caches"] = iterations(*target_split, *draft_split, *carry["caches"],
                                         int(gamma), k)
      return out
    return run

  jobs = {}  # name -> a call running k steps
  for role, model in sj_models.items():
    for w in (widths if role == "target" else (1,)):
      jobs[f"{role}_w{w}"] = step_job(model, w)
  if "draft" in sj_models:
    target_split, draft_split = nnx.split(sj_models["target"]), nnx.split(sj_models["draft"])
    for g in gammas:
      jobs[f"iteration_g{g}"] = iteration_job(g, target_split, draft_split)
  def head_job(head):
    target = sj_models["target"]
    graphs, states = zip(nnx.split(head), nnx.split(target))
    carry = {"cache": cache_for(head)}
    tokens = jnp.ones((batch,), jnp.int32)
    hidden = jnp.zeros((batch, head.config.hidden_size), jnp.dtype(head.config.dtype))

    def run():
      out, _, carry["cache"] = head_steps(*graphs, *states, tokens, hidden, carry["cache"], k)
      return out
    return run

  for name, head in (heads or {}).items():
    jobs[f"head_{name}"] = head_job(head)
  times: dict[str, list[float]] = {name: [] for name in jobs}
  t_compile = time.perf_counter()
  for run in jobs.values():  # compile
    jax.block_until_ready(run())
  compile_s = time.perf_counter() - t_compile
  start = time.perf_counter()
  for it in range(max_iters):
    for name, run in jobs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(run())
      times[name].append((time.perf_counter() - t0) / k)
    if it >= 4 and time.perf_counter() - start > min_seconds * len(jobs):
      break
  medians = {name: statistics.median(v) for name, v in times.items()}
  result = {"batch": batch, "context": context, "steps_per_call": k,
            "iterations": len(times["target_w1"]), "compile_s": compile_s, "seconds": medians,
            "target_step_ms": medians["target_w1"] * 1e3}
  if "draft_w1" in medians:
    result["draft_step_ms"] = medians["draft_w1"] * 1e3
    result["cost_ratio"] = medians["draft_w1"] / medians["target_w1"]
  result["target_verify_ms"] = {str(w - 1): medians[f"target_w{w}"] * 1e3 for w in widths if w > 1}
  result["iteration_ms"] = {str(g): medians[f"iteration_g{g}"] * 1e3 for g in gammas
                            if f"iteration_g{g}" in medians}
  if heads:
    result["head_step_ms"] = {n: medians[f"head_{n}"] * 1e3 for n in heads}
    result["head_cost_ratio"] = {n: medians[f"head_{n}"] / medians["target_w1"] for n in heads}
  return result


def modelled_speedup(alpha: float, gamma: int, iteration_cost: float, busy: float = 1.0) -> float:
  """The runs' cost model: Eq. 1's expected tokens per iteration (Leviathan et al. 2023) over a
  bare iteration's measured cost in target steps (``measure_step_costs``), times the rows kept
  busy (vs the autoregressive baseline's). What it leaves out is the loop's own work:
  verification, rollback, bookkeeping, each call's setup and prefills."""
  return metrics.expected_tokens_per_iteration(alpha, gamma) / iteration_cost * busy
