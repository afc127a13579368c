r"""EAGLE-2 dynamic trees (Li et al. 2024, arXiv 2406.16858) against a static tree and chains.

    python -m experiments.run --config=configs/eagle2_tree.py
    python -m experiments.run --config=configs/eagle2_tree.py:temperature=1

``dynamic:DxWxN``: the draft expands the W most confident nodes per level (cumulative draft
probability) for D levels and the N best candidates are verified, per row; next to a static tree
of the same size (``comb``) and chains. Dynamic trees are verified by the one-hot rule (their
children are a deterministic function of the draft), exact at any temperature.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "eagle2_tree"
  c.prompts = "python"
  c.num_prompts = 8
  c.methods = ("autoregressive", "speculative", "tree")
  c.gammas = (4, 8)
  c.trees = ("dynamic:4x4x16", "dynamic:6x4x32", "dynamic:8x2x16", "comb:8x4")
  c.temperatures = (0.0, 1.0)
  c.batch_size = 4
  c.max_new_tokens = 64
  c.repeats = 2
  c.output_dir = "runs/eagle2_tree"
  return runconfig.apply_arg(c, arg)
