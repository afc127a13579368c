r"""How ``sj.Adaptive``'s estimator settings (decay, prior, forget, margin) do against every
fixed draft length, under one measured cost table: the measurement behind its defaults.

    python -m experiments.adaptive_tune --target=smollm2-135m --draft=smollm2-draft \
        --prompts=code-edit --batch_size=1 --num_prompts=4 --prompt_tokens=192 \
        --max_new_tokens=64 --chat_template

Each prompt set's first ``num_prompts`` prompts, ``batch_size`` at a time (batch 1: each row's
choices follow its own text, as in the runner's batch-1 cells). ``--warm`` (default) adds the
defaults warmed as the runner's cost rule is (``sj.Adaptive.warmed``: every call started from the
estimates a call on the first batch ended with), for the defaults, each of ``--drifts`` and the
rule with its check of its own model toggled (``correct``; cold and warmed).

Costs. One ``sj.CostTable`` is measured first (the target's passes over 1..G + 1 tokens, the
draft step and a bare iteration per draft length, jitted and timed side by side at the run's
batch and a context of the prompts plus half the new tokens); it is printed and saved
(``--costs_out``), or read back with ``--costs_in`` so that later runs model the same machine
(a saved table, or a runner's results.json: the table its cost rule priced by at T = 0, so that
a timed cell's choices replay free of timing noise).

Figure of merit. Greedy decoding makes every setting's tokens, iterations and choices a pure
function of the models, the prompts and the table, so the comparison is free of timing noise:
modelled throughput = tokens / sum over iterations of the iteration's cost in target steps (a
fixed gamma: ``entry_cost(gamma)`` per iteration; the adaptive rule: ``sum_k counts_k
entry_cost(k)`` over its choice histogram), relative to autoregressive decoding's (its tokens
per ``entry_cost(0)``: the rows still decoding); a skipped draft's catch-up passes are left out
of it unless the table was calibrated (``--costs_in`` of a runner's calibrated one: every
entry at its loop's own iteration, ``sj.Adaptive.calibrated``). Wall clock of one timed call
per setting is printed beside it (the setting's time over autoregressive decoding's: noisy on a
shared CPU; the runner's ``configs/adaptive.py`` times them with repeats).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time

import numpy as np
from absl import app, flags

from experiments import cost_split  # noqa: F401  (the shared flags: target, draft, prompts, ...)

FLAGS = flags.FLAGS


def define_flags() -> None:
  """This tool's flags (beside ``cost_split``'s shared ones), defined when it runs, so that
  tests can import it."""
  flags.DEFINE_integer("max_new_tokens", 64, "new tokens per prompt")
  flags.DEFINE_integer("num_prompts", 0, "prompts of the set to decode, batch_size at a time "
                       "(0: one batch)")
  flags.DEFINE_list("choices", ["0", "1", "2", "3", "4", "6"], "the adaptive menu")
  flags.DEFINE_list("decays", ["0.1", "0.3", "0.6"], "EMA weights to try")
  flags.DEFINE_list("priors", ["0.3", "0.6", "0.9"], "priors to try")
  flags.DEFINE_list("forgets", ["0.02", "0.05", "0.2"], "drift rates to try (at the default "
                    "decay and prior)")
  flags.DEFINE_list("margins", ["0.05", "0.1"], "hysteresis margins to try (at the default "
                    "decay and prior)")
  flags.DEFINE_list("drifts", ["first"], "where untested positions drift, to try (at the other "
                    "defaults; warmed too with --warm)")
  flags.DEFINE_list("rules", ["schedule", "confidence"], "the other rules to run beside")
  flags.DEFINE_bool("warm", True, "also the defaults warmed (sj.Adaptive.warmed): every call "
                    "started from the estimates the first batch's call ended with")
  flags.DEFINE_bool("chat_template", False, "wrap the prompts in the tokenizer's chat template")
  flags.DEFINE_string("costs_in", "", "a saved sj.CostTable to model with (skip the "
                        "measurement), or a runner's results.json (``table_from``)")
  flags.DEFINE_string("costs_out", "", "where to save the measured sj.CostTable")


def table_from(path: str, temperature: float = 0.0):
  """``--costs_in``'s ``sj.CostTable``: a saved table, or a runner's results.json, whose first
  cost-rule setting at ``temperature`` holds the table its rule priced by (the calibrated one
  where the run calibrated); errors name the path."""
  import specjax as sj
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError):
    return sj.CostTable.load(path)  # its errors name the path and what is wrong
  if not isinstance(data, dict) or "settings" not in data:
    return sj.CostTable.load(path)
  tables = [s["cost_table"] for s in data["settings"] if s.get("rule") == "cost"
            and s.get("temperature") == temperature and s.get("cost_table")]
  if not tables:
    raise ValueError(f"{path}: a results.json without a cost-rule setting at T = "
                     f"{temperature:g}")
  return sj.CostTable.from_dict(tables[0])


@dataclasses.dataclass
class Totals:
  """One setting's batches, summed: tokens after the prefill's, target calls after the
  prefill, the choice histogram (adaptive; empty otherwise)."""
  tokens: int
  calls: int
  choices: np.ndarray

  @property
  def tokens_per_call(self) -> float:
    return self.tokens / max(self.calls, 1)


def modelled(totals: Totals, table, choices) -> float:
  """Tokens per target step under ``table`` for an adaptive setting's batches."""
  try:
    cost = table.menu_cost(choices, totals.choices)
  except ValueError:  # a length the table has no pass for (a loaded table, another menu)
    return float("nan")
  return totals.tokens / cost


def run_one(target, batches, method, tokens: int, eos):
  """(Totals, seconds of the timed calls) over ``batches`` (each compiled first)."""
  import jax

  import specjax as sj
  made, seconds = [], 0.0
  for prompts in batches:
    sj.generate(target, prompts, method, max_new_tokens=tokens, eos_token_id=eos)  # compile
    t0 = time.perf_counter()
    out = sj.generate(target, prompts, method, max_new_tokens=tokens, eos_token_id=eos)
    jax.block_until_ready(out.tokens)
    seconds += time.perf_counter() - t0
    made.append(out.stats)
  return Totals(
      tokens=sum(int(np.sum(s.generated)) - len(s.generated) for s in made),
      calls=sum(int(s.target_calls) - 1 for s in made),
      choices=sum(np.asarray(s.choice_counts) for s in made)), seconds


def main(argv):
  del argv
  import specjax as sj
  from experiments import models
  from specjax import options

  choices = tuple(int(k) for k in FLAGS.choices)
  gammas = tuple(k for k in choices if k > 0)
  target, draft, prompts, _ = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.num_prompts or FLAGS.batch_size,
      FLAGS.prompt_tokens, gammas, 0.0, FLAGS.max_new_tokens, chat_template=FLAGS.chat_template)
  size = FLAGS.batch_size
  batches = [prompts[i:i + size] for i in range(0, len(prompts), size)]
  eos = getattr(target.config, "eos_token_id", None)
  if FLAGS.costs_in:
    try:
      table = table_from(FLAGS.costs_in)
    except (OSError, ValueError) as error:
      raise app.UsageError(str(error)) from None
  else:
    context = int(np.mean([len(p) for p in prompts])) + FLAGS.max_new_tokens // 2
    table = sj.CostTable.measure(
        target, draft, batch=size, context=context,
        cache_length=context + max(gammas) + 2, widths=tuple(range(1, max(gammas) + 2)),
        gammas=gammas)
    if FLAGS.costs_out:
      table.save(FLAGS.costs_out)
  print("costs:", json.dumps(table.to_dict()))
  print(f"{'setting':44s} {'tok/call':>8s} {'modelled':>8s} {'wall s':>7s}  choices")
  ar_out, ar_s = run_one(target, batches, sj.Autoregressive(), FLAGS.max_new_tokens, eos)
  rows = {}

  def show(name, out, seconds, model):
    rows[name] = model
    counts = [int(c) for c in out.choices] if np.ndim(out.choices) else ""
    print(f"{name:44s} {out.tokens_per_call:8.3f} {model:8.3f} "
          f"{seconds / ar_s:7.3f}  {counts}", flush=True)

  ar_rate = ar_out.tokens / (ar_out.calls * table.entry_cost(0))  # per target step (all rows)
  show("autoregressive", ar_out, ar_s, 1.0)
  for g in gammas:
    out, s = run_one(target, batches, sj.Speculative(draft, gamma=g), FLAGS.max_new_tokens, eos)
    show(f"speculative gamma {g}", out, s,
         out.tokens / (out.calls * table.entry_cost(g)) / ar_rate)
  default = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=choices, costs=table)
  settings = [dict(decay=float(d), prior=float(p)) for d, p in
              itertools.product(FLAGS.decays, FLAGS.priors)]
  settings += [dict(forget=float(f)) for f in FLAGS.forgets if float(f) != default.forget]
  settings += [dict(margin=float(m)) for m in FLAGS.margins if float(m) != default.margin]
  drifts = [d for d in FLAGS.drifts if d != default.drift]
  settings += [dict(drift=d) for d in drifts] + [dict(correct=not default.correct)]
  settings += [dict(rule=rule) for rule in FLAGS.rules]
  for kwargs in settings:
    menu = tuple(range(1, max(choices) + 1)) if kwargs.get("rule") == "confidence" else choices
    method = dataclasses.replace(default, choices=menu, **kwargs)
    out, s = run_one(target, batches, method, FLAGS.max_new_tokens, eos)
    name = "adaptive " + " ".join(f"{k}={v}" for k, v in kwargs.items())
    show(name, out, s, modelled(out, table, method.choices) / ar_rate)
  warm_settings = [{}] + [dict(drift=d) for d in drifts] + [dict(correct=not default.correct)]
  for kwargs in warm_settings if FLAGS.warm else ():
    # as the runner's adaptive_warm: from where a call on the first batch ended
    cold = dataclasses.replace(default, **kwargs)
    first = sj.generate(target, batches[0], cold, max_new_tokens=FLAGS.max_new_tokens,
                        eos_token_id=eos)
    warm = cold.warmed(first.stats)
    out, s = run_one(target, batches, warm, FLAGS.max_new_tokens, eos)
    prior = " ".join(f"{p:.2f}" for p in warm.prior)
    name = " ".join(f"{k}={v}" for k, v in kwargs.items())
    show(f"adaptive warmed {name or 'defaults'} (prior {prior})", out, s,
         modelled(out, table, warm.choices) / ar_rate)
  best_fixed = max(v for k, v in rows.items() if k.startswith("speculative"))
  defaults = rows.get(f"adaptive decay={default.decay} prior={options.ADAPTIVE_DEFAULTS['prior']}")
  print(f"best fixed gamma (modelled): {best_fixed:.3f}; adaptive defaults: "
        f"{'not in the grid' if defaults is None else f'{defaults:.3f}'}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
