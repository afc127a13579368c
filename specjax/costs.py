"""Measured pass costs: what one decoding step, one verification pass over T tokens and one bare
speculative iteration cost on the running device, batch and context, and the cost model built on
them.

Leviathan et al. 2023 (arXiv 2211.17192) model an iteration as gamma draft steps of cost c plus
one target pass of cost 1 (Eq. 1, Thm 3.8). On real hardware a pass over T tokens costs v(T) target
steps (v > 1 on a CPU, ~1 on an accelerator at small batch) and the two models share caches and
threads, so the runner times them: ``measure`` (``specjax.cost_timing``) runs many steps inside
one jitted ``fori_loop`` (as the decoding loop does: dispatch is spread over the steps), at the
run's sampling (sampled iterations cost more), and alternates the jobs so that machine noise hits
all alike. It returns a ``CostTable`` (the costs in target steps, the library's object: saved
with a run, loaded to choose gamma or a tree) and the raw timings, which ``measure_step_costs``
hands to the runner. ``modelled_speedup`` is Eq. 1 over those measured costs. In a run of
several processes every table timed here is process 0's on all of them (``shared``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np

from specjax import cost_timing, metrics
from specjax.sampling import Sampling


FORMAT = "specjax.cost_table/1"
GREEDY = Sampling(temperature=0.0)


def _cost(where: str, value: Any, allow_zero: bool = False) -> float:
  """``value`` as a float cost, or a one-line ValueError naming ``where`` and the value: a cost
  must be a finite number above 0 (at or above 0 where ``allow_zero``)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(f"{where} = {value!r} must be a number")
  value = float(value)
  if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
    raise ValueError(f"{where} = {value!r} must be finite and {'>= 0' if allow_zero else '> 0'}")
  return value


def checked_int(where: str, value: Any, minimum: int) -> int:
  """``value`` as an int, or a one-line ValueError naming ``where`` and the value."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"{where} = {value!r} must be an int >= {minimum}")
  return int(value)


def _costs_by_int(name: str, table: Any, minimum: int = 1) -> dict[int, float]:
  """A checked copy of ``table`` (tokens or gamma -> cost), in key order."""
  if not isinstance(table, dict):
    raise ValueError(f"{name} = {table!r} must be a dict")
  checked = {checked_int(f"{name} key", k, minimum): _cost(f"{name}[{k}]", v)
             for k, v in table.items()}
  return dict(sorted(checked.items()))


def _menu(choices, tree_nodes=None, draft_widths=None) -> list[tuple]:
  """``entry_cost``'s arguments for each entry of an ``sj.Adaptive`` menu: (drafts, the tree's
  nodes or None for a chain, the draft passes' widths)."""
  nodes = [None] * len(choices) if tree_nodes is None else list(tree_nodes)
  widths = [()] * len(choices) if draft_widths is None else list(draft_widths)
  return [(int(k), m, tuple(w)) for k, m, w in zip(choices, nodes, widths)]


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
  ``draft_step``: c, one draft step (0 for draft-free methods); ``draft_pass``: T -> a draft
  pass over T > 1 tokens that projects one of them onto the vocabulary (a draft tree's level;
  ``draft_pass_cost``); ``iteration``: gamma -> a measured
  bare iteration (gamma draft steps, then a gamma + 1 token pass); ``head_step``: an EAGLE head's
  c by name; ``loop``: gamma (a menu entry's drafts or depth, 0 for plain decoding) -> one
  iteration of an ``sj.Adaptive`` loop held at that entry, timed in the loop itself
  (``sj.Adaptive.calibrated``: its bookkeeping, rollback and a skipped draft's catch-up
  included, which the bare passes leave out), priced instead of the passes where present (for
  the method and menu it was timed with); ``autoregressive``: one iteration of the bare
  autoregressive loop, timed beside the entries by the same calibration (what a call that skips
  the draft runs, ``sj.Adaptive(probe_every=)``; 0: not timed, ``skipped_step``);
  ``target_step_ms``: the unit, in milliseconds;
  ``device``: where it was measured;
  ``sampling``: the ``sj.Sampling`` its steps and iterations ran at (greedy by default: a sampled
  iteration draws its drafts and applies rejection sampling, and costs more than a greedy one).
  Keyword-only; the dicts are copied (int keys, float costs) and every value checked."""

  verify: dict[int, float]
  draft_step: float = 0.0
  draft_pass: dict[int, float] = dataclasses.field(default_factory=dict)
  iteration: dict[int, float] = dataclasses.field(default_factory=dict)
  head_step: dict[str, float] = dataclasses.field(default_factory=dict)
  loop: dict[int, float] = dataclasses.field(default_factory=dict)
  autoregressive: float = 0.0
  batch: int
  context: int
  target_step_ms: float
  device: str
  sampling: Sampling = Sampling(temperature=0.0)

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
    if not isinstance(self.sampling, Sampling):
      raise ValueError(f"sampling = {self.sampling!r} must be an sj.Sampling")
    fields = dict(
        verify=verify, draft_step=_cost("draft_step", self.draft_step, allow_zero=True),
        draft_pass=_costs_by_int("draft_pass", self.draft_pass),
        iteration=_costs_by_int("iteration", self.iteration),
        head_step={n: _cost(f"head_step[{n!r}]", v) for n, v in sorted(self.head_step.items())},
        loop=_costs_by_int("loop", self.loop, minimum=0),
        autoregressive=_cost("autoregressive", self.autoregressive, allow_zero=True),
        batch=checked_int("batch", self.batch, 1), context=checked_int("context", self.context, 0),
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
    if checked_int("gamma", gamma, 0) == 0:
      return 1.0
    if gamma in self.iteration:
      return self.iteration[gamma]
    return gamma * self.draft_step + self.pass_cost(gamma + 1)

  def draft_pass_cost(self, tokens: int) -> float:
    """A draft pass over ``tokens`` tokens in target steps: c for one (``draft_step``), else a
    measured ``draft_pass`` (no interpolation, as for ``pass_cost``)."""
    if tokens == 1 and self.draft_step > 0:
      return self.draft_step
    if tokens not in self.draft_pass:
      raise ValueError(f"no measured draft pass over {tokens!r} tokens (widths measured: "
                       f"{sorted(self.draft_pass)}{', and 1' if self.draft_step > 0 else ''})")
    return self.draft_pass[tokens]

  def entry_cost(self, gamma: int, tree_nodes: int | None = None,
                 draft_widths: tuple[int, ...] = ()) -> float:
    """One iteration of an ``sj.Adaptive`` menu entry, in target steps: a chain of ``gamma``
    drafts (``chain_cost``), or a tree ``gamma`` deep of ``tree_nodes`` nodes: its draft
    passes over ``draft_widths`` tokens each (none for a draft-free tree) and its target pass,
    ``sum_w draft_pass_cost(w) + v(tree_nodes + 1)``; plain decoding (``gamma`` 0) is 1.0.
    The sum leaves out what the two models cost more run in turn than timed apart (a chain's
    measured bare iteration holds it). A calibrated table (``loop``) gives the loop's own
    iteration at ``gamma`` instead."""
    if self.loop:
      if checked_int("gamma", gamma, 0) not in self.loop:
        raise ValueError(f"no calibrated loop iteration at {gamma} drafts (calibrated: "
                         f"{sorted(self.loop)}): calibrate the table for this menu")
      return self.loop[gamma]
    if tree_nodes is None or checked_int("gamma", gamma, 0) == 0:
      return self.chain_cost(gamma)
    drafting = sum(self.draft_pass_cost(checked_int("draft width", w, 1)) for w in draft_widths)
    return drafting + self.pass_cost(checked_int("tree_nodes", tree_nodes, 1) + 1)

  def skipped_step(self) -> float:
    """What a call that skips the draft (plain decoding, ``sj.Autoregressive()``) pays an
    iteration, in target steps: the timed bare loop's (``autoregressive``), at most the menu's
    plain entry (``entry_cost(0)``: the calibrated loop's plain iteration, the same step and
    the skipped draft's upkeep besides, or the bare step 1.0; a fit above it is noise), which
    is also the price where the bare loop was not timed."""
    plain = self.entry_cost(0)
    return min(self.autoregressive, plain) if self.autoregressive else plain

  def entry_costs(self, choices, tree_nodes=None, draft_widths=None) -> tuple[float, ...]:
    """``entry_cost`` of every entry of an ``sj.Adaptive`` menu (``choices[i]`` drafts; with
    ``tree_nodes``, a tree of ``tree_nodes[i]`` nodes drafted in passes over
    ``draft_widths[i]`` tokens): what the cost rule prices each entry at."""
    return tuple(float(self.entry_cost(*e)) for e in _menu(choices, tree_nodes, draft_widths))

  def menu_cost(self, choices, counts, tree_nodes=None, draft_widths=None) -> float:
    """What iterations cost in target steps when ``counts[i]`` of them ran menu entry i
    (``choices[i]`` drafts; with ``tree_nodes``, a tree of ``tree_nodes[i]`` nodes drafted in
    passes over ``draft_widths[i]`` tokens) (an ``sj.Adaptive`` run's
    ``DecodeStats.choice_counts``): ``sum_i counts_i entry_cost(i)``; an entry never chosen
    needs no pass in the table."""
    return sum(int(n) * self.entry_cost(*e)
               for e, n in zip(_menu(choices, tree_nodes, draft_widths), counts) if n)

  def to_dict(self) -> dict:
    """A JSON-able dict (int keys as strings), tagged with the format."""
    return {"format": FORMAT, "verify": {str(k): v for k, v in self.verify.items()},
            "draft_step": self.draft_step,
            "draft_pass": {str(k): v for k, v in self.draft_pass.items()},
            "iteration": {str(k): v for k, v in self.iteration.items()},
            "head_step": dict(self.head_step),
            "loop": {str(k): v for k, v in self.loop.items()},
            "autoregressive": self.autoregressive,
            "batch": self.batch, "context": self.context,
            "target_step_ms": self.target_step_ms, "device": self.device,
            "sampling": dataclasses.asdict(self.sampling)}

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

    sampling = data.get("sampling", {"temperature": 0.0})  # tables before it: greedy
    if not isinstance(sampling, dict) or set(sampling) - {"temperature", "top_k", "top_p"}:
      raise ValueError(f"sampling = {sampling!r} must be an object of temperature, top_k, top_p")
    return cls(**{**{k: v for k, v in data.items() if k in names},
                  "verify": by_int("verify"), "iteration": by_int("iteration"),
                  "draft_pass": by_int("draft_pass"), "loop": by_int("loop"),
                  "sampling": Sampling(**sampling)})

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
              min_seconds: float = 0.3, max_iters: int = 100,
              sampling: Sampling = Sampling(temperature=0.0), draft_widths=()) -> CostTable:
    """The table timed on the running device (``measure``: the target at each width in
    ``widths``, the draft's step and its passes over ``draft_widths`` tokens, bare iterations
    at ``gammas``, the ``heads``' steps), at ``sampling`` (the run's: sampled iterations cost
    more than greedy ones)."""
    models = {"target": target} if draft is None else {"target": target, "draft": draft}
    return measure(models, batch, context, cache_length, widths=widths, gammas=gammas,
                   heads=heads, steps_per_call=steps_per_call, min_seconds=min_seconds,
                   max_iters=max_iters, sampling=sampling, draft_widths=draft_widths)[0]


def measure(models: dict, batch: int, context: int, cache_length: int, *, widths=(1,),
            gammas=(), heads: dict | None = None, steps_per_call: int = 16,
            min_seconds: float = 0.3, max_iters: int = 100,
            sampling: Sampling = GREEDY, draft_widths=()) -> tuple[CostTable, dict]:
  """The one timing of the passes: a ``CostTable`` and the raw timings (``measure_step_costs``'s
  dict, which carries the table as ``"table"``); the jobs are ``specjax.cost_timing``'s.

  Median seconds of one decoding step of each model (``models``: ``{"target": ...}`` or
  ``{"target": ..., "draft": ...}``; target at every width in ``widths`` and at width 1, the
  unit; draft at width 1 and at each width of ``draft_widths``, there projecting one token onto
  the vocabulary, as a draft tree's passes do) at ``batch`` rows, with ``context`` tokens
  already in a cache of ``cache_length`` slots; and, for each ``gammas`` entry, of one bare
  speculative iteration (``_bare_iterations_fn``: gamma draft steps, then a gamma + 1 token
  target pass and the exact rule). Steps and iterations run at ``sampling`` (greedy by
  default; module docstring), which the table records: a run at T > 0 should decide by a table
  measured at its sampling.

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
  with a pass of that shape). Heads are timed greedy."""
  unknown = sorted(set(models) - {"target", "draft"})
  if "target" not in models or unknown:
    raise ValueError(f"models {sorted(models)} must be 'target' and optionally 'draft'")
  batch, context = checked_int("batch", batch, 1), checked_int("context", context, 0)
  widths = tuple(sorted({1, *(checked_int("width", w, 1) for w in widths)}))
  gammas = tuple(checked_int("gamma", g, 1) for g in gammas)
  if gammas and "draft" not in models:
    raise ValueError(f"gammas {list(gammas)} need a draft: a bare iteration runs one")
  draft_widths = tuple(sorted({checked_int("draft width", w, 2) for w in draft_widths}))
  if draft_widths and "draft" not in models:
    raise ValueError(f"draft_widths {list(draft_widths)} need a draft")
  widest = max(widths + draft_widths + tuple(g + 1 for g in gammas))
  if context + widest > checked_int("cache_length", cache_length, 1):
    raise ValueError(f"cache_length {cache_length} holds no {widest}-token pass after context "
                     f"{context}")
  if not isinstance(sampling, Sampling):
    raise ValueError(f"sampling must be an sj.Sampling, got {sampling!r}")
  result = cost_timing.time_passes(
      dict(models), batch, context, cache_length, widths, gammas, heads, int(steps_per_call),
      min_seconds, max_iters, sampling, draft_widths)
  medians = result["seconds"]
  unit = medians["target_w1"]
  table = CostTable(verify={w: medians[f"target_w{w}"] / unit for w in widths},
                    draft_step=result.get("cost_ratio", 0.0),
                    draft_pass={w: medians[f"draft_w{w}"] / unit for w in draft_widths},
                    iteration={g: medians[f"iteration_g{g}"] / unit for g in gammas},
                    head_step=dict(result.get("head_cost_ratio", {})), batch=batch,
                    context=context, target_step_ms=result["target_step_ms"],
                    device=result["device"], sampling=sampling)
  table = shared(table)
  result["table"] = table.to_dict()
  return table, result


def shared(table: CostTable) -> CostTable:
  """``table`` with process 0's costs on every process of a multi-process run (``table`` itself
  in one process). Each process times its own devices, so their tables differ by the timing
  noise; but the cost rule's choice (``sj.Adaptive``), computed from the table on every device
  of one program, must not: devices of two processes would run different menu entries of one
  loop, whose collectives then mismatch. A collective: every process calls it, with tables of
  the same keys."""
  if jax.process_count() == 1:
    return table
  costs = {"verify": table.verify, "draft_step": table.draft_step,
           "draft_pass": table.draft_pass, "iteration": table.iteration,
           "head_step": table.head_step, "loop": table.loop,
           "target_step_ms": table.target_step_ms}
  leaves, tree = jax.tree.flatten(costs)
  agreed = np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(leaves, np.float32)))
  return dataclasses.replace(table, **jax.tree.unflatten(tree, [float(x) for x in agreed]))


def measure_step_costs(models: dict, batch: int, context: int, cache_length: int,
                       widths=(1,), gammas=(), steps_per_call: int = 16,
                       min_seconds: float = 0.3, max_iters: int = 100,
                       heads: dict | None = None, sampling: Sampling = GREEDY,
                       draft_widths=()) -> dict:
  """``measure``'s raw timings, the runner's ``cost`` dict: milliseconds (``target_step_ms``,
  ``draft_step_ms``, ``target_verify_ms`` by extra tokens, ``iteration_ms`` by gamma,
  ``head_step_ms``), the ratios to a target step (``cost_ratio``, ``head_cost_ratio``), the
  medians in seconds, and the ``CostTable`` as ``table`` (``CostTable.to_dict``)."""
  return measure(models, batch, context, cache_length, widths=widths, gammas=gammas, heads=heads,
                 steps_per_call=steps_per_call, min_seconds=min_seconds, max_iters=max_iters,
                 sampling=sampling, draft_widths=draft_widths)[1]


def modelled_speedup(alpha: float, gamma: int, iteration_cost: float, busy: float = 1.0) -> float:
  """The runs' cost model: Eq. 1's expected tokens per iteration (Leviathan et al. 2023) over a
  bare iteration's measured cost in target steps (``measure_step_costs``), times the rows kept
  busy (vs the autoregressive baseline's). What it leaves out is the loop's own work:
  verification, rollback, bookkeeping, each call's setup and prefills."""
  return metrics.expected_tokens_per_iteration(alpha, gamma) / iteration_cost * busy

