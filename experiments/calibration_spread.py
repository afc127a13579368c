r"""How far a calibrated price moves between calibrations (``sj.Adaptive.calibrated``), by the
number of repeats each keeps the fastest of: one long series of the calibration's own calls
(``adaptive_calibration.timed_calls``, ``--repeats`` rounds), cut into consecutive groups of
``--groups`` rounds, each group priced as one calibration would price it
(``adaptive_calibration.priced``: each call's fastest time, one fit, each entry its own
iteration, and the fit pooled on the bare table's shape beside it). For each group size, each
menu entry's iteration relative to plain decoding's (what the rule weighs), its median over the
groups and their range, beside the bare table's ratio, and the bare autoregressive loop's (what
a skipped call pays, ``probe_every``: its own fit); ``--divisors``: shorter second lengths
(the calls at every length are timed in one series; each is priced with ``max_new_tokens``).

    python -m experiments.calibration_spread --target=runs/train_bench/target \
        --draft=runs/train_bench/draft_distill --prompts=code-edit --batch_size=4 \
        --prompt_tokens=192 --max_new_tokens=128 --repeats=12 --groups=1,3,6 --divisors=2,4 \
        [--temperature=1] [--calls_out=calls.json]

Why: on a shared 2-core box the runner's calibration (3 repeats) moved a price 10-15% between
runs (docs/benchmarks.md, session 44), enough to flip the rule where two entries sit ~10% apart;
there a calibration's prices follow the machine's state, which moves one draft's price up to
40% between minutes-long windows (session 45).
"""

from __future__ import annotations

import json

import numpy as np
from absl import app, flags

from experiments import adaptive_upkeep
from experiments import cost_split  # noqa: F401  (the shared flags: target, draft, prompts, ...)

FLAGS = flags.FLAGS
MENU = adaptive_upkeep.MENU


def spread(method, calls, group: int, lengths=None,
           pooled: bool = False) -> list[dict[int, float]]:
  """Per consecutive ``group`` of rounds in ``calls`` (those at ``lengths`` only, if given):
  {entry: its calibrated iteration / plain decoding's} (``adaptive_calibration.priced``, each
  entry its own iteration or ``pooled`` on the bare table's shape); a group whose fit is noise
  is left out."""
  from specjax.decoding import adaptive_calibration
  rounds = 1 + max(c.repeat for c in calls)
  out = []
  for first in range(0, rounds - group + 1, group):
    part = [c for c in calls if first <= c.repeat < first + group
            and (lengths is None or c.length in lengths)]
    try:
      priced = adaptive_calibration.priced(method, part, pooled)
    except adaptive_calibration.CalibrationNoise:
      continue
    out.append({k: v / priced.loop[0] for k, v in
                (*priced.loop.items(), (adaptive_calibration.SKIPPED, priced.autoregressive))})
  return out


def main(argv):
  del argv
  import specjax as sj
  from experiments import models
  from specjax.decoding import adaptive_calibration

  target, draft, prompts, _ = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens, (1,),
      FLAGS.temperature, FLAGS.max_new_tokens, chat_template=FLAGS.chat_template)
  sampling = sj.Sampling(FLAGS.temperature)
  inner = sj.Speculative(draft, gamma=max(MENU))
  passes = sj.Adaptive.passes(inner, MENU)
  table = sj.CostTable.measure(target, draft, batch=len(prompts), context=256,
                               cache_length=256 + FLAGS.max_new_tokens, sampling=sampling,
                               **passes)
  method = sj.Adaptive(inner, choices=MENU, costs=table, probe_every=4)  # + the bare AR loop
  longest = FLAGS.max_new_tokens
  shorter = tuple(longest // int(d) for d in FLAGS.divisors)
  calls = adaptive_calibration.timed_calls(method, target, prompts, sampling=sampling,
                                           max_new_tokens=longest, repeats=FLAGS.repeats,
                                           shorter=shorter)
  if FLAGS.calls_out:
    with open(FLAGS.calls_out, "w") as f:
      json.dump([c._asdict() for c in calls], f)
  bare = adaptive_calibration.bare_costs(method)
  print(f"batch {len(prompts)}, prompts {FLAGS.prompts}, T = {FLAGS.temperature:g}, "
        f"{FLAGS.repeats} rounds of {len(calls) // FLAGS.repeats} calls; an entry's iteration / "
        f"plain decoding's: median (range) over the groups")
  for n in shorter:
    seconds = sum(c.seconds for c in calls if c.length in (longest, n)) / FLAGS.repeats
    print(f"\nlengths {longest} and {n} ({seconds:.1f} s a round)")
    entries = (*MENU[1:], adaptive_calibration.SKIPPED)
    print(f"{'rounds kept':>12s} {'groups':>6s}  " + "  ".join(f"{k:>19d}" for k in MENU[1:])
          + f"  {'skipped call':>19s}")
    print(f"{'bare table':>12s} {'':>6s}  " + "  ".join(f"{bare[k] / bare[0]:19.3f}"
                                                      for k in MENU[1:]))
    for pooled in (True, False):
      print("pooled on the bare table's shape" if pooled else "each entry its own iteration")
      for group in (int(g) for g in FLAGS.groups):
        ratios = spread(method, calls, group, (longest, n), pooled)
        cells = []
        for k in entries:
          x = np.asarray([r[k] for r in ratios])
          cells.append(f"{np.median(x):.3f} ({x.min():.3f}-{x.max():.3f})" if len(x) else
                       "noise")
        print(f"{group:12d} {len(ratios):6d}  " + "  ".join(f"{c:>19s}" for c in cells))


if __name__ == "__main__":
  flags.DEFINE_integer("max_new_tokens", 128, "new tokens per row at the longer length")
  flags.DEFINE_bool("chat_template", False, "wrap the prompts in the tokenizer's chat template")
  flags.DEFINE_list("groups", ["1", "3", "6"], "rounds per simulated calibration")
  flags.DEFINE_list("divisors", ["2"], "the shorter lengths: max_new_tokens over each (the "
                    "calibration's: 2); each priced with max_new_tokens alone")
  flags.DEFINE_string("calls_out", "", "a JSON file for the timed calls")
  app.run(main)
