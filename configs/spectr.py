r"""SpecTr (Sun et al. 2023, arXiv 2310.15141), Table 1 shape: K i.i.d. drafts, K-SEQ vs naive.

    python -m experiments.run --config=configs/spectr.py
    python -m experiments.run --config=configs/spectr.py:trees=spectr:8x4/naive:8x4

K = 1, 2, 4, 8 draft chains of L = 4 and 8 tokens at T = 1, selected by K-SEQ (``spectr:KxL``,
rho* for the surviving drafts at each depth) and by SpecInfer's naive multi-draft rule on the same
drafts (``naive:KxL``). The figure of merit is block efficiency: tok/iteration in the tree table
(the paper: K = 8 +25-35% over K = 1). K = 1 K-SEQ is the plain speculative chain.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "spectr"
  c.prompts = "python"
  c.methods = ("autoregressive", "tree")
  c.trees = tuple(f"{kind}:{k}x{length}" for length in (4, 8)
                  for kind, ks in (("spectr", (1, 2, 4, 8)), ("naive", (2, 4, 8))) for k in ks)
  c.temperatures = (1.0,)
  c.batch_size = 8
  c.max_new_tokens = 96
  c.repeats = 1
  c.output_dir = "runs/spectr"
  return runconfig.apply_arg(c, arg)
