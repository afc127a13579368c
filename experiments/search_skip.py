r"""Searches the layers that a self-speculative draft (``sj.SelfSpeculative``) skips on a target.

    python -m experiments.search_skip                          # the experiments' default target
    python -m experiments.search_skip --target=random:tiny-target --prompts=python-tiny
    python -m experiments.search_skip --target=path/to/checkpoint --max_skip=12 --gammas=2,3,4 \
        --output=configs/self_speculative.py

Acceptance. At temperature 0 every accepted draft equals the target's greedy continuation, so each
verified position's context is that text: the greedy acceptance of a skip set is the share of the
continuation's positions where the skipping draft's argmax, teacher-forced on the text, equals the
target's (the loop's E[alpha] at T = 0, up to which positions fall in one iteration; the chosen set
is then run through ``sj.generate`` to show both). At ``--temperature`` > 0 it is the mean of
``sum_x min(p, q)`` over the same positions (Leviathan's beta, on greedy rather than sampled text).
One cache-free forward of the draft per candidate; skip sets of one size share one compilation.

Search. Greedy: from no skipped layer, repeatedly skip the layer whose removal keeps the most
acceptance, up to ``--max_skip`` layers (at most L (L + 1) / 2 forwards for L layers). Draft &
Verify (Zhang et al. 2023, arXiv 2309.08168) searches the layer mask by Bayesian optimisation and
SWIFT (Xia et al. 2024, arXiv 2410.06916) by an acceptance-guided random search; greedy selection
is deterministic, has no budget or prior to tune, and yields nested sets: one point of the curve
per skip count.

Cost. For the best set of each size, the draft's decoding step against the target's and a bare
iteration per gamma, jitted and timed side by side (``specjax.costs.measure_step_costs``, the runner's own
measurement); the modelled speedup is the runner's (``specjax.costs.modelled_speedup``: Eq. 1's tokens per
iteration over the iteration's measured cost). The best (skip set, gamma) by modelled speedup,
among the non-empty skip sets (skipping none, the target drafting for itself, is the curve's
reference), is written as a runner config (``--output``; ``python -m experiments.run
--config=<output>`` then runs it against autoregressive decoding).

``--target``, ``--prompts``, ``--batch_size`` (the number of calibration prompts),
``--prompt_tokens``, ``--gammas`` and ``--temperature`` are ``experiments/cost_split.py``'s flags
(one registry for the tools that load models the runner's way).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex

import numpy as np
from absl import app, flags

from experiments import cost_split  # noqa: F401  (the shared flags)

FLAGS = flags.FLAGS
flags.DEFINE_integer("calibration_tokens", 64, "greedy tokens of the target per calibration prompt")
flags.DEFINE_integer("max_skip", -1, "the most layers to skip (-1: all but one)")
flags.DEFINE_string("output", "configs/self_speculative.py", "runner config to write ('': none)")


def calibration_text(target, prompts, tokens: int):
  """(int32[B, W] each prompt followed by the target's greedy continuation, right-padded;
  bool[B, W] the positions whose next token is a continuation token)."""
  import specjax as sj
  out = np.asarray(sj.generate(target, prompts, sj.Autoregressive(), max_new_tokens=tokens).tokens)
  width = max(len(p) for p in prompts) + tokens
  text, scored = np.zeros((len(prompts), width), np.int32), np.zeros((len(prompts), width), bool)
  for b, prompt in enumerate(prompts):
    n = len(prompt)
    text[b, :n], text[b, n:n + tokens] = prompt, out[b]
    scored[b, n - 1:n - 1 + tokens] = True
  return text, scored


def acceptance(target_logits, draft_logits, scored, sampling) -> float:
  """Mean over the scored positions of [draft argmax == target argmax] (greedy) or of
  ``sum_x min(p, q)`` (the warped laws' overlap)."""
  import jax.numpy as jnp

  from specjax import sampling as sampling_lib
  if sampling.is_greedy:
    hits = sampling_lib.greedy(draft_logits) == sampling_lib.greedy(target_logits)
  else:
    p, q = (sampling_lib.probabilities(x, sampling) for x in (target_logits, draft_logits))
    hits = jnp.minimum(p, q).sum(-1)
  return float(np.asarray(hits)[scored].mean())


def search(target, text, scored, sampling, max_skip: int) -> list[tuple[tuple[int, ...], float]]:
  """Greedy selection: ``[(skip set, acceptance)]`` for 0, 1, ..., ``max_skip`` skipped layers."""
  import specjax as sj
  from specjax.models.layer_skip import skip_layers

  target_logits = sj.forward(target, text)
  score = lambda skip: acceptance(target_logits, sj.forward(skip_layers(target, skip), text),
                                  scored, sampling)
  skip = ()
  curve = [(skip, score(skip))]
  for _ in range(max_skip):
    best = max(((score(skip + (layer,)), layer) for layer in range(target.config.num_layers)
                if layer not in skip), key=lambda s: (s[0], -s[1]))  # ties: the lower layer
    skip = tuple(sorted(skip + (best[1],)))
    curve.append((skip, best[0]))
  return curve


def measure_curve(target, curve, prompts, gammas, tokens: int) -> list[dict]:
  """Per curve point: its costs (``specjax.costs.measure_step_costs``, target and draft side by
  side) and, per gamma, the iteration cost in target steps and the runner's modelled speedup."""
  from specjax import costs
  from specjax.models.layer_skip import skip_layers

  lengths = [len(p) for p in prompts]
  context = int(np.mean(lengths)) + tokens // 2
  cache_length = max(lengths) + tokens + max(gammas) + 2
  rows = []
  for skip, alpha in curve:
    cost = costs.measure_step_costs({"target": target, "draft": skip_layers(target, skip)},
                                    len(prompts), context, cache_length, gammas=gammas)
    per_gamma = {}
    for g in gammas:
      iteration = cost["iteration_ms"][str(g)] / cost["target_step_ms"]
      per_gamma[g] = (iteration, costs.modelled_speedup(alpha, g, iteration))
    gamma = max(per_gamma, key=lambda g: per_gamma[g][1])
    rows.append(dict(skip=skip, acceptance=alpha, cost_ratio=cost["cost_ratio"], gamma=gamma,
                     iteration_cost=per_gamma[gamma][0], speedup=per_gamma[gamma][1],
                     per_gamma=per_gamma))
  return rows


def format_curve(rows: list[dict]) -> str:
  lines = [f"{'skip':>4s}  {'layers skipped':24s} {'acceptance':>10s} {'c':>6s} {'gamma':>5s} "
           f"{'iter':>6s} {'modelled speedup':>16s}"]
  for r in rows:
    layers = ",".join(map(str, r["skip"])) or "-"
    lines.append(f"{len(r['skip']):4d}  {layers:24s} {r['acceptance']:10.3f} "
                 f"{r['cost_ratio']:6.3f} {r['gamma']:5d} {r['iteration_cost']:6.2f} "
                 f"{r['speedup']:16.2f}")
  return "\n".join(lines)


CONFIG = '''r"""Self-speculative decoding (sj.SelfSpeculative) against autoregressive decoding: the
target ({target}) drafts for itself with its layers {skip} skipped.

    python -m experiments.run --config={path}

Written by experiments/search_skip.py on {date}:

    {command}

The search curve on {prompts} ({acceptance}; c = draft step / target step; iter = a bare
iteration in target steps at the best gamma; speedup = the runner's modelled speedup):

{curve}

The skip set belongs to that target: another one needs its own search.
"""

from experiments import runconfig


def get_config(arg=None):
  c = runconfig.base_config()
  c.name = "self_speculative"
  c.target = {target_literal}
  c.prompts = {prompts_literal}
  c.methods = ("autoregressive", "self_speculative")
  c.skip = {skip!r}
  c.gammas = ({gamma},)
  c.temperatures = (0.0, 1.0)
  c.batch_size = 4
  c.max_new_tokens = 96
  c.repeats = 3
  c.output_dir = "runs/self_speculative"
  return runconfig.apply_arg(c, arg)
'''


def write_config(path: str, target: str, prompts: str, best: dict, rows: list[dict],
                 temperature: float, command: str) -> str:
  """Writes the runner config of the chosen (skip set, gamma); returns its ``--config=`` path."""
  rel = os.path.relpath(path)
  shown = path if rel.startswith("..") else rel
  curve = "\n".join("    " + line for line in format_curve(rows).splitlines())
  with open(path, "w") as f:
    f.write(CONFIG.format(
        target=target, prompts=prompts, target_literal=json.dumps(target),
        prompts_literal=json.dumps(prompts), skip=tuple(int(i) for i in best["skip"]),
        gamma=best["gamma"], path=shown, command=command, curve=curve,
        date=datetime.date.today().isoformat(),
        acceptance="greedy acceptance" if temperature == 0 else f"overlap at T={temperature:g}"))
  return shown


def run_search(target_spec: str, prompts_spec: str, num_prompts: int, prompt_tokens: int, gammas,
               temperature: float, tokens: int, max_skip: int, output: str) -> dict:
  """The whole tool (``main`` with the flags as arguments): loads the target and prompts,
  searches, measures, prints, writes ``output``."""
  import jax

  import specjax as sj
  from experiments import models

  gammas = tuple(sorted(int(g) for g in gammas))
  target, _, prompts, specs = models.load_pair(target_spec, None, prompts_spec, num_prompts,
                                               prompt_tokens, gammas, temperature, tokens)
  layers = target.config.num_layers
  max_skip = layers - 1 if max_skip < 0 else max_skip
  if not 0 <= max_skip < layers:
    raise ValueError(f"--max_skip={max_skip} must be in [0, {layers - 1}] for a {layers}-layer "
                     f"target")
  sampling = sj.Sampling(temperature=temperature)
  print(f"target {specs['target'].spec}: {layers} layers, {target.config.num_params() / 1e6:.2f}M "
        f"parameters; {len(prompts)} calibration prompts ({prompts_spec}) + {tokens} greedy "
        f"tokens each; temperature {temperature:g}; gammas {','.join(map(str, gammas))}; jax "
        f"{jax.__version__} on {jax.default_backend()}", flush=True)
  text, scored = calibration_text(target, prompts, tokens)
  curve = search(target, text, scored, sampling, max_skip)
  rows = measure_curve(target, curve, prompts, gammas, tokens)
  print("\n" + format_curve(rows))
  # Skipping nothing is the curve's reference (the target drafting for itself, c ~ 1), not a
  # candidate: the choice is among the skip sets, whether or not one beats autoregressive decoding.
  best = max([r for r in rows if r["skip"]] or rows, key=lambda r: r["speedup"])
  out = sj.generate(target, prompts, sj.SelfSpeculative(best["skip"], best["gamma"]), sampling,
                    max_new_tokens=tokens, key=jax.random.key(0))
  s = out.stats
  print(f"\nchosen: skip {best['skip']}, gamma {best['gamma']}: modelled speedup "
        f"{best['speedup']:.2f}; through sj.generate on the calibration prompts: acceptance "
        f"{s.acceptance_rate:.3f}, E[alpha] {s.expected_alpha:.3f} (search: "
        f"{best['acceptance']:.3f}), {s.tokens_per_target_call:.2f} tokens per target call")
  if best["speedup"] < 1:
    print("no skip set is modelled to beat autoregressive decoding on this target")
  result = dict(rows=rows, best=best, measured=s.summary())
  if output:
    used = (("target", target_spec), ("prompts", prompts_spec), ("batch_size", num_prompts),
            ("prompt_tokens", prompt_tokens), ("gammas", ",".join(map(str, gammas))),
            ("temperature", temperature), ("calibration_tokens", tokens), ("max_skip", max_skip),
            ("output", output))
    command = "python -m experiments.search_skip"
    for name, value in used:  # wrapped like the configs' own command lines
      arg = shlex.quote(f"--{name}={value}")
      width = len(command) - command.rfind("\n") + len(arg)
      command += (" \\\n        " if width > 90 else " ") + arg
    result["config"] = write_config(output, target_spec, prompts_spec, best, rows, temperature,
                                    command)
    print(f"wrote {output}: python -m experiments.run --config={result['config']}")
  return result


def main(argv):
  del argv
  from experiments import runconfig
  try:
    run_search(FLAGS.target, FLAGS.prompts, FLAGS.batch_size, FLAGS.prompt_tokens, FLAGS.gammas,
               FLAGS.temperature, FLAGS.calibration_tokens, FLAGS.max_skip, FLAGS.output)
  except (runconfig.ConfigError, ValueError) as e:
    raise app.UsageError(str(e)) from None


if __name__ == "__main__":
  FLAGS.set_default("gammas", ["1", "2", "3", "4"])
  FLAGS.set_default("batch_size", 8)
  app.run(main)
