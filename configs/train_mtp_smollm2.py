r"""A DeepSeek-V3 multi-token-prediction (MTP) module for SmolLM2-135M-Instruct (DeepSeek-AI 2024,
arXiv 2412.19437 §2.2), trained on its own answers; ``experiments/smollm2_eagle.py`` builds it on
first use (``ensure_smollm2_head("mtp")``), or by hand (outputs in runs/train_mtp_smollm2/):

  python -m experiments.train --config=configs/train_mtp_smollm2.py

Target: ``sj.load_model("smollm2-135m")`` (Llama, 30 layers x 576, vocabulary 49152). Module
(``specjax.heads.mtp``): ``eh_proj`` over [enorm(embedding of token t + 1) ; hnorm(SmolLM2's
final-norm state at t)], one full Llama decoder layer (with its input norm), its own final norm
(``shared_head.norm``) and SmolLM2's LM head, shared and frozen. It starts as a pass-through of
the target's state with ``hnorm`` / ``shared_head.norm`` undoing and redoing SmolLM2's final norm
(``init_eagle_head``): its first guess is SmolLM2's own law one token behind. Trained like
EAGLE-3 (``specjax.training.eagle``): soft-label CE alone, over the full vocabulary (the module
drafts through the whole LM head), at 2 chained steps (the module on its own output, as drafting
chains it), step k weighted 0.8 ** k.

Data: ``experiments/eagle_phase.py``'s defaults (the EAGLE heads now take three times as much).
Budget: a fixed 300 steps of 8 rows: ~2200 s on 2026-12-03's shared box (~5 s a step quiet; its
full-vocabulary CE per chained step is the cost: the EAGLE-1 config cuts its CE to 8192 ids for
speed, the MTP loss has no such option); held-out acceptance in docs/benchmarks.md (every trained
head on SmolLM2).

Saved with ``sj.save_head`` in DeepSeek-V3's layout: the module as layer 30 of the checkpoint
(``model.layers.30.*``), config.json SmolLM2's with ``num_nextn_predict_layers: 1``.
"""

from experiments.eagle_phase import base_config
from specjax.training.eagle import eagle_defaults


def get_config(arg=None):
  del arg
  c = base_config()
  c.out_dir = "runs/train_mtp_smollm2"
  c.eagle.kind = "mtp"
  c.eagle.draft_vocab = 0  # EAGLE-3 only
  c.eagle.train = eagle_defaults(
      steps=300, batch_size=8, lr=2e-3, warmup_steps=20, ttt_steps=2,
      compute_dtype="bfloat16", ckpt_every=50, log_every=25, seed=0)
  return c
