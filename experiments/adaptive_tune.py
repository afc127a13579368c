r"""How ``sj.Adaptive``'s estimator settings (decay, prior, forget) do against every fixed draft
length, under one measured cost table: the measurement behind its defaults.

    python -m experiments.adaptive_tune --target=smollm2-135m --draft=smollm2-draft \
        --prompts=code-edit --batch_size=1 --max_new_tokens=64 --chat_template

Costs. One ``sj.CostTable`` is measured first (the target's passes over 1..G + 1 tokens, the
draft step and a bare iteration per draft length, jitted and timed side by side at the run's
batch and a context of the prompts plus half the new tokens); it is printed and saved
(``--costs_out``), or read back with ``--costs_in`` so that later runs model the same machine.

Figure of merit. Greedy decoding makes every setting's tokens, iterations and choices a pure
function of the models, the prompts and the table, so the comparison is free of timing noise:
modelled throughput = tokens / sum over iterations of the iteration's cost in target steps (a
fixed gamma: ``chain_cost(gamma)`` per iteration; the adaptive rule: ``sum_k counts_k
chain_cost(k)`` over its choice histogram), relative to autoregressive decoding (1 token per
target step). Wall clock of one timed call per setting is printed beside it (noisy on a shared
CPU; the runner's ``configs/adaptive.py`` times them with repeats).
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
flags.DEFINE_integer("max_new_tokens", 64, "new tokens per prompt")
flags.DEFINE_list("choices", ["0", "1", "2", "3", "4", "6"], "the adaptive menu")
flags.DEFINE_list("decays", ["0.1", "0.3", "0.6"], "EMA weights to try")
flags.DEFINE_list("priors", ["0.3", "0.6", "0.9"], "priors to try")
flags.DEFINE_list("forgets", ["0.02", "0.05", "0.2"], "drift rates to try (at the default "
                  "decay and prior)")
flags.DEFINE_bool("chat_template", False, "wrap the prompts in the tokenizer's chat template")
flags.DEFINE_string("costs_in", "", "a saved sj.CostTable to model with (skip the measurement)")
flags.DEFINE_string("costs_out", "", "where to save the measured sj.CostTable")


def modelled(stats, table, choices) -> float:
  """Tokens per target step under ``table`` for a run's ``DecodeStats`` (prefill left out)."""
  try:
    cost = table.menu_cost(choices, np.asarray(stats.choice_counts))
  except ValueError:  # a length the table has no pass for (a loaded table, another menu)
    return float("nan")
  return (float(np.sum(stats.generated)) - len(stats.generated)) / cost


def run_one(target, prompts, method, tokens: int, eos):
  import jax

  import specjax as sj
  sj.generate(target, prompts, method, max_new_tokens=tokens, eos_token_id=eos)  # compile
  t0 = time.perf_counter()
  out = sj.generate(target, prompts, method, max_new_tokens=tokens, eos_token_id=eos)
  jax.block_until_ready(out.tokens)
  return out, time.perf_counter() - t0


def main(argv):
  del argv
  import specjax as sj
  from experiments import models

  choices = tuple(int(k) for k in FLAGS.choices)
  gammas = tuple(k for k in choices if k > 0)
  target, draft, prompts, _ = models.load_pair(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens, gammas,
      0.0, FLAGS.max_new_tokens, chat_template=FLAGS.chat_template)
  eos = getattr(target.config, "eos_token_id", None)
  if FLAGS.costs_in:
    table = sj.CostTable.load(FLAGS.costs_in)
  else:
    context = int(np.mean([len(p) for p in prompts])) + FLAGS.max_new_tokens // 2
    table = sj.CostTable.measure(
        target, draft, batch=len(prompts), context=context,
        cache_length=context + max(gammas) + 2, widths=tuple(range(1, max(gammas) + 2)),
        gammas=gammas)
    if FLAGS.costs_out:
      table.save(FLAGS.costs_out)
  print("costs:", json.dumps(table.to_dict()))
  print(f"{'setting':44s} {'tok/call':>8s} {'modelled':>8s} {'wall s':>7s}  choices")
  ar_out, ar_s = run_one(target, prompts, sj.Autoregressive(), FLAGS.max_new_tokens, eos)
  rows = {}

  def show(name, out, seconds, model):
    rows[name] = model
    counts = list(np.asarray(out.stats.choice_counts))
    print(f"{name:44s} {out.stats.tokens_per_target_call:8.3f} {model:8.3f} "
          f"{seconds / ar_s:7.3f}  {counts or ''}", flush=True)

  show("autoregressive", ar_out, ar_s, 1.0)
  for g in gammas:
    out, s = run_one(target, prompts, sj.Speculative(draft, gamma=g), FLAGS.max_new_tokens, eos)
    iterations = int(out.stats.target_calls) - 1
    show(f"speculative gamma {g}", out, s,
         (float(np.sum(out.stats.generated)) - len(prompts)) / (iterations * table.chain_cost(g)))
  default = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=choices, costs=table)
  settings = [dict(decay=float(d), prior=float(p)) for d, p in
              itertools.product(FLAGS.decays, FLAGS.priors)]
  settings += [dict(forget=float(f)) for f in FLAGS.forgets if float(f) != default.forget]
  for rule in ("schedule", "confidence"):
    settings.append(dict(rule=rule))
  for kwargs in settings:
    menu = tuple(range(1, max(choices) + 1)) if kwargs.get("rule") == "confidence" else choices
    method = dataclasses.replace(default, choices=menu, **kwargs)
    out, s = run_one(target, prompts, method, FLAGS.max_new_tokens, eos)
    name = "adaptive " + " ".join(f"{k}={v}" for k, v in kwargs.items())
    show(name, out, s, modelled(out.stats, table, method.choices))
  best_fixed = max(v for k, v in rows.items() if k.startswith("speculative"))
  print(f"best fixed gamma (modelled): {best_fixed:.3f}; adaptive defaults: "
        f"{rows[f'adaptive decay={default.decay} prior={default.prior}']:.3f}")


if __name__ == "__main__":
  app.run(main)
