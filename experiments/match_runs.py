r"""What decides each fixed draft length's tokens an iteration at T = 0: the draft's greedy match
along the target's greedy text (the cost rule's model error, issue 30).

    python -m experiments.match_runs --target=runs/train_bench/target \
        --draft=runs/train_bench/draft_distill --prompts=python --num_prompts=8 \
        --max_new_tokens=128

At T = 0 a chain's draft at a position is the draft's greedy guess given the true prefix (an
accepted draft is the target's token), so one teacher-forced draft pass over each prompt's
greedy continuation gives the match sequence m_t, and every fixed gamma's iterations follow from
it exactly (``chain_iterations``: an iteration at t accepts the run of matches from t, at most
gamma, then emits one token; none past the text's end). Beside each gamma's real tokens an
iteration: Leviathan et al.'s iid model at the match rate
(``metrics.expected_tokens_per_iteration``: what the cost rule's per-position estimates
assume), and a first-order Markov model of the matches (P(match | match before), P(match |
miss before), each iteration started from its real start state: after a miss, P(match | miss
before); after a full acceptance, whose last token the draft never guessed, the match rate),
to see whether clustered misses explain the gap; and the same chains over each prompt's matches
shuffled (``--shuffles`` times, the matches' count per prompt kept: the iid model's own
sampling spread on this text), so that a gap is set beside the spread a text of this length
gives by chance (``--per_prompt``: each prompt's own; on the benchmark pair's Python at T = 0,
greedy text that repeats a line makes the misses periodic, and a gamma whose iterations fall in
phase with them gains well beyond any shuffle).
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from experiments import cost_split  # noqa: F401  (the shared flags: target, draft, prompts, ...)

FLAGS = flags.FLAGS


def chain_iterations(matches: list[np.ndarray], gamma: int) -> tuple[float, float, float]:
  """(tokens an iteration, the share of iterations whose first draft matched, the share that
  start right after a miss) of a greedy chain of ``gamma`` drafts over each 0/1 sequence."""
  tokens = iterations = firsts = after_miss = 0
  for m in matches:
    t, full = 0, True
    while t < len(m):
      n = 0
      while n < gamma and t + n < len(m) and m[t + n]:
        n += 1
      firsts += int(m[t])
      after_miss += int(not full)
      emitted = min(n + 1, len(m) - t)  # the budget ends the text: no token past it
      tokens, iterations, full, t = tokens + emitted, iterations + 1, n == gamma, t + n + 1
  return tokens / iterations, firsts / iterations, after_miss / iterations


def markov_tokens(first: float, stay: float, gamma: int) -> float:
  """Expected tokens of an iteration whose first draft matches with probability ``first`` and
  each later one, after a match, with ``stay``."""
  total, alive = 1.0, 1.0
  for i in range(gamma):
    alive *= first if i == 0 else stay
    total += alive
  return total


def transitions(matches: list[np.ndarray]) -> tuple[float, float]:
  """(P(match | match before), P(match | miss before)) over the sequences."""
  pairs = np.concatenate([np.stack([m[:-1], m[1:]], axis=1) for m in matches if len(m) > 1])
  after = lambda v: float(np.mean(pairs[pairs[:, 0] == v, 1])) if np.any(pairs[:, 0] == v) else 0.0
  return after(1), after(0)


def shuffled_iterations(matches: list[np.ndarray], gamma: int, shuffles: int,
                        seed: int = 0) -> tuple[float, float]:
  """(mean, standard deviation) of ``chain_iterations``' tokens an iteration over ``shuffles``
  random orders of each sequence (its count of matches kept): where a fixed gamma's real figure
  falls among them says whether the order of the matches, rather than chance, moves it."""
  rng = np.random.default_rng(seed)
  values = [chain_iterations([rng.permutation(m) for m in matches], gamma)[0]
            for _ in range(shuffles)]
  return float(np.mean(values)), float(np.std(values))


def z_score(real: float, mean: float, spread: float) -> float:
  """How many of the shuffles' standard deviations ``real`` lies from their mean (0 where they
  do not spread: every order gives the same chains)."""
  return (real - mean) / spread if spread > 0 else 0.0


def shuffle_z(matches: list[np.ndarray], gamma: int, shuffles: int) -> tuple[float, float]:
  """(real tokens an iteration, its z-score among ``shuffled_iterations``' orders)."""
  real = chain_iterations(matches, gamma)[0]
  return real, z_score(real, *shuffled_iterations(matches, gamma, shuffles))


def main(argv):
  del argv
  import jax.numpy as jnp

  import specjax as sj
  from experiments import models
  from specjax import metrics
  from specjax.models.transformer import forward
  target, draft, prompts, _ = models.load_pair_for_tool(
      FLAGS.target, FLAGS.draft, FLAGS.prompts, FLAGS.num_prompts, FLAGS.prompt_tokens, (1,),
      0.0, FLAGS.max_new_tokens, chat_template=FLAGS.chat_template)
  matches = []
  for prompt in prompts:
    out = sj.generate(target, [prompt], sj.Autoregressive(), max_new_tokens=FLAGS.max_new_tokens)
    text = list(prompt) + [int(t) for t in np.asarray(out.tokens)[0]]
    guesses = np.asarray(jnp.argmax(forward(draft, jnp.asarray([text[:-1]]))[0], axis=-1))
    matches.append((guesses[len(prompt) - 1:] == np.asarray(text[len(prompt):])).astype(int))
  rate = float(np.mean(np.concatenate(matches)))
  stay, recover = transitions(matches)
  print(f"match rate {rate:.3f}; P(match | match before) {stay:.3f}; "
        f"P(match | miss before) {recover:.3f}")
  print(f"{'gamma':>5s} {'real':>6s} {'iid':>6s} {'markov':>6s} {'first':>6s} {'after miss':>10s} "
        f"{'shuffled':>15s} {'z':>5s}")
  for gamma in (int(g) for g in FLAGS.gammas):
    real, first, after_miss = chain_iterations(matches, gamma)
    markov = (after_miss * markov_tokens(recover, stay, gamma)
              + (1 - after_miss) * markov_tokens(rate, stay, gamma))
    iid = metrics.expected_tokens_per_iteration(rate, gamma)
    mean, spread = shuffled_iterations(matches, gamma, FLAGS.shuffles)
    z = z_score(real, mean, spread)
    print(f"{gamma:5d} {real:6.3f} {iid:6.3f} {markov:6.3f} {first:6.3f} {after_miss:10.2f} "
          f"{mean:7.3f} +- {spread:5.3f} {z:5.1f}")
  if FLAGS.per_prompt:  # each prompt's own figures (tokens an iteration, z) and its matches
    for i, m in enumerate(matches):
      cells = " ".join("g%d %.2f (z %+.1f)" % (g, *shuffle_z([m], g, FLAGS.shuffles))
                       for g in (int(g) for g in FLAGS.gammas))
      print(f"prompt {i:2d}: match rate {m.mean():.2f}; {cells}; {''.join(map(str, m[:64]))}")


if __name__ == "__main__":
  flags.DEFINE_integer("num_prompts", 8, "prompts of the set, each decoded alone")
  flags.DEFINE_integer("max_new_tokens", 128, "greedy tokens per prompt")
  flags.DEFINE_integer("shuffles", 400, "random orders of each prompt's matches (the null)")
  flags.DEFINE_bool("per_prompt", False, "also each prompt's figures and its first 64 matches")
  flags.DEFINE_bool("chat_template", False, "wrap the prompts in the tokenizer's chat template")
  flags.FLAGS.set_default("gammas", ["1", "2", "3", "4", "6"])
  app.run(main)
