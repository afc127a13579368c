r"""Hydra++ heads for SmolLM2-135M-Instruct (Ankner et al. 2024, arXiv 2402.05109, Hydra++: the
Hydra repository's ``prefix-mlp`` heads): configs/train_hydra_smollm2.py's heads, data, steps and
loss, plus the prefix layer, one more SmolLM2 decoder layer run causally over SmolLM2's normed
states (teacher-forced over each cached row), whose output replaces the state in every head's
input. Started from SmolLM2's last decoder layer with its output projections at zero
(``start_prefix_from_target``: the heads start as plain Hydra's); trained with the blocks (the
projections stay frozen, as there).

  python -m experiments.train --config=configs/train_hydra_prefix_smollm2.py
"""

from configs.train_hydra_smollm2 import get_config as hydra_config


def get_config(arg=None):
  c = hydra_config(arg)
  c.out_dir = "runs/train_hydra_prefix_smollm2"
  c.eagle.prefix_layer = True
  return c
