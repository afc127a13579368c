r"""How many kernels a call of ``sj.Adaptive`` runs against the method it reproduces, counted from
a ``jax.profiler`` trace (deterministic, unlike a wall clock on a shared box): the menu 0, 1, 2,
3, 4, 6 under a table by hand that holds it at plain decoding (``--gamma=0``: against
autoregressive decoding; the draft only follows the text) or at ``--gamma`` drafts (against the
bare ``sj.Speculative(draft, gamma)``). Kernels: the trace's leaf events (XLA:CPU thunks), each
call's, with the difference per iteration; held plain, the skipped draft's looks are put past
the run's end (its prefill stays) unless ``--looks``.

    python -m experiments.adaptive_kernels --target=smollm2-135m --draft=smollm2-draft \
        --prompts=chat --batch_size=8 --prompt_tokens=192 --max_new_tokens=32 --temperature=1 \
        --gamma=0
    python -m experiments.adaptive_kernels --target=runs/train_bench/target \
        --draft=runs/train_bench/draft_distill --prompts=code-edit --batch_size=1 \
        --prompt_tokens=192 --max_new_tokens=128 --nochat_template --gamma=2
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import tempfile

import numpy as np
from absl import app, flags

from experiments import adaptive_upkeep
from experiments import cost_split  # noqa: F401  (the shared flags: target, draft, prompts, ...)

FLAGS = flags.FLAGS
# Trace events that are not kernels: the executor's own spans, the host side of a call.
NOT_KERNELS = ("Thunk", "Slinky", "ThreadpoolListener", "Pjit", "Common", "end:", "Parse",
               "Handle", "$")


def kernel_counts(run, calls: int) -> tuple[float, collections.Counter]:
  """(kernels a call, {kernel name without its numeric suffix: count a call}) of ``run()`` (one
  call, blocking) over ``calls`` traced calls, after one untraced (compiling) call."""
  import jax

  run()
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      for _ in range(calls):
        run()
    events = json.load(gzip.open(glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)[0]))
  names = collections.Counter()
  for e in events["traceEvents"]:
    if e.get("ph") == "X" and not e["name"].startswith(NOT_KERNELS):
      names[e["name"].rsplit(".", 1)[0] if e["name"].rsplit(".", 1)[-1].isdigit()
            else e["name"]] += 1 / calls
  return sum(names.values()), names


def compare(target, draft, prompts, max_new_tokens: int, temperature: float, gamma: int,
            looks: bool = False, calls: int = 3) -> dict[str, tuple]:
  """{setting: (kernels a call, iterations a call, kernels by name)} for the reference
  (autoregressive decoding at ``gamma`` 0, else the bare method) and the menu held at ``gamma``
  (``looks``: the skipped draft's looks as they are, else past the run's end)."""
  import jax

  import specjax as sj

  inner = sj.Speculative(draft, gamma=max(gamma, 1))
  menu = adaptive_upkeep.MENU
  passes = sj.Adaptive.passes(inner, menu)
  sampling = sj.Sampling(temperature)
  held = sj.CostTable(
      verify={w: 1.0 if w in (1, gamma + 1) else 50.0 for w in passes["widths"]},
      draft_step=10.0 if gamma == 0 else 1e-3,
      draft_pass={w: 10.0 for w in passes["draft_widths"]},
      iteration={g: 0.5 if g == gamma else 50.0 for g in passes["gammas"]},
      batch=len(prompts), context=256, target_step_ms=1.0,
      device=f"by hand: gamma {gamma} always wins", sampling=sampling)
  reference = sj.Autoregressive() if gamma == 0 else inner
  settings = {"autoregressive" if gamma == 0 else f"speculative gamma {gamma}": reference,
              f"adaptive, menu {menu}, held at {gamma}": sj.Adaptive(inner, choices=menu,
                                                                       costs=held)}
  result = {}
  for name, method in settings.items():
    last = {}

    def run(method=method, last=last):
      last["out"] = sj.generate(target, prompts, method, sampling, max_new_tokens=max_new_tokens,
                                key=jax.random.key(0))
      jax.block_until_ready(last["out"].tokens)

    span = {} if looks else dict(LOOK_SPAN=max_new_tokens // menu[-1] + 1)
    with adaptive_upkeep.look_constants(**span):
      total, names = kernel_counts(run, calls)
    stats = last["out"].stats
    if name.startswith("adaptive"):
      counts = np.asarray(stats.choice_counts)
      if counts.sum() != counts[menu.index(gamma)]:
        raise RuntimeError(f"{name}: the rule left gamma {gamma}: {counts.tolist()}")
    result[name] = (total, int(np.asarray(stats.target_calls)) - 1, names)
  return result


def main(argv):
  del argv
  from experiments import models

  target, draft, prompts, _ = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens,
      (max(FLAGS.gamma, 1),), FLAGS.temperature, FLAGS.max_new_tokens,
      chat_template=FLAGS.chat_template)
  result = compare(target, draft, prompts, FLAGS.max_new_tokens, FLAGS.temperature, FLAGS.gamma,
                   FLAGS.looks)
  (ref_name, (ref, _, ref_names)), (name, (got, iterations, names)) = result.items()
  print(f"batch {len(prompts)}, prompts {FLAGS.prompts}, {FLAGS.max_new_tokens} tokens a row, "
        f"T = {FLAGS.temperature:g}")
  print(f"{ref_name}: {ref:.0f} kernels a call")
  print(f"{name}: {got:.0f} kernels a call, {got - ref:+.0f} ({(got - ref) / iterations:+.1f} "
        f"an iteration over {iterations} iterations)")
  extra = sorted(names, key=lambda k: -(names[k] - ref_names.get(k, 0)))[:8]
  print("most added: " + ", ".join(f"{k} {names[k] - ref_names.get(k, 0):+.0f}" for k in extra))


if __name__ == "__main__":
  adaptive_upkeep.define_timing_flags(rounds=1)
  flags.DEFINE_integer("gamma", 0, "the draft length the menu is held at (0: plain decoding)")
  flags.DEFINE_bool("looks", False, "held plain: the skipped draft's looks as they are")
  app.run(main)
