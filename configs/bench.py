r"""The benchmark pair (configs/train_bench.py): speculative vs autoregressive, a gamma sweep.

    python -m experiments.train --config=configs/train_bench.py   # once: <= 60 min on 2 CPU cores
    python -m experiments.run --config=configs/bench.py
    python -m experiments.run --config=configs/bench.py:batch_size=4,gamma=3

Target: 6 x 384 Llama-style (GQA), draft: 1 x 128 distilled from it, both trained by
experiments/train.py on the standard library's source (runs/train_bench/). Batch 4: on a CPU,
XLA runs a one-row matmul as a fast matrix-vector product, so at batch 1 the target's
(gamma + 1)-token verification pass costs 1.3-2.3 single-token steps and the gain is smaller
(measured: 1.07-1.26x greedy, ``configs/bench.py:batch_size=1``); at batch 4 it costs 1.2-2.2
steps (best gamma 1.46-1.75x over several runs: the host's load decides the 1.5x floor). The
README's benchmark table comes from this config and from
``configs/compare_hf.py:target=runs/train_bench/target,...`` (see the README).
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "bench"
  c.target = "runs/train_bench/target"
  c.draft = "runs/train_bench/draft_distill"
  c.prompts = "python"
  c.methods = ("autoregressive", "speculative", "draft_autoregressive")
  c.gammas = (1, 2, 3, 4, 6)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 4
  c.max_new_tokens = 128
  c.repeats = 3
  c.output_dir = "runs/bench"
  return runconfig.apply_arg(c, arg)
