r"""Tiny pair for tests and smoke runs: a few KB of stdlib source, models of a few thousand params.

  python -m experiments.train --config=configs/train_tiny.py --config.out_dir=/tmp/specjax_tiny
"""

from experiments.train import base_config, train_defaults


def get_config(arg=None):
  del arg
  c = base_config()
  c.out_dir = "runs/train_tiny"
  c.corpus.max_train_bytes = 40_000
  c.corpus.max_val_bytes = 8_000
  c.corpus.val_percent = 20.0
  c.tokenizer.vocab_size = 320
  c.data.seq_len = 32
  c.data.eval_tokens = 1024
  small = dict(steps=40, batch_size=8, lr=1e-2, warmup_steps=5, ckpt_every=20, log_every=10)
  c.target.model.update(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
  c.target.train = train_defaults(**small)
  c.draft.model.update(hidden_size=16, num_layers=1, num_heads=1, intermediate_size=32)
  c.draft.train = train_defaults(**small, seed=1)
  c.draft_distill.train = train_defaults(**small, seed=1)
  return c
