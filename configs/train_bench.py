r"""A bigger target/draft pair for benchmarks: <= 60 minutes on 2 CPU cores, resumable.

  python -m experiments.train --config=configs/train_bench.py
  # interrupted? run the same command again: each stage resumes from its last orbax checkpoint
  # (runs/train_bench/checkpoints/<stage>, every 100-200 steps); finished phases are skipped.

Target: Llama-style 6 layers x 384 (GQA, 6 query / 2 key-value heads), trained 1 layer deep first
and grown to 6 (as in configs/train_default.py); draft: 1 layer x 128 distilled from the target (add
`draft` to the phases for a data-trained one as well). Vocabulary 4096, 256-token windows, 10 MB of
stdlib source. Budgets: data ~1 min, target 12 + 28 min, draft 14 min, evaluation/export ~3 min.
The step counts are upper bounds; on 2 cores the `time_budget`s end each stage (its learning-rate
schedule then runs on the time axis; see experiments/train.py). With a 60-minute budget the
step count limits the target more than its size does (see configs/train_default.py), so expect
the target to beat a data-trained draft by less than its size suggests.
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
  c.target.grow_from_layers = 1
  c.target.grow_train = train_defaults(steps=4000, batch_size=8, lr=2e-3, warmup_steps=50,
                                       min_lr_ratio=0.3, time_budget=12 * 60.0, ckpt_every=200,
                                       log_every=50)
  c.target.train = train_defaults(steps=3000, batch_size=8, lr=1.5e-3, warmup_steps=50,
                                  time_budget=28 * 60.0, ckpt_every=100, log_every=25)
  c.draft.model.update(hidden_size=128, num_layers=1, num_heads=2, intermediate_size=384,
                       max_position_embeddings=1024)
  c.draft.train = train_defaults(steps=4000, batch_size=8, lr=3e-3, warmup_steps=50,
                                 time_budget=14 * 60.0, ckpt_every=200, log_every=50, seed=1)
  c.draft_distill.alpha = 1.0
  c.draft_distill.train = train_defaults(steps=4000, batch_size=8, lr=3e-3, warmup_steps=50,
                                         time_budget=14 * 60.0, ckpt_every=200, log_every=50,
                                         seed=1)
  return c
