r"""An EAGLE-3 head for SmolLM2-135M-Instruct (Li et al. 2025, arXiv 2503.01840), trained on its
own answers; ``experiments/smollm2_eagle.py`` builds it on first use
(``ensure_smollm2_head("eagle3")``), or by hand (outputs in runs/train_eagle3_smollm2/):

  python -m experiments.train --config=configs/train_eagle3_smollm2.py

Target: ``sj.load_model("smollm2-135m")`` (Llama, 30 layers x 576, vocabulary 49152). Head: one
midlayer over [norm(embedding) ; norm(fused hidden)], ``fc`` fusing the inputs of layers 2, 15
and 27, its own norm and an 8192-token LM head (the ids most frequent in the training answers),
started from SmolLM2's final norm and LM head columns and kept there (``frozen``: 15% faster
steps, no worse on held-out rows), the midlayer from a pass-through of the top fused layer
(``init_eagle_head``). Trained by training-time test (``specjax.training.eagle``): 3 steps, not
the repository's 7 (a TTT step added ~0.3 s to a 1.1 s two-step training step: 7 would cost
about twice the time a step), CE against SmolLM2's soft labels over the draft vocabulary, step k
weighted 0.8 ** k.

Data (``experiments/eagle_phase.py``'s defaults): SmolLM2's greedy answers (96 tokens) to 96
instructions and 32 stdlib code windows, ~11.6k answer tokens, plus 384 rows of reference chats and
stdlib source (61k tokens), sampled half and half, in rows of 160 tokens; 8 answer rows held out.

Budget: a fixed 220 steps of 8 rows. On the quiet 2-core box: load 4 s, answers 59 s, features
73 s, training 280 s (1.3 s a step), ~7 minutes in all (a first use skips the acceptance check,
~70 s). Held-out top-1 agreement per TTT step 0.43 0.34 0.33 0.22; greedy acceptance per draft
position at gamma 4 (P(the first i drafts all pass)), CHAT 0.28 0.08 0.03 0.00, PYTHON 0.33
0.10 0.02 0.00, CODE_EDIT 0.43 0.18 0.06 0.00. At this budget EAGLE-1 (configs/
train_eagle_smollm2.py) drafts better: an EAGLE-3 step trains ~3 predictions a position through a
wider layer and its own 8192-row head, 2.4x an EAGLE-1 step's time.

The head is written with ``sj.save_head`` in the EAGLE repository's EAGLE-3 layout (the numbers
above were measured before that layout landed, with the head saved as an npz).
"""

from experiments.eagle_phase import base_config
from specjax.training.eagle import eagle_defaults


def get_config(arg=None):
  del arg
  c = base_config()
  c.out_dir = "runs/train_eagle3_smollm2"
  c.eagle.kind = "eagle3"
  c.eagle.draft_vocab = 8192
  c.eagle.train = eagle_defaults(
      steps=220, batch_size=8, lr=3e-3, warmup_steps=20, ttt_steps=3, frozen="lm_head",
      compute_dtype="bfloat16", ckpt_every=50, log_every=20, seed=0)
  return c
