r"""What a change of menu entry costs ``sj.Adaptive``: the menu 0, 1, 2, 3, 4, 6 held at
``--gamma``, held at ``--other``, and alternating between the two every iteration (the rule's
choice swapped for a forced one while tracing; everything else of the loop runs as it is), beside
the bare ``sj.Speculative(draft, gamma)``; interleaved calls, the order rotated each round
(``adaptive_upkeep.time_settings``). A change from a longer entry to a shorter one leaves the
longer one's loop and goes round the sweep to the shorter one's (``specjax.decoding.loop``'s
``sweep``); a change up enters the next loop in the same sweep.

    python -m experiments.adaptive_switch --target=runs/train_bench/target \
        --draft=runs/train_bench/draft_distill --prompts=python --batch_size=1 \
        --prompt_tokens=192 --max_new_tokens=128 --nochat_template --gamma=3 --other=4

The cost of a change: the alternating call's time less what its iterations cost held (each
entry's held call's time per iteration, times the alternating call's iterations of it), over
its changes. At T = 0 every setting's tokens are checked equal to the bare method's.

Run it in a process of its own (as a command): in the test suite's process, later compilations
after its forced loops ended in a segfault inside JAX's compilation-cache write
(jax 0.10.2, XLA:CPU; not reproduced without them), so its test runs it in a subprocess.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
from absl import app, flags

from experiments import adaptive_upkeep
from experiments import cost_split  # noqa: F401  (the shared flags: target, draft, prompts, ...)

FLAGS = flags.FLAGS
MENU = adaptive_upkeep.MENU
# The forced settings are told apart by their hysteresis margin (a field of the proposer, so
# each compiles its own loop; the forced rule ignores it): held at gamma, held at the other
# entry, alternating.
TAGS = {1e-6: "gamma", 2e-6: "other", 3e-6: "alternate"}


def define_flags() -> None:
  """This tool's flags (``adaptive_upkeep.define_timing_flags``, and the two entries)."""
  adaptive_upkeep.define_timing_flags(rounds=12)
  flags.DEFINE_integer("gamma", 3, "one entry of the alternation (and the bare method's length)")
  flags.DEFINE_integer("other", 4, "the other entry")


@contextlib.contextmanager
def forced_choices(gamma: int, other: int):
  """``AdaptiveProposer.best`` (the cost rule's choice) replaced, for the menus whose margin is a
  ``TAGS`` key, by entry ``gamma``, entry ``other``, or the one that was not ``last``."""
  import jax.numpy as jnp

  from specjax.proposers.adaptive import AdaptiveProposer

  rule = AdaptiveProposer.best

  def best(self, costs, acceptance, seen, active, last, remaining, factors=None):
    tag = TAGS.get(self.margin)
    if tag is None:
      return rule(self, costs, acceptance, seen, active, last, remaining, factors)
    mine, theirs = self.choices.index(gamma), self.choices.index(other)
    if tag == "alternate":
      return jnp.where(last == mine, theirs, mine).astype(jnp.int32)
    return jnp.int32(mine if tag == "gamma" else theirs)

  AdaptiveProposer.best = best
  try:
    yield
  finally:
    AdaptiveProposer.best = rule


def switch_cost(target, draft, prompts, max_new_tokens: int, temperature: float = 0.0,
                rounds: int = 12, gamma: int = 3, other: int = 4) -> dict[str, tuple]:
  """{setting: (median wall-clock s, median CPU s, iterations, choice histogram)} on
  ``prompts`` (one batch, ``max_new_tokens`` a row, no EOS). Raises if a held setting chose
  another entry, if the alternating one ever stayed, or (T = 0) if any setting's tokens differ
  from the bare method's."""
  import specjax as sj

  for k in (gamma, other):
    if k not in MENU[1:]:
      raise ValueError(f"gamma and other must be draft lengths of the menu {MENU[1:]}, got {k}")
  if gamma == other:
    raise ValueError(f"gamma and other must differ, got {gamma} twice")
  sampling = sj.Sampling(temperature)
  inner = sj.Speculative(draft, gamma=gamma)
  passes = sj.Adaptive.passes(inner, MENU)
  table = sj.CostTable(verify={w: 1.0 for w in passes["widths"]}, draft_step=0.1,
                       batch=len(prompts), context=256, target_step_ms=1.0,
                       device="by hand: the forced rule ignores it", sampling=sampling)
  menu = sj.Adaptive(inner, choices=MENU, costs=table)
  names = {"gamma": f"held at {gamma}", "other": f"held at {other}",
           "alternate": f"alternating {gamma} / {other}"}
  bare_name = f"speculative gamma {gamma}"
  settings = {bare_name: (inner, {})}
  settings.update({names[tag]: (dataclasses.replace(menu, margin=margin), {})
                   for margin, tag in TAGS.items()})
  with forced_choices(gamma, other):
    medians, outputs = adaptive_upkeep.time_settings(target, prompts, settings, sampling,
                                                     max_new_tokens, rounds)
  bare = np.asarray(outputs[bare_name].tokens)
  out = {}
  for name, (method, _) in settings.items():
    stats = outputs[name].stats
    counts = None if name == bare_name else np.asarray(stats.choice_counts)
    if counts is not None:
      held = {names["gamma"]: gamma, names["other"]: other}.get(name)
      used = {k: int(c) for k, c in zip(MENU, counts.tolist()) if c}
      if held is not None and set(used) != {held}:
        raise RuntimeError(f"{name}: chose {used}")
      if held is None and (set(used) != {gamma, other} or abs(used[gamma] - used[other]) > 1):
        raise RuntimeError(f"{name}: did not alternate: {used}")
    if sampling.is_greedy and not np.array_equal(np.asarray(outputs[name].tokens), bare):
      raise RuntimeError(f"{name}: its greedy tokens differ from the bare method's")
    out[name] = medians[name] + (int(np.asarray(stats.target_calls)) - 1,
                                 {} if counts is None else used)
  return out


def change_cost(result: dict, gamma: int, other: int) -> float:
  """Seconds (wall clock) a change of entry costs: the alternating call's time less its
  iterations at each held call's time per iteration, over its changes."""
  per = {k: result[f"held at {k}"][0] / result[f"held at {k}"][2] for k in (gamma, other)}
  wall, _, iterations, used = result[f"alternating {gamma} / {other}"]
  return (wall - sum(used[k] * per[k] for k in (gamma, other))) / max(iterations - 1, 1)


def main(argv):
  del argv
  from experiments import models

  target, draft, prompts, _ = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens,
      (FLAGS.gamma, FLAGS.other), FLAGS.temperature, FLAGS.max_new_tokens,
      chat_template=FLAGS.chat_template)
  result = switch_cost(target, draft, prompts, FLAGS.max_new_tokens, FLAGS.temperature,
                       FLAGS.rounds, FLAGS.gamma, FLAGS.other)
  print(f"batch {len(prompts)}, prompts {FLAGS.prompts}, {FLAGS.max_new_tokens} tokens a row, "
        f"T = {FLAGS.temperature:g}, {FLAGS.rounds} rounds (order rotated)")
  print(f"{'setting':28s} {'median ms':>10s} {'iterations':>10s} {'ms an iteration':>16s}  "
        f"choices")
  for name, (wall, _, iterations, used) in result.items():
    print(f"{name:28s} {wall * 1e3:10.1f} {iterations:10d} {wall * 1e3 / iterations:16.3f}  "
          f"{used or ''}")
  cost = change_cost(result, FLAGS.gamma, FLAGS.other)
  per = result[f"held at {FLAGS.gamma}"]
  print(f"a change of entry: {cost * 1e6:+.1f} us ({cost / (per[0] / per[2]):+.1%} of an "
        f"iteration held at {FLAGS.gamma})")


if __name__ == "__main__":
  define_flags()
  app.run(main)
