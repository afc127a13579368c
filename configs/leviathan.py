r"""Leviathan et al. 2023 (arXiv 2211.17192), Tables 2-3 shape: a gamma sweep at T=0 and T=1.

    python -m experiments.run --config=configs/leviathan.py
    python -m experiments.run --config=configs/leviathan.py:gamma=2,temperature=1

For each temperature and gamma: the measured acceptance rate alpha (and E[alpha] = mean of
sum_x min(p, q)), tokens per target call next to (1 - alpha^(gamma+1)) / (1 - alpha) (Eq. 1), and
the measured wall-time speedup next to the paper's Theorem 3.8 at the measured alpha and cost ratio
c. c is measured both ways: draft vs target decoding steps inside a jitted loop, and draft-alone vs
target-alone autoregressive tokens/s (the draft_autoregressive method); the theory uses the former.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "leviathan"
  c.target = "default"
  c.draft = "default"
  c.prompts = "python"
  c.methods = ("autoregressive", "speculative", "draft_autoregressive")
  c.gammas = (1, 2, 3, 4, 5, 6, 7, 8)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 4
  c.max_new_tokens = 128
  c.repeats = 3
  c.output_dir = "runs/leviathan"
  return runconfig.apply_arg(c, arg)
