"""The law harness: does a sampling method, run through the real ``sj.generate``, emit the target's law?

Every sampling method's tests go through this one harness (``check_law``), so that what "lossless"
means, how much data backs it and how it fails are the same for every method:

* **What is sampled.** ``rows_per_prompt`` rows of each prompt (batch > 1; several prompts are
  interleaved row by row, so rows are ragged) run through ``sj.generate`` with the method under
  test, and the first ``n_tokens`` new tokens of every row are kept. For a method that proposes
  ``gamma`` tokens per iteration, ``n_tokens >= gamma + 3`` is enforced: the first token comes
  from the prefill, the next ``gamma + 1`` from the first iteration (every draft position and the
  bonus token) and at least one from the second iteration even when the first accepted every
  draft, so a wrong bonus, a wrong rollback or a wrong commit all reach the tested law.
* **What it is compared with.** The exact joint law of those ``n_tokens`` tokens, computed
  independently of the loop: from the table itself for tabular models (``tabular_law``), and
  from the Hugging Face torch model with transformers' own warpers (temperature, top-k, top-p)
  for random transformers (``transformer_law``; the JAX model is written with ``sj.save_model``
  and read back by ``transformers``).
* **The statistic.** The joint law has ``V ** n_tokens`` cells (4096 for V = 4, n = 6), far too
  many for a chi-square at the sample sizes below, so the harness tests every single position's
  marginal and every adjacent pair's joint law (``2 n - 1`` tables per prompt; the pairs are where
  the iterations join), each with Pearson's chi-square (``stats_util.chi_square_pvalue``; cells
  with an expected count below 5 pooled). The tables' p-values are combined by Bonferroni:
  ``p = min(1, m * min_i p_i)`` over the ``m`` tables of all prompts, so ``p`` is itself a valid
  p-value: a correct implementation gets ``p < P_FLOOR = 1e-6`` with probability below 1e-6
  (per fixed seed).
* **The sample size** (``required_rows``). For a tested table with ``k`` cells, an error of total
  variation ``d`` has chi-square divergence ``sum (o - e)^2 / e >= (sum |o - e|)^2 = 4 d^2``
  (Cauchy-Schwarz, ``sum e = 1``), so with N rows the statistic is noncentral chi-square with
  ``df = k - 1`` and noncentrality ``lambda >= 4 N d^2``. A table is rejected at level
  ``P_FLOOR / m`` when the statistic exceeds ``crit = chi2.isf(P_FLOOR / m, df)``; the power
  ``ncx2.sf(crit, df, lambda)`` falls as df grows, so the largest table (a pair, ``df = V^2 - 1``)
  sets the size: N is the smallest number of rows with power >= ``POWER = 0.99`` at ``d =
  TV_DETECT = 0.03``. E.g. V = 4, n = 6 (m = 11): lambda = 88.8, N = 24,672 rows per prompt; V = 6,
  n = 5 (m = 9): lambda = 109.8, N = 30,513.
* **Draft = target** (``self_draft_pvalue``). Losslessness holds for *any* proposal law q, so a
  draft whose own cache is rolled back wrongly (a worse q) keeps the law; what it breaks is
  acceptance. With the draft = the target, q = p and every draft must be accepted; the harness
  counts rejections R over the K verified positions and returns ``P(Binomial(K, 1e-6) >= R)``
  (1e-6 allows float round-off between the two passes' logits; the tabular models' are
  bit-identical).

* **How it runs.** A transformer's law run is one compiled loop over tens of thousands of rows,
  so running the program dominates, not compiling it: ``sj.generate`` runs with the loop compiled at
  ``LAW_RUN_OPTIONS`` (LLVM optimisation level 1, where ``tests/conftest.py`` sets 0 for the
  suite's many small programs): the same ``loop.decode`` and HLO, no fast-math, about half the
  run time for a little more compile time (an EAGLE chain law run, 62k rows: the loop's run
  33 s -> 17 s; the whole test 41 -> 33 CPU-s).
  Each run compiles afresh: a new ``jax.jit`` of a new Python function per call (JAX caches
  traces per function, so a jit of ``loop.decode`` itself could hand a test's patched mutant the
  clean trace); XLA's persistent cache still serves identical programs. A tabular model's run
  (a table lookup per token) is cheap and compiling dominates: plain ``sj.generate`` (measured: no
  gain at level 1; nor for ``generate_rowwise``'s tabular runs in tests/test_adaptive.py: 27 CPU-s
  at level 0, 31 at 1).

Mutation controls (``tests/test_laws.py``) patch the real code with a known bug and assert that
the same harness rejects it (``p < 1e-12``) while the clean code passes (``p > 1e-3``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import tempfile
from typing import Callable, Sequence
from unittest import mock

import jax
import numpy as np
from scipy import stats as scipy_stats

import specjax as sj
from specjax.decoding import loop

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import tabular
  from tests.stats_util import chi_square_pvalue
except ImportError:  # pragma: no cover
  import tabular
  from stats_util import chi_square_pvalue

__all__ = [
    "P_FLOOR", "CLEAN_FLOOR", "MUTANT_CEILING", "TV_DETECT", "POWER", "LawCheck", "check_law",
    "required_rows", "table_pvalues", "tabular_law", "transformer_law", "self_draft_pvalue",
]

P_FLOOR = 1e-6  # a correct implementation fails below this with probability < 1e-6 per seed
CLEAN_FLOOR = 1e-3  # in a mutation control the clean code must pass with this margin
MUTANT_CEILING = 1e-12  # ... and the mutant must be rejected below this
TV_DETECT = 0.03  # total-variation error that each tested table detects ...
POWER = 0.99  # ... with this probability
ROUND_OFF = 1e-6  # per-position rejection probability allowed when draft == target
LAW_RUN_OPTIONS = {"xla_backend_optimization_level": 1}  # see "How it runs" above


# ----------------------------------------------------------------------------- sample size


def tested_tables(n_tokens: int) -> list[tuple[int, ...]]:
  """The token positions of each tested table: every single position, then every adjacent pair."""
  return [(i,) for i in range(n_tokens)] + [(i, i + 1) for i in range(n_tokens - 1)]


@functools.lru_cache(maxsize=None)
def required_rows(vocab: int, n_tokens: int, num_prompts: int = 1, tv: float = TV_DETECT,
                  power: float = POWER, alpha: float = P_FLOOR) -> int:
  """Rows per prompt so that a ``tv`` error in any tested table is rejected with ``power``.

  See the module docstring: df = V^2 - 1 (the largest table), level alpha / m, noncentrality
  >= 4 N tv^2; solved for the noncentrality by bisection, then N = ceil(lambda / (4 tv^2)).
  """
  m = num_prompts * len(tested_tables(n_tokens))
  df = vocab * vocab - 1
  crit = scipy_stats.chi2.isf(alpha / m, df)
  lo, hi = 0.0, 1e6
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    lo, hi = (lo, mid) if scipy_stats.ncx2.sf(crit, df, mid) >= power else (mid, hi)
  return int(math.ceil(hi / (4.0 * tv * tv)))


# ----------------------------------------------------------------------------- exact laws


def tabular_law(model: tabular.TabularLM, prompt: Sequence[int], n_tokens: int,
                sampling: sj.Sampling) -> np.ndarray:
  """float64[V] * n: the exact law of the first ``n_tokens`` tokens, from the table itself."""
  return tabular.exact_law(model, prompt, n_tokens, sampling)


def _hf_warpers(sampling: sj.Sampling):
  from transformers.generation import logits_process as lp
  warpers = []
  if sampling.temperature != 1.0:
    warpers.append(lp.TemperatureLogitsWarper(sampling.temperature))
  if sampling.top_k > 0:
    warpers.append(lp.TopKLogitsWarper(sampling.top_k))
  if sampling.top_p < 1.0:
    warpers.append(lp.TopPLogitsWarper(sampling.top_p))
  return warpers


@functools.lru_cache(maxsize=None)
def _torch_model(model: sj.Transformer):
  """The same weights as a transformers torch model: written by ``sj.save_model``, read by HF."""
  import transformers
  with tempfile.TemporaryDirectory(prefix="specjax_law_") as path:
    sj.save_model(model, path)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager")
  return torch_model.float().eval()


def transformer_law(model: sj.Transformer, prompt: Sequence[int], n_tokens: int,
                    sampling: sj.Sampling) -> np.ndarray:
  """float64[V] * n: the exact law of the first ``n_tokens`` tokens of a (small-V) transformer.

  Computed with torch and transformers' ``TemperatureLogitsWarper`` -> ``TopKLogitsWarper`` ->
  ``TopPLogitsWarper`` (the order ``generate`` applies them), independently of specjax's loop,
  sampling code and caches: one batch of the ``V ** (n - 1)`` continuations ``prompt + s`` gives,
  at each position along each row, the conditional law of the next token.
  """
  import torch
  if sampling.is_greedy:
    raise ValueError("transformer_law is the law of a sampling method; greedy is deterministic")
  v = model.config.vocab_size
  prefixes = np.array(list(itertools.product(range(v), repeat=n_tokens - 1)), np.int64)
  prefixes = prefixes.reshape(v ** (n_tokens - 1), n_tokens - 1)
  rows = np.concatenate([np.tile(np.asarray(prompt, np.int64), (len(prefixes), 1)), prefixes], 1)
  with torch.no_grad():
    logits = _torch_model(model)(input_ids=torch.as_tensor(rows)).logits.double()
    logits = logits[:, len(prompt) - 1:].reshape(-1, v)  # [R * n, V]: next-token logits
    for warp in _hf_warpers(sampling):
      logits = warp(None, logits)
    cond = torch.softmax(logits, -1).reshape(len(prefixes), n_tokens, v).numpy()
  # law[s_0..s_{n-1}] = prod_{i < n-1} cond[row(s_<n-1), i, s_i] * cond[row, n-1, s_{n-1}]
  index = np.arange(len(prefixes))
  path = np.ones(len(prefixes))
  for i in range(n_tokens - 1):
    path = path * cond[index, i, prefixes[:, i]]
  return (path[:, None] * cond[:, n_tokens - 1]).reshape((v,) * n_tokens)


# ----------------------------------------------------------------------------- the test statistic


def table_pvalues(tokens: np.ndarray, law: np.ndarray) -> dict[tuple[int, ...], float]:
  """Chi-square p-value of every tested table (marginals, adjacent pairs) of int[N, n] tokens."""
  n_rows, n_tokens = tokens.shape
  v = law.shape[0]
  if law.ndim != n_tokens:
    raise ValueError(f"law is over {law.ndim} tokens, the sample over {n_tokens}")
  if not np.all((tokens >= 0) & (tokens < v)):
    raise AssertionError("a row emitted fewer tokens than asked for (or an id outside the law)")
  out = {}
  for positions in tested_tables(n_tokens):
    others = tuple(i for i in range(n_tokens) if i not in positions)
    expected = law.sum(axis=others).ravel()
    index = np.ravel_multi_index(tuple(tokens[:, i] for i in positions), (v,) * len(positions))
    out[positions] = chi_square_pvalue(np.bincount(index, minlength=v ** len(positions)), expected)
  return out


def combined_pvalue(pvalues: Sequence[float]) -> float:
  """Bonferroni: ``min(1, m min p)``; a valid p-value for "every table follows its law"."""
  return min(1.0, len(pvalues) * min(pvalues))


@dataclasses.dataclass
class LawCheck:
  """One harness run: the combined p-value, each table's, and what ``sj.generate`` returned."""

  pvalue: float
  pvalues: dict  # (prompt index, positions) -> p-value
  out: sj.GenerateOutput
  tokens: list  # int[N, n] per prompt

  def summary(self) -> str:
    worst = sorted(self.pvalues.items(), key=lambda kv: kv[1])[:3]
    return f"combined p = {self.pvalue:.3g}; smallest tables: {worst}"


def check_law(target: sj.Transformer, method, sampling: sj.Sampling,
              prompts: Sequence[Sequence[int]], n_tokens: int, seed: int,
              exact_law: Callable = tabular_law, rows_per_prompt: int | None = None,
              eos_token_id=None, rowwise: bool = False) -> LawCheck:
  """Runs ``method`` through ``sj.generate`` and tests the law of the first ``n_tokens`` tokens.

  Args:
    target: the target model (a ``TabularLM`` or a small-vocabulary transformer).
    method: the decoding method under test (``sj.Autoregressive()``, ``sj.Speculative(...)``...).
    sampling: a sampling (non-greedy) ``sj.Sampling``; the target law is warped with it.
    prompts: one or more prompts; row b of the batch gets prompt ``b % len(prompts)``.
    n_tokens: tokens per row to test; at least ``gamma + 3`` for a method with ``gamma``.
    seed: the PRNG seed of the run (tests fix it).
    exact_law: ``(target, prompt, n_tokens, sampling) -> float64[V] * n``.
    rows_per_prompt: defaults to ``required_rows`` (the power computation above); a smaller
      value is refused.
    rowwise: run every row as its own batch of one (``generate_rowwise``) instead of one batch:
      a method whose choices are made per batch (``sj.Adaptive``) then chooses per row, so the
      choices vary with each row's own past.
  """
  if sampling.is_greedy:
    raise ValueError("check_law tests a sampling method; greedy runs are tested token for token")
  gamma = int(getattr(method, "gamma", 0))
  if n_tokens < gamma + 3:
    raise ValueError(f"n_tokens {n_tokens} < gamma + 3 = {gamma + 3}: the tested law would miss "
                     f"the bonus token or the second iteration")
  v = target.config.vocab_size
  needed = required_rows(v, n_tokens, len(prompts))
  rows = needed if rows_per_prompt is None else rows_per_prompt
  if rows < needed:
    raise ValueError(f"rows_per_prompt {rows} < {needed} rows needed for power {POWER} at total "
                     f"variation {TV_DETECT}")
  batch = [list(prompts[b % len(prompts)]) for b in range(rows * len(prompts))]
  if rowwise and len(prompts) != 1:
    raise ValueError(f"rowwise runs one prompt, got {len(prompts)}")
  run = generate_rowwise if rowwise else (
      sj.generate if isinstance(target, tabular.TabularLM) else _generate)
  # The prompts at their own width, not padded to generate's bucket of 16: the prefill over
  # tens of thousands of rows is most of a run, and padding changes no law.
  out = run(target, batch, method=method, sampling=sampling, max_new_tokens=n_tokens,
            key=jax.random.key(seed), eos_token_id=eos_token_id,
            prompt_width=max(len(p) for p in prompts))
  tokens = np.asarray(out.tokens)
  per_prompt, pvalues = [], {}
  for i, prompt in enumerate(prompts):
    sample = tokens[i::len(prompts)]
    per_prompt.append(sample)
    law = exact_law(target, tuple(prompt), n_tokens, sampling)
    for positions, p in table_pvalues(sample, law).items():
      pvalues[(i, positions)] = p
  return LawCheck(pvalue=combined_pvalue(list(pvalues.values())), pvalues=pvalues, out=out,
                  tokens=per_prompt)


def _law_jit(fn, **kwargs):
  """``jax.jit`` of a new function that calls ``fn``, compiled with ``LAW_RUN_OPTIONS``. New
  per call: JAX caches traces per function (not per ``jax.jit`` object), so a jit of ``fn``
  itself could reuse the clean trace inside a test's patch, or a mutant's after it."""
  fresh = functools.wraps(fn)(lambda *args, **kw: fn(*args, **kw))
  return jax.jit(fresh, compiler_options=LAW_RUN_OPTIONS, **kwargs)


def _generate(*args, **kwargs) -> sj.GenerateOutput:
  """``sj.generate`` itself, its loop (``loop.decode``, the static arguments of
  ``loop.decode_jit``) jitted by ``_law_jit`` for this call."""
  decode = _law_jit(loop.decode, static_argnums=(0, 2), static_argnames=(
      "sampling", "max_new_tokens", "eos_ids", "cache_length", "placement"))
  with mock.patch.object(loop, "decode_jit", decode):
    return sj.generate(*args, **kwargs)


def generate_rowwise(target, prompts, method, sampling, max_new_tokens, key, eos_token_id=None,
                     prompt_width=None):
  """``sj.generate``'s output for ``prompts`` (of one length) run as independent batches of one
  row, the loop vmapped over the rows' keys (row i: ``fold_in(key, i)``). Under ``vmap`` a
  batched ``while_loop`` (an adaptive menu entry's) runs while any row is in it and keeps each
  row's own state: the same law per row as a
  batch-of-one run. Outputs and stats lead with the row axis."""
  from specjax.decoding import generate as generate_lib

  args, kwargs, _ = generate_lib._loop_arguments(  # pylint: disable=protected-access
      target, prompts[:1], method, sampling, max_new_tokens, key, eos_token_id, prompt_width,
      None, None, "rules")
  graphdef, state, proposer, params, prompt, lengths, _ = args
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, np.arange(len(prompts)))

  @jax.jit
  def run(keys):
    return jax.vmap(lambda k: loop.decode(graphdef, state, proposer, params, prompt, lengths, k,
                                          **kwargs))(keys)

  tokens, out_lengths, stats = run(keys)
  return sj.GenerateOutput(tokens=tokens[:, 0], lengths=out_lengths[:, 0], stats=stats)


def self_draft_pvalue(out: sj.GenerateOutput) -> float:
  """For a run whose draft IS the target: ``P(Binomial(K, ROUND_OFF) >= R)``, R rejected drafts
  over K verified positions. A draft cache that is rolled back wrongly gives the draft another
  context than the target, so it is no longer q = p and drafts get rejected."""
  s = out.stats
  verified = int(s.alpha_count)
  rejected = verified - int(np.sum(s.accepted))
  if verified == 0:
    raise AssertionError("no draft position was verified")
  return float(scipy_stats.binom.sf(rejected - 1, verified, ROUND_OFF))

