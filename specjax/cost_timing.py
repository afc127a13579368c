"""Timing the passes on the running device: the jitted jobs behind ``specjax.costs.measure``'s
``CostTable`` (a decoding step at each width, a draft step, bare speculative iterations, the
trained heads' drafting steps), run side by side; their medians are what the table is built of.

Each job runs many steps inside one jitted ``fori_loop``, as the decoding loop does, so that the
per-call dispatch is spread over the steps; the jobs alternate so that machine noise hits all
alike. Target and draft steps and the bare iterations run at the run's ``Sampling``: at T > 0 a
step computes the law over every position of its pass and draws (what a sampled decoding or
verification pass adds to the matrix products), an iteration draws its drafts with their laws
and applies rejection sampling, so a table measured at T > 0 prices sampled iterations, which
cost more than greedy ones.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from specjax import sampling as sampling_lib
from specjax import verify
from specjax.heads.hydra import HydraHead
from specjax.heads.medusa import MedusaHead
from specjax.heads.mtp import MTPStack
from specjax.models.kv_cache import init_cache
from specjax.proposers import draft_chain
from specjax.proposers import eagle as eagle_lib
from specjax.sampling import Sampling


def _next_token(key: jax.Array, logits: jax.Array, sampling: Sampling) -> jax.Array:
  """int32[B]: the next token a pass's ``logits`` (float[B, T, V]) give at ``sampling``: the
  argmax of the last position, or (T > 0) a draw from its law, the law computed at every
  position as a verification pass needs it (``sampling.probabilities``)."""
  if sampling.is_greedy:
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
  p = sampling_lib.probabilities(logits, sampling)
  keys = jax.random.split(key, logits.shape[0])
  return jax.vmap(sampling_lib.sample_from_probs)(keys, p[:, -1])


def _steps_fn():
  @functools.partial(jax.jit, static_argnums=(0, 4, 5, 6), donate_argnums=3)
  def steps(graphdef, state, tokens, cache, k, sampling, project_last=False):
    """``k`` forward steps in one ``fori_loop``, each writing at the same cache slots and feeding
    its next token (``_next_token``: the argmax, or a draw at T > 0) to the next (a data
    dependence, as in decoding): per-step cost without dispatch. ``project_last``: only the
    last token's logits (a draft tree's pass), else every token's (a verification pass)."""
    model = nnx.merge(graphdef, state)
    lengths = cache.lengths
    logits_at = tokens.shape[1] - 1 if project_last else None

    def body(i, carry):
      tokens, cache = carry
      logits, cache = model(tokens, cache.with_lengths(lengths), logits_at=logits_at)
      nxt = _next_token(jax.random.fold_in(jax.random.key(0), i), logits, sampling)
      return jnp.broadcast_to(nxt[:, None].astype(tokens.dtype), tokens.shape), cache

    tokens, cache = jax.lax.fori_loop(0, k, body, (tokens, cache))
    return tokens, cache

  return steps


def _bare_iterations_fn():
  @functools.partial(jax.jit, static_argnums=(0, 2, 6, 7, 8), donate_argnums=(4, 5))
  def iterations(target_graphdef, target_state, draft_graphdef, draft_state, target_cache,
                 draft_cache, gamma, k, sampling):
    """``k`` bare speculative iterations in one ``fori_loop``: the draft proposes ``gamma`` tokens
    (``draft_chain.propose``, the decoding loop's own proposer: greedy, or drawn with their laws
    at T > 0), the target runs one ``gamma + 1``-token pass, and the exact rule (the greedy match,
    or rejection sampling: ``specjax.verify``) gives the token that feeds the next iteration; no
    rollback or bookkeeping, and both caches write at the same slots every time. The two models'
    work per iteration as the decoding loop runs it, one after the other."""
    target = nnx.merge(target_graphdef, target_state)
    draft = nnx.merge(draft_graphdef, draft_state)
    batch = target_cache.lengths.shape[0]
    t_len, d_len = target_cache.lengths, draft_cache.lengths

    def body(i, carry):
      pending, target_cache, draft_cache = carry
      keys = jax.random.split(jax.random.fold_in(jax.random.key(0), i), batch * (gamma + 1))
      keys = keys.reshape(batch, gamma + 1)
      state = draft_chain.DraftChainState(draft_cache.with_lengths(d_len),
                                          behind=jnp.zeros((batch,), bool),
                                          last_draft=jnp.zeros((batch,), jnp.int32))
      drafts, q, state = draft_chain.propose(draft, state, pending, keys[:, 1:], sampling, gamma)
      tokens = jnp.concatenate([pending[:, None], drafts], axis=1)
      logits, target_cache = target(tokens, target_cache.with_lengths(t_len))
      if sampling.is_greedy:
        verdict = jax.vmap(verify.greedy_chain)(sampling_lib.greedy(logits), drafts)
      else:
        p = sampling_lib.probabilities(logits, sampling)
        verdict = jax.vmap(verify.rejection_chain)(keys[:, 0], p, q, drafts)
      return verdict.next_token, target_cache, state.cache

    return jax.lax.fori_loop(0, k, body, (jnp.ones((batch,), jnp.int32), target_cache,
                                          draft_cache))

  return iterations


def _head_steps_fn():
  @functools.partial(jax.jit, static_argnums=(0, 1, 7), donate_argnums=6)
  def head_steps(head_graphdef, target_graphdef, head_state, target_state, tokens, hidden, cache,
                 k):
    """``k`` greedy drafting steps of an EAGLE head in one ``fori_loop`` (one head pass and its
    greedy draft each, what a chain's step costs; ``proposers.eagle``), the argmax and the
    predicted feature feeding the next, writing at the same cache slots every time."""
    models = eagle_lib.Models(head_graphdef, target_graphdef, (head_state, target_state))
    lengths = cache.lengths

    def body(_, carry):
      tokens, hidden, cache = carry
      out, cache = models.step(tokens[:, None], hidden[:, None], cache.with_lengths(lengths))
      hidden = out[:, 0]
      return models.draw(None, hidden, Sampling(0.0))[0].astype(tokens.dtype), hidden, cache

    return jax.lax.fori_loop(0, k, body, (tokens, hidden, cache))

  return head_steps


def _medusa_steps_fn():
  @functools.partial(jax.jit, static_argnums=(0, 1, 5))
  def medusa_steps(head_graphdef, target_graphdef, head_state, target_state, hidden, k):
    """``k`` passes of Medusa heads (all K heads' logits of one state each, what an iteration's
    drafting costs; ``proposers.medusa``), each pass's state the embedding of the last one's
    first guess (a dependency, so that nothing is hoisted out of the loop)."""
    heads = nnx.merge(head_graphdef, head_state)
    target = nnx.merge(target_graphdef, target_state)

    def body(_, hidden):
      guess = jnp.argmax(heads.logits(hidden, target)[:, 0], axis=-1)
      return jnp.take(target.embed[...], guess, axis=0).astype(hidden.dtype)

    return jax.lax.fori_loop(0, k, body, hidden)

  return medusa_steps


def _prefix_steps_fn():
  @functools.partial(jax.jit, static_argnums=(0, 3))
  def prefix_steps(head_graphdef, head_state, cache, k, hidden):
    """``k`` passes of Hydra++'s prefix layer over one new state each (what an iteration adds
    to a Hydra head's drafting: its commit runs the layer over the accepted states; one token
    stands for those few), writing at the same cache slots every time."""
    heads = nnx.merge(head_graphdef, head_state)
    lengths = cache.lengths

    def body(_, carry):
      hidden, cache = carry
      out, cache = heads.prefix_pass(hidden[:, None], cache.with_lengths(lengths))
      return out[:, 0], cache

    return jax.lax.fori_loop(0, k, body, (hidden, cache))

  return prefix_steps


def _hydra_steps_fn():
  @functools.partial(jax.jit, static_argnums=(0, 1, 6))
  def hydra_steps(head_graphdef, target_graphdef, head_state, target_state, hidden, tokens, k):
    """``k`` greedy chain steps of Hydra's first head (one head pass and its logits each, what
    a chain's depth costs; deeper heads read a slightly wider input, the same projection)."""
    heads = nnx.merge(head_graphdef, head_state)
    target = nnx.merge(target_graphdef, target_state)

    def body(_, tokens):
      path = target.embed_tokens(tokens)[:, None]
      logits = heads.project(0, heads.state(0, hidden, path))
      return jnp.argmax(logits, axis=-1).astype(tokens.dtype)

    return jax.lax.fori_loop(0, k, body, tokens)

  return hydra_steps


def time_passes(models: dict, batch: int, context: int, cache_length: int, widths: tuple,
                gammas: tuple, heads: dict | None, steps_per_call: int, min_seconds: float,
                max_iters: int, sampling: Sampling, draft_widths: tuple = ()) -> dict:
  """The raw timings behind ``specjax.costs.measure`` (which checks the arguments and documents
  the jobs): medians in seconds per job and the milliseconds and ratios derived from them."""
  steps, iterations, head_steps = _steps_fn(), _bare_iterations_fn(), _head_steps_fn()
  k = int(steps_per_call)
  sj_models = dict(models)

  def cache_for_config(config):
    return init_cache(config, batch, cache_length).with_lengths(
        jnp.full((batch,), context, jnp.int32))
  cache_for = lambda model: cache_for_config(model.config)

  def step_job(model, w, project_last=False):
    graphdef, state = nnx.split(model)
    carry = {"cache": cache_for(model)}
    tokens = jnp.ones((batch, w), jnp.int32)

    def run():
      out, carry["cache"] = steps(graphdef, state, tokens, carry["cache"], k, sampling,
                                  project_last)
      return out
    return run

  def iteration_job(gamma, target_split, draft_split):
    carry = {"caches": (cache_for(sj_models["target"]), cache_for(sj_models["draft"]))}

    def run():
      out, *carry["caches"] = iterations(*target_split, *draft_split, *carry["caches"],
                                         int(gamma), k, sampling)
      return out
    return run

  jobs = {}  # name -> a call running k steps
  for role, model in sj_models.items():
    for w in (widths if role == "target" else (1,)):
      jobs[f"{role}_w{w}"] = step_job(model, w)
  for w in draft_widths:  # a draft tree's passes: one projection each
    jobs[f"draft_w{w}"] = step_job(sj_models["draft"], w, project_last=True)
  if "draft" in sj_models:
    target_split, draft_split = nnx.split(sj_models["target"]), nnx.split(sj_models["draft"])
    for g in gammas:
      jobs[f"iteration_g{g}"] = iteration_job(g, target_split, draft_split)

  def head_job(head):
    if isinstance(head, MTPStack):  # D modules of one shape: a chain step is one module's pass
      head = head.modules[0]
    target = sj_models["target"]
    graphs, states = zip(nnx.split(head), nnx.split(target))
    state = jnp.zeros((batch, target.config.hidden_size), jnp.dtype(target.config.dtype))
    if isinstance(head, MedusaHead):
      medusa_steps = _medusa_steps_fn()
      return lambda: medusa_steps(*graphs, *states, state, k)
    if isinstance(head, HydraHead):
      hydra_steps = _hydra_steps_fn()
      return lambda: hydra_steps(*graphs, *states, state, jnp.ones((batch,), jnp.int32), k)
    carry = {"cache": cache_for(head)}
    tokens = jnp.ones((batch,), jnp.int32)
    hidden = jnp.zeros((batch, head.config.hidden_size), jnp.dtype(head.config.dtype))

    def run():
      out, _, carry["cache"] = head_steps(*graphs, *states, tokens, hidden, carry["cache"], k)
      return out
    return run

  def prefix_job(head):
    prefix_steps, split = _prefix_steps_fn(), nnx.split(head)
    carry = {"cache": cache_for_config(head.config.prefix),
             "hidden": jnp.zeros((batch, head.config.hidden_size), jnp.dtype(head.config.dtype))}
    return lambda: prefix_steps(*split, carry["cache"], k, carry["hidden"])[0]

  for name, head in (heads or {}).items():
    jobs[f"head_{name}"] = head_job(head)
    if isinstance(head, HydraHead) and head.has_prefix:  # Hydra++: its layer's pass per iteration
      jobs[f"prefix_{name}"] = prefix_job(head)
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
  device = jax.devices()[0]
  result = {"device": f"{device.device_kind} ({device.platform})", "batch": batch,
            "context": context, "steps_per_call": k,
            "iterations": len(times["target_w1"]), "compile_s": compile_s, "seconds": medians,
            "target_step_ms": medians["target_w1"] * 1e3}
  if "draft_w1" in medians:
    result["draft_step_ms"] = medians["draft_w1"] * 1e3
    result["cost_ratio"] = medians["draft_w1"] / medians["target_w1"]
  result["target_verify_ms"] = {str(w - 1): medians[f"target_w{w}"] * 1e3 for w in widths if w > 1}
  result["iteration_ms"] = {str(g): medians[f"iteration_g{g}"] * 1e3 for g in gammas}
  if heads:
    result["head_step_ms"] = {n: medians[f"head_{n}"] * 1e3 for n in heads}
    result["head_cost_ratio"] = {n: medians[f"head_{n}"] / medians["target_w1"] for n in heads}
    prefixed = [n for n in heads if f"prefix_{n}" in medians]
    if prefixed:  # Hydra++ heads: their prefix layer's pass, once per iteration
      result["prefix_step_ms"] = {n: medians[f"prefix_{n}"] * 1e3 for n in prefixed}
      result["prefix_cost_ratio"] = {n: medians[f"prefix_{n}"] / medians["target_w1"]
                                     for n in prefixed}
  return result
