r"""An EAGLE-1 head for SmolLM2-135M-Instruct (Li et al. 2024, arXiv 2401.15077), trained on its
own answers; ``experiments/smollm2_eagle.py`` builds it on first use
(``ensure_smollm2_head("eagle")``), or by hand (outputs in runs/train_eagle_smollm2/):

  python -m experiments.train --config=configs/train_eagle_smollm2.py

Target: ``sj.load_model("smollm2-135m")``. Head: ``fc`` over [embedding of token t + 1 ; SmolLM2's
final-norm feature at t] and one decoder layer, predicting the feature at t + 1, drafting through
SmolLM2's own LM head; it starts as a pass-through of the feature (``init_eagle_head``). Loss
(``specjax.training.eagle``): smooth-L1 on the feature + 0.1 x CE against SmolLM2's soft labels,
uniform noise of width 0.2 on the input features; the CE over the 8192 ids most frequent in the
answers (``loss_vocab``: all 49152 made the step ~3x dearer; drafting still uses every id).

Data (``eagle_phase.EAGLE_DATA``): SmolLM2's greedy answers (96 tokens) to 288 instructions,
to 288 requests SmolLM2 wrote itself (``self_instructions``, Magpie) and to 96 stdlib code
windows, and its answers (64 tokens) to 96 code edits (``corpus.edit_prompts``), 745 prompts in
all (the benchmark's own are never among them), 62.8k answer tokens, plus 1152 rows of
reference chats and stdlib source (184k tokens), sampled half and half, in rows of 160 tokens;
8 answer rows held out. The same as configs/train_eagle3_smollm2.py: equal data for the two.

Budget: a fixed 550 steps of 8 rows. On the 2-core Intel box (2026-12-06, session 38; data
shared with the EAGLE-3 build): features 109 s, training 142 s (0.26 s a step). Greedy
acceptance per draft position at gamma 4 (P(the first i drafts all pass)): CHAT 0.38 0.11 0.04
0.01, PYTHON 0.50 0.17 0.06 0.01, CODE_EDIT 0.58 0.23 0.10 0.01 (the EAGLE-3 head on the same
data: 0.37 0.14 0.05 0.02, 0.53 0.23 0.09 0.03, 0.58 0.29 0.19 0.05; acceptance lengths 1.58,
1.88, 2.11 against these 1.53, 1.74, 1.93). Held-out top-1 agreement per chained step 0.45
0.28 0.22 0.20 (the held-out rows are mostly the target's own requests). The v3 head (no
requests, the AMD box, 2026-12-05: answers ~150 s, features 209 s, training 216 s): 0.66 0.44
0.39 0.33; CHAT 0.36 0.10 0.04 0.01, PYTHON 0.52 0.21 0.06 0.01, CODE_EDIT 0.53 0.20 0.10 0.02
(the distilled draft, configs/train_smollm2_draft.py: 0.515 on CODE_EDIT at gamma 1). Without
the code edits (the v2 head, 2026-12-04): 0.67 0.43 0.37 0.31; CHAT 0.36 0.10 0.03 0.01, PYTHON
0.49 0.18 0.05 0.01, CODE_EDIT 0.53 0.19 0.12 0.03.

On the defaults' third of the data (11.6k answer tokens, 61k text tokens; the head of
smollm2-eagle-v1): answers 59-67 s, features 77 s, training 280 s, CHAT 0.32 0.09 0.02 0.01,
PYTHON 0.43 0.15 0.04 0.02, CODE_EDIT 0.48 0.17 0.10 0.02; there peak lr 4e-3 did no better
(0.31 / 0.42 / 0.44) and 176 prompts instead of 128 neither (0.34 / 0.45 / 0.45).
"""

from experiments.eagle_phase import EAGLE_DATA, base_config
from specjax.training.eagle import eagle_defaults


def get_config(arg=None):
  del arg
  c = base_config()
  c.out_dir = "runs/train_eagle_smollm2"
  c.eagle.kind = "eagle"
  c.eagle.num_layers = 1
  c.eagle.update(EAGLE_DATA)  # three times the defaults' data, code edits, requests (docstring)
  c.eagle.train = eagle_defaults(
      steps=550, batch_size=8, lr=2e-3, warmup_steps=20, loss_vocab=8192,
      compute_dtype="bfloat16", ckpt_every=50, log_every=25, seed=0)
  return c
