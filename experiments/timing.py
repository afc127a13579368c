"""What the run's passes cost on this machine (``specjax.costs.measure_step_costs``), measured
once per run before the timed settings: the draft/target cost ratio c, the verification passes of
every chain, tree and draft-free setting in target steps, and bare speculative iterations; for
adaptive settings, every pass and iteration of their menus (their base's ``CostTable``)."""

from __future__ import annotations

from experiments.errors import log as _log
from experiments.methods import ADAPTIVE, CHAIN, COST_RULES, HEAD, METHODS, PASS, SELF, TREE


def chain_gammas(config, model: str) -> tuple[int, ...]:
  """The draft lengths whose bare iterations a chain cost model (CHAIN: the draft pair; SELF:
  the self-draft) needs measured: every gamma of a method of that model, and every positive
  choice of an adaptive menu over such a base."""
  gammas = set()
  for m in config.methods:
    if METHODS[m].cost_model == model:
      gammas.update(int(g) for g in config.gammas)
    if METHODS[m].cost_model == ADAPTIVE and METHODS[config.adaptive_method].cost_model == model:
      gammas.update(int(k) for k in config.adaptive_choices if k > 0)
  return tuple(sorted(gammas))


def _draft_free_table(steps: dict) -> dict:
  """The draft-free methods' ``CostTable`` (its ``to_dict``) from a measurement of target passes:
  the passes alone, no draft step, no bare iterations (an iteration is one pass)."""
  from specjax.costs import CostTable
  table = dict(steps["table"], draft_step=0.0, iteration={}, head_step={})
  return CostTable.from_dict(table).to_dict()


def measure_run_costs(config, models: dict, settings: list[dict], prompt_lengths: list[int],
                      batch: int) -> dict:
  """The run's ``cost`` dict: the draft pair's steps, verification passes and bare iterations
  (``models`` has a draft), the self-speculative draft's (measured apart), and the draft-free
  passes (``cost["draft_free"]``; from the draft's measurement when there is one), all greedy;
  and ``cost["sampled"]``: the tables of the adaptive settings at T > 0 (``sampled_tables``)."""
  from specjax import costs
  from specjax.models.layer_skip import skip_layers

  def passes_of(*kinds):
    widths = {METHODS[s["method"]].pass_tokens(config, s) for s in settings
              if METHODS[s["method"]].cost_model in kinds}
    for s in settings:  # an adaptive menu over a draft-free base: a pass per positive choice
      if s.get("rule") and METHODS[s["base"]].cost_model in kinds:
        widths.update(s["passes"])
    return sorted(widths - {0})

  cost: dict = {}
  tree_nodes, passes = passes_of(TREE, HEAD), passes_of(PASS)
  draft_widths = menu_draft_widths(settings)
  heads = {m: models[METHODS[m].head] for m in config.methods if METHODS[m].head}
  spec_gammas, self_gammas = chain_gammas(config, CHAIN), chain_gammas(config, SELF)
  context, cache_len = _context(config, prompt_lengths, [
      *tuple(config.gammas), *tree_nodes, *spec_gammas, *self_gammas])
  if "draft" in models or heads:
    # Verification passes over gamma + 1 tokens, over a tree's N + 1 (the mask does not change
    # the cost) and over the draft-free settings' 1 + N, all in one measurement.
    widths = tuple(sorted({1, *(g + 1 for g in spec_gammas), *(n + 1 for n in tree_nodes),
                           *(n + 1 for n in passes)}))
    _log(f"[run] measuring step costs (decoding steps in a jitted loop, "
         f"batch {batch}, context {context})")
    pair = {r: models[r] for r in ("target", "draft") if r in models}
    cost = costs.measure_step_costs(pair, batch, context, cache_len + max(passes, default=0),
                                    widths=widths, gammas=spec_gammas if "draft" in pair else (),
                                    heads=heads, draft_widths=draft_widths)
    if "draft" in pair:
      _log(f"[run]   target step {cost['target_step_ms']:.3f} ms, draft step "
           f"{cost['draft_step_ms']:.3f} ms: c = {cost['cost_ratio']:.3f}")
    for name, c in (cost.get("head_cost_ratio") or {}).items():
      _log(f"[run]   {name} head step {cost['head_step_ms'][name]:.3f} ms: c = {c:.3f}")
  if self_gammas:  # the target, layers skipped
    view = skip_layers(models["target"], tuple(config.skip))
    cost["self_speculative"] = costs.measure_step_costs(
        {"target": models["target"], "draft": view}, batch, context, cache_len,
        widths=(1,) + tuple(g + 1 for g in self_gammas), gammas=self_gammas)
    _log(f"[run]   self-speculative draft (skip {list(config.skip)}): c = "
         f"{cost['self_speculative']['cost_ratio']:.3f}")
  if passes:
    cost["draft_free"] = ({k: cost[k] for k in ("target_step_ms", "target_verify_ms")}
                          if "target_step_ms" in cost else
                          costs.measure_step_costs({"target": models["target"]}, batch, context,
                                                   cache_len + max(passes),
                                                   widths=(1, *(n + 1 for n in passes))))
    steps = cost["draft_free"]
    if any(s.get("rule") and METHODS[s["base"]].cost_model == PASS for s in settings):
      steps["table"] = _draft_free_table(cost if "table" in cost else steps)
    _log("[run]   draft-free passes, in target steps: " + ", ".join(
        f"1 + {n} tokens {steps['target_verify_ms'][str(n)] / steps['target_step_ms']:.2f}"
        for n in passes))
  sampled = sampled_tables(config, models, settings, prompt_lengths, batch)
  if sampled:
    cost["sampled"] = sampled
  return cost


def menu_draft_widths(settings: list[dict], temperature: float | None = None) -> tuple[int, ...]:
  """The draft passes (by tokens, over one) of the adaptive menus over a draft's tree among
  ``settings`` (at ``temperature`` when given): what their cost table must price."""
  return tuple(sorted({w for s in settings for entry in s.get("draft_widths") or ()
                       for w in entry if w > 1
                       and (temperature is None or s["temperature"] == temperature)}))


def _context(config, prompt_lengths: list[int], widest) -> tuple[int, int]:
  """(context, cache length) of the run's timings: the mean prompt plus half the new tokens in
  the cache, room for the longest prompt, the new tokens and the ``widest`` pass's drafts."""
  import numpy as np
  context = int(np.mean(prompt_lengths)) + int(config.max_new_tokens) // 2
  return context, max(prompt_lengths) + int(config.max_new_tokens) + max([*widest, 0]) + 2


def sampled_tables(config, models: dict, settings: list[dict], prompt_lengths: list[int],
                   batch: int) -> dict:
  """``{temperature: {base: CostTable.to_dict()}}`` for the cost rule's adaptive settings at
  T > 0: their base's passes and bare iterations timed again at the run's sampling (a sampled
  iteration draws its drafts and applies rejection sampling: on SmolLM2 + draft 1-9% dearer
  than the run's greedy iterations, growing with gamma). Keys are the temperatures as
  ``f"{t:g}"``."""
  from specjax import costs
  from specjax.models.layer_skip import skip_layers
  from specjax.sampling import Sampling
  chosen = [s for s in settings if s.get("rule") in COST_RULES and s["temperature"] > 0]
  out: dict = {}
  for t in sorted({s["temperature"] for s in chosen}):
    sampling = Sampling(temperature=t, top_k=int(config.top_k), top_p=float(config.top_p))
    for base in sorted({s["base"] for s in chosen if s["temperature"] == t}):
      # each entry's candidates: a chain's drafts, a draft-free tree's nodes (``adaptive_passes``)
      menu = sorted({p for s in chosen if s["temperature"] == t and s["base"] == base
                     for p in s["passes"] if p > 0})
      context, cache_len = _context(config, prompt_lengths, menu)
      kind = METHODS[base].cost_model
      drafted: dict = {}
      if kind == PASS:  # one target pass over the pending token and the candidates
        pair, widths, gammas = {"target": models["target"]}, (1, *(k + 1 for k in menu)), ()
      elif kind == TREE:  # a draft's tree: its draft passes and the target's over the nodes
        pair, widths, gammas = ({"target": models["target"], "draft": models["draft"]},
                                (1, *(k + 1 for k in menu)), ())
        drafted["draft_widths"] = menu_draft_widths(
            [s for s in chosen if s["base"] == base], t)
      else:
        draft = (models["draft"] if kind == CHAIN
                 else skip_layers(models["target"], tuple(config.skip)))
        pair, widths, gammas = {"target": models["target"], "draft": draft}, (1,), tuple(menu)
      _log(f"[run] measuring {base}'s passes at T = {t:g} (adaptive menu {menu})")
      table = costs.measure(pair, batch, context, cache_len, widths=widths, gammas=gammas,
                            sampling=sampling, **drafted)[0].to_dict()
      out.setdefault(f"{t:g}", {})[base] = table
  return out
