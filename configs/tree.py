r"""Static token trees against chains at equal target budget (SpecInfer / Medusa / Sequoia trees).

    python -m experiments.run --config=configs/tree.py
    python -m experiments.run --config=configs/tree.py:temperature=1,batch=1

Chains at gamma 2-8 next to static trees of 8-39 nodes (``comb:DxW``: the draft's top-1 chain of
depth D with W - 1 extra siblings per depth; ``full:DxB``: B children per node down to D), greedy
and T = 1. The report's tree table gives nodes per pass, the pass's cost in target steps and how
deep accepted paths reach; compare a tree's tokens per call with the best chain's. On a CPU a pass
over N nodes costs about N steps, so trees win tokens per call here, not wall clock
(docs/benchmarks.md; experiments/tree_vs_chain.py for a quicker side-by-side).
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "tree"
  c.prompts = "python"
  c.num_prompts = 8
  c.methods = ("autoregressive", "speculative", "tree")
  c.gammas = (2, 4, 8)
  c.trees = ("comb:4x2", "comb:8x4", "full:3x3", "chains:4x4")
  c.temperatures = (0.0, 1.0)
  c.batch_size = 4
  c.max_new_tokens = 64
  c.repeats = 2
  c.output_dir = "runs/tree"
  return runconfig.apply_arg(c, arg)
