r"""The README's first experiment: the embedded default pair, greedy and T=1, a gamma sweep.

    python -m experiments.run --config=configs/default.py

The first run trains the default target/draft pair (about 10 minutes on 2 CPU cores, cached; see
experiments/default_pair.py); after that this finishes in a few minutes. Writes runs/default/
(results.json, report.md, plots). Override anything: ``configs/default.py:gamma=4,temperature=0``
or ``--config.max_new_tokens=128``.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "default"
  c.target = "default"
  c.draft = "default"
  c.prompts = "python-small"
  c.methods = ("autoregressive", "speculative")
  c.gammas = (1, 2, 4)  # the full sweep is configs/leviathan.py; this keeps the first run short
  c.temperatures = (0.0, 1.0)
  c.batch_size = 4
  c.max_new_tokens = 96
  c.repeats = 3
  c.output_dir = "runs/default"
  return runconfig.apply_arg(c, arg)
