"""Measured pass costs: what one decoding step, one verification pass over T tokens and one bare
speculative iteration cost on the running device, batch and context, and the cost model built on
them.

Leviathan et al. 2023 (arXiv 2211.17192) model an iteration as gamma draft steps of cost c plus
one target pass of cost 1 (Eq. 1, Thm 3.8). On real hardware a pass over T tokens costs v(T) target
steps (v > 1 on a CPU, ~1 on an accelerator at small batch) and the two models share caches and
threads, so the runner times them: ``measure`` runs many steps inside one jitted ``fori_loop`` (as
the decoding loop does: dispatch is spread over the steps) and alternates the jobs so that machine
noise hits all alike. It returns a ``CostTable`` (the costs in target steps, the library's object:
saved with a run, loaded to choose gamma or a tree) and the raw timings, which
``measure_step_costs`` hands to the runner. ``modelled_speedup`` is Eq. 1 over those measured
costs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import os
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from specjax import metrics
from specjax.heads.hydra import HydraHead
from specjax.heads.medusa import MedusaHead
from specjax.heads.mtp import MTPStack
from specjax.models.kv_cache import init_cache
from specjax.proposers import draft_chain
from specjax.proposers import eagle as eagle_lib
from specjax.sampling import Sampling


FORMAT = "specjax.cost_table/1"


def _cost(where: str, value: Any, allow_zero: bool = False) -> float:
  """``value`` as a float cost, or a one-line ValueError naming ``where`` and the value: a cost
  must be a finite number above 0 (at or above 0 where ``allow_zero``)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(f"{where} = {value!r} must be a number")
  value = float(value)
  if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
    raise ValueError(f"{where} = {value!r} must be finite and {'>= 0' if allow_zero else '> 0'}")
  return value


def _int(where: str, value: Any, minimum: int) -> int:
  """``value`` as an int, or a one-line ValueError naming ``where`` and the value."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"{where} = {value!r} must be an int >= {minimum}")
  return int(value)


def _costs_by_int(name: str, table: Any) -> dict[int, float]:
  """A checked copy of ``table`` (tokens or gamma -> cost), in key order."""
  if not isinstance(table, dict):
    raise ValueError(f"{name} = {table!r} must be a dict")
  checked = {_int(f"{name} key", k, 1): _cost(f"{name}[{k}]", v) for k, v in table.items()}
  return dict(sorted(checked.items()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostTable:
  """The measured cost model on one device at one batch and context, every cost in target
  decoding steps (a target forward over 1 token at ``batch`` rows = 1.0), so that a table carries
  over between runs on the same hardware and a method can choose gamma or a tree by it.

  Leviathan et al. 2023 (arXiv 2211.17192, Eq. 1 / Thm 3.8) cost an iteration as gamma draft steps
  of cost c plus one target pass of cost 1; on real hardware a pass over T tokens costs v(T)
  target steps, and the draft and target run in turn can cost more than the sum (shared caches
  and threads), so the table holds the measured bare iterations as well.

  ``verify``: T -> v(T), a target pass over T tokens (``verify[1]`` is 1.0 by definition);
  ``draft_step``: c, one draft step (0 for draft-free methods); ``iteration``: gamma -> a measured
  bare iteration (gamma draft steps, then a gamma + 1 token pass); ``head_step``: an EAGLE head's
  c by name; ``target_step_ms``: the unit, in milliseconds; ``device``: where it was measured.
  Keyword-only; the dicts are copied (int keys, float costs) and every value checked."""

  verify: dict[int, float]
  draft_step: float = 0.0
  iteration: dict[int, float] = dataclasses.field(default_factory=dict)
  head_step: dict[str, float] = dataclasses.field(default_factory=dict)
  batch: int
  context: int
  target_step_ms: float
  device: str

  def __post_init__(self):
    verify = _costs_by_int("verify", self.verify)
    if 1 not in verify:
      raise ValueError(f"verify has no 1-token pass (widths {sorted(verify)}): v(1) is the unit")
    if abs(verify[1] - 1.0) > 1e-9:
      raise ValueError(f"verify[1] = {verify[1]!r} must be 1.0 (costs are in target steps)")
    if not isinstance(self.head_step, dict):
      raise ValueError(f"head_step = {self.head_step!r} must be a dict")
    for name in self.head_step:
      if not isinstance(name, str):
        raise ValueError(f"head_step key {name!r} must be a str")
    if not isinstance(self.device, str):
      raise ValueError(f"device = {self.device!r} must be a str")
    fields = dict(
        verify=verify, draft_step=_cost("draft_step", self.draft_step, allow_zero=True),
        iteration=_costs_by_int("iteration", self.iteration),
        head_step={n: _cost(f"head_step[{n!r}]", v) for n, v in sorted(self.head_step.items())},
        batch=_int("batch", self.batch, 1), context=_int("context", self.context, 0),
        target_step_ms=_cost("target_step_ms", self.target_step_ms))
    for name, value in fields.items():  # normalised copies: the caller's dicts stay theirs
      object.__setattr__(self, name, value)

  def pass_cost(self, tokens: int) -> float:
    """v(T): a target pass over ``tokens`` tokens, in target steps. Only measured widths: the
    cost is not linear in T (flat on an accelerator, then rising), so no interpolation."""
    if tokens not in self.verify:
      raise ValueError(f"no measured pass over {tokens!r} tokens (widths measured: "
                       f"{sorted(self.verify)})")
    return self.verify[tokens]

  def chain_cost(self, gamma: int) -> float:
    """One iteration of a chain of ``gamma`` drafts, in target steps: 1.0 at gamma 0 (plain
    decoding), the measured bare iteration when there is one, else Eq. 1's denominator on real
    hardware, ``gamma * c + v(gamma + 1)``."""
    if _int("gamma", gamma, 0) == 0:
      return 1.0
    if gamma in self.iteration:
      return self.iteration[gamma]
    return gamma * self.draft_step + self.pass_cost(gamma + 1)

  def menu_cost(self, choices, counts) -> float:
    """What iterations cost in target steps when ``counts[i]`` of them drafted ``choices[i]``
    tokens (an ``sj.Adaptive`` run's ``DecodeStats.choice_counts``): ``sum_i counts_i
    chain_cost(choices_i)``; a length never chosen needs no pass in the table."""
    return sum(int(n) * self.chain_cost(int(k)) for k, n in zip(choices, counts) if n)

  def to_dict(self) -> dict:
    """A JSON-able dict (int keys as strings), tagged with the format."""
    return {"format": FORMAT, "verify": {str(k): v for k, v in self.verify.items()},
            "draft_step": self.draft_step,
            "iteration": {str(k): v for k, v in self.iteration.items()},
            "head_step": dict(self.head_step), "batch": self.batch, "context": self.context,
            "target_step_ms": self.target_step_ms, "device": self.device}

  @classmethod
  def from_dict(cls, data: Any) -> CostTable:
    """The table ``to_dict`` wrote; a one-line ValueError for another format or a bad value."""
    if not isinstance(data, dict):
      raise ValueError(f"a cost table is a JSON object, not {type(data).__name__}")
    if data.get("format") != FORMAT:
      raise ValueError(f"format {data.get('format')!r} is not {FORMAT!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - {"format"})
    if unknown:
      raise ValueError(f"unknown cost table keys {unknown}")
    missing = sorted(f.name for f in dataclasses.fields(cls)
                     if f.name not in data and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    if missing:
      raise ValueError(f"cost table keys {missing} missing")

    def by_int(name):
      table = data.get(name, {})
      if not isinstance(table, dict):
        raise ValueError(f"{name} = {table!r} must be an object")
      out = {}
      for k, v in table.items():
        try:
          out[int(k)] = v
        except ValueError:
          raise ValueError(f"{name} key {k!r} is not an int") from None
      return out

    return cls(**{**{k: v for k, v in data.items() if k in names},
                  "verify": by_int("verify"), "iteration": by_int("iteration")})

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=1, allow_nan=False)

  @classmethod
  def from_json(cls, text: str) -> CostTable:
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"not JSON ({e})") from None
    return cls.from_dict(data)

  def save(self, path: str | os.PathLike) -> None:
    with open(path, "w") as f:
      f.write(self.to_json() + "\n")

  @classmethod
  def load(cls, path: str | os.PathLike) -> CostTable:
    """The table saved at ``path``; errors name the path and the bad value."""
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{os.fspath(path)}: no cost table file")
    with open(path) as f:
      text = f.read()
    try:
      return cls.from_json(text)
    except ValueError as e:
      raise ValueError(f"{os.fspath(path)}: {e}") from None

  @classmethod
  def measure(cls, target, draft=None, *, batch: int, context: int, cache_length: int,
              widths=(1,), gammas=(), heads: dict | None = None, steps_per_call: int = 16,
              min_seconds: float = 0.3, max_iters: int = 100) -> CostTable:
    """The table timed on the running device (``measure``: the target at each width in
    ``widths``, the draft's step, bare iterations at ``gammas``, the ``heads``' steps)."""
    models = {"target": target} if draft is None else {"target": target, "draft": draft}
    return measure(models, batch, context, cache_length, widths=widths, gammas=gammas,
                   heads=heads, steps_per_call=steps_per_call, min_seconds=min_seconds,
                   max_iters=max_iters)[0]


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


def measure(models: dict, batch: int, context: int, cache_length: int, *, widths=(1,),
            gammas=(), heads: dict | None = None, steps_per_call: int = 16,
            min_seconds: float = 0.3, max_iters: int = 100) -> tuple[CostTable, dict]:
  """The one timing of the passes: a ``CostTable`` and the raw timings (``measure_step_costs``'s
  dict, which carries the table as ``"table"``).

  Median seconds of one decoding step of each model (``models``: ``{"target": ...}`` or
  ``{"target": ..., "draft": ...}``; target at every width in ``widths`` and at width 1, the
  unit; draft at width 1) at ``batch`` rows, with ``context`` tokens already in a cache of
  ``cache_length`` slots; and, for each ``gammas`` entry, of one bare speculative iteration
  (``_bare_iterations_fn``: gamma draft steps, then a gamma + 1 token target pass).

  Each call runs ``steps_per_call`` steps inside one jitted ``fori_loop``, as the decoding loop
  does, so the per-call dispatch cost (which dwarfs a tiny draft's step when timed one jitted call
  at a time, and so overstated c) is spread over the steps. The calls alternate between the jobs
  so noise hits all alike. A bare iteration can cost more than gamma draft steps plus a
  verification pass timed apart (the default pair on a 2-core CPU at gamma 1: 1.77 target steps
  against c + v = 1.31): run in turn, the two models share caches and threads.

  ``heads``: name -> an EAGLE head drafting for the target; each one's drafting step (a head pass
  and its draft logits, ``_head_steps_fn``) is timed too: ``head_step_ms[name]`` and its ratio
  to a target step, ``head_cost_ratio[name]`` (the c of an EAGLE chain); for Medusa heads, one
  pass of all of them (``_medusa_steps_fn``: what an iteration's drafting costs); for Hydra
  heads, one head's pass (``_hydra_steps_fn``: a depth of its tree), and with Hydra++'s prefix
  layer that layer's pass too (``prefix_step_ms`` / ``prefix_cost_ratio``: once per iteration,
  ``_prefix_steps_fn``); for a stack of MTP modules
  (``MTPStack``), its first module's pass (each module of the stack drafts one token of a chain
  with a pass of that shape)."""
  unknown = sorted(set(models) - {"target", "draft"})
  if "target" not in models or unknown:
    raise ValueError(f"models {sorted(models)} must be 'target' and optionally 'draft'")
  batch, context = _int("batch", batch, 1), _int("context", context, 0)
  widths = tuple(sorted({1, *(_int("width", w, 1) for w in widths)}))
  gammas = tuple(_int("gamma", g, 1) for g in gammas)
  if gammas and "draft" not in models:
    raise ValueError(f"gammas {list(gammas)} need a draft: a bare iteration runs one")
  widest = max(widths + tuple(g + 1 for g in gammas))
  if context + widest > _int("cache_length", cache_length, 1):
    raise ValueError(f"cache_length {cache_length} holds no {widest}-token pass after context "
                     f"{context}")
  steps, iterations, head_steps = _steps_fn(), _bare_iterations_fn(), _head_steps_fn()
  k = int(steps_per_call)
  sj_models = dict(models)

  def cache_for_config(config):
    return init_cache(config, batch, cache_length).with_lengths(
        jnp.full((batch,), context, jnp.int32))
  cache_for = lambda model: cache_for_config(model.config)

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
  result = {"batch": batch, "context": context, "steps_per_call": k,
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
  unit = medians["target_w1"]
  device = jax.devices()[0]
  table = CostTable(verify={w: medians[f"target_w{w}"] / unit for w in widths},
                    draft_step=result.get("cost_ratio", 0.0),
                    iteration={g: medians[f"iteration_g{g}"] / unit for g in gammas},
                    head_step=dict(result.get("head_cost_ratio", {})), batch=batch,
                    context=context, target_step_ms=result["target_step_ms"],
                    device=f"{device.device_kind} ({device.platform})")
  result["table"] = table.to_dict()
  return table, result


def measure_step_costs(models: dict, batch: int, context: int, cache_length: int,
                       widths=(1,), gammas=(), steps_per_call: int = 16,
                       min_seconds: float = 0.3, max_iters: int = 100,
                       heads: dict | None = None) -> dict:
  """``measure``'s raw timings, the runner's ``cost`` dict: milliseconds (``target_step_ms``,
  ``draft_step_ms``, ``target_verify_ms`` by extra tokens, ``iteration_ms`` by gamma,
  ``head_step_ms``), the ratios to a target step (``cost_ratio``, ``head_cost_ratio``), the
  medians in seconds, and the ``CostTable`` as ``table`` (``CostTable.to_dict``)."""
  return measure(models, batch, context, cache_length, widths=widths, gammas=gammas, heads=heads,
                 steps_per_call=steps_per_call, min_seconds=min_seconds, max_iters=max_iters)[1]


def modelled_speedup(alpha: float, gamma: int, iteration_cost: float, busy: float = 1.0) -> float:
  """The runs' cost model: Eq. 1's expected tokens per iteration (Leviathan et al. 2023) over a
  bare iteration's measured cost in target steps (``measure_step_costs``), times the rows kept
  busy (vs the autoregressive baseline's). What it leaves out is the loop's own work:
  verification, rollback, bookkeeping, each call's setup and prefills."""
  return metrics.expected_tokens_per_iteration(alpha, gamma) / iteration_cost * busy
