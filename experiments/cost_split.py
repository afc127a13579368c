"""Per-call and per-token cost of ``sj.generate``: where speculative decoding's time goes.

    python -m experiments.cost_split                         # the embedded default pair, batch 4
    python -m experiments.cost_split --batch_size=1 --gammas=1,2,4
    python -m experiments.cost_split --target=runs/train_bench/target \\
        --draft=runs/train_bench/draft_distill

Times ``sj.generate`` (autoregressive, and speculative at each gamma) at several
``max_new_tokens`` on the same prompts, runs interleaved so that load noise hits every method
alike, and fits ``seconds = per_call + per_token x max_new_tokens`` by least squares over the
medians. ``per_call`` is what every call pays once (splitting the models into graph and state,
dispatch, the prefills, reading the result back); ``per_token`` is the decoding loop. A
speculative method whose per-token cost exceeds autoregressive decoding's loses at any length; one
that wins per token but not per call wins only on long enough generations. ``ms/iteration`` is
the loop's cost per target call, to compare with the cost model ``c gamma + v`` target steps of
the run reports (``experiments.run``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("target", "default", "as the runner's config.target: a checkpoint dir, "
                    "'default' (the embedded pair) or 'random:NAME'")
flags.DEFINE_string("draft", "default", "as the runner's config.draft")
flags.DEFINE_string("prompts", "python-small", "built-in prompt set or a file of prompts")
flags.DEFINE_integer("batch_size", 4, "rows per call (the first batch_size prompts)")
flags.DEFINE_integer("prompt_tokens", 32, "prompts are cut to their last this many tokens")
flags.DEFINE_list("gammas", ["1", "2"], "speculative gammas to time")
flags.DEFINE_list("lengths", ["32", "64", "128"], "max_new_tokens values to fit over")
flags.DEFINE_float("temperature", 0.0, "sampling temperature (0 = greedy)")
flags.DEFINE_integer("repeats", 7, "timed calls per method and length")


def split_costs(target, draft, prompts, gammas, lengths, repeats: int,
                temperature: float = 0.0, seed: int = 0) -> list[dict]:
  """One dict per method: per_call_ms, per_token_ms, iterations and ms_per_iteration at the
  longest length, and the median seconds at every length."""
  import jax

  import specjax as sj

  lengths = sorted(int(n) for n in lengths)
  if len(lengths) < 2 or lengths[0] < 1:
    raise ValueError(f"lengths must hold at least two values >= 1, got {lengths}")
  methods = [("autoregressive", sj.Autoregressive())]
  methods += [(f"speculative g={int(g)}", sj.Speculative(draft=draft, gamma=int(g)))
              for g in gammas]
  sampling = sj.Sampling(temperature=temperature)
  calls, iterations, times = {}, {}, {}
  for name, method in methods:
    for n in lengths:
      def call(method=method, n=n):
        out = sj.generate(target, prompts, method, sampling, max_new_tokens=n,
                          key=jax.random.key(seed))
        jax.block_until_ready(out.tokens)
        return out
      out = call()  # compiles
      calls[name, n] = call
      iterations[name, n] = int(out.stats.target_calls) - 1  # the prefill is not an iteration
      times[name, n] = []
  for _ in range(repeats):
    for key, call in calls.items():
      start = time.perf_counter()
      call()
      times[key].append(time.perf_counter() - start)
  rows = []
  for name, _ in methods:
    medians = [statistics.median(times[name, n]) for n in lengths]
    per_token, per_call = np.polyfit(lengths, medians, 1)
    longest = lengths[-1]
    rows.append({"method": name, "per_call_ms": per_call * 1e3, "per_token_ms": per_token * 1e3,
                 "iterations": iterations[name, longest],
                 "ms_per_iteration": per_token * longest / iterations[name, longest] * 1e3,
                 "median_s": dict(zip(lengths, medians))})
  return rows


def main(argv):
  del argv
  import jax

  from experiments import models

  target, draft, prompts, specs = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens,
      FLAGS.gammas, FLAGS.temperature, max(int(n) for n in FLAGS.lengths))
  print(f"target {specs['target'].spec} ({target.config.num_params() / 1e6:.2f}M), draft "
        f"{specs['draft'].spec} ({draft.config.num_params() / 1e6:.2f}M); batch "
        f"{FLAGS.batch_size}, temperature {FLAGS.temperature}, max_new_tokens "
        f"{','.join(FLAGS.lengths)}, {FLAGS.repeats} interleaved repeats; jax {jax.__version__} "
        f"on {jax.default_backend()}")
  rows = split_costs(target, draft, prompts, FLAGS.gammas, FLAGS.lengths, FLAGS.repeats,
                     FLAGS.temperature)
  ar = rows[0]["per_token_ms"]
  print(f"\n{'method':18s} {'per call ms':>11s} {'per token ms':>12s} {'per-token speedup':>17s} "
        f"{'iterations':>10s} {'ms/iteration':>12s}")
  for r in rows:
    print(f"{r['method']:18s} {r['per_call_ms']:11.1f} {r['per_token_ms']:12.3f} "
          f"{ar / r['per_token_ms']:17.2f} {r['iterations']:10d} {r['ms_per_iteration']:12.3f}")


if __name__ == "__main__":
  app.run(main)
