r"""What an adaptive look observes at T > 0 (``specjax.proposers.adaptive``): at each position
of sampled answers, the first draft's exact acceptance ``sum_x min(p, q)`` (what the look scores
where the plain iteration kept the target's law p, ``KEEP_LAWS``) against one draw's estimate
``min(1, q(x) / p(x))`` for the token x the target drew (its mean is the same), over the
target's own answers sampled at the run's temperature:

    python -m experiments.look_observations --target=smollm2-135m --draft=smollm2-draft \
        --prompts=chat --batch_size=8 --max_new_tokens=128 --temperature=1

Prints both estimators' mean and standard deviation over the positions and the ratio of their
variances: how many times the evidence one look brings the rule the kept laws are worth.
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from experiments import cost_split  # noqa: F401  (the shared flags: target, draft, prompts, ...)

FLAGS = flags.FLAGS


def observations(target, draft, prompts, max_new_tokens: int, temperature: float, seed: int = 0):
  """(exact, one draw): float arrays over every position of the answers the target samples to
  ``prompts`` (one call a prompt, ``max_new_tokens`` each, key ``seed + i``) at
  ``temperature`` > 0: ``sum_x min(p, q)`` and ``min(1, q(x) / p(x))`` for the first draft at
  that position, p and q the two models' laws under the run's sampling (full causal passes)."""
  import jax
  import jax.numpy as jnp

  import specjax as sj
  from specjax import sampling as sampling_lib
  from specjax.models.transformer import forward

  sampling = sj.Sampling(temperature)
  if sampling.is_greedy:
    raise ValueError(f"temperature must be > 0 (at T = 0 a look scores the match), got "
                     f"{temperature}")
  exact, draw = [], []
  for i, prompt in enumerate(prompts):
    out = sj.generate(target, [prompt], sj.Autoregressive(), sampling,
                      max_new_tokens=max_new_tokens, key=jax.random.key(seed + i))
    answer = [int(t) for t in np.asarray(out.tokens)[0] if t >= 0]
    text = jnp.asarray([list(prompt) + answer], jnp.int32)
    p, q = (np.asarray(sampling_lib.probabilities(forward(m, text)[0], sampling))
            for m in (target, draft))
    for t in range(len(prompt) - 1, text.shape[1] - 1):  # the laws of token t + 1
      x = int(text[0, t + 1])
      exact.append(float(np.minimum(p[t], q[t]).sum()))
      draw.append(min(1.0, float(q[t, x]) / max(float(p[t, x]), 1e-30)))
  return np.asarray(exact), np.asarray(draw)


def main(argv):
  del argv
  from experiments import models

  target, draft, prompts, _ = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens, (1,),
      FLAGS.temperature, FLAGS.max_new_tokens, chat_template=FLAGS.chat_template)
  exact, draw = observations(target, draft, prompts, FLAGS.max_new_tokens, FLAGS.temperature)
  print(f"{len(prompts)} prompts ({FLAGS.prompts}), {FLAGS.max_new_tokens} tokens each, "
        f"T = {FLAGS.temperature:g}: {len(exact)} positions")
  for name, x in (("exact sum_x min(p, q)", exact), ("one draw min(1, q(x)/p(x))", draw)):
    print(f"  {name:28s} mean {x.mean():.3f}  sd {x.std():.3f}")
  print(f"  variance ratio (one draw / exact): {draw.var() / exact.var():.2f}")


if __name__ == "__main__":
  flags.DEFINE_integer("max_new_tokens", 128, "tokens each answer")
  flags.DEFINE_bool("chat_template", True, "wrap the prompts in the tokenizer's chat template")
  app.run(main)
