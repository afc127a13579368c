"""Training data as token streams: random windows per step, validation windows, the most frequent
ids of a stream (a reduced-vocabulary head), a teacher's own greedy text (on-policy data) and
requests a chat teacher writes itself (``self_instructions``).

Batches are a pure function of ``(seed, step)``, so a run resumed from a checkpoint at any step
sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class Batches:
  """Training windows: batch ``step`` is ``batch_size`` random windows of ``seq_len + 1`` tokens,
  drawn by a generator seeded with ``(seed, step)``; resuming at any step is exact."""

  def __init__(self, stream: np.ndarray, batch_size: int, seq_len: int, seed: int = 0):
    if len(stream) < seq_len + 2:
      raise ValueError(f"token stream of {len(stream)} tokens is shorter than seq_len + 2 = "
                       f"{seq_len + 2}")
    self.stream = np.asarray(stream, np.int32)
    self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
    self._offsets = np.arange(seq_len + 1)[None, :]

  def __call__(self, step: int) -> np.ndarray:
    rng = np.random.default_rng([self.seed, step])
    starts = rng.integers(0, len(self.stream) - self.seq_len - 1, size=self.batch_size)
    return self.stream[starts[:, None] + self._offsets]  # int32[B, T + 1]


def eval_windows(stream: np.ndarray, seq_len: int, max_tokens: int) -> np.ndarray:
  """int32[N, seq_len + 1] non-overlapping windows from the start of ``stream``."""
  n = min((len(stream) - 1) // seq_len, max(1, max_tokens // seq_len))
  if n < 1:
    raise ValueError(f"validation stream of {len(stream)} tokens is shorter than seq_len + 1")
  idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
  return np.asarray(stream, np.int32)[idx]


def frequent_ids(stream: np.ndarray, k: int, vocab_size: int) -> np.ndarray:
  """int32[k], ascending: the ``k`` ids most frequent in ``stream``; ties (unseen ids included)
  go to the lower id, which in a BPE vocabulary is the earlier, more frequent merge."""
  if not 0 < k <= vocab_size:
    raise ValueError(f"vocab_size {k} must be in 1..{vocab_size}")
  counts = np.bincount(np.asarray(stream, np.int64), minlength=vocab_size)[:vocab_size]
  return np.sort(np.argsort(-counts, kind="stable")[:k]).astype(np.int32)


def teacher_prompts(tokenizer, instructions: Sequence[str], code_texts: Sequence[str],
                    n_code: int, seed: int = 0, prompt_tokens: int = 48) -> list[list[int]]:
  """Token prompts: the chat ``instructions`` in the tokenizer's chat template (with the
  assistant's generation prompt), then ``n_code`` windows of ``prompt_tokens`` tokens cut at
  seeded random offsets from seeded random texts of ``code_texts``."""
  rng = np.random.default_rng([seed, 7])
  chat = [tokenizer.encode(tokenizer.apply_chat_template(
      [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True),
      add_special_tokens=False) for text in instructions]
  code = []
  for i in rng.permutation(len(code_texts))[:n_code]:
    ids = tokenizer.encode(code_texts[i], add_special_tokens=False)
    start = int(rng.integers(0, max(1, len(ids) - prompt_tokens)))
    code.append(ids[start:start + prompt_tokens])
  return chat + code


def self_instructions(model, tokenizer, n: int, temperature: float = 0.8,
                      max_tokens: int = 48, seed: int = 0) -> list[str]:
  """Up to ``n`` distinct user instructions written by ``model`` itself (Magpie: Xu et al. 2024,
  arXiv 2406.08464): its chat template up to the start of a user turn, sampled at
  ``temperature`` until the end of that turn; rows that do not end it within ``max_tokens``
  tokens are dropped, so fewer than ``n`` may come back (``2 n`` rows are sampled, in one
  ``sj.generate`` batch). An aligned chat model writes the requests it was tuned on, so its
  answers to them are on-policy data from its own instruction distribution, far wider than
  a template's (SmolLM2-135M at 0.8: recipes, careers, sustainability, small Python tasks).
  Deterministic for a given ``seed``, model and machine."""
  import jax

  from specjax.decoding.generate import generate
  from specjax.sampling import Sampling

  if n < 1 or not 0 < temperature or max_tokens < 2:
    raise ValueError(f"need n >= 1, temperature > 0 and max_tokens >= 2, got {n}, "
                     f"{temperature}, {max_tokens}")
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError("self_instructions needs a chat model: the tokenizer has no chat template")
  marker = "\x00INSTRUCTION\x00"
  text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                       add_generation_prompt=True)
  if text.count(marker) != 1:
    raise ValueError("self_instructions: the chat template does not place a user message "
                     "verbatim, so the text before one cannot be found")
  head, tail = text.split(marker)
  end_ids = tokenizer.encode(tail, add_special_tokens=False)[:1]  # the end-of-turn token
  if not end_ids:
    raise ValueError("self_instructions: the chat template puts nothing after a user message, "
                     "so a sampled one has no end")
  prefix = tokenizer.encode(head, add_special_tokens=False)
  out = generate(model, [prefix] * (2 * n), sampling=Sampling(temperature=temperature),
                 max_new_tokens=max_tokens, key=jax.random.key(seed), eos_token_id=end_ids)
  seen, found = set(), []
  for row, length in zip(np.asarray(out.tokens), np.asarray(out.lengths)):
    if length < 2 or int(row[length - 1]) != end_ids[0]:
      continue  # unfinished within max_tokens
    instruction = tokenizer.decode([int(t) for t in row[:length - 1]]).strip()
    if instruction and instruction not in seen:
      seen.add(instruction)
      found.append(instruction)
  return found[:n]


def teacher_answers(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    eos_token_id: int | None) -> list[np.ndarray]:
  """int32 greedy continuation of each prompt by ``model`` (a loaded ``Transformer``), up to
  ``max_new_tokens`` tokens, ending at its first EOS (included) if it emits one.

  All prompts go in one ``sj.generate`` batch: one compilation and one loop (greedy rows are
  independent, so the batch does not change any row's tokens)."""
  from specjax.decoding.generate import generate

  out = generate(model, [list(p) for p in prompts], max_new_tokens=max_new_tokens,
                 eos_token_id=eos_token_id)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  return [np.asarray(row[:length], np.int32) for row, length in zip(tokens, lengths)]


def teacher_samples(teacher, tokenizer, instructions: Sequence[str],
                    code_texts: Sequence[str], n_code: int, max_new_tokens: int, seed: int = 0,
                    prompt_tokens: int = 48) -> np.ndarray:
  """int32 token stream of the teacher's greedy continuations (each prompt + its continuation +
  EOS) of the chat ``instructions`` (in its chat template) and of ``n_code`` windows of
  ``prompt_tokens`` tokens cut from ``code_texts`` (``teacher_prompts``, ``teacher_answers``);
  ``teacher`` is a loaded model, or a path or checkpoint name for ``specjax.load_model``.

  What a draft meets at decoding time is the target's own output, and the teacher's greedy text is
  far easier to predict than human text: a 2-layer SmolLM2 draft agreed with it on 0.65 of the
  positions of such samples against 0.36 on the stdlib's own code. On-policy data, as in
  DistillSpec (Zhou et al. 2023, arXiv 2310.08461). The teacher decodes in float32, the target's
  own dtype in the runs the draft serves: its greedy text is that model's (in bfloat16, with the
  products on the CPU's fast kernels, the 96 chats took as long end to end).
  """
  if isinstance(teacher, str):
    from specjax.models.hf import load_model
    teacher = load_model(teacher)
  eos = tokenizer.eos_token_id
  prompts = teacher_prompts(tokenizer, instructions, code_texts, n_code, seed, prompt_tokens)
  answers = teacher_answers(teacher, prompts, max_new_tokens, eos)
  return np.concatenate([np.asarray(list(prompt) + answer.tolist() + [eos], np.int32)
                         for prompt, answer in zip(prompts, answers)])
