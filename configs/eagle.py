r"""EAGLE heads on SmolLM2-135M-Instruct, side by side with the distilled draft.

    python -m experiments.run --config=configs/eagle.py
    python -m experiments.run --config=configs/eagle.py:temperature=1
    python -m experiments.run --config=configs/eagle.py --config.batch_size=4

EAGLE-1 (Li et al. 2024, arXiv 2401.15077: the head drafts on the target's final features,
``smollm2-eagle``) and EAGLE-3 (Li et al. 2025, arXiv 2503.01840: fused low/middle/high features,
training-time test, a reduced draft vocabulary, ``smollm2-eagle3``), both trained on this machine
on first use (configs/train_eagle_smollm2.py, configs/train_eagle3_smollm2.py) and cached; the
distilled draft (``smollm2-draft``) as chains at the same gammas; each head also as two EAGLE-2
dynamic trees, a small one (``3x2x4``: 4 nodes, the fastest tree on a 2-core CPU, where a pass
over 13 tokens costs 2.3 steps) and EAGLE-2's shape (``4x4x12``, for accelerators). The report
gives tokens per target call, acceptance by position, wall clock against our autoregressive
decoding, and checks every greedy row against it token for token.
Prompts: the code-edit chats of configs/smollm2.py (the heads never trained on them).
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "eagle"
  c.target = "smollm2-135m"
  c.draft = "smollm2-draft"
  c.prompts = "code-edit"
  c.num_prompts = 4
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "speculative", "eagle", "eagle3")
  c.gammas = (1, 2, 3, 4, 5)
  c.head_trees = ("dynamic:3x2x4", "dynamic:4x4x12")
  c.temperatures = (0.0,)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  c.repeats = 2
  c.output_dir = "runs/eagle"
  return runconfig.apply_arg(c, arg)
