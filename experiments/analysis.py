"""From an experiment's timed records to its figures: per setting tokens/s, speedups, acceptance,
ours over transformers', the cost model's theory and measured-over-modelled ratios, greedy
token-exactness, the formula's optimal gamma and the sample continuations."""

from __future__ import annotations

import hashlib
import math
import statistics

import numpy as np

from experiments.methods import (ADAPTIVE, CHAIN, HEAD, METHODS, PASS, SELF, TREE, TREE_BASES,
                                 tree_of)
from experiments.runconfig import setting_key, setting_label
from specjax import costs, metrics


def busy_over_baseline(entry: dict, base: dict | None) -> float:
  """The share of rows a setting kept busy, relative to its autoregressive baseline's (1 when
  there is none or it is unknown): a batch iterates until its slowest row is done."""
  base_busy = (base or {}).get("row_utilisation", 1.0)
  return entry["row_utilisation"] / (base_busy if math.isfinite(base_busy) else 1.0)


def _entry(rec: dict) -> dict:
  """A record's own figures: tokens/s per repeat, summed stats, compile time, output hash."""
  tps = [n / t for n, t in zip(rec["tokens"], rec["times"])]
  entry = {k: rec[k] for k in ("method", "gamma", "tree", "temperature", "top_k", "top_p",
                               "mesh", "memory")}
  entry.update({k: rec[k] for k in ("rule", "base", "base_tree", "choices", "passes",
                                    "draft_widths", "cost_table", "verify", "prior",
                                    "prior_evidence", "prior_tally", "calibration_s",
                                    "calibration_from", "calibration_error", "draft_skips",
                                    "probe_cost")
                if k in rec})
  # The greedy/sampled outputs of the first timed repeat, to compare runs (e.g. one process
  # against several) without storing every token.
  entry["outputs_sha256"] = hashlib.sha256(
      np.ascontiguousarray(rec["outputs"], np.int32).tobytes()).hexdigest()
  entry.update(rec["stats"].summary())
  entry.update(
      tokens_per_s=statistics.median(tps), tokens_per_s_runs=tps, seconds_runs=rec["times"],
      tokens_per_pass=statistics.median(rec["tokens"]), warmup_s=rec["warmup_s"],
      compile_s=max(0.0, rec["warmup_s"] - statistics.median(rec["first_batch_s"])))
  if rec["method"] == "hf_autoregressive":
    entry["tokens_per_target_call"] = 1.0  # by definition
  return entry


def _cost_ratio(config, cost: dict, find) -> float | None:
  """The cost ratio c the theory uses (config, else whole autoregressive runs with
  cost_ratio_source="ar", else the measured steps); recorded in ``cost``."""
  cost_ratio, source = None, None
  if config.cost_ratio > 0:
    cost_ratio, source = float(config.cost_ratio), "config"
  ar_ratios = {}
  for t in config.temperatures:
    ar, dr = find("autoregressive", float(t)), find("draft_autoregressive", float(t))
    if ar and dr:
      ar_ratios[float(t)] = ar["tokens_per_s"] / dr["tokens_per_s"]
  if ar_ratios:
    cost["cost_ratio_ar"] = statistics.median(ar_ratios.values())
    cost["cost_ratio_ar_by_temperature"] = {str(k): v for k, v in ar_ratios.items()}
  if cost_ratio is None:
    if config.cost_ratio_source == "ar" and "cost_ratio_ar" in cost:
      cost_ratio, source = cost["cost_ratio_ar"], "ar"
    elif "cost_ratio" in cost:
      cost_ratio, source = cost["cost_ratio"], "step"
  cost["used"], cost["used_source"] = cost_ratio, source
  return cost_ratio


def _chain_model(e: dict, pair_cost: dict, ratio: float | None, base: dict | None) -> None:
  """A draft chain's theory (Thm 3.8 at the cost ratio) and cost model (Eq. 1 over its measured
  bare iteration), from its own draft's measured costs."""
  alpha = e["expected_alpha"]
  a = min(max(alpha, 0.0), 1.0) if alpha == alpha else None  # None: no verified position
  if ratio is not None and a is not None:
    e["theoretical_speedup"] = metrics.expected_speedup(a, e["gamma"], ratio)
    e["measured_over_theoretical"] = e["speedup"] / e["theoretical_speedup"]
    verify_ms = (pair_cost.get("target_verify_ms") or {}).get(str(e["gamma"]))
    if verify_ms is not None:  # the (gamma + 1)-token pass in target steps (Thm 3.8: 1)
      e["verify_cost"] = verify_ms / pair_cost["target_step_ms"]
    iteration_ms = (pair_cost.get("iteration_ms") or {}).get(str(e["gamma"]))
    if iteration_ms is not None:
      e["iteration_cost"] = iteration_ms / pair_cost["target_step_ms"]
      e["modelled_speedup"] = costs.modelled_speedup(a, e["gamma"], e["iteration_cost"],
                                                     busy_over_baseline(e, base))
      e["measured_over_modelled"] = e["speedup"] / e["modelled_speedup"]
  if a is not None:
    e["expected_tokens_per_call"] = metrics.expected_tokens_per_iteration(a, e["gamma"])


def _pass_model(e: dict, nodes: int, pass_cost: dict, base: dict | None, draft_free: bool) -> None:
  """The pass over [pending, ``nodes`` tokens] in target steps; for a draft-free method (an
  iteration is that one pass) the modelled speedup = tokens per iteration / that cost."""
  verify_ms = (pass_cost.get("target_verify_ms") or {}).get(str(nodes))
  if verify_ms is not None:
    e["verify_cost"] = verify_ms / pass_cost["target_step_ms"]
    if draft_free:
      e["modelled_speedup"] = (e["tokens_per_iteration"] / e["verify_cost"]
                               * busy_over_baseline(e, base))
      e["measured_over_modelled"] = e["speedup"] / e["modelled_speedup"]


def _head_model(e: dict, nodes: int, cost: dict, base: dict | None) -> None:
  """A head setting's iteration in target steps: its head passes (EAGLE: gamma for a chain, the
  tree's depth; Medusa: one) at the head's measured step cost c, Hydra++'s prefix pass (once, when
  measured), plus the verification pass over [pending,
  ``nodes``]; the modelled speedup = tokens per iteration / that (times the rows kept busy)."""
  c = (cost.get("head_cost_ratio") or {}).get(e["method"])
  verify_ms = (cost.get("target_verify_ms") or {}).get(str(nodes))
  if c is None or verify_ms is None:
    return
  e["head_cost_ratio"] = c
  e["verify_cost"] = verify_ms / cost["target_step_ms"]
  depth = e["gamma"] if e["gamma"] is not None else tree_of(e["tree"])[0].max_depth
  passes = 1 if METHODS[e["method"]].head_passes == "one" else depth  # Medusa: all heads at once
  prefix = (cost.get("prefix_cost_ratio") or {}).get(e["method"], 0.0)  # Hydra++: once
  if prefix:
    e["prefix_cost_ratio"] = prefix
  e["iteration_cost"] = passes * c + prefix + e["verify_cost"]
  e["modelled_speedup"] = (e["tokens_per_iteration"] / e["iteration_cost"]
                           * busy_over_baseline(e, base))
  e["measured_over_modelled"] = e["speedup"] / e["modelled_speedup"]


def _adaptive_model(e: dict, base: dict | None) -> None:
  """An adaptive setting's modelled speedup from its histogram of choices: the tokens a row got
  from the loop's iterations over what those iterations cost in target steps (each choice k at
  its table's ``entry_cost(k)``: its loop's own when calibrated), per call. The iterations are
  the batch's, so rows left idle are in the cost already; only the baseline's own idle rows are
  divided out."""
  counts, table = e.get("choice_counts"), e.get("cost_table")
  if not counts or not table or not e.get("calls"):
    return
  try:
    trees = e["passes"] if e.get("base") in TREE_BASES else None  # a tree menu: its passes
    cost = costs.CostTable.from_dict(table).menu_cost(e["choices"], counts, trees,
                                                      e.get("draft_widths"))
  except ValueError:  # a pass the table lacks (a choice never measured): no model
    return
  e["iteration_cost"] = cost / max(sum(counts), 1)
  base_busy = (base or {}).get("row_utilisation", 1.0)
  e["modelled_speedup"] = (e["new_tokens_per_row"] / (cost / e["calls"])
                           / (base_busy if math.isfinite(base_busy) else 1.0))
  e["measured_over_modelled"] = e["speedup"] / e["modelled_speedup"]


def analyse(config, records: list[dict], cost: dict, texts: list[str], decode) -> dict:
  """``{"settings": [...], "optimal_gamma": {...}, "samples": {...}}`` from the timed
  ``records``; adds the cost ratio used (and the autoregressive-based one) to ``cost``.
  ``decode``: token ids -> text (the run's tokenizer)."""
  results_settings = [_entry(rec) for rec in records]

  def find(method, temperature, gamma=None, tree=None, mesh="", rule=None):
    for e in results_settings:
      if setting_key(e) == (method, gamma, tree, temperature, mesh, rule):
        return e
    return None

  cost_ratio = _cost_ratio(config, cost, find)
  for e in results_settings:
    method = METHODS[e["method"]]
    # Speedup: vs the same library's autoregressive decoding at the same sampling settings.
    base = find("hf_autoregressive" if method.hf else "autoregressive", e["temperature"],
                mesh=e["mesh"])
    e["speedup"] = e["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
    if base:  # each repeat's ratio: the two settings ran interleaved in the same pass
      e["speedup_runs"] = [a / b for a, b in zip(e["tokens_per_s_runs"],
                                                  base["tokens_per_s_runs"])]
    # Ours vs transformers' counterpart (AR vs greedy/sampling generate, a chain vs assisted
    # generation, prompt lookup vs theirs) at the same gamma.
    if method.counterpart:
      gamma = e["gamma"] if METHODS[method.counterpart].sweep == "gammas" else None
      theirs = find(method.counterpart, e["temperature"], gamma)
      if theirs:
        e["tokens_per_s_over_hf"] = e["tokens_per_s"] / theirs["tokens_per_s"]
        if method.cost_model == CHAIN:
          e["tokens_per_s_over_hf_assisted"] = e["tokens_per_s_over_hf"]
    if method.hf and e["temperature"] == 0.0 and find("autoregressive", 0.0) is not None:
      e["greedy_match_vs_specjax"] = match(records, e, find("autoregressive", 0.0))
    if method.cost_model == CHAIN:
      _chain_model(e, cost, cost_ratio, base)
    elif method.cost_model == SELF:  # its draft's costs were measured apart
      _chain_model(e, cost["self_speculative"], cost["self_speculative"]["cost_ratio"], base)
    elif method.cost_model == HEAD:
      _head_model(e, method.pass_tokens(config, e), cost, base)
    elif method.cost_model == ADAPTIVE:
      _adaptive_model(e, base)
    elif method.cost_model in (TREE, PASS):
      draft_free = method.cost_model == PASS
      _pass_model(e, method.pass_tokens(config, e),
                  cost.get("draft_free", {}) if draft_free else cost, base, draft_free)
    if e["mesh"]:  # the same setting on one device: its speed, and the very same tokens
      alone = find(e["method"], e["temperature"], e["gamma"], e["tree"], rule=e.get("rule"))
      if alone is not None:
        e["over_one_device"] = e["tokens_per_s"] / alone["tokens_per_s"]
        e["same_as_one_device"] = match(records, e, alone)
    # Every exact method must reproduce the target's greedy tokens.
    ar = find("autoregressive", e["temperature"], mesh=e["mesh"])
    if (e["temperature"] == 0.0 and ar is not None and not method.hf
        and method.role == "target" and e["method"] != "autoregressive"):
      e["greedy_match"] = match(records, e, ar)

  # Optimal gamma by the formula, per temperature (alpha averaged over the gammas run), which
  # takes a pass over gamma + 1 tokens at one target step; and, where the run measured two or
  # more chain gammas, the one whose measured iteration cost models fastest (on a CPU a pass
  # costs several steps, and the two can differ: the formula's 3 against the measured 1).
  optimal = {}
  for t in config.temperatures:
    chains = [e for e in results_settings
              if METHODS[e["method"]].cost_model == CHAIN and e["temperature"] == float(t)
              and e["expected_alpha"] == e["expected_alpha"]]
    if chains and cost_ratio is not None:
      a = min(max(float(np.mean([e["expected_alpha"] for e in chains])), 0.0), 1.0)
      g = metrics.optimal_gamma(a, cost_ratio, max_gamma=16)
      optimal[str(float(t))] = {"alpha": a, "gamma": int(g),
                                "speedup": metrics.expected_speedup(a, int(g), cost_ratio)}
      modelled = [e for e in chains if e.get("modelled_speedup") is not None]
      if len({e["gamma"] for e in modelled}) > 1:
        best = max(modelled, key=lambda e: e["modelled_speedup"])
        optimal[str(float(t))]["measured"] = {"method": best["method"], "gamma": best["gamma"],
                                              "modelled_speedup": best["modelled_speedup"]}

  # Greedy sample text for one prompt.
  samples = {}
  i = int(config.sample_prompt)
  sample_settings = [r for r in records if r["temperature"] == 0.0] or \
      [r for r in records if r["temperature"] == min(config.temperatures)]
  if sample_settings:
    samples = {"prompt_index": i, "prompt": texts[i],
               "temperature": sample_settings[0]["temperature"],
               "continuations": {setting_label(r): decode(r["outputs"][i])
                                 for r in sample_settings}}
  return {"settings": results_settings, "optimal_gamma": optimal, "samples": samples}


def match(records, a: dict, b: dict) -> float:
  """Fraction of prompts whose outputs (the first timed repeat's) of settings ``a`` and ``b`` are
  identical."""

  def output(entry):
    for r in records:
      if setting_key(r) == setting_key(entry):
        return r["outputs"]
    raise KeyError(setting_label(entry))

  return float(np.mean(np.all(output(a) == output(b), axis=1)))
