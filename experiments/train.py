r"""Trains a target/draft pair from scratch on the Python standard library's source.

Run:

  python -m experiments.train --config=configs/train_default.py
  python -m experiments.train --config=configs/train_default.py --config.out_dir=/tmp/pair

Phases (``config.phases``, comma-separated, run in order):

* ``tokenizer``      byte-level BPE on the training split (always done first if missing);
* ``target``         the target model, next-token cross-entropy (optionally trained shallow first
                     and grown to full depth: ``target.grow_from_layers``);
* ``draft``          a small draft trained on the data alone;
* ``draft_distill``  the same draft shape trained by KL(target || draft) on the target's full
                     next-token distributions (target forward inside the step, no gradient),
                     mixed with the data loss by ``alpha`` (1.0 = pure KL).

With ``config.teacher`` (a path or checkpoint name, e.g. ``smollm2-135m``) the target is that model
instead, its tokenizer encodes the data and ``draft_distill`` is the only phase; the draft may start
as some of the teacher's layers (``draft_distill.init_layers``, ``draft_from_teacher``), keep
parameters frozen (``train.frozen``), predict a reduced vocabulary (``draft_distill.vocab_size``,
ALGORITHMS.md §13), and the data may add the Python reference as chat conversations and the
teacher's own answers (``corpus.chat_train_bytes``, ``corpus.teacher_chat_prompts``). See
configs/train_smollm2_draft.py.

A config with an ``eagle`` block (configs/train_eagle3_smollm2.py, configs/train_eagle_smollm2.py,
configs/train_medusa_smollm2.py, configs/train_hydra_smollm2.py)
trains an EAGLE-1 or EAGLE-3 head for ``teacher`` on its own answers instead
(experiments/eagle_phase.py).

The mechanisms are ``specjax.training``'s (data windows, losses, optimiser, step, checkpoints,
evaluation, export); this app holds the configs, the data preparation (experiments/corpus.py) and
the phases. Each model phase is resumable: an orbax ``CheckpointManager`` under
``out_dir/checkpoints/<phase>`` holds ``{params, opt_state, meta}`` every ``ckpt_every`` steps and
at the end; on restart the latest one is restored and training continues; finished phases are
skipped. The batch for step ``s`` is a pure function of ``(data seed, s)`` and the learning rate of
``(s, steps)``, so without a time budget a resumed run ends bit-identical to an uninterrupted one.

Limits: ``steps``; ``time_budget`` (seconds per stage; the learning-rate schedule runs on
max(step / steps, time spent / time_budget), so a slow machine ends on time with a decayed schedule;
the time spent is checkpointed too); ``max_seconds`` / ``max_steps_per_run`` (hard caps for one run:
checkpoint, export, stop the run there; rerun to continue).

Outputs (``out_dir``): ``<phase>/`` in Hugging Face layout (config.json, model.safetensors and the
tokenizer, loadable by ``transformers`` and ``specjax.load_model``), ``tokenizer/``, ``data/``
(token streams), ``train_report.json``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time

import numpy as np

from experiments import corpus as corpus_lib
from specjax.models.transformer import Transformer
from specjax.training import (Batches, draft_from_teacher, eval_windows, export_model,
                              frequent_ids, greedy_agreement, grow_model, initial_model,
                              load_exported, mean_kl, model_config, teacher_samples,
                              train_defaults, train_model)
from specjax.training.checkpoint import has_checkpoint
from specjax.training.progress import log as _log

PHASES = ("target", "draft", "draft_distill")
REPORT_FILE = "train_report.json"

__all__ = ["PHASES", "REPORT_FILE", "base_config", "main", "prepare_data", "run",
           "train_defaults"]  # train_defaults: configs/train_*.py build their blocks with it


def base_config():
  """Every field ``run`` reads, with defaults; config files start from this and override."""
  import ml_collections
  c = ml_collections.ConfigDict()
  c.out_dir = "runs/train"
  c.phases = "target,draft,draft_distill"  # any of target, draft, draft_distill, in order
  c.default_draft = "draft_distill"  # the draft the default pair uses
  # A model to distil draft_distill from instead of a target trained here: a path or checkpoint
  # name for specjax.load_model (e.g. "smollm2-135m"); its tokenizer replaces the trained one and
  # the only phase is draft_distill. Loaded in teacher_dtype (bfloat16: ~2x faster,
  # specjax.training.forward.mm).
  c.teacher = ""
  c.teacher_dtype = "bfloat16"
  c.corpus = ml_collections.ConfigDict(dict(
      root="",                  # "" -> the Python standard library (sysconfig stdlib path)
      max_train_bytes=4_000_000,
      max_val_bytes=200_000,
      val_percent=5.0,          # share of files (by path checksum) held out for validation
      seed=0,
      chat_train_bytes=0,       # >0 (with a teacher): corpus.chat_corpus, the Python reference as
      chat_val_bytes=20_000,    # conversations in the teacher's chat template, added to the data
      teacher_chat_prompts=0,   # >0 (with a teacher): teacher_samples, the teacher's greedy
      teacher_code_prompts=0,   # answers to corpus.chat_prompts and to stdlib code windows (up
      teacher_tokens=128,       # to teacher_tokens each), repeated to make about
      teacher_share=0.5))       # teacher_share of the training windows
  c.tokenizer = ml_collections.ConfigDict(dict(vocab_size=2048, min_frequency=2))
  c.data = ml_collections.ConfigDict(dict(seq_len=128, seed=0, eval_tokens=32768))
  # Greedy agreement and KL of each draft with the target on the validation windows, after
  # training (report["agreement"]); a first-use build skips it (the run measures acceptance).
  c.agreement = True
  c.target = ml_collections.ConfigDict()
  c.target.model = ml_collections.ConfigDict(dict(
      hidden_size=256, num_layers=4, num_heads=4, intermediate_size=768,
      tie_word_embeddings=False))
  c.target.train = train_defaults()
  # >0: first train a model of this many layers (same width) with `grow_train`, then grow it into
  # target.model (see grow_model) and train that with `train`.
  c.target.grow_from_layers = 0
  c.target.grow_train = train_defaults(min_lr_ratio=0.3)
  c.draft = ml_collections.ConfigDict()
  c.draft.model = ml_collections.ConfigDict(dict(
      hidden_size=128, num_layers=1, num_heads=2, intermediate_size=384,
      tie_word_embeddings=False))
  c.draft.train = train_defaults(seed=1)
  c.draft_distill = ml_collections.ConfigDict()  # same shape as draft.model
  c.draft_distill.alpha = 1.0  # weight of KL(target || draft); 1 - alpha goes to the data loss
  # Teacher layers (e.g. "0,1") that start the draft: draft_from_teacher, the teacher's width and
  # embedding/head (draft.model is then unused); "" = draft.model, initialised at random.
  c.draft_distill.init_layers = ""
  # K > 0: the draft's head covers the K token ids most frequent in the training data (ties: the
  # lower id, i.e. the earlier BPE merge); q = 0 elsewhere (ALGORITHMS.md §13). The exported
  # draft keeps its full head, with the ids in reduced_vocab.VOCAB_FILE beside it.
  c.draft_distill.vocab_size = 0
  c.draft_distill.train = train_defaults(seed=1)
  return c


# --------------------------------------------------------------------------------------- pipeline


def _int_list(value) -> list[int]:
  """``"0,1"`` / ``(0, 1)`` / ``""`` -> a list of ints."""
  if isinstance(value, str):
    return [int(v) for v in value.split(",") if v.strip()]
  return [int(v) for v in (value or ())]


def prepare_data(config, out_dir: pathlib.Path):
  """(tokenizer, train stream, val stream), built once and cached under ``out_dir``."""
  from transformers import AutoTokenizer

  tok_dir, data_dir = out_dir / "tokenizer", out_dir / "data"
  have_tokenizer = (tok_dir / "tokenizer.json").exists()
  if have_tokenizer and (data_dir / "val.npy").exists():
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    return tokenizer, np.load(data_dir / "train.npy"), np.load(data_dir / "val.npy")
  t0 = time.time()
  c = config.corpus
  corpus = corpus_lib.load_corpus(
      root=c.get("root") or None, max_train_bytes=int(c.max_train_bytes),
      max_val_bytes=int(c.max_val_bytes), val_percent=float(c.val_percent), seed=int(c.seed))
  _log(f"corpus: {len(corpus.train)} training files ({corpus.train_bytes / 1e6:.2f} MB), "
       f"{len(corpus.val)} validation files ({corpus.val_bytes / 1e6:.2f} MB) from "
       f"{c.get('root') or corpus_lib.stdlib_root()}")
  teacher = config.get("teacher", "")
  if have_tokenizer:  # keep the tokenizer the saved models were trained with; re-encode only
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
  elif teacher:
    from specjax.models.hf import load_tokenizer
    tokenizer = load_tokenizer(teacher)
  else:
    tokenizer = corpus_lib.train_tokenizer(corpus.train, int(config.tokenizer.vocab_size),
                                           int(config.tokenizer.get("min_frequency", 2)))
  train_texts, val_texts = list(corpus.train), list(corpus.val)
  if int(c.get("chat_train_bytes", 0) or 0):
    if not teacher:
      raise ValueError("corpus.chat_train_bytes needs a teacher (its tokenizer's chat template)")
    chat = corpus_lib.chat_corpus(tokenizer, int(c.chat_train_bytes), int(c.chat_val_bytes),
                                  float(c.val_percent))
    train_texts += chat.train
    val_texts += chat.val
    _log(f"chat slice: {len(chat.train)} training / {len(chat.val)} validation conversations "
         f"({chat.train_bytes / 1e6:.2f} MB) from the Python reference")
  train = corpus_lib.encode_stream(tokenizer, train_texts)
  val = corpus_lib.encode_stream(tokenizer, val_texts)
  train_bytes = sum(len(t.encode()) for t in train_texts)
  _log(f"tokenizer: {teacher + chr(39) + 's' if teacher else 'byte-level BPE'}, "
       f"{len(tokenizer)} tokens; {len(train):,} training / {len(val):,} validation tokens "
       f"({train_bytes / max(len(train), 1):.2f} bytes/token), {time.time() - t0:.1f}s")
  n_chat, n_code = (int(c.get(k, 0) or 0) for k in ("teacher_chat_prompts",
                                                        "teacher_code_prompts"))
  if n_chat or n_code:
    if not teacher:
      raise ValueError("corpus.teacher_chat_prompts / teacher_code_prompts need a teacher")
    t1 = time.time()
    instructions = corpus_lib.chat_prompts(corpus.train, n_chat, int(c.seed))
    samples = teacher_samples(teacher, tokenizer, instructions, corpus.train, n_code,
                              int(c.teacher_tokens), int(c.seed))
    share = float(c.teacher_share)
    reps = max(1, round(len(train) * share / (1.0 - share) / len(samples)))
    train = np.concatenate([train, np.tile(samples, reps)])
    _log(f"teacher samples: {len(samples):,} tokens, the teacher's greedy answers to {n_chat} "
         f"chat and {n_code} code prompts (x{reps}: ~{share:.0%} of the "
         f"training windows), "
         f"{time.time() - t1:.1f}s")
  data_dir.mkdir(parents=True, exist_ok=True)
  np.save(data_dir / "train.npy", train)
  np.save(data_dir / "val.npy", val)
  if not have_tokenizer:
    tmp = out_dir / "tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(tok_dir, ignore_errors=True)
    os.replace(tmp, tok_dir)
  return tokenizer, train, val


def run(config, out_dir: str | os.PathLike | None = None) -> dict:
  """Runs ``config.phases`` (see the module docstring); returns the report (also written to
  ``out_dir/train_report.json``). Phases already exported (``<phase>/config.json``) are skipped."""
  if "eagle" in config:  # an EAGLE head for config.teacher instead of the phases
    from experiments import eagle_phase
    return eagle_phase.run(config, out_dir)
  out_dir = pathlib.Path(out_dir or config.out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  t_start = time.time()
  phases = [p.strip() for p in str(config.phases).split(",") if p.strip()]
  for p in phases:
    if p not in PHASES + ("tokenizer",):
      raise ValueError(f"unknown phase {p!r}; known: tokenizer, {', '.join(PHASES)}")
  teacher_name = str(config.get("teacher", "") or "")
  others = [p for p in phases if p not in ("tokenizer", "draft_distill")]
  if teacher_name and others:
    raise ValueError(f"with a teacher the only phase is draft_distill, got {others[0]!r}")
  report_path = out_dir / REPORT_FILE
  report = json.loads(report_path.read_text()) if report_path.exists() else {}
  report.setdefault("phases", {})

  t0 = time.time()
  tokenizer, train_stream, val_stream = prepare_data(config, out_dir)
  report["data"] = {"vocab_size": len(tokenizer), "train_tokens": int(len(train_stream)),
                    "val_tokens": int(len(val_stream)), "seconds": time.time() - t0}
  seq_len = int(config.data.seq_len)
  val_windows = eval_windows(val_stream, seq_len, int(config.data.eval_tokens))
  vocab = len(tokenizer)

  models: dict[str, Transformer] = {}
  if teacher_name:  # the target is given: distil from it
    from specjax.models.hf import load_model
    models["target"] = load_model(teacher_name, dtype=config.get("teacher_dtype") or None)
    vocab = models["target"].config.vocab_size

  def get_model(phase):
    if phase not in models:
      models[phase] = load_exported(out_dir / phase)
    return models[phase]

  for phase in phases:
    if phase == "tokenizer":
      continue
    dest = out_dir / phase
    if (dest / "config.json").exists() and phase in report["phases"] and \
        not report["phases"][phase].get("stopped_early"):
      _log(f"{phase}: already trained ({dest}), skipping")
      continue
    spec = config[phase]
    model_cfg = config.draft.model if phase == "draft_distill" else spec.model
    mc = model_config(model_cfg, vocab, seq_len, eos_id=tokenizer.eos_token_id)
    train_cfg = spec.train
    ckpt_dir = out_dir / "checkpoints" / phase
    grow_from = int(spec.get("grow_from_layers", 0) or 0)
    init_layers = _int_list(spec.get("init_layers", "")) if phase == "draft_distill" else []
    k = int(spec.get("vocab_size", 0) or 0) if phase == "draft_distill" else 0
    head_ids = frequent_ids(train_stream, k, vocab) if k else None
    stage1_report = None
    if init_layers:  # also when resuming: the frozen parameters come from the teacher again
      model = draft_from_teacher(get_model("target"), init_layers)
      mc = model.config
    elif grow_from and not has_checkpoint(ckpt_dir, train_cfg):
      # Stage 1: a shallow model of the same width, grown below into the full depth.
      stage_cfg = spec.grow_train
      small_mc = model_config(dict(model_cfg, num_layers=grow_from), vocab, seq_len,
                              eos_id=tokenizer.eos_token_id)
      small, stage1_report = train_model(
          initial_model(small_mc, stage_cfg), stage_cfg,
          Batches(train_stream, int(stage_cfg.batch_size), seq_len,
                  seed=int(config.data.seed) + 1000),
          val_windows, out_dir / "checkpoints" / f"{phase}_stage1", name=f"{phase}_stage1")
      if stage1_report["stopped_early"]:
        report["phases"][f"{phase}_stage1"] = stage1_report
        report_path.write_text(json.dumps(report, indent=1))
        _log(f"{phase}_stage1 stopped early; rerun to continue it")
        break
      model = grow_model(small, mc, train_cfg)
    else:
      model = initial_model(mc, train_cfg)  # replaced by the checkpoint when resuming
    teacher = get_model("target") if phase == "draft_distill" else None
    batches = Batches(train_stream, int(train_cfg.batch_size), seq_len,
                      seed=int(config.data.seed))
    model, rep = train_model(model, train_cfg, batches, val_windows, ckpt_dir, teacher=teacher,
                             alpha=float(spec.get("alpha", 1.0)), name=phase, head_ids=head_ids)
    if stage1_report is not None:
      rep["stage1"] = stage1_report
    rep["model"] = {k: getattr(mc, k) for k in ("vocab_size", "hidden_size", "num_layers",
                                                 "num_heads", "num_kv_heads", "intermediate_size")}
    if init_layers:
      rep["model"]["init_layers"] = init_layers
    if head_ids is not None:
      rep["model"]["head_vocab_size"] = len(head_ids)
    export_model(model, tokenizer, dest, vocab_ids=head_ids)
    models[phase] = model
    report["phases"][phase] = rep
    report_path.write_text(json.dumps(report, indent=1))
    if rep["stopped_early"]:
      _log(f"{phase} stopped early; later phases wait for it (rerun to continue)")
      break

  # Comparisons on the validation windows (inputs only).
  inputs = val_windows[:, :-1]
  summary = {}
  if config.get("agreement", True) and (teacher_name or
                                        (out_dir / "target" / "config.json").exists()):
    from specjax.models.reduced_vocab import load_vocab_ids, reduce_vocab
    for d in ("draft", "draft_distill"):
      if d in report["phases"] and (out_dir / d / "config.json").exists():
        target, draft = get_model("target"), get_model(d)
        summary[d] = {"greedy_agreement": greedy_agreement(target, draft, inputs),
                      "kl_target_draft": mean_kl(target, draft, inputs),
                      "val_loss": report["phases"][d].get("val_loss")}
        ids = load_vocab_ids(out_dir / d)
        if ids is not None:  # what the reduced head proposes (the KL is infinite there)
          summary[d]["greedy_agreement_reduced"] = greedy_agreement(
              target, reduce_vocab(draft, ids), inputs)
        _log(f"{d}: greedy agreement with target {summary[d]['greedy_agreement']:.3f}"
             + (f" ({summary[d]['greedy_agreement_reduced']:.3f} with its {len(ids)}-token head)"
                if ids is not None else "")
             + f", KL(target||{d}) {summary[d]['kl_target_draft']:.3f}")
  report["agreement"] = summary
  report["wall_seconds_this_run"] = time.time() - t_start
  report_path.write_text(json.dumps(report, indent=1))
  return report


def main(argv):
  del argv
  from absl import flags, logging
  if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  report = run(config)
  if "eagle" in config:
    brief = {k: report.get(k) for k in ("seconds", "data", "acceptance")}
    print(json.dumps(dict(brief, agreement=report["train"].get("agreement")), indent=1))
    return
  brief = {p: {k: r.get(k) for k in ("steps", "wall_seconds", "val_loss", "tokens_per_second")}
           for p, r in report["phases"].items()}
  print(json.dumps({"phases": brief, "agreement": report.get("agreement")}, indent=1))


if __name__ == "__main__":
  from absl import app
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.",
                                            lock_config=True)
  app.run(main)
