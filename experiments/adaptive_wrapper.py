r"""What wrapping a method in ``sj.Adaptive`` costs where the rule's choice is the fixed method's:
the bare ``sj.Speculative(draft, gamma)`` against ``sj.Adaptive`` over the one-entry menu
(gamma), the full menu 0, 1, 2, 3, 4, 6 under a cost table by hand in which gamma always wins
(the menu's loops, the estimates, the rule, the text history, the draft's catch-up check, all
running, choosing gamma in every iteration), and the full menu under the table measured for the
run or read with ``--costs_in`` (a saved ``sj.CostTable``, e.g. a runner's calibrated one: what
the rule does there), from the fixed prior and warmed by an untimed call's estimates
(``sj.Adaptive.warmed``, as the runner times it), beside autoregressive decoding; interleaved
calls, the order rotated each round (``adaptive_upkeep.time_settings``).

    python -m experiments.adaptive_wrapper --target=smollm2-135m --draft=smollm2-draft \
        --prompts=code-edit --batch_size=4 --prompt_tokens=192 --max_new_tokens=128 \
        --rounds=12 [--temperature=1] [--gamma=1] [--costs_in=TABLE.json]

At T = 0 every setting's tokens are checked equal to the bare method's.
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from experiments import adaptive_upkeep
from experiments import cost_split  # noqa: F401  (the shared flags: target, draft, prompts, ...)

FLAGS = flags.FLAGS
MENU = adaptive_upkeep.MENU


def define_flags() -> None:
  """This tool's flags (``adaptive_upkeep.define_timing_flags``, and the gamma to reproduce)."""
  adaptive_upkeep.define_timing_flags(rounds=12)
  flags.DEFINE_integer("gamma", 1, "the fixed draft length the wrapped settings reproduce")
  flags.DEFINE_string("costs_in", "", "a saved sj.CostTable for the rule (default: measured)")


def wrapper_cost(target, draft, prompts, max_new_tokens: int, temperature: float = 0.0,
                 rounds: int = 12, gamma: int = 1, measured=None) -> dict[str, tuple]:
  """{setting: (median wall-clock s, median CPU s, choice histogram)} on ``prompts`` (one
  batch, ``max_new_tokens`` a row, no EOS); ``measured``: the run's ``sj.CostTable`` for the
  last setting (timed here when None). Raises if the forced settings ever chose other than
  ``gamma``, or (T = 0) if any setting's tokens differ from the bare method's."""
  import jax

  import specjax as sj

  if gamma not in MENU[1:]:
    raise ValueError(f"gamma must be one of the menu's draft lengths {MENU[1:]}, got {gamma}")
  sampling = sj.Sampling(temperature)
  inner = sj.Speculative(draft, gamma=gamma)
  passes = sj.Adaptive.passes(inner, MENU)
  if measured is None:
    measured = sj.CostTable.measure(target, draft, batch=len(prompts), context=256,
                                    cache_length=256 + max_new_tokens, sampling=sampling,
                                    **passes)
  # gamma's iteration at half a target step, every other entry at 50: gamma wins at any estimate
  forced = sj.CostTable(
      verify={w: 1.0 if w in (1, gamma + 1) else 50.0 for w in passes["widths"]},
      draft_step=1e-3, iteration={g: 0.5 if g == gamma else 50.0 for g in passes["gammas"]},
      batch=len(prompts), context=256, target_step_ms=1.0, device="by hand: gamma wins",
      sampling=sampling)
  wrapped = {f"adaptive, menu ({gamma},)": sj.Adaptive(inner, choices=(gamma,), costs=forced),
             f"adaptive, menu {MENU}, forced to {gamma}": sj.Adaptive(inner, choices=MENU,
                                                                      costs=forced)}
  rule = sj.Adaptive(inner, choices=MENU, costs=measured)
  settings = {
      "autoregressive": (sj.Autoregressive(), {}),
      f"speculative gamma {gamma}": (inner, {}),
      **{name: (method, {}) for name, method in wrapped.items()},
      f"adaptive, menu {MENU}, measured table": (rule, {}),
      f"adaptive, menu {MENU}, measured table, warmed": (rule.warmed(sj.generate(
          target, prompts, rule, sampling, max_new_tokens=max_new_tokens,
          key=jax.random.key(1)).stats), {}),  # a key for T > 0, not the timed calls' own
  }
  medians, outputs = adaptive_upkeep.time_settings(target, prompts, settings, sampling,
                                                   max_new_tokens, rounds)
  bare = np.asarray(outputs[f"speculative gamma {gamma}"].tokens)
  out = {}
  for name, (method, _) in settings.items():
    counts = np.asarray(outputs[name].stats.choice_counts)
    if name in wrapped:
      chosen = counts[list(method.choices).index(gamma)]
      if chosen != counts.sum():
        raise RuntimeError(f"{name}: chose other than gamma {gamma}: {counts.tolist()}")
    if sampling.is_greedy and not np.array_equal(np.asarray(outputs[name].tokens), bare):
      raise RuntimeError(f"{name}: its greedy tokens differ from the bare method's")
    out[name] = medians[name] + (dict(zip(getattr(method, "choices", ()), counts.tolist())),)
  return out


def main(argv):
  del argv
  from experiments import models

  target, draft, prompts, _ = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens,
      (FLAGS.gamma,), FLAGS.temperature, FLAGS.max_new_tokens, chat_template=FLAGS.chat_template)
  import specjax as sj
  result = wrapper_cost(target, draft, prompts, FLAGS.max_new_tokens, FLAGS.temperature,
                        FLAGS.rounds, FLAGS.gamma,
                        sj.CostTable.load(FLAGS.costs_in) if FLAGS.costs_in else None)
  bare = result[f"speculative gamma {FLAGS.gamma}"]
  print(f"batch {len(prompts)}, prompts {FLAGS.prompts}, {FLAGS.max_new_tokens} tokens a row, "
        f"T = {FLAGS.temperature:g}, {FLAGS.rounds} rounds (order rotated)")
  print(f"{'setting':50s} {'median s':>9s} {'vs bare (wall)':>15s} {'vs bare (CPU)':>14s}  "
        f"choices")
  for name, (wall, cpu, counts) in result.items():
    print(f"{name:50s} {wall:9.3f} {bare[0] / wall:15.3f} {bare[1] / cpu:14.3f}  "
          f"{counts or ''}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
