r"""Every trained-head method on SmolLM2-135M-Instruct side by side with the distilled draft:
EAGLE-1 and EAGLE-3 heads, Medusa heads, Hydra heads and a DeepSeek-V3 MTP module (each trained
on this machine on first use and cached: configs/train_{eagle,eagle3,medusa,hydra,mtp}_smollm2.py),
chains of gamma 1-4 and one static tree each, greedy and T = 1.

    python -m experiments.run --config=configs/heads.py
    python -m experiments.run --config=configs/heads.py:batch_size=4

The report gives tokens per target call, acceptance by position, wall clock against our
autoregressive decoding (and the cost model: a head's passes x its measured step cost + the
verification pass; Medusa drafts every depth in one pass), and checks every greedy row against
autoregressive decoding token for token. Hydra's tokens per call against Medusa's at the same
tree is the comparison the Hydra paper makes. Prompts: the code-edit chats (no head trained on
them). Head fields (``eagle_head`` ...) take a directory instead of ``"auto"`` to skip a build.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "heads"
  c.target = "smollm2-135m"
  c.draft = "smollm2-draft"
  c.prompts = "code-edit"
  c.num_prompts = 4
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "speculative", "eagle", "eagle3", "medusa", "hydra", "mtp")
  c.gammas = (1, 2, 3, 4)
  c.head_trees = ("full:2x2",)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  c.repeats = 2
  c.output_dir = "runs/heads"
  return runconfig.apply_arg(c, arg)
