"""The head phase of ``experiments/train.py``: an EAGLE-1 or EAGLE-3 head, a DeepSeek-V3 MTP
module (configs/train_mtp_smollm2.py) or Medusa heads for
``config.teacher`` (the target), trained on its own greedy answers with
``specjax.training.eagle`` / ``specjax.training.medusa``.

  python -m experiments.train --config=configs/train_eagle3_smollm2.py
  python -m experiments.train --config=configs/train_eagle_smollm2.py
  python -m experiments.train --config=configs/train_medusa_smollm2.py

A config with an ``eagle`` block runs this instead of train.py's phases (``base_config`` gives
every field). Data: the target's answers to ``corpus.chat_prompts`` instructions (stdlib coding
tasks, questions on the Python reference, everyday requests, in its chat template) and to stdlib
code windows, as rows of ``seq_len`` tokens with the answers masked in (``eagle_rows``); and
``text_rows`` windows of plain text (the Python reference as chats, stdlib source) whose every
token counts. Text rows are cheap (a feature pass, ~1 ms a token on 2 cores, against ~5 ms to
generate an answer token) and their soft labels are still the target's. On the answers alone
(11.6k tokens) an EAGLE-3 head for SmolLM2 agreed with the target on 0.72 of its training
positions after 100 steps but on 0.26 of held-out ones, learning the answers by heart; with 384
text rows it reached 0.33 held out after 300 steps, still rising, and with three times the
answers and the text (configs/train_eagle3_smollm2.py) 0.55 after 550. ``self_instructions``
adds requests the target writes itself (``specjax.training.self_instructions``, Magpie; cached
in ``data/``), answered the same way: with 288 of them and 1100 steps the EAGLE-3 head drafted
as much or more on all three of the benchmark's prompt sets as without them (docs/benchmarks.md,
session 38). Batches take
``answer_share`` of their rows from the answers. The benchmark's own prompts
(``experiments.prompts.CHAT``, ``PYTHON``, ``CODE_EDIT``) are never trained on: they are the
held-out acceptance check (``eval_prompts``).

Outputs (``out_dir``): ``head/`` (``sj.save_head``: the EAGLE repository's layout; ``sj.load_head``
reads it), ``train_report.json`` (phase times, data sizes, the loss history, held-out agreement
per TTT step and acceptance per draft position), ``data/`` (cached answers and features) and
``checkpoints/`` (resumable: rerun the same command after an interruption).
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time

import numpy as np

from experiments import corpus as corpus_lib
from specjax.training.progress import log

REPORT_FILE = "train_report.json"
# The EAGLE-1 and EAGLE-3 heads' data (configs/train_eagle{,3}_smollm2.py, one dict so that the
# two always train on the same): three times base_config's, which the other heads keep, 96 code
# edits (stdlib functions asked back with a change: what teaches a head to copy) and 288
# requests the target writes itself (Magpie: its own instruction distribution, far wider than
# the templates').
EAGLE_DATA = dict(chat_prompts=288, code_prompts=96, edit_prompts=96, self_instructions=288,
                  text_rows=1152)


def base_config():
  """Every field ``run`` reads, with defaults (an EAGLE-3 head for SmolLM2-135M)."""
  import ml_collections

  from specjax.training.eagle import eagle_defaults
  c = ml_collections.ConfigDict()
  c.out_dir = "runs/train_eagle"
  c.teacher = "smollm2-135m"  # the target: a path or checkpoint name for sj.load_model
  c.corpus = ml_collections.ConfigDict(dict(max_train_bytes=1_000_000, chat_bytes=400_000,
                                            seed=0))  # the stdlib and the reference chats
  c.eagle = ml_collections.ConfigDict(dict(
      kind="eagle3",           # "eagle" (EAGLE-1/2), "eagle3", "mtp" (a DeepSeek-V3 MTP
                               # module), "medusa" or "hydra" (these two: train =
                               # medusa_defaults)
      num_layers=1,            # EAGLE-1/2: decoder layers of the head; Medusa: blocks per head
      mtp_modules=1,           # MTP: DeepSeek's sequential modules (> 1: an MTPStack, its D
                               # modules trained as the D steps of its loss)
      medusa_heads=4,          # Medusa / Hydra: heads (head k guesses the token k + 2 ahead)
      prefix_layer=False,      # Hydra: Hydra++'s prefix layer (a decoder layer over the states)
      own_lm_head=False,       # Medusa: a projection per head (the released layout) or the
                               # target's LM head, shared (no [E, V] per head to train)
      draft_vocab=8192,        # EAGLE-3: the most frequent answer ids (0: the whole vocabulary)
      init_from_target=True,   # start as a pass-through of the target's top feature (EAGLE-3:
                               # its LM head and final norm too): init_eagle_head
      layer_from_target=False,  # EAGLE-3: the midlayer starts as the target layer that reads
                               # its high feature (init_eagle_head)
      chat_prompts=96,         # instructions of corpus.chat_prompts answered by the target
      code_prompts=32,         # stdlib code windows of prompt_tokens continued by the target
      edit_prompts=0,          # corpus.edit_prompts: short stdlib functions asked back with a
                               # change (answers of edit_answer_tokens; prompts that do not fit
                               # a row with them are left out)
      edit_answer_tokens=64,
      self_instructions=0,     # requests the target writes itself (training.self_instructions,
                               # Magpie), answered like chat_prompts (answer_tokens each)
      self_temperature=0.8,    # their sampling temperature
      prompt_tokens=48,
      answer_tokens=96,        # max_new_tokens of each answer
      seq_len=160,             # row length (prompt tail + answer)
      text_rows=384,           # extra rows of plain text (Python reference chats, stdlib code):
                               # ~1 ms of feature pass a token against ~5 ms to generate one
      answer_share=0.5,        # with text rows: the share of sampled rows that are answers
      eval_rows=8,             # answer rows held out: top-1 agreement per TTT step
      feature_dtype="bfloat16",  # the target's dtype for the feature pass
      eval_prompts="chat,code,edit",  # held-out acceptance, comma-separated: "chat"
                               # (prompts.CHAT), "code" (PYTHON), "edit" (CODE_EDIT chats); "" none
      eval_gamma=4,
      eval_new_tokens=64,
      train=eagle_defaults()))
  return c


def training_rows(config, target, tokenizer, cache_dir: pathlib.Path) -> dict:
  """{tokens, mask, eval_rows, text_rows, seconds, sizes}: the rows ``run`` trains on, the text
  rows first and the held-out answer rows last."""
  from experiments.prompts import CHAT, CODE_EDIT, PYTHON
  from specjax.training import eagle_rows, teacher_prompts

  c, e = config.corpus, config.eagle
  seed = int(c.seed)
  t0 = time.time()
  corpus = corpus_lib.load_corpus(max_train_bytes=int(c.max_train_bytes), max_val_bytes=50_000,
                                  seed=seed)
  held_out = set(CHAT) | set(PYTHON) | set(CODE_EDIT)
  instructions = [p for p in corpus_lib.chat_prompts(corpus.train, int(e.chat_prompts), seed)
                  if p not in held_out]
  prompts = teacher_prompts(tokenizer, instructions, corpus.train, int(e.code_prompts), seed,
                            int(e.prompt_tokens))
  t1 = time.time()
  tokens, mask = eagle_rows(target, prompts, int(e.answer_tokens), tokenizer.eos_token_id,
                            int(e.seq_len), cache_dir=cache_dir)
  if int(e.edit_prompts):  # whole prompts in the row: the answer copies from them
    if not getattr(tokenizer, "chat_template", None):
      raise ValueError(f"eagle.edit_prompts={e.edit_prompts} asks a chat model for code edits, "
                       f"but {config.teacher}'s tokenizer has no chat template")
    room = int(e.seq_len) - int(e.edit_answer_tokens)
    edits = [p for p in teacher_prompts(
        tokenizer, corpus_lib.edit_prompts(corpus.train, 3 * int(e.edit_prompts), seed), [], 0)
        if len(p) <= room][:int(e.edit_prompts)]
    if not edits:
      raise ValueError(f"no code-edit prompt fits a row of eagle.seq_len={e.seq_len} with "
                       f"eagle.edit_answer_tokens={e.edit_answer_tokens} answer tokens")
    edit_tokens, edit_mask = eagle_rows(target, edits, int(e.edit_answer_tokens),
                                        tokenizer.eos_token_id, int(e.seq_len),
                                        cache_dir=cache_dir)
    prompts = prompts + edits
    tokens, mask = np.concatenate([tokens, edit_tokens]), np.concatenate([mask, edit_mask])
  if int(e.self_instructions):  # the target's own requests (Magpie), answered like the chats
    own = [p for p in cached_self_instructions(target, tokenizer, int(e.self_instructions),
                                               float(e.self_temperature), seed, cache_dir)
           if p not in held_out]
    own = teacher_prompts(tokenizer, own, [], 0)
    own_tokens, own_mask = eagle_rows(target, own, int(e.answer_tokens), tokenizer.eos_token_id,
                                      int(e.seq_len), cache_dir=cache_dir)
    prompts = prompts + own
    tokens, mask = np.concatenate([tokens, own_tokens]), np.concatenate([mask, own_mask])
  t2 = time.time()
  order = np.random.default_rng([seed, 11]).permutation(len(tokens))  # chats and code mixed
  tokens, mask = tokens[order], mask[order]
  text = np.zeros((0, tokens.shape[1]), np.int32)
  if int(e.text_rows):
    streams = [corpus_lib.encode_stream(tokenizer, corpus.train)]
    if getattr(tokenizer, "chat_template", None):  # a chat model: the reference as chats too
      chat = corpus_lib.chat_corpus(tokenizer, int(c.chat_bytes), 0)
      streams.insert(0, corpus_lib.encode_stream(tokenizer, chat.train))
    rng = np.random.default_rng([seed, 12])
    width = tokens.shape[1]
    rows = []
    for i in range(int(e.text_rows)):  # alternately a reference chat and stdlib source
      stream = streams[i % len(streams)]
      start = int(rng.integers(0, len(stream) - width))
      rows.append(stream[start:start + width])
    text = np.stack(rows)
  log(f"data: {len(prompts)} prompts, {int(mask.sum()):,} answer tokens in {len(tokens)} rows "
      f"({t2 - t1:.0f}s), {text.size:,} text tokens in {len(text)} rows")
  return {"tokens": np.concatenate([text, tokens]),
          "mask": np.concatenate([np.ones(text.shape, bool), mask]),
          "eval_rows": int(e.eval_rows), "text_rows": len(text),
          "seconds": {"prompts": t1 - t0, "answers": t2 - t1, "text": time.time() - t2},
          "sizes": {"prompts": len(prompts), "answer_tokens": int(mask.sum()),
                    "text_tokens": int(text.size), "rows": len(tokens) + len(text)}}


def cached_self_instructions(target, tokenizer, n: int, temperature: float, seed: int,
                             cache_dir: pathlib.Path) -> list[str]:
  """``specjax.training.self_instructions`` of ``target``, cached in ``cache_dir`` (keyed by the
  target's parameters and the settings): sampled text is only reproducible on one machine."""
  from specjax.cache import atomic_path
  from specjax.training import self_instructions
  from specjax.training.eagle_data import fingerprint

  path = cache_dir / f"instructions-{fingerprint(target)}-{n}-{temperature}-{seed}.json"
  if path.exists():
    return json.loads(path.read_text())
  t0 = time.time()
  found = self_instructions(target, tokenizer, n, temperature, seed=seed)
  with atomic_path(path) as tmp:  # a crashed build leaves no half-written cache
    tmp.write_text(json.dumps(found, indent=0))
  log(f"data: {len(found)} instructions written by the target ({time.time() - t0:.0f}s)")
  return found


def eval_prompt_sets(config, tokenizer) -> dict[str, list[list[int]]]:
  """The held-out prompt sets of ``config.eagle.eval_prompts``, tokenized (chat: in the target's
  chat template)."""
  from experiments.prompts import CHAT, CODE_EDIT, PYTHON
  chats = {"chat": CHAT, "edit": CODE_EDIT}
  sets = {}
  for name in [s.strip() for s in str(config.eagle.eval_prompts).split(",") if s.strip()]:
    if name in chats:
      sets[name] = [tokenizer.encode(tokenizer.apply_chat_template(
          [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True),
          add_special_tokens=False) for text in chats[name]]
    elif name == "code":
      sets[name] = [tokenizer.encode(text, add_special_tokens=False) for text in PYTHON]
    else:
      raise ValueError(f"eagle.eval_prompts: unknown set {name!r} (known: chat, code, edit)")
  return sets


def run(config, out_dir: str | os.PathLike | None = None) -> dict:
  """Trains the head of ``config.eagle`` into ``out_dir/head``; returns the report (also in
  ``out_dir/train_report.json``)."""
  import specjax as sj
  from specjax.training import draft_vocabulary, init_eagle_head, train_eagle
  from specjax.training.eagle import eagle_acceptance
  from specjax.training.eagle_eval import describe_acceptance
  from specjax.training.medusa import (init_hydra_heads, init_medusa_heads, medusa_acceptance,
                                      train_medusa)

  out_dir = pathlib.Path(out_dir or config.out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  e = config.eagle
  kind = str(e.kind)
  t0 = time.time()
  target = sj.load_model(config.teacher)
  tokenizer = sj.load_tokenizer(config.teacher)
  seconds = {"load": time.time() - t0}
  data = training_rows(config, target, tokenizer, out_dir / "data")
  seconds.update(data["seconds"])
  tokens, mask, n_eval = data["tokens"], data["mask"], data["eval_rows"]
  ids = None
  if kind == "eagle3" and int(e.draft_vocab):  # from the training answers: what drafting meets
    answers = slice(data["text_rows"], len(tokens) - n_eval)
    ids = draft_vocabulary(tokens[answers], mask[answers], int(e.draft_vocab),
                           target.config.vocab_size)
  if kind == "medusa":
    head = init_medusa_heads(target, int(e.medusa_heads), int(e.num_layers),
                             bool(e.own_lm_head), int(e.train.seed), bool(e.init_from_target))
  elif kind == "hydra":
    head = init_hydra_heads(target, int(e.medusa_heads), int(e.num_layers), int(e.train.seed),
                            bool(e.init_from_target), bool(e.prefix_layer))
  else:
    head = init_eagle_head(target, kind, ids, key=int(e.train.seed),
                           num_layers=int(e.num_layers), from_target=bool(e.init_from_target),
                           num_modules=int(e.mtp_modules),
                           layer_from_target=bool(e.layer_from_target))
  with tempfile.TemporaryDirectory() as scratch:  # a layout save_head refuses fails now, not
    sj.save_head(head, scratch)                   # after minutes of training
  n_text, n_answers = data["text_rows"], len(tokens) - n_eval - data["text_rows"]
  share = float(e.answer_share) if n_text else 1.0
  weights = np.concatenate([np.full(n_text, (1.0 - share) / max(n_text, 1)),
                            np.full(n_answers, share / n_answers)])
  train = train_medusa if kind in ("medusa", "hydra") else train_eagle
  head, rep = train(target, head, tokens, mask, eval_rows=n_eval, weights=weights,
                    eos_token_id=tokenizer.eos_token_id, feature_dtype=e.feature_dtype or None,
                    checkpoint_dir=out_dir / "checkpoints" / kind, cache_dir=out_dir / "data",
                    name=kind, **e.train.to_dict())
  seconds.update(rep.pop("seconds"))
  report = {"kind": kind, "teacher": config.teacher, "data": data["sizes"], "seconds": seconds,
            "train": rep}
  if not rep["stopped_early"]:
    t1 = time.time()
    report["acceptance"] = {}
    for name, prompts in eval_prompt_sets(config, tokenizer).items():
      if kind in ("medusa", "hydra"):
        acc = medusa_acceptance(target, head, prompts, int(e.medusa_heads),
                                int(e.eval_new_tokens), tokenizer.eos_token_id)
      else:
        acc = eagle_acceptance(target, head, prompts, int(e.eval_gamma),
                               int(e.eval_new_tokens), tokenizer.eos_token_id)
      report["acceptance"][name] = acc
      log(f"{kind}: held-out {name} prompts, greedy acceptance per position at gamma "
          f"{acc['gamma']}: " + describe_acceptance(acc))
    seconds["acceptance"] = time.time() - t1
    # Hydra++'s file carries the target's embedding for the repository's strict load
    sj.save_head(head, out_dir / "head", target=target if kind == "hydra" else None)
  seconds["total"] = time.time() - t0
  (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=1, default=float))
  return report
