r"""A bigger target/draft pair for benchmarks: <= 60 minutes on 2 CPU cores, resumable.

  python -m experiments.train --config=configs/train_bench.py
  # interrupted? run the same command again: each phase resumes from its last orbax checkpoint
  # (out_dir/checkpoints/<phase>); finished phases are skipped.

Target: 6 layers x 384 (GQA 6/2 heads), vocabulary 4096, 256-token windows; draft: 1 layer x 192,
distilled from the target (add `draft` to phases for a data-trained one as well). Step counts are
what an idle 2-core machine should reach in the phase budgets; the `time_budget`s (target 38 min,
draft 14 min; the rest is data, compilation and evaluation) end a phase on time on a slower one
(its learning-rate schedule then runs on the time axis; see experiments/train.py).
"""

from experiments.train import base_config, train_defaults


def get_config(arg=None):
  del arg
  c = base_config()
  c.out_dir = "runs/train_bench"
  c.phases = "target,draft_distill"
  c.default_draft = "draft_distill"
  c.corpus.max_train_bytes = 10_000_000
  c.corpus.max_val_bytes = 300_000
  c.tokenizer.vocab_size = 4096
  c.data.seq_len = 256
  c.data.eval_tokens = 32768
  c.target.model.update(hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2,
                        intermediate_size=1024, max_position_embeddings=1024)
  c.target.train = train_defaults(steps=1200, batch_size=16, lr=2e-3, warmup_steps=50,
                                  time_budget=38 * 60.0, ckpt_every=50, log_every=10)
  c.draft.model.update(hidden_size=192, num_layers=1, num_heads=3, intermediate_size=512,
                       max_position_embeddings=1024)
  c.draft.train = train_defaults(steps=1200, batch_size=16, lr=4e-3, warmup_steps=50,
                                 time_budget=14 * 60.0, ckpt_every=100, log_every=20, seed=1)
  c.draft_distill.alpha = 1.0
  c.draft_distill.train = train_defaults(steps=1200, batch_size=16, lr=4e-3, warmup_steps=50,
                                         time_budget=14 * 60.0, ckpt_every=100, log_every=20,
                                         seed=1)
  return c
