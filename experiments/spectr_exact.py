"""K-SEQ against the naive multi-draft rule, exactly: per-position acceptance on a pair's real laws.

    python -m experiments.spectr_exact                         # the embedded default pair, T = 1
    python -m experiments.spectr_exact --ks=1,2,4,8 --prompts=chat --batch_size=8
    python -m experiments.spectr_exact --target=runs/train_bench/target \\
        --draft=runs/train_bench/draft_distill

End-to-end block efficiency (``experiments.tree_vs_chain --trees=spectr:8x4,naive:8x4``) mixes the
selection rule with sampling noise: with a few hundred iterations per cell the two rules' tokens per
call differ by less than their standard error. Here the rule is isolated and nothing is sampled
but the text: the target writes ``--text_tokens`` tokens per prompt at ``--temperature``
(autoregressive, its own law), both models score that text (teacher forcing), and at every
written position, with the target's law p and the draft's q there, the probability that one of k
i.i.d. drafts from q is accepted is computed in closed form for K-SEQ (``1 - (1 - beta(rho*))^k``,
SpecTr, Sun et al. 2023) and for the naive rule (SpecInfer's with replacement,
``1 - prod_i (1 - beta_i)``), next to the bound no rule can pass,
``sum_x min(p(x), 1 - (1 - q(x))^k)`` (``specjax.verify.spectr``; checked against the verifier by
enumeration in tests/test_spectr.py). Printed: the mean over positions for each k, and the share
of positions where K-SEQ accepts more.
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

# --target, --draft, --prompts, --batch_size, --prompt_tokens and --temperature are cost_split's
# flags (one registry: the side tools load a pair the same way).
from experiments import cost_split  # noqa: E402,F401  pylint: disable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_list("ks", ["1", "2", "4", "8"], "numbers of i.i.d. drafts to compare")
flags.DEFINE_integer("text_tokens", 64, "tokens the target writes per prompt")
flags.DEFINE_integer("seed", 0, "sampling seed of the target's text")


def position_laws(target, draft, prompts, max_new_tokens: int, temperature: float, seed: int):
  """(float32[P, V] p, float32[P, V] q): the target's and the draft's laws at every position of
  the text the target writes after ``prompts`` (autoregressive at ``temperature``,
  ``max_new_tokens`` per row, no EOS), P = the positions of all rows."""
  import jax
  import jax.numpy as jnp

  import specjax as sj
  from specjax.models.transformer import forward

  out = sj.generate(target, prompts, sj.Autoregressive(), sj.Sampling(temperature=temperature),
                    max_new_tokens=max_new_tokens, key=jax.random.key(seed))
  laws = ([], [])
  for prompt, row, length in zip(prompts, np.asarray(out.tokens), np.asarray(out.lengths)):
    text = list(prompt) + row[:length].tolist()
    where = np.arange(len(prompt) - 1, len(text) - 1)  # positions whose next token was written
    for model, found in zip((target, draft), laws):
      logits = forward(model, jnp.asarray([text], jnp.int32))[0, where]
      found.append(np.asarray(jax.nn.softmax(logits / temperature, axis=-1)))
  return np.concatenate(laws[0]), np.concatenate(laws[1])


def compare(p: np.ndarray, q: np.ndarray, ks) -> list[dict]:
  """One dict per k: mean acceptance of K-SEQ, the naive rule and the bound over the positions,
  and the share of positions where K-SEQ beats / trails the naive rule by more than 1e-6."""
  import jax
  import jax.numpy as jnp

  from specjax.verify import spectr

  p, q = jnp.float32(p), jnp.float32(q)
  rows = []
  for k in ks:
    k = int(k)
    k_seq, naive, bound = (
        np.asarray(jax.jit(jax.vmap(lambda a, b, f=f: f(a, b, k)))(p, q))
        for f in (spectr.k_seq_acceptance, spectr.naive_acceptance, spectr.acceptance_bound))
    rows.append({"k": k, "k_seq": float(k_seq.mean()), "naive": float(naive.mean()),
                 "bound": float(bound.mean()),
                 "k_seq_ahead": float(np.mean(k_seq > naive + 1e-6)),
                 "naive_ahead": float(np.mean(naive > k_seq + 1e-6)),
                 "stderr_diff": float(np.std(k_seq - naive) / np.sqrt(len(k_seq)))})
  return rows


def main(argv):
  del argv
  import jax

  from experiments import models, runconfig

  if FLAGS.temperature <= 0:
    raise app.UsageError("--temperature must be > 0: the rules compared are sampling rules")
  try:
    ks = sorted({int(k) for k in FLAGS.ks})
    if ks[0] < 1:
      raise ValueError(f"--ks must be integers >= 1, got {FLAGS.ks}")
    target, draft, prompts, specs = models.load_pair(
        FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens,
        [1], FLAGS.temperature, FLAGS.text_tokens)
  except (runconfig.ConfigError, ValueError) as e:
    raise app.UsageError(str(e)) from None
  p, q = position_laws(target, draft, prompts, FLAGS.text_tokens, FLAGS.temperature,
                       FLAGS.seed)
  print(f"target {specs['target'].spec}, draft {specs['draft'].spec}; {len(prompts)} prompts x "
        f"{FLAGS.text_tokens} tokens written by the target at T = {FLAGS.temperature}: "
        f"{len(p)} positions; jax {jax.__version__} on {jax.default_backend()}")
  print(f"\n{'k':>3s} {'K-SEQ':>7s} {'naive':>7s} {'bound':>7s} {'K-SEQ - naive':>14s} "
        f"{'K-SEQ ahead':>12s} {'naive ahead':>12s}")
  for r in compare(p, q, ks):
    print(f"{r['k']:3d} {r['k_seq']:7.4f} {r['naive']:7.4f} {r['bound']:7.4f} "
          f"{r['k_seq'] - r['naive']:+8.4f} ±{r['stderr_diff']:.4f} {r['k_seq_ahead']:12.1%} "
          f"{r['naive_ahead']:12.1%}")
  print("\nacceptance: mean over positions of P(one of k i.i.d. drafts is accepted), exact; "
        "± the standard error of the mean difference over positions; ahead: share of positions "
        "where one rule accepts more (by > 1e-6)")


if __name__ == "__main__":
  FLAGS.set_default("temperature", 1.0)
  FLAGS.set_default("batch_size", 8)
  FLAGS.set_default("prompts", "python")
  app.run(main)
