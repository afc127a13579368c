"""What the run's passes cost on this machine (``specjax.costs.measure_step_costs``), measured
once per run before the timed settings: the draft/target cost ratio c, the verification passes of
every chain, tree and draft-free setting in target steps, and bare speculative iterations."""

from __future__ import annotations

from experiments.errors import log as _log
from experiments.methods import CHAIN, HEAD, METHODS, PASS, SELF, TREE


def measure_run_costs(config, models: dict, settings: list[dict], prompt_lengths: list[int],
                      batch: int) -> dict:
  """The run's ``cost`` dict: the draft pair's steps, verification passes and bare iterations
  (``models`` has a draft), the self-speculative draft's (measured apart), and the draft-free
  passes (``cost["draft_free"]``; from the draft's measurement when there is one)."""
  import numpy as np

  from specjax import costs
  from specjax.models.transformer import skip_layers

  def passes_of(*kinds):
    return sorted({METHODS[s["method"]].pass_tokens(config, s) for s in settings
                   if METHODS[s["method"]].cost_model in kinds} - {0})

  cost: dict = {}
  context = int(np.mean(prompt_lengths)) + int(config.max_new_tokens) // 2
  tree_nodes, passes = passes_of(TREE, HEAD), passes_of(PASS)
  heads = {m: models[METHODS[m].head] for m in config.methods if METHODS[m].head}
  cache_len = (max(prompt_lengths) + int(config.max_new_tokens)
               + max([*tuple(config.gammas), *tree_nodes, 0]) + 2)
  if "draft" in models or heads:
    spec_gammas = tuple(int(g) for g in config.gammas) if any(
        METHODS[m].cost_model == CHAIN for m in config.methods) else ()
    # Verification passes over gamma + 1 tokens, over a tree's N + 1 (the mask does not change
    # the cost) and over the draft-free settings' 1 + N, all in one measurement.
    widths = tuple(sorted({1, *(g + 1 for g in spec_gammas), *(n + 1 for n in tree_nodes),
                           *(n + 1 for n in passes)}))
    _log(f"[run] measuring step costs (decoding steps in a jitted loop, "
         f"batch {batch}, context {context})")
    pair = {r: models[r] for r in ("target", "draft") if r in models}
    cost = costs.measure_step_costs(pair, batch, context, cache_len + max(passes, default=0),
                                    widths=widths, gammas=spec_gammas if "draft" in pair else (),
                                    heads=heads)
    if "draft" in pair:
      _log(f"[run]   target step {cost['target_step_ms']:.3f} ms, draft step "
           f"{cost['draft_step_ms']:.3f} ms: c = {cost['cost_ratio']:.3f}")
    for name, c in (cost.get("head_cost_ratio") or {}).items():
      _log(f"[run]   {name} head step {cost['head_step_ms'][name]:.3f} ms: c = {c:.3f}")
  if any(METHODS[m].cost_model == SELF for m in config.methods):  # the target, layers skipped
    gammas = tuple(int(g) for g in config.gammas)
    view = skip_layers(models["target"], tuple(config.skip))
    cost["self_speculative"] = costs.measure_step_costs(
        {"target": models["target"], "draft": view}, batch, context, cache_len,
        widths=(1,) + tuple(g + 1 for g in gammas), gammas=gammas)
    _log(f"[run]   self-speculative draft (skip {list(config.skip)}): c = "
         f"{cost['self_speculative']['cost_ratio']:.3f}")
  if passes:
    cost["draft_free"] = ({k: cost[k] for k in ("target_step_ms", "target_verify_ms")}
                          if "target_step_ms" in cost else
                          costs.measure_step_costs({"target": models["target"]}, batch, context,
                                                   cache_len + max(passes),
                                                   widths=(1, *(n + 1 for n in passes))))
    steps = cost["draft_free"]
    _log("[run]   draft-free passes, in target steps: " + ", ".join(
        f"1 + {n} tokens {steps['target_verify_ms'][str(n)] / steps['target_step_ms']:.2f}"
        for n in passes))
  return cost
