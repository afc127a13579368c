r"""Adaptive draft lengths against fixed gammas on the benchmark pair (issue 30).

    python -m experiments.train --config=configs/train_bench.py   # once: ~55 min on 2 CPU cores
    python -m experiments.run --config=configs/adaptive_bench.py                   # Python, batch 1
    python -m experiments.run --config=configs/adaptive_bench.py:batch=4
    python -m experiments.run --config=configs/adaptive_bench.py:prompts=code-edit,batch=8

configs/adaptive.py's menu (0, 1, 2, 3, 4, 6), rules (cost, schedule, confidence) and fixed
chains at gamma 1-6, on the pair of configs/bench.py (6 x 384 target, 1 x 128 draft distilled
from it, both trained on the standard library's source): a regime unlike SmolLM2's, where a fixed
gamma gains 1.6-1.7x at batch 1 and loses at batch 4 (the target's steps are overhead-bound at
batch 1 and cheap per row at batch 4). Prompts: the Python continuations (``python``) or the
code-edit instructions as plain text (``code-edit``: the pair knows no chat template; the
function is copied, then edited), 8 of each, 128 tokens a row (``stop_at_eos=False``: equal
work per setting), 3 interleaved repeats. Each cell writes to its own directory,
``runs/adaptive_bench_<prompts>_b<batch>``, unless ``output_dir=...`` is given.
"""

from configs import adaptive


def get_config(arg=None):
  c = adaptive.get_config()
  c.target = "runs/train_bench/target"
  c.draft = "runs/train_bench/draft_distill"
  c.prompts = "python"
  c.num_prompts = 8
  c.chat_template = False
  c.max_new_tokens = 128
  c.stop_at_eos = False
  c.repeats = 3
  return adaptive.per_cell(c, arg, "adaptive_bench")
