r"""Hydra heads for SmolLM2-135M-Instruct (Ankner et al. 2024, arXiv 2402.05109), trained on its
own answers like the Medusa heads (configs/train_medusa_smollm2.py: the same data, steps, rate
and loss), teacher-forced: head k reads ``[SmolLM2's normed state at t ; the embeddings of the
tokens t + 1 .. t + k + 1]`` and guesses the token at t + k + 2. ``experiments/smollm2_eagle.py``
builds them on first use (``ensure_smollm2_head("hydra")``), or by hand:

  python -m experiments.train --config=configs/train_hydra_smollm2.py

Heads: 4, one conditioned residual block each and a projection of their own (Hydra's released
layout: [E, V] and a bias per head), started from SmolLM2's LM head (``start_hydra_from_target``)
and kept there (``frozen="lm_heads"``: 28M parameters a head would dominate a CPU step; the
blocks, 1.3-2.3M parameters a head, learn). A GPU run would train them too.
"""

from configs.train_medusa_smollm2 import get_config as medusa_config


def get_config(arg=None):
  c = medusa_config(arg)
  c.out_dir = "runs/train_hydra_smollm2"
  c.eagle.kind = "hydra"
  c.eagle.train.frozen = "lm_heads"
  return c
