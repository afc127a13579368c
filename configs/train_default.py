r"""The embedded default target/draft pair, trained from scratch on first use (no network).

`experiments.default_pair.ensure_default_pair()` builds it into the user cache with these settings;
to build it by hand:

  python -m experiments.train --config=configs/train_default.py

Sized for a 2-core CPU and <= 10 minutes in total (tokenizer, target, draft, evaluation, export):
each phase has a `time_budget`, and its learning-rate schedule runs on max(step / steps,
time spent / time_budget), so a slow machine ends the phase on time with a fully decayed schedule
and a fast one stops at `steps` (then the result does not depend on the machine's speed).
"""

from experiments.train import base_config, train_defaults


def get_config(arg=None):
  del arg
  c = base_config()
  c.out_dir = "runs/train_default"
  c.phases = "target,draft_distill"
  c.default_draft = "draft_distill"
  c.corpus.max_train_bytes = 4_000_000
  c.corpus.max_val_bytes = 200_000
  c.tokenizer.vocab_size = 2048
  c.data.seq_len = 128
  c.data.eval_tokens = 16384
  c.target.model.update(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=768)
  c.target.train = train_defaults(steps=1500, batch_size=16, lr=4e-3, warmup_steps=30,
                                  time_budget=330.0, ckpt_every=250, log_every=25)
  c.draft.model.update(hidden_size=128, num_layers=1, num_heads=2, intermediate_size=384)
  c.draft.train = train_defaults(steps=1500, batch_size=16, lr=5e-3, warmup_steps=30,
                                 time_budget=150.0, ckpt_every=250, log_every=25, seed=1)
  c.draft_distill.alpha = 1.0
  c.draft_distill.train = train_defaults(steps=1500, batch_size=16, lr=5e-3, warmup_steps=30,
                                         time_budget=150.0, ckpt_every=250, log_every=25, seed=1)
  return c
