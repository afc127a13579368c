"""What a pass over T tokens costs the matrix products, against one token: the backend's side of
the runner's ``v`` (a verification pass's cost in target steps).

    python -m experiments.dot_shapes                       # SmolLM2-135M's MLP shapes, 30 layers
    python -m experiments.dot_shapes --hidden=4096 --mlp=11008 --layers=4 --tokens=1,4,8
    python -m experiments.dot_shapes --dtypes=float32,bfloat16   # the same in bfloat16 beside

Times, inside one ``jit``, ``--layers`` gated MLPs (``x + down(silu(x @ gate) * (x @ up))``, the
weights of every layer distinct, so they stream from memory as a model's do) on ``[1, T, hidden]``
activations, for each T in ``--tokens``, interleaved over ``--repeats``; prints the median and
its ratio to T = 1. On an accelerator, or any backend whose small-M matrix products run at the
memory's speed, the ratio stays near 1 up to tens of tokens: reading the weights is the cost
whatever T. Measured on this 2-core CPU (jax 0.10.2, docs/benchmarks.md): T = 1 runs as
matrix-vector products near the memory bandwidth, T >= 2 through XLA:CPU's YNNPACK matrix
products at roughly half of it, so a pass over 4 tokens costs about 2 steps of these layers. This
is why draft-free methods and speculative verification gain less here than their tokens per call
promise; the runner's cost model column carries it.
"""

from __future__ import annotations

import statistics
import time

from absl import app, flags

# --repeats is cost_split's flag (one registry: the side tools share their flags).
from experiments import cost_split  # noqa: E402,F401  pylint: disable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_integer("hidden", 576, "model width (SmolLM2-135M: 576)")
flags.DEFINE_integer("mlp", 1536, "MLP width (SmolLM2-135M: 1536)")
flags.DEFINE_integer("layers", 30, "layers, each with its own weights (SmolLM2-135M: 30)")
flags.DEFINE_list("tokens", ["1", "2", "4", "8", "16"], "tokens per pass (T)")
flags.DEFINE_list("dtypes", ["float32"], "weight dtypes to time (float32, bfloat16), side by side")


def time_passes(hidden: int, mlp: int, layers: int, tokens, repeats: int,
                dtype: str = "float32") -> dict[int, float]:
  """Median seconds of the ``layers``-MLP pass for each T in ``tokens`` (module docstring), the
  weights and activations in ``dtype``, each product computed as the models' ``Dense`` does
  (``specjax.models.transformer.matmul``)."""
  import jax
  import jax.numpy as jnp

  from specjax.models.transformer import matmul

  keys = jax.random.split(jax.random.key(0), 3 * layers)
  shapes = [(hidden, mlp), (hidden, mlp), (mlp, hidden)] * layers
  weights = [(0.02 * jax.random.normal(k, s, jnp.float32)).astype(dtype)
             for k, s in zip(keys, shapes)]

  @jax.jit
  def mlps(weights, x):
    for i in range(0, len(weights), 3):
      gate, up, down = weights[i:i + 3]
      x = x + matmul(jax.nn.silu(matmul(x, gate)) * matmul(x, up), down)
    return x

  inputs = {int(t): jnp.ones((1, int(t), hidden), dtype) for t in tokens}
  for x in inputs.values():
    jax.block_until_ready(mlps(weights, x))  # compiles
  times = {t: [] for t in inputs}
  for _ in range(repeats):
    for t, x in inputs.items():
      start = time.perf_counter()
      jax.block_until_ready(mlps(weights, x))
      times[t].append(time.perf_counter() - start)
  return {t: statistics.median(v) for t, v in times.items()}


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  if not FLAGS.tokens or min(int(t) for t in FLAGS.tokens) < 1:
    raise app.UsageError(f"--tokens must be integers >= 1, got {FLAGS.tokens}")
  bad = [d for d in FLAGS.dtypes if d not in ("float32", "bfloat16")]
  if bad or not FLAGS.dtypes:
    raise app.UsageError(f"--dtypes must be float32 and/or bfloat16, got {FLAGS.dtypes}")
  tokens = sorted({1, *(int(t) for t in FLAGS.tokens)})
  medians = {d: time_passes(FLAGS.hidden, FLAGS.mlp, FLAGS.layers, tokens, FLAGS.repeats, d)
             for d in FLAGS.dtypes}
  params = 3 * FLAGS.hidden * FLAGS.mlp * FLAGS.layers
  print(f"{FLAGS.layers} gated MLPs {FLAGS.hidden} -> {FLAGS.mlp} -> {FLAGS.hidden} "
        f"({params * 4 / 2**20:.0f} MiB of float32 weights); jax {jax.__version__} on "
        f"{jax.default_backend()}, {FLAGS.repeats} interleaved repeats\n")
  first = FLAGS.dtypes[0]
  print(f"{'dtype':>9s} {'T':>4s} {'ms':>8s} {'x T=1':>7s} {'x ' + first + ' T=1':>14s} "
        f"{'GB/s of weights':>16s}")
  for d, m in medians.items():
    size = jnp.dtype(d).itemsize
    for t in tokens:
      print(f"{d:>9s} {t:4d} {m[t] * 1e3:8.2f} {m[t] / m[1]:7.2f} "
            f"{m[t] / medians[first][1]:14.2f} {params * size / m[t] / 1e9:16.1f}")


if __name__ == "__main__":
  FLAGS.set_default("repeats", 20)
  app.run(main)
