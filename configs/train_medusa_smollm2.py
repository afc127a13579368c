r"""Medusa heads for SmolLM2-135M-Instruct (Cai et al. 2024, arXiv 2401.10774, Medusa-1: a frozen
target), trained on its own answers; ``experiments/smollm2_eagle.py`` builds them on first use
(``ensure_smollm2_head("medusa")``), or by hand (outputs in runs/train_medusa_smollm2/):

  python -m experiments.train --config=configs/train_medusa_smollm2.py

Target: ``sj.load_model("smollm2-135m")``. Heads: 4, each one residual SiLU block on SmolLM2's
final-norm state at t, guessing the token at t + k + 2 through SmolLM2's own LM head (shared:
``own_lm_head=False``; the released layout's [E, V] projection per head would be 28M parameters
each), starting as the identity (Medusa's initialisation: head k first guesses what the target
says next). Loss (``specjax.training.medusa``): CE against SmolLM2's soft law at t + k + 1,
head k weighted 0.8 ** (k + 1), over the 8192 ids most frequent in the answers.

Data: ``experiments/eagle_phase.py``'s defaults (SmolLM2's answers to 128 prompts and 384 text
rows, half and half; 8 answer rows held out), the EAGLE heads' data before they took three times
as much (smollm2-eagle*-v2).
"""

from experiments.eagle_phase import base_config
from specjax.training.medusa import medusa_defaults


def get_config(arg=None):
  del arg
  c = base_config()
  c.out_dir = "runs/train_medusa_smollm2"
  c.eagle.kind = "medusa"
  c.eagle.num_layers = 1
  c.eagle.medusa_heads = 4
  c.eagle.own_lm_head = False
  c.eagle.train = medusa_defaults(
      steps=400, batch_size=8, lr=3e-3, warmup_steps=20, loss_vocab=8192,
      compute_dtype="bfloat16", ckpt_every=50, log_every=25, seed=0)
  return c
