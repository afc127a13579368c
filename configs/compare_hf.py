r"""specjax vs Hugging Face transformers on the same checkpoints and prompts, batch 1.

    python -m experiments.run --config=configs/compare_hf.py
    python -m experiments.run --config=configs/compare_hf.py:target=random:tiny-target,draft=random:tiny-draft,prompts=python-tiny

Runs, interleaved prompt by prompt: specjax autoregressive and speculative, transformers greedy
``generate`` and assisted generation (``assistant_model=``, the assistant's generation_config set
to ``num_assistant_tokens = gamma``, ``num_assistant_tokens_schedule = "constant"`` and
``assistant_confidence_threshold = 0`` so that it drafts exactly gamma tokens per iteration, like
ours), our prompt lookup and transformers' (``prompt_lookup_num_tokens = gamma``,
``max_matching_ngram_size = max_ngram``; theirs takes the earliest match of the longest n-gram,
ours the latest). Batch 1 because transformers' assisted generation refuses batches. The table's
``ours/HF`` column is our tokens/s divided by transformers' for the same method, gamma and
temperature; ``greedy=AR`` on the hf_autoregressive rows is the fraction of
prompts where transformers' greedy tokens equal ours. Needs torch (pip install 'specjax[hf]').
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "compare_hf"
  c.target = "default"
  c.draft = "default"
  c.prompts = "python-small"
  c.methods = ("autoregressive", "speculative", "prompt_lookup", "hf_autoregressive",
               "hf_assisted", "hf_prompt_lookup")
  c.gammas = (2, 4)
  c.temperatures = (0.0,)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.repeats = 3
  c.output_dir = "runs/compare_hf"
  return runconfig.apply_arg(c, arg)
