"""Pricing an ``sj.Adaptive`` menu by its own loop (``sj.Adaptive.calibrated``): each entry's
iteration timed in the compiled adaptive loop held at that entry.

Why: ``sj.CostTable.measure`` times bare passes and bare speculative iterations; the decoding
loop does more around them (a draft's rollback and catch-up, the verifier's bookkeeping, the
rule's estimates, a skipped draft's looks in plain stretches), and that work weighs on the
entries unequally. On SmolLM2 + its draft at batch 4-8 (XLA:CPU) one draft's loop iteration ran
~6% dearer, relative to plain decoding, than its bare iteration said (docs/benchmarks.md,
session 42), and at one draft's modelled break-even the rule then drafted where it lost.

How: the entries' costs are traced (``AdaptiveParams.costs``), so one compiled loop runs the
menu held at each entry in turn (a table pricing that entry at 1 and the others at ``HOLD``: the
rule never leaves it) at two lengths, ``max_new_tokens`` and half of it, the entries and lengths
alternating so that machine noise hits all alike. A call takes ``F + I_k s_k`` seconds: a fixed
part ``F`` (prefills, setup; the same executable and prompts for every entry) and ``I_k``
iterations of ``s_k`` seconds. Each call (an entry at a length) is timed ``repeats`` times and
its fastest time kept: on a shared machine interference only ever slows a call (``timeit``'s
minimum; on the benchmark pair at batch 4 the same call's three times spread up to 60% on the
2-core box, and the repeats' fits, each its own noise, had priced one draft at 1.5-2.3x plain
decoding where its bare price was 1.4-1.7x). The fastest calls give ``F`` and every ``s_k`` by
least squares (``fit_loop_seconds``), and the table's ``loop[k]`` is ``s_k`` in target steps
(the table's ``target_step_ms``). No EOS stops a row: every call decodes its budget, so the
iteration counts differ between the two lengths.

A method that skips its draft for whole calls (``probe_every``) also has the bare autoregressive
loop timed in the same rounds (entry ``SKIPPED``, its own fixed part: no draft prefill), the
table's ``autoregressive``: what a skipped call pays an iteration, below the loop's plain entry by
the skipped draft's upkeep (its looks and the text it follows).

Each entry its own ``s_k``: sessions 43-44 pooled the entries on the bare table's shape
(``s_k = b c_k + o_k``, ``c_k`` the bare price, ``o`` one value for plain decoding and one for
every drafting entry; ``priced(pooled=True)``), which also imports that table's own timing noise
at every entry: on the pair's batch-4 code edits at T = 1 two runs' bare tables priced two drafts
at 1.09-1.18x one draft, the pooled fits 1.12-1.16x, while the loop's own iterations there ran
1.39x (the fixed gammas' tokens per second and per iteration); the rule drafted two where one
paid (0.86x the best fixed gamma). With each call's fastest time kept, an entry's own fit
scatters about as much as the pooled one between calibrations (that cell, groups of 3 rounds:
ranges of 11-23% of an entry's price against 12-19%; ``experiments/calibration_spread.py``,
docs/benchmarks.md, session 45).
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import jax
import numpy as np

from specjax.costs import CostTable, checked_int, shared
from specjax.decoding import methods
from specjax.decoding.generate import generate

# A held entry's rivals cost this many times more an iteration: above any ratio of modelled
# tokens an iteration (at most 1 + the largest choice), so the rule never leaves the entry.
HOLD = 1e3
# The entry of a call of the bare autoregressive loop (``Call.entry``): what a skipped call runs.
SKIPPED = -1


class CalibrationNoise(RuntimeError):
  """The calls' times fitted an iteration of no positive cost: on that machine the lengths'
  difference drowned in its noise (tiny models, a small ``max_new_tokens``)."""


def held_table(table: CostTable, choices: tuple[int, ...], gamma: int) -> CostTable:
  """``table`` with a ``loop`` that prices ``gamma`` at 1 and every other entry of ``choices``
  at ``HOLD``: the cost rule run with it chooses ``gamma`` at every iteration."""
  return dataclasses.replace(table, loop={k: 1.0 if k == gamma else HOLD for k in choices})


def fit_loop_seconds(runs: list[tuple[int, int, float]],
                     bare: dict[int, float] | None = None) -> tuple[float, dict[int, float]]:
  """(F, {gamma: s}) from ``runs`` of (gamma, iterations, seconds), by least squares on
  ``seconds = F + iterations x s_gamma``, one fixed part ``F`` shared by every call. With
  ``bare``, ``s_gamma = b bare[gamma] + o_gamma``, ``o_gamma`` one value for plain decoding
  (``gamma`` 0) and one for every drafting entry (the entries pooled on the bare table's shape);
  without, each entry's ``s_gamma`` its own (module docstring). A one-line ValueError when an
  entry's calls do not differ in iterations (nothing to tell ``F`` from its iterations by)."""
  gammas = sorted({g for g, _, _ in runs})
  for g in gammas:
    if len({i for k, i, _ in runs if k == g}) < 2:
      raise ValueError(f"the calls held at {g} drafts all ran the same number of iterations: "
                       f"an iteration's time cannot be told from the fixed part")
  per_iteration = (np.eye(len(gammas)) if bare is None else
                   np.asarray([[bare[g], g == 0, g > 0] for g in gammas], np.float64))
  design = np.asarray([[1.0, *(n * per_iteration[gammas.index(g)])] for g, n, _ in runs])
  seconds = np.asarray([t for _, _, t in runs], np.float64)
  solution = np.linalg.lstsq(design, seconds, rcond=None)[0]
  return float(solution[0]), {g: float(s) for g, s in zip(gammas, per_iteration @ solution[1:])}


def time_call(run) -> tuple:
  """(``run()``'s ``DecodeStats``, the seconds it took to the tokens' readiness)."""
  start = time.perf_counter()
  out = run()
  jax.block_until_ready(out.tokens)
  return out.stats, time.perf_counter() - start


class Call(NamedTuple):
  """One timed call of the loop held at ``entry`` drafts (``SKIPPED``: the bare autoregressive
  loop): ``length`` new tokens a row, in the ``repeat``-th round, ``iterations`` iterations in
  ``seconds``."""
  entry: int
  length: int
  repeat: int
  seconds: float
  iterations: int


def bare_costs(method) -> dict[int, float]:
  """{entry: its iteration by the bare table} (``entry_costs`` without the loop)."""
  return dict(zip(method.choices, dataclasses.replace(method.costs, loop={}).entry_costs(
      method.choices, method.tree_nodes, method.draft_widths)))


def timed_calls(method, target, prompts, *, sampling, max_new_tokens: int,
                key: jax.Array | None = None, repeats: int = 3,
                shorter: tuple[int, ...] | None = None, **generate_kwargs) -> list[Call]:
  """Every call ``calibrate`` times, ``repeats`` rounds of each menu entry at ``max_new_tokens``
  and at each of ``shorter`` (default: half of it; the entries' order rotated and the lengths'
  order reversed each round, so that machine noise hits all alike), after one untimed call per
  length (the compilations); with ``probe_every``, the bare autoregressive loop's calls too
  (entry ``SKIPPED``, after the menu's in each round)."""
  if method.rule != "cost" or not isinstance(method.costs, CostTable):
    raise ValueError(f"calibration prices rule 'cost' by its sj.CostTable; got rule "
                     f"{method.rule!r}, costs {type(method.costs).__name__}")
  if "eos_token_id" in generate_kwargs:
    raise ValueError("calibration decodes every row's whole budget: no eos_token_id")
  longest = checked_int("max_new_tokens", max_new_tokens, 4)
  repeats = checked_int("repeats", repeats, 1)
  bare_costs(method)  # a table that cannot price the menu fails before any call
  shorter = (longest // 2,) if shorter is None else tuple(shorter)
  for n in shorter:
    if checked_int("a shorter length", n, 1) >= longest:
      raise ValueError(f"a shorter length = {n} must be below max_new_tokens = {longest}")
  lengths = (longest, *dict.fromkeys(shorter))
  key = jax.random.key(0) if key is None else key
  held = {k: dataclasses.replace(method, costs=held_table(method.costs, method.choices, k),
                                 probe_every=0)  # each call the held loop, never a skip
          for k in method.choices}

  if method.probe_every:  # what a skipped call runs
    held[SKIPPED] = methods.Autoregressive()

  def call(k, length):
    return lambda: generate(target, prompts, held[k], sampling, max_new_tokens=length, key=key,
                            **generate_kwargs)

  for length in lengths:  # compile the loops (the costs are traced: one loop per length)
    for k in {method.choices[0], SKIPPED} & set(held):
      jax.block_until_ready(call(k, length)().tokens)
  calls = []
  for r in range(repeats):
    order = method.choices[r % len(method.choices):] + method.choices[:r % len(method.choices)]
    for k in order + (SKIPPED,) * (SKIPPED in held):
      for length in lengths if r % 2 == 0 else lengths[::-1]:
        stats, elapsed = time_call(call(k, length))
        if k == SKIPPED:  # the prefill's pass makes the first token
          calls.append(Call(k, length, r, elapsed, int(stats.target_calls) - 1))
          continue
        counts = np.asarray(stats.choice_counts)
        if counts.sum() != counts[method.choices.index(k)]:
          raise RuntimeError(f"the rule left the entry it was held at ({k} drafts): "
                             f"choices {counts.tolist()}")
        calls.append(Call(k, length, r, elapsed, int(counts.sum())))
  return calls


def priced(method, calls: list[Call], pooled: bool = False) -> CostTable:
  """``method.costs`` with ``loop`` fitted to ``calls``: each (entry, length)'s fastest call
  (``fit_loop_seconds``, ``pooled`` on the bare table's shape or each entry its own), in target
  steps (module docstring); ``autoregressive`` fitted the same way to the ``SKIPPED`` calls,
  with a fixed part of their own, where there are any."""
  fastest: dict[tuple[int, int], tuple[float, int]] = {}  # (entry, length): (seconds, iterations)
  for c in calls:
    fastest[c.entry, c.length] = min(fastest.get((c.entry, c.length), (np.inf, 0)),
                                     (c.seconds, c.iterations))
  runs = [(k, n, t) for (k, _), (t, n) in fastest.items()]
  seconds = fit_loop_seconds([r for r in runs if r[0] != SKIPPED],
                             bare_costs(method) if pooled else None)[1]
  skipped = [r for r in runs if r[0] == SKIPPED]
  if skipped:
    seconds[SKIPPED] = fit_loop_seconds(skipped)[1][SKIPPED]
  unit = method.costs.target_step_ms / 1e3
  loop = {k: s / unit for k, s in seconds.items()}
  bad = {k: v for k, v in loop.items() if not v > 0}
  if bad:
    raise CalibrationNoise(f"calibration timed no positive iteration cost at {bad} (a "
                           f"machine too noisy for these lengths? more max_new_tokens or repeats)")
  return dataclasses.replace(method.costs, loop={k: v for k, v in loop.items() if k != SKIPPED},
                             autoregressive=loop.get(SKIPPED, 0.0))


def calibrate(method, target, prompts, *, sampling, max_new_tokens: int,
              key: jax.Array | None = None, repeats: int = 3, **generate_kwargs) -> CostTable:
  """``method.costs`` (an ``sj.Adaptive`` of rule "cost") with ``loop`` set: each menu entry's
  iteration in target steps, timed in ``method``'s own loop held at that entry on ``prompts``
  (the run's batch) at ``sampling``, ``max_new_tokens`` and half of it, ``repeats`` times
  each, the fastest kept (module docstring; ``timed_calls`` then ``priced``).
  ``generate_kwargs``: the rest of ``sj.generate``'s (``prompt_width``, ``mesh``, ...) as the
  run passes them, so that a run without EOS reuses the compiled loop; no ``eos_token_id``.
  Several processes: process 0's table on all (``costs.shared``)."""
  return shared(priced(method, timed_calls(
      method, target, prompts, sampling=sampling, max_new_tokens=max_new_tokens, key=key,
      repeats=repeats, **generate_kwargs)))
