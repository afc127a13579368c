r"""Self-speculative decoding (sj.SelfSpeculative) against autoregressive decoding: the
target (default) drafts for itself with its layers (1, 2, 3) skipped.

    python -m experiments.run --config=configs/self_speculative.py

Written by experiments/search_skip.py on 2026-12-01:

    python -m experiments.search_skip --target=default --prompts=python-small --batch_size=8 \
        --prompt_tokens=32 --gammas=1,2,3,4 --temperature=0.0 --calibration_tokens=64 \
        --max_skip=3 --output=configs/self_speculative.py

The search curve on python-small (greedy acceptance; c = draft step / target step; iter = a bare
iteration in target steps at the best gamma; speedup = the runner's modelled speedup):

    skip  layers skipped           acceptance      c gamma   iter modelled speedup
       0  -                             1.000  1.026     4   6.10             0.82
       1  1                             0.969  0.815     2   2.91             1.00
       2  1,2                           0.945  0.693     2   2.89             0.98
       3  1,2,3                         0.912  0.422     2   2.26             1.22

The skip set belongs to that target: another one needs its own search.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "self_speculative"
  c.target = "default"
  c.prompts = "python-small"
  c.methods = ("autoregressive", "self_speculative")
  c.skip = (1, 2, 3)
  c.gammas = (2,)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 4
  c.max_new_tokens = 96
  c.repeats = 3
  c.output_dir = "runs/self_speculative"
  return runconfig.apply_arg(c, arg)
