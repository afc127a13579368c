r"""Decoding step time against the memory roofline: how close one step gets to reading its bytes at
the device's copy bandwidth.

    python -m experiments.roofline                                   # ~1B random Llama, bf16
    python -m experiments.roofline --model=small --batch_sizes=1,8   # seconds, on a CPU

A decoding step at small batch is memory bound: it reads every weight once (the embedding table
only for the rows it looks up) and every KV buffer it attends over (the loop's attention reads
all ``cache_length`` slots of each row, masked). The roofline is those bytes over the bandwidth
measured here, on this device, by a jitted copy (read + write of a large bf16 array); the figure
is roofline time / measured step time (1.0 = at the bandwidth). Steps are timed as the runner
times them (``specjax.costs.measure_step_costs``: many steps inside one jitted loop).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags

import specjax as sj

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "1b", ["1b", "small"], "1b: 20 x 2048 Llama, GQA 32/8 (1.03B); "
                  "small: 4 x 256 (a CPU smoke test)")
flags.DEFINE_list("batch_sizes", ["1", "64"], "batch sizes")
flags.DEFINE_integer("context", 256, "tokens already in the cache")
flags.DEFINE_integer("cache_length", 512, "cache slots per row (what attention reads)")
flags.DEFINE_string("dtype", "bfloat16", "weights and caches")
flags.DEFINE_integer("copy_mib", 1024, "size of the array the bandwidth copy reads")
flags.DEFINE_string("out", "", "write the results as JSON here")

CONFIGS = {
    "1b": dict(vocab_size=32000, hidden_size=2048, num_layers=20, num_heads=32, num_kv_heads=8,
               intermediate_size=5632),
    "small": dict(vocab_size=2048, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                  intermediate_size=768),
}


def copy_bandwidth(mib: int, dtype=jnp.bfloat16, repeats: int = 20) -> float:
  """Bytes per second of a jitted elementwise pass over a ``mib`` MiB array (reads it once,
  writes a new one: 2 x its bytes moved)."""
  x = jnp.ones((mib * 2**20 // jnp.dtype(dtype).itemsize,), dtype)
  f = jax.jit(lambda a: a * 2)
  jax.block_until_ready(f(x))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(x))
    times.append(time.perf_counter() - t0)
  return 2 * x.nbytes / statistics.median(times)


def step_bytes(config: sj.ModelConfig, batch: int, cache_length: int) -> dict:
  """Bytes one decoding step reads: the weights (the embedding table's looked-up rows only, the
  output head whole) and the KV buffers of every layer over ``cache_length`` slots."""
  item = jnp.dtype(config.dtype).itemsize
  c = config
  embedding = c.vocab_size * c.hidden_size
  weights = (c.num_params() - embedding * (1 if not c.tie_word_embeddings else 0)
             + batch * c.hidden_size) * item
  cache = 2 * c.num_layers * batch * c.num_kv_heads * cache_length * c.head_dim * item
  return {"weights": int(weights), "kv_cache": int(cache), "total": int(weights + cache)}


def run(model: str, batch_sizes, context: int, cache_length: int, dtype: str,
        copy_mib: int) -> dict:
  from specjax.costs import measure_step_costs
  if context >= cache_length:
    raise ValueError(f"context {context} must be below cache_length {cache_length}")
  config = sj.ModelConfig(model_type="llama", max_position_embeddings=max(2048, cache_length),
                          dtype=dtype, **CONFIGS[model])
  t0 = time.perf_counter()
  target = sj.init_model(config, 0)
  jax.block_until_ready(jax.tree.leaves(target))
  bandwidth = copy_bandwidth(copy_mib)
  rows = []
  for b in batch_sizes:
    cost = measure_step_costs({"target": target}, int(b), context, cache_length)
    step_s = cost["target_step_ms"] / 1e3
    nbytes = step_bytes(config, int(b), cache_length)
    rows.append({"batch": int(b), "step_ms": step_s * 1e3, "tokens_per_s": int(b) / step_s,
                 "bytes": nbytes, "roofline_ms": nbytes["total"] / bandwidth * 1e3,
                 "roofline_fraction": nbytes["total"] / bandwidth / step_s})
  return {"model": model, "params": int(config.num_params()), "dtype": dtype,
          "context": context, "cache_length": cache_length,
          "device": str(jax.devices()[0].device_kind), "backend": jax.default_backend(),
          "copy_bandwidth_gb_s": bandwidth / 1e9, "rows": rows,
          "wall_s": time.perf_counter() - t0}


def format_results(r: dict) -> str:
  lines = [f"{r['model']}: {r['params'] / 1e6:,.0f}M parameters, {r['dtype']}, on "
           f"{r['device']} ({r['backend']}); copy bandwidth {r['copy_bandwidth_gb_s']:.1f} GB/s; "
           f"context {r['context']} in a {r['cache_length']}-slot cache",
           f"{'batch':>5}  {'step ms':>8}  {'tok/s':>9}  {'GB/step':>8}  {'roofline ms':>11}  "
           f"{'of roofline':>11}"]
  for row in r["rows"]:
    lines.append(f"{row['batch']:>5}  {row['step_ms']:>8.3f}  {row['tokens_per_s']:>9.1f}  "
                 f"{row['bytes']['total'] / 1e9:>8.3f}  {row['roofline_ms']:>11.3f}  "
                 f"{row['roofline_fraction']:>11.2f}")
  return "\n".join(lines)


def main(argv):
  del argv
  results = run(FLAGS.model, FLAGS.batch_sizes, FLAGS.context, FLAGS.cache_length, FLAGS.dtype,
                FLAGS.copy_mib)
  print(format_results(results))
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
