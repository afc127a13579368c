"""Token trees and multi-draft methods against chains on one pair: tokens per target call and
wall clock, side by side.

    python -m experiments.tree_vs_chain                        # the embedded default pair
    python -m experiments.tree_vs_chain --batch_size=1 --temperature=1
    python -m experiments.tree_vs_chain --target=runs/train_bench/target \\
        --draft=runs/train_bench/draft_distill --gammas=1,2,4,6,8 --trees=comb:6x3,full:3x3
    python -m experiments.tree_vs_chain --temperature=1 --gammas=4 \\
        --trees=spectr:1x4,spectr:2x4,spectr:4x4,spectr:8x4,naive:2x4,naive:4x4,naive:8x4

Runs ``sj.Autoregressive``, ``sj.Speculative`` at each gamma and each tree method on the same
prompts, interleaved over ``--repeats`` (load noise hits every method alike), and
prints per method: tokens per target call (the prefill excluded: Eq. 1's tokens per iteration),
nodes verified per call, tok/s and the speedup over autoregressive decoding; then the best tree's
tokens per call over the best chain's (issue floor at T = 0: >= 1.15 for a tree of 16-64 nodes).

Tree specs (``sj.TreeSpeculative`` unless said): ``full:DxB`` (depth D, B children per node),
``chains:NxD`` (N disjoint chains of D), ``comb:DxW`` (the draft's top-1 chain of depth D with
W - 1 extra leaf siblings at every depth: D x W nodes; most of a good draft's mass is on its top-1
chain), ``dynamic:DxWxN`` (``sj.DynamicTree(depth=D, width=W, nodes=N)``, EAGLE-2),
``spectr:KxL`` (``sj.SpecTr`` with K i.i.d. chains of L, K-SEQ) and ``naive:KxL`` (the same
drafts under SpecInfer's naive multi-draft rule: the SpecTr paper's Table 1 pairs the two). A
static tree may say how its children are drawn: ``comb:4x4:top_k`` (the draft's top-k, one-hot
rule), ``:iid`` or ``:sampled`` (the default). The grammar is the runner's
(``methods.parse_tree_spec``, ``methods.tree_method``).
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

# --target, --draft, --prompts, --batch_size, --prompt_tokens, --gammas, --temperature and
# --repeats are cost_split's flags (one registry: both tools load a pair the same way).
from experiments import cost_split  # noqa: E402,F401  pylint: disable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_integer("max_new_tokens", 64, "tokens per row")
flags.DEFINE_list("trees", ["comb:4x2", "comb:4x4", "full:2x4", "full:3x2", "chains:2x4"],
                  "tree specs (module docstring)")


def compare(target, draft, prompts, gammas, trees, max_new_tokens: int, temperature: float,
            repeats: int, seed: int = 0) -> list[dict]:
  """One dict per method: name, nodes per call, tokens per call, median seconds."""
  import jax

  import specjax as sj
  from experiments.methods import tree_method

  methods = [("autoregressive", sj.Autoregressive(), 0)]
  methods += [(f"chain g={g}", sj.Speculative(draft, int(g)), int(g)) for g in gammas]
  methods += [tree_method(spec, draft) for spec in trees]
  sampling = sj.Sampling(temperature=temperature)
  rows, calls = [], []
  for name, method, nodes in methods:
    def call(method=method):
      out = sj.generate(target, prompts, method, sampling, max_new_tokens=max_new_tokens,
                        key=jax.random.key(seed))
      jax.block_until_ready(out.tokens)
      return out
    out = call()  # compiles
    s = out.stats
    rows_iters = int(s.row_target_calls.sum()) - len(prompts)  # the prefills are not iterations
    tokens = int(s.generated.sum()) - len(prompts)
    rows.append(dict(method=name, nodes=nodes, tokens_per_call=tokens / max(rows_iters, 1),
                     times=[]))
    calls.append(call)
  for _ in range(repeats):
    for row, call in zip(rows, calls):
      start = time.perf_counter()
      call()
      row["times"].append(time.perf_counter() - start)
  for row in rows:
    row["seconds"] = statistics.median(row.pop("times"))
  return rows


def main(argv):
  del argv
  import jax

  from experiments import models, runconfig

  try:
    trees = list(FLAGS.trees)
    for spec in trees:
      runconfig.parse_tree_spec(spec)  # a bad spec fails before anything loads
    target, draft, prompts, specs = models.load_pair(
        FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens,
        FLAGS.gammas, FLAGS.temperature, FLAGS.max_new_tokens)
  except (runconfig.ConfigError, ValueError) as e:
    raise app.UsageError(str(e)) from None
  print(f"target {specs['target'].spec}, draft {specs['draft'].spec}; batch {FLAGS.batch_size}, "
        f"temperature {FLAGS.temperature}, {FLAGS.max_new_tokens} new tokens, {FLAGS.repeats} "
        f"interleaved repeats; jax {jax.__version__} on {jax.default_backend()}")
  rows = compare(target, draft, prompts, FLAGS.gammas, trees, FLAGS.max_new_tokens,
                 FLAGS.temperature, FLAGS.repeats)
  ar = rows[0]["seconds"]
  tokens = FLAGS.batch_size * FLAGS.max_new_tokens
  print(f"\n{'method':40s} {'nodes/call':>10s} {'tokens/call':>11s} {'tok/s':>8s} {'speedup':>8s}")
  for r in rows:
    print(f"{r['method']:40s} {r['nodes']:10d} {r['tokens_per_call']:11.2f} "
          f"{tokens / r['seconds']:8.1f} {ar / r['seconds']:8.2f}")
  chains = [r for r in rows if r["method"].startswith("chain")]
  tree_rows = [r for r in rows if not r["method"].startswith(("chain", "autoregressive"))]
  if chains and tree_rows:
    best_chain = max(chains, key=lambda r: r["tokens_per_call"])
    best_tree = max(tree_rows, key=lambda r: r["tokens_per_call"])
    print(f"\nbest tree / best chain, tokens per call: {best_tree['method']} / "
          f"{best_chain['method']} = "
          f"{best_tree['tokens_per_call'] / best_chain['tokens_per_call']:.2f}")


if __name__ == "__main__":
  FLAGS.set_default("gammas", ["1", "2", "3", "4", "6"])
  FLAGS.set_default("repeats", 3)
  app.run(main)
