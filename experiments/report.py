"""Reports of speculative-decoding experiments: results dict -> text table, markdown, PNG plots.

Reusable apart from the runner: ``write_report(results, out_dir)`` writes ``results.json``,
``report.md`` and the plots for any dict shaped like the one ``experiments.run.run_experiment``
returns; ``load_results(path)`` reads a ``results.json`` back, so a report can be redrawn:

    python -m experiments.report runs/default/results.json [out_dir]

The results dict holds ``settings``: one entry per (method, gamma, temperature) with
``tokens_per_s``, ``speedup`` (vs autoregressive at the same sampling; ``speedup_runs``: each
repeat's own ratio, whose spread the table shows as ``range``), ``acceptance_rate``,
``expected_alpha``, ``tokens_per_target_call``, ``acceptance_by_position``,
``theoretical_speedup`` (Leviathan et al. 2023, Thm 3.8, at the measured alpha and cost ratio c)
and ``measured_over_theoretical``; ``verify_cost`` v (the measured gamma + 1 token verification pass
in target steps; Thm 3.8 takes v = 1), ``iteration_cost`` (a bare iteration -- gamma draft steps,
then that pass, the two models in turn -- in target steps; Thm 3.8 takes gamma c + 1),
``row_utilisation`` (busy rows per loop iteration / batch size: a batch iterates until its slowest
row is done), ``modelled_speedup`` (Eq. 1's tokens per iteration over that iteration cost, times
the speculative run's row utilisation over the autoregressive one's) and
``measured_over_modelled``, which isolates what the two models' steps do not account for (the
loop's verification, rollback and bookkeeping, each call's setup and prefills); plus ``cost`` (c
and the step timings), ``config``, ``command``, ``versions``, ``machine``, ``models``, ``prompts``,
``samples``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Callable

from experiments.methods import CHAIN, METHODS
from experiments.report_adaptive import adaptive_label, choice_lines, optimal_gamma_note

PLOT_FILES = {"speedup": "speedup_vs_gamma.png", "acceptance": "acceptance_by_position.png",
              "theory": "measured_vs_theoretical.png"}


# ----------------------------------------------------------------------------------------- utils


def _num(x) -> float | None:
  return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _spread(runs) -> str | None:
  """'min-max' of per-repeat values (None under two repeats, or all alike: a baseline's 1.00)."""
  if not runs or len(runs) < 2 or min(runs) == max(runs):
    return None
  return f"{min(runs):.2f}-{max(runs):.2f}"


def _fmt(x, spec: str = ".2f", missing: str = "-") -> str:
  x = _num(x)
  if x is None:
    return missing
  return format(x, spec)


def _json_safe(x):
  if isinstance(x, float):
    return None if not math.isfinite(x) else x
  if isinstance(x, dict):
    return {str(k): _json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_json_safe(v) for v in x]
  if hasattr(x, "tolist"):  # numpy scalars and arrays
    return _json_safe(x.tolist())
  return x


def _method_label(e: dict) -> str:
  if e.get("rule"):
    return adaptive_label(e)
  return (e["method"] + (f" g={e['gamma']}" if e.get("gamma") is not None else "")
          + (f" {e['tree']}" if e.get("tree") else "")
          + (" typical(LOSSY)" if e.get("verify") == "typical" else ""))


def _temperatures(results: dict) -> list[float]:
  return sorted({e["temperature"] for e in results["settings"]})


def _spec_rows(results: dict, temperature: float) -> list[dict]:
  """The draft-chain settings (Leviathan et al.'s tables and plots) at ``temperature``."""
  rows = [e for e in results["settings"] if METHODS[e["method"]].cost_model == CHAIN
          and e["temperature"] == temperature]
  return sorted(rows, key=lambda e: e["gamma"])


# Columns of the main table: (header, getter, format, shown only when some row has a value).
Column = tuple[str, Callable[[dict], Any], str, bool]
COLUMNS: list[Column] = [
    ("T", lambda e: e["temperature"], "g", False),
    ("method", _method_label, "s", False),
    ("mesh", lambda e: e.get("mesh") or None, "s", True),
    ("tok/s", lambda e: e.get("tokens_per_s"), ".1f", False),
    ("speedup", lambda e: e.get("speedup"), ".2f", False),
    ("range", lambda e: _spread(e.get("speedup_runs")), "s", True),
    ("accept", lambda e: e.get("acceptance_rate"), ".3f", False),
    ("E[alpha]", lambda e: e.get("expected_alpha"), ".3f", False),
    ("tok/call", lambda e: e.get("tokens_per_target_call"), ".2f", False),
    ("nodes", lambda e: e.get("nodes_per_call") if e.get("tree") else None, ".0f", True),
    ("formula", lambda e: e.get("expected_tokens_per_call"), ".2f", True),
    ("theory", lambda e: e.get("theoretical_speedup"), ".2f", True),
    ("meas/theory", lambda e: e.get("measured_over_theoretical"), ".2f", True),
    ("v", lambda e: e.get("verify_cost"), ".2f", True),
    ("iter", lambda e: e.get("iteration_cost"), ".2f", True),
    ("meas/model", lambda e: e.get("measured_over_modelled"), ".2f", True),
    ("ours/HF", lambda e: e.get("tokens_per_s_over_hf"), ".2f", True),
    ("greedy=AR", lambda e: e.get("greedy_match", e.get("greedy_match_vs_specjax")), ".2f", True),
    ("x 1 device", lambda e: e.get("over_one_device"), ".2f", True),
    ("same tokens", lambda e: e.get("same_as_one_device"), ".2f", True),
    ("MiB/device", lambda e: _memory_mib(e.get("memory")), ".1f", True),
    ("compile s", lambda e: e.get("compile_s"), ".1f", False),
]


def _memory_mib(memory: dict | None) -> float | None:
  """Bytes one device holds for a compiled loop (arguments + outputs + temporaries), in MiB."""
  if not memory:
    return None
  return (memory["argument_bytes"] + memory["output_bytes"] + memory["temp_bytes"]
          - memory.get("alias_bytes", 0)) / 2**20


def _table_cells(results: dict) -> tuple[list[str], list[list[str]]]:
  rows = results["settings"]
  cols = [c for c in COLUMNS if not c[3] or any(_num(c[1](e)) is not None for e in rows)]
  header = [c[0] for c in cols]
  body = []
  for e in rows:
    cells = []
    for _, get, spec, _ in cols:
      v = get(e)
      cells.append(v if isinstance(v, str) else _fmt(v, spec))
    body.append(cells)
  return header, body


def _self_draft_note(results: dict) -> str:
  """The self-speculative draft's own step cost (``run.py`` measures it apart from a draft's)."""
  own = results["cost"]["self_speculative"]
  skip = (results.get("config") or {}).get("skip")
  return (f"self-speculative draft (the target without layers {list(skip or ())}): step "
          f"{own['draft_step_ms']:.3f} ms vs target {own['target_step_ms']:.3f} ms, c = "
          f"{own['cost_ratio']:.3f}")


def format_table(results: dict) -> str:
  """The main table as aligned plain text (what the runner prints)."""
  header, body = _table_cells(results)
  widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
  left = {"method"}
  line = lambda cells: "  ".join(c.ljust(w) if h in left else c.rjust(w)
                                 for c, w, h in zip(cells, widths, header))
  out = [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in body]
  cost = results.get("cost") or {}
  notes = []
  if cost.get("used") is not None:
    notes.append(f"cost ratio c = {cost['used']:.3f} ({cost.get('used_source')})")
  if cost.get("target_step_ms") is not None and cost.get("draft_step_ms") is not None:
    notes.append(f"one step: target {cost['target_step_ms']:.3f} ms, draft "
                 f"{cost['draft_step_ms']:.3f} ms")
  if cost.get("cost_ratio_ar") is not None:
    notes.append(f"c from AR tokens/s = {cost['cost_ratio_ar']:.3f}")
  if cost.get("self_speculative"):
    notes.append(_self_draft_note(results))
  for name, c in (cost.get("head_cost_ratio") or {}).items():
    notes.append(f"{name} head: step {cost['head_step_ms'][name]:.3f} ms, c = {c:.3f}")
  for t, o in (results.get("optimal_gamma") or {}).items():
    notes.append(f"T={float(t):g}: {optimal_gamma_note(o)}")
  if choice_lines(results):
    notes += ["adaptive choices (share of iterations per draft length):", *choice_lines(results)]
  title = (f"{results.get('name', 'experiment')}: tokens/s = median of "
           f"{results.get('config', {}).get('repeats', '?')} interleaved repeats; speedup vs "
           f"autoregressive at the same T")
  return "\n".join([title, ""] + out + ([""] + notes if notes else []))


def memory_lines(results: dict) -> list[str]:
  """One line per setting with a compiled loop: its bytes per device."""
  mib = lambda b: f"{b / 2**20:.1f} MiB"
  out = []
  for e in results["settings"]:
    m = e.get("memory")
    if m:
      out.append(f"- {_method_label(e)}{' mesh=' + e['mesh'] if e.get('mesh') else ''} "
                 f"T={e['temperature']:g}: arguments {mib(m['argument_bytes'])}, temporaries "
                 f"{mib(m['temp_bytes'])}, outputs {mib(m['output_bytes'])}")
  return out


def _markdown_table(header: list[str], body: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(r) + " |" for r in body]
  return "\n".join(lines)


def leviathan_table(results: dict) -> str:
  """Per temperature and gamma: alpha, tokens per call (measured vs Eq. 1), speedup (measured vs
  Thm 3.8) -- the shape of Leviathan et al. 2023, Tables 2-3."""
  header = ["T", "gamma", "accept rate", "E[alpha]", "tok/call", "tok/iteration",
            "(1-a^(g+1))/(1-a)", "speedup", "theory", "meas/theory", "v", "iter", "rows busy",
            "model (iter, busy)", "meas/model"]
  body = []
  for t in _temperatures(results):
    for e in _spec_rows(results, t):
      body.append([f"{t:g}", str(e["gamma"]), _fmt(e.get("acceptance_rate"), ".3f"),
                   _fmt(e.get("expected_alpha"), ".3f"), _fmt(e.get("tokens_per_target_call")),
                   _fmt(e.get("tokens_per_iteration")),
                   _fmt(e.get("expected_tokens_per_call")), _fmt(e.get("speedup")),
                   _fmt(e.get("theoretical_speedup")), _fmt(e.get("measured_over_theoretical")),
                   _fmt(e.get("verify_cost")), _fmt(e.get("iteration_cost")),
                   _fmt(e.get("row_utilisation")),
                   _fmt(e.get("modelled_speedup")),
                   _fmt(e.get("measured_over_modelled"))])
  return _markdown_table(header, body) if body else ""


def tree_table(results: dict) -> str:
  """Per tree setting: nodes per pass, its cost, tokens per iteration and how deep paths reach."""
  rows = [e for e in results["settings"] if e.get("tree")]
  if not rows:
    return ""
  depth = max(len(e.get("acceptance_by_position") or []) for e in rows)
  header = ["T", "tree", "nodes", "v", "tok/iteration", "speedup"]
  header += [f"reach {d}" for d in range(1, depth + 1)]
  body = []
  for e in rows:
    reach = list(e.get("acceptance_by_position") or [])
    reach += [None] * (depth - len(reach))
    label = e["tree"] if e["method"] == "tree" else f"{e['method']} {e['tree']}"
    body.append([f"{e['temperature']:g}", label, _fmt(e.get("nodes_per_call"), ".0f"),
                 _fmt(e.get("verify_cost")), _fmt(e.get("tokens_per_iteration")),
                 _fmt(e.get("speedup"))] + [_fmt(r, ".3f") for r in reach])
  return _markdown_table(header, body)


def format_samples(results: dict, width: int = 100) -> str:
  s = results.get("samples") or {}
  if not s.get("continuations"):
    return ""
  out = [f"\nPrompt {s['prompt_index']} at temperature {s['temperature']:g}:",
         "  " + repr(s["prompt"])[:width]]
  texts = s["continuations"]
  for label, text in texts.items():
    out.append(f"  {label:<28} {repr(text)[:width]}")
  if s["temperature"] == 0:
    ar = [t for k, t in texts.items() if k.startswith("autoregressive ")]
    exact = [m for m, e in METHODS.items()  # every exact method: not the draft alone, not hf_*
             if not e.hf and e.role == "target" and m != "autoregressive"]
    specs = [t for k, t in texts.items() if k.split(" ", 1)[0] in exact]
    if ar and specs:
      same = all(t == ar[0] for t in specs)
      out.append("  speculative == autoregressive: " + ("yes, token for token" if same else
                                                       "NO (see the greedy=AR column)"))
  return "\n".join(out)


# ----------------------------------------------------------------------------------------- plots


def _save(fig, out_dir: str, plot: str) -> str:
  """Writes one figure as ``PLOT_FILES[plot]`` in ``out_dir``, closes it, returns the path."""
  import matplotlib.pyplot as plt

  path = os.path.join(out_dir, PLOT_FILES[plot])
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def make_plots(results: dict, out_dir: str) -> dict[str, str]:
  """Writes the PNG plots (matplotlib, Agg) for the speculative settings; returns {name: path}."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator

  os.makedirs(out_dir, exist_ok=True)
  temps = _temperatures(results)
  spec = {t: _spec_rows(results, t) for t in temps}
  if not any(spec.values()):
    return {}
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  paths = {}

  # 1. Speedup and tokens per target call vs gamma, one line per temperature.
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
  for i, t in enumerate(temps):
    rows, c = spec[t], colors[i % len(colors)]
    if not rows:
      continue
    g = [e["gamma"] for e in rows]
    ax1.plot(g, [_num(e.get("speedup")) for e in rows], "o-", color=c, label=f"T={t:g} measured")
    if any(_num(e.get("theoretical_speedup")) is not None for e in rows):
      ax1.plot(g, [_num(e.get("theoretical_speedup")) for e in rows], "s--", color=c, alpha=0.6,
               label=f"T={t:g} theory")
    ax2.plot(g, [_num(e.get("tokens_per_target_call")) for e in rows], "o-", color=c,
             label=f"T={t:g} measured")
    ax2.plot(g, [_num(e.get("expected_tokens_per_call")) for e in rows], "s--", color=c,
             alpha=0.6, label=f"T={t:g} (1-a^(g+1))/(1-a)")
  ax1.axhline(1.0, color="gray", lw=0.8)
  for ax in (ax1, ax2):
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax1.set(xlabel="gamma (draft tokens per iteration)", ylabel="speedup vs autoregressive",
          title="Wall-time speedup")
  ax2.set(xlabel="gamma", ylabel="tokens per target call", title="Tokens per target call")
  for ax in (ax1, ax2):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  paths["speedup"] = _save(fig, out_dir, "speedup")

  # 2. Acceptance by draft position, one panel per temperature, one line per gamma.
  shown = [t for t in temps if spec[t]]
  fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.8), squeeze=False)
  for ax, t in zip(axes[0], shown):
    for j, e in enumerate(spec[t]):
      acc = [_num(a) for a in e.get("acceptance_by_position") or []]
      if acc:
        ax.plot(range(1, len(acc) + 1), acc, "o-", color=colors[j % len(colors)],
                label=f"gamma={e['gamma']}")
    alphas = [e["expected_alpha"] for e in spec[t] if _num(e.get("expected_alpha")) is not None]
    if alphas:  # i.i.d. acceptance with probability alpha: position i is accepted w.p. alpha^i
      a = sum(alphas) / len(alphas)
      longest = max(len(e.get("acceptance_by_position") or []) for e in spec[t])
      ax.plot(range(1, longest + 1), [a ** i for i in range(1, longest + 1)], "k--", lw=0.8,
              label=f"E[alpha]^i, E[alpha]={a:.2f}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="draft position i", ylabel="fraction of iterations accepted", ylim=(0, 1.05),
           title=f"Acceptance by position, T={t:g}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  paths["acceptance"] = _save(fig, out_dir, "acceptance")

  # 3. Measured vs theoretical speedup.
  fig, ax = plt.subplots(figsize=(5, 4.6))
  lim = [0.0, 0.0]
  for i, t in enumerate(temps):
    pts = [(e["theoretical_speedup"], e["speedup"], e["gamma"]) for e in spec[t]
           if _num(e.get("theoretical_speedup")) is not None and _num(e.get("speedup")) is not None]
    if not pts:
      continue
    x, y, g = zip(*pts)
    ax.scatter(x, y, color=colors[i % len(colors)], label=f"T={t:g}")
    for xi, yi, gi in pts:
      ax.annotate(f"g={gi}", (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    lim[1] = max(lim[1], *x, *y)
  lim[1] *= 1.1
  ax.plot(lim, lim, color="gray", lw=0.8, label="measured = theory")
  ax.set(xlim=lim, ylim=lim, xlabel="theoretical speedup (Leviathan Thm 3.8)",
         ylabel="measured speedup",
         title=f"Measured vs theory (c = {_fmt((results.get('cost') or {}).get('used'), '.3f')})")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  paths["theory"] = _save(fig, out_dir, "theory")
  return paths


# -------------------------------------------------------------------------------------- markdown


def markdown(results: dict, plot_paths: dict[str, str] | None = None) -> str:
  """The report: setup, command, main table, Leviathan-style table, cost ratio, samples, plots."""
  header, body = _table_cells(results)
  cfg = results.get("config", {})
  models = results.get("models", {})
  prompts = results.get("prompts", {})
  cost = results.get("cost") or {}
  md = [f"# {results.get('name', 'experiment')}", ""]
  md += ["Command:", "", "```", results.get("command", ""), "```", ""]
  md += ["## Setup", ""]
  for role, m in models.items():
    md.append(f"- {role}: `{m['spec']}`" + (f" ({m['path']})" if m.get("path") and
                                          m["path"] != m["spec"] else "")
              + f", {m['params'] / 1e6:.2f}M parameters, {m['layers']} layers, hidden "
              f"{m['hidden_size']}, vocabulary {m['vocab_size']}")
  for field, h in (results.get("heads") or {}).items():
    md.append(f"- {field}: `{h['path']}`, {h['kind']}, {h['params'] / 1e6:.2f}M parameters")
  if prompts:
    md.append(f"- prompts: `{prompts['source']}`, {prompts['count']} prompts of "
              f"{prompts['tokens_min']}-{prompts['tokens_max']} tokens, {prompts['batches']} "
              f"batches of {prompts['batch_size']}")
  md.append(f"- max_new_tokens {cfg.get('max_new_tokens')}, repeats {cfg.get('repeats')}, seed "
            f"{cfg.get('seed')}, top_k {cfg.get('top_k')}, top_p {cfg.get('top_p')}, dtype "
            f"{cfg.get('dtype')}")
  v = results.get("versions", {})
  md.append("- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
  m = results.get("machine", {})
  if m:
    md.append(f"- machine: {m.get('platform')}, {m.get('processor')}, {m.get('cpu_count')} CPUs, "
              f"jax backend {m.get('jax_backend')} ({', '.join(m.get('devices', []))})")
  md.append(f"- created {results.get('created')}, wall time {results.get('wall_s', 0):.0f}s")
  md += ["", "## Results", "",
         "tokens/s: median over interleaved repeats; speedup: vs autoregressive at the same "
         "temperature; range: lowest-highest of the repeats' own speedups (each repeat runs "
         "every setting on every batch, interleaved), a measure of the machine's noise; "
         "accept: accepted / proposed draft tokens; E[alpha]: mean of "
         "sum_x min(p, q) over verified positions; tok/call: tokens per target forward (prefill "
         "included; tok/iteration in the next table leaves the prefill out); formula: "
         "(1 - a^(g+1)) / (1 - a) at a = E[alpha]; theory: Leviathan et al. Thm 3.8 speedup at "
         "E[alpha] and the cost ratio c, which takes the (gamma + 1)-token verification pass to "
         "cost one target step; meas/theory: measured over that (1 = the "
         "formula's ideal); v: the verification pass's measured cost in target steps; iter: a "
         "bare iteration's measured cost in target steps (gamma greedy draft steps, then that "
         "pass, the two models in turn, nothing else; sampled drafts cost a little more; the "
         "theory takes gamma c + 1; above gamma c + v where the models, run in turn, each run "
         "slower than timed alone); meas/model: measured over the formula's tokens per "
         "iteration / iter, times the share of rows kept busy (a batch iterates until its "
         "slowest row is done; 'rows busy' in the next table), so what remains is work outside "
         "the models' steps (verification, rollback and bookkeeping, each call's setup and "
         "prefills; for a draft-free method, whose iteration is one pass over the pending token "
         "and its guesses, v is that pass and the model is tok/iteration / v); ours/HF (when transformers ran): specjax tokens/s over transformers' "
         "(autoregressive over greedy/sampling generate, "
         "speculative over assisted generation, prompt lookup over its prompt lookup, at the same gamma); hf_* rows' speedup is vs "
         "hf_autoregressive; greedy=AR: "
         "fraction of prompts whose greedy tokens equal specjax autoregressive's; compile s: first "
         "call (on the first batch) minus that batch's median timed call.", "",
         _markdown_table(header, body), ""]
  trees = tree_table(results)
  if trees:
    md += ["## Trees and multi-draft methods", "",
           "nodes: candidates verified per target pass; v: that pass over [pending, nodes] in "
           "target steps; reach d: share of iterations whose accepted path reaches depth d "
           "(for SpecTr, d drafts of one chain); tok/iteration leaves the prefill out.", "",
           trees, ""]
  if choice_lines(results):
    md += ["## Adaptive choices", "", "Share of loop iterations that ran each draft length "
           "(0: plain decoding).", ""] + choice_lines(results) + [""]
  lev = leviathan_table(results)
  if lev:
    md += ["## Against the closed forms (Leviathan et al. 2023, Tables 2-3 shape)", "", lev, ""]
  if cost:
    md += ["## Cost ratio", ""]
    if cost.get("target_step_ms") is not None:
      md.append(f"- one decoding step (inside a jitted loop) at batch {cost.get('batch')}, context "
                f"{cost.get('context')}: target {cost['target_step_ms']:.3f} ms"
                + (f", draft {cost['draft_step_ms']:.3f} ms -> c = {cost['cost_ratio']:.3f}"
                   if cost.get("draft_step_ms") is not None else ""))
    for g, ms in (cost.get("target_verify_ms") or {}).items():
      md.append(f"- target verification pass over gamma + 1 = {int(g) + 1} tokens: {ms:.3f} ms "
                f"({ms / cost['target_step_ms']:.2f}x one step)")
    for g, ms in (cost.get("iteration_ms") or {}).items():
      md.append(f"- bare iteration at gamma = {g} (the draft's steps, then that pass): {ms:.3f} "
                f"ms ({ms / cost['target_step_ms']:.2f}x one target step)")
    for name, c in (cost.get("head_cost_ratio") or {}).items():
      md.append(f"- {name} head: one drafting step {cost['head_step_ms'][name]:.3f} ms -> c = {c:.3f}")
    md += [f"- {n} prefix layer (once per iteration): {c:.3f} target steps"
           for n, c in (cost.get("prefix_cost_ratio") or {}).items()]
    if cost.get("cost_ratio_ar") is not None:
      md.append(f"- from autoregressive tokens/s (target alone / draft alone): c = "
                f"{cost['cost_ratio_ar']:.3f}")
    if cost.get("self_speculative"):
      md.append(f"- {_self_draft_note(results)} (self_speculative rows use it)")
    md.append(f"- used for the theory: c = {_fmt(cost.get('used'), '.3f')} "
              f"({cost.get('used_source')})")
    for t, o in (results.get("optimal_gamma") or {}).items():
      md.append(f"- T={float(t):g}: {optimal_gamma_note(o)}")
    md.append("")
  memory = memory_lines(results)
  if memory:
    md += ["## Memory per device", "",
           "From each setting's compiled loop (``sj.compile_generate(...).memory_analysis()``): "
           "arguments are the weights (target and draft) and the prompts; temporaries hold the "
           "KV caches and the activations; under a mesh, one device's share.", ""] + memory + [""]
  samples = format_samples(results, width=400)
  if samples:
    md += ["## Sample", "", "```", samples.strip(), "```", ""]
  if plot_paths:
    md += ["## Plots", ""]
    for name, path in plot_paths.items():
      md.append(f"![{name}]({os.path.basename(path)})")
    md.append("")
  return "\n".join(md)


# ----------------------------------------------------------------------------------------- files


def write_report(results: dict, out_dir: str, plots: bool = True) -> dict[str, str]:
  """Writes ``results.json``, ``report.md`` and (``plots``) the PNGs; returns {name: path}."""
  os.makedirs(out_dir, exist_ok=True)
  paths = make_plots(results, out_dir) if plots else {}
  results_path = os.path.join(out_dir, "results.json")
  with open(results_path, "w") as f:
    json.dump(_json_safe({k: v for k, v in results.items() if k != "files"}), f, indent=1)
  report_path = os.path.join(out_dir, "report.md")
  with open(report_path, "w") as f:
    f.write(markdown(results, paths))
  return {"results": results_path, "report": report_path, **paths}


def load_results(path: str) -> dict:
  """A ``results.json`` back as a dict (null -> nan where the report expects numbers)."""
  with open(path) as f:
    results = json.load(f)
  for e in results.get("settings", []):
    for k, v in list(e.items()):
      if v is None and k not in ("gamma", "tree", "target_calls", "draft_calls", "proposed",
                                 "accepted"):
        e[k] = float("nan")
  return results


if __name__ == "__main__":
  if len(sys.argv) not in (2, 3):
    sys.exit("usage: python -m experiments.report RESULTS_JSON [OUT_DIR]")
  res = load_results(sys.argv[1])
  out = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(sys.argv[1]))
  written = write_report(res, out)
  print(format_table(res))
  print("wrote", ", ".join(written.values()))
