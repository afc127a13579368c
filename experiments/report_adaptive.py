"""The report's notes on how many tokens to draft: the optimal gamma (the formula's, and the
measured pass costs'), and the adaptive settings (``sj.Adaptive``, runner method "adaptive"):
their label in the speed table and the histogram of the draft lengths each chose, as fractions
per menu entry."""

from __future__ import annotations


def adaptive_label(e: dict) -> str:
  """``adaptive cost (speculative 0..6)``: the rule, the base method (a draft's tree: with its
  spec, ``tree dynamic:6x4x24``) and the menu's range."""
  choices = list(e.get("choices") or [e.get("gamma")])
  base = " ".join(str(part) for part in (e.get("base"), e.get("base_tree")) if part)
  return f"adaptive {e['rule']} ({base} {choices[0]}..{choices[-1]})"


def choice_lines(results: dict) -> list[str]:
  """One line per adaptive setting: the share of loop iterations that ran each menu entry (and
  the per-position prior its timed calls started from, where the warm-up set it)."""
  out = []
  for e in results.get("settings", []):
    counts = e.get("choice_counts")
    if not e.get("rule") or not counts:
      continue
    total = sum(counts) or 1
    shares = ", ".join(f"{k}: {n / total:.2f}" for k, n in zip(e["choices"], counts))
    mesh = f" mesh={e['mesh']}" if e.get("mesh") else ""
    prior = (f"; prior from the warm-up {' '.join(f'{p:.2f}' for p in e['prior'])}"
             if e.get("prior") else "")
    if e.get("prior_evidence"):
      prior += f" over {' '.join(f'{n:.0f}' for n in e['prior_evidence'])} observations"
    loop = (e.get("cost_table") or {}).get("loop")
    if loop:  # sj.Adaptive.calibrated: each entry's loop iteration, in target steps
      timed = (f"timed by {e['calibration_from']}" if e.get("calibration_from")
               else f"{e.get('calibration_s', 0.0):.0f} s")
      bare = (e.get("cost_table") or {}).get("autoregressive")
      bare = f", a skipped call's {bare:.2f}" if bare else ""
      prior += (f"; priced by its loop ({' '.join(f'{k}: {v:.2f}' for k, v in loop.items())} "
                f"target steps{bare}, {timed})")
    elif e.get("calibration_error"):
      prior += f"; priced by the bare table ({e['calibration_error']})"
    if e.get("probe_cost"):  # the warm-up's call priced against a skipped call's
      prior += f"; the warm-up's call cost {e['probe_cost']:.3f}x a skipped call's"
    skips = e.get("draft_skips")
    if skips:  # sj.Adaptive(probe_every=): calls run without the draft, the rest probes
      prior += (f"; draft skipped in {skips[0]} of {skips[1]} timed calls (the shares above: "
                f"the probes')")
    out.append(f"- {adaptive_label(e)}{mesh} T={e['temperature']:g}: {shares} "
               f"({sum(counts)} iterations{prior})")
  return out


def optimal_gamma_note(optimal: dict) -> str:
  """The formula's optimal gamma (every pass at one target step: c alone) and, where the run
  timed several gammas, the one its measured iteration costs model fastest."""
  note = (f"formula's optimal gamma {optimal['gamma']} (alpha {optimal['alpha']:.3f}, speedup "
          f"{optimal['speedup']:.2f}, each pass at one target step)")
  measured = optimal.get("measured")
  if measured:
    note += (f"; by the measured pass costs, {measured['method']} gamma {measured['gamma']} "
             f"(modelled {measured['modelled_speedup']:.2f}x)")
  return note
