r"""What a skipped draft's upkeep costs ``sj.Adaptive`` where plain decoding is the right choice
throughout: the menu 0, 1, 2, 3, 4, 6 under a cost table in which no draft pays, so that the cost
rule decodes plainly in every iteration and its draft only follows the text, timed against
autoregressive decoding, interleaved (the floor of issue 30: >= 0.97x autoregressive decoding).

    python -m experiments.adaptive_upkeep --target=smollm2-135m --draft=smollm2-draft \
        --prompts=code-edit --batch_size=8 --prompt_tokens=192 --max_new_tokens=128 \
        --chat_template [--temperature=1] [--tree=dynamic:6x4x24]

``--tree``: the menu over the draft's tree of that spec (``sj.TreeSpeculative`` / ``sj.SpecTr``,
cut to each depth of the menu) instead of the draft's chain.

Settings: ``looks`` (the code as it is: a look after 2k plain tokens, k the largest choice,
scoring the last ``LOOK_SCORED`` of them, each look that leaves the rule plain doubling the span
up to ``LOOK_BACKOFF`` x), ``looks scoring every token, every 2k`` (the same loop with
``LOOK_SCORED`` = 2k and ``LOOK_BACKOFF`` = 1: the looks of sessions 24-31), at T > 0 ``looks
scoring one draw`` (``KEEP_LAWS`` off: no target laws kept, each guess scored by one draw's
min(1, q(x) / p(x)), the looks before session 37), ``no looks`` (the span past the run's end:
the draft's prefill and the rule's bookkeeping only). Each setting's
median time over ``--rounds`` interleaved calls (``time_settings``), as a speed relative to
autoregressive decoding's (wall clock and process CPU time; the CPU time is less disturbed by a
busy neighbour).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import numpy as np
from absl import app, flags

from experiments import cost_split  # noqa: F401  (the shared flags: target, draft, prompts, ...)

FLAGS = flags.FLAGS


def define_timing_flags(rounds: int) -> None:
  """The flags of the tools timed by ``time_settings`` (this one, ``adaptive_wrapper``), defined
  when a tool runs as a script only (so that importing it beside another tool defining
  ``max_new_tokens`` does not clash); ``rounds``: the tool's default."""
  flags.DEFINE_integer("max_new_tokens", 128, "new tokens per row")
  flags.DEFINE_integer("rounds", rounds, "interleaved timed calls per setting")
  flags.DEFINE_bool("chat_template", True, "wrap the prompts in the tokenizer's chat template")


def define_flags() -> None:
  """This tool's flags (``define_timing_flags``, and the tree to menu over)."""
  define_timing_flags(rounds=8)
  flags.DEFINE_string("tree", "", "a tree spec (as the runner's trees): the menu over the "
                      "draft's tree instead of its chain")

MENU = (0, 1, 2, 3, 4, 6)


@contextlib.contextmanager
def look_constants(**values):
  """``specjax.proposers.adaptive``'s look constants set to ``values`` while tracing."""
  from specjax.proposers import adaptive
  old = {name: getattr(adaptive, name) for name in values}
  for name, value in values.items():
    setattr(adaptive, name, value)
  try:
    yield
  finally:
    for name, value in old.items():
      setattr(adaptive, name, value)


def upkeep(target, draft, prompts, max_new_tokens: int, temperature: float = 0.0,
           rounds: int = 8, tree: str = "") -> dict[str, tuple[float, float]]:
  """{setting: (median wall-clock s, median CPU s)} over ``rounds`` interleaved calls of each
  setting on ``prompts`` (one batch), every row decoding ``max_new_tokens`` (no EOS: equal
  work); the menu over the draft's chain, or over its ``tree`` (a tree spec). Raises if an
  adaptive setting ever drafted."""
  import specjax as sj
  from experiments.methods import tree_method

  inner = tree_method(tree, draft)[1] if tree else sj.Speculative(draft, gamma=1)
  passes = sj.Adaptive.passes(inner, MENU)
  sampling = sj.Sampling(temperature)
  hopeless = sj.CostTable(verify={w: 1.0 if w == 1 else 50.0 for w in passes["widths"]},
                          draft_step=10.0, draft_pass={w: 10.0 for w in passes["draft_widths"]},
                          batch=len(prompts), context=256, target_step_ms=1.0,
                          device="by hand: no draft pays", sampling=sampling)
  plain = sj.Adaptive(inner, choices=MENU, costs=hopeless)
  span = 2 * MENU[-1]
  # Distinct (equal-behaving: no estimate can make a draft pay) methods, so that no setting
  # reuses another's compiled loop; the constants are read while tracing.
  settings = {
      "autoregressive": (sj.Autoregressive(), {}),
      "looks": (plain, {}),
      f"looks scoring every token, every {span}": (
          dataclasses.replace(plain, decay=0.11), dict(LOOK_SCORED=span, LOOK_BACKOFF=1)),
      **({} if sampling.is_greedy else {"looks scoring one draw": (
          dataclasses.replace(plain, decay=0.13), dict(KEEP_LAWS=False))}),
      # the first span past the run's end (its passes are compiled, never run)
      "no looks": (dataclasses.replace(plain, decay=0.12),
                   dict(LOOK_SPAN=max_new_tokens // MENU[-1] + 1)),
  }

  medians, outputs = time_settings(target, prompts, settings, sampling, max_new_tokens, rounds)
  for name, out in outputs.items():
    if name != "autoregressive" and int(np.asarray(out.stats.choice_counts)[1:].sum()):
      raise RuntimeError(f"{name}: the rule drafted under a table where no draft pays")
  return medians


def time_settings(target, prompts, settings: dict, sampling, max_new_tokens: int,
                  rounds: int) -> tuple[dict[str, tuple[float, float]], dict]:
  """({setting: (median wall-clock s, median CPU s)}, {setting: its last call's output}):
  ``settings`` maps a name to (method, ``look_constants`` to trace it under); each is compiled
  once, then timed ``rounds`` times, interleaved, the order rotated by one every round (in a
  fixed order two settings of the same computation measured 3.5% apart over 14 rounds at batch
  4; Intel Xeon, SmolLM2)."""
  import jax

  import specjax as sj

  def timed(method, constants):
    with look_constants(**constants):
      wall, cpu = time.perf_counter(), time.process_time()
      out = sj.generate(target, prompts, method, sampling, max_new_tokens=max_new_tokens,
                        key=jax.random.key(0))
      jax.block_until_ready(out.tokens)
      return time.perf_counter() - wall, time.process_time() - cpu, out

  for method, constants in settings.values():
    timed(method, constants)  # compile
  names = list(settings)
  times, outputs = {name: [] for name in names}, {}
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      wall, cpu, outputs[name] = timed(*settings[name])
      times[name].append((wall, cpu))
  return {name: tuple(float(x) for x in np.median(np.asarray(t), axis=0))
          for name, t in times.items()}, outputs


def main(argv):
  del argv
  from experiments import models

  target, draft, prompts, _ = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens, (1,),
      FLAGS.temperature, FLAGS.max_new_tokens, chat_template=FLAGS.chat_template)
  medians = upkeep(target, draft, prompts, FLAGS.max_new_tokens, FLAGS.temperature, FLAGS.rounds,
                   FLAGS.tree)
  base = medians["autoregressive"]
  print(f"batch {len(prompts)}, prompts {FLAGS.prompts}, {FLAGS.max_new_tokens} tokens a row, "
        f"T = {FLAGS.temperature:g}, {FLAGS.rounds} rounds, menu over the draft's "
        f"{FLAGS.tree or 'chain'}")
  print(f"{'setting':40s} {'median s':>9s} {'vs AR (wall)':>13s} {'vs AR (CPU)':>12s}")
  for name, (wall, cpu) in medians.items():
    print(f"{name:40s} {wall:9.3f} {base[0] / wall:13.3f} {base[1] / cpu:12.3f}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
