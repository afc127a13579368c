"""Training a proposer: token-stream data, losses (cross-entropy, KL to a teacher), the optimiser,
the jitted step (with its low-precision matmul gradient), resumable orbax checkpoints, evaluation
(validation loss, greedy agreement, KL) and export to a Hugging Face-layout checkpoint.

Entry points::

  import specjax as sj
  draft = sj.training.draft_from_teacher(teacher, [0, 1])      # or initial_model / init_model
  draft, report = sj.training.distill(teacher, draft, train_ids, steps=200, batch_size=8,
                                      seq_len=128, checkpoint_dir="/tmp/ckpt")
  sj.training.export_model(draft, tokenizer, "/tmp/draft")

  model, report = sj.training.fit(model, train_ids, val_stream=val_ids, steps=1000)

  tokens, mask = sj.training.eagle_rows(target, prompts, 96, eos_id, seq_len=160)  # EAGLE heads
  head = sj.training.init_eagle_head(target, "eagle3",
                                     sj.training.draft_vocabulary(tokens, mask, 8192, V))
  head, report = sj.training.train_eagle(target, head, tokens, mask, steps=300)

``fit`` / ``distill`` take the hyper-parameters of ``train_defaults`` as keywords; ``train_model``
is the loop itself (a ``train_defaults`` config, a ``Batches``, validation windows, a checkpoint
directory). Module by module: ``data``, ``losses``, ``optim``, ``forward`` (the training forward
pass), ``step``, ``checkpoint``, ``evaluation``, ``models`` (initialisation), ``loop``,
``export``, ``progress`` (log lines and bars); for EAGLE heads ``eagle`` (steps, loop),
``eagle_data`` (answers, cached features, draft vocabulary), ``eagle_forward`` (the training
forward, training-time test) and ``eagle_eval``. ``experiments/train.py`` is the command-line
app over it.
"""

from specjax.training.checkpoint import checkpoint_manager, restore_checkpoint, save_checkpoint
from specjax.training.data import (Batches, eval_windows, frequent_ids, self_instructions,
                                   teacher_answers, teacher_prompts, teacher_samples)
from specjax.training.eagle import (draft_vocabulary, eagle_defaults, eagle_rows,
                                    init_eagle_head, train_eagle)
from specjax.training.evaluation import evaluate, greedy_agreement, mean_kl
from specjax.training.export import export_model, load_exported
from specjax.training.losses import cross_entropy, kl_divergence
from specjax.training.loop import distill, fit, train_defaults, train_model
from specjax.training.models import draft_from_teacher, grow_model, initial_model, model_config
from specjax.training.optim import learning_rate, make_optimizer
from specjax.training.progress import set_verbose
from specjax.training.step import make_train_step

__all__ = [
    "Batches", "checkpoint_manager", "cross_entropy", "distill", "draft_from_teacher",
    "draft_vocabulary", "eagle_defaults", "eagle_rows", "eval_windows", "evaluate",
    "export_model", "fit", "frequent_ids", "greedy_agreement", "grow_model", "init_eagle_head",
    "initial_model", "kl_divergence", "learning_rate", "load_exported", "make_optimizer",
    "make_train_step", "mean_kl", "model_config", "restore_checkpoint", "save_checkpoint",
    "self_instructions", "set_verbose", "teacher_answers", "teacher_prompts", "teacher_samples",
    "train_defaults", "train_eagle", "train_model",
]
