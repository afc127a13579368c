r"""Chen et al. 2023 (arXiv 2302.01318) setting: K = 4 draft tokens, greedy and nucleus p = 0.8.

    python -m experiments.run --config=configs/chen.py
    python -m experiments.run --config=configs/chen.py:temperature=1

Chen et al. report speculative sampling (their "modified rejection sampling") at K = 4 with greedy
decoding and nucleus sampling (top_p = 0.8, temperature 1). top_p applies to both temperatures here;
at temperature 0 it does not change the argmax, so the greedy row is plain greedy decoding.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "chen"
  c.target = "default"
  c.draft = "default"
  c.prompts = "python"
  c.methods = ("autoregressive", "speculative")
  c.gammas = (4,)
  c.temperatures = (0.0, 1.0)
  c.top_p = 0.8
  c.batch_size = 4
  c.max_new_tokens = 128
  c.repeats = 3
  c.output_dir = "runs/chen"
  return runconfig.apply_arg(c, arg)
