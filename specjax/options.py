"""The names of options the library's methods accept, importable without JAX.

The runner (``experiments/``) checks a config against these before JAX starts, so that a bad
config is refused in well under a second; the library modules that take the options import them
from here. Nothing in this module may import jax (``specjax/__init__.py`` is lazy for this).
"""

import math
import numbers

# How a static draft tree's children are drawn (``sj.TreeSpeculative(children=)``,
# ``specjax.proposers.draft_tree``): without replacement from the draft's law, its top-k, or
# i.i.d. with replacement.
TREE_CHILDREN = ("sampled", "top_k", "iid")

# How a draft model is placed on a mesh (``sj.generate(draft_sharding=)``, ``specjax.sharding``):
# split by the target's partition rules, or replicated on every device.
DRAFT_SHARDINGS = ("rules", "replicated")

# ``sj.Adaptive``'s rules (``specjax.proposers.adaptive``): the measured cost model, Hugging
# Face's +2/-1 schedule, the draft-confidence stop.
ADAPTIVE_RULES = ("cost", "schedule", "confidence")
# sj.Adaptive's settings by default (the runner's config takes the same): the estimates' EMA
# weight, prior and drift, the cost rule's hysteresis, the confidence rule's threshold (HF's).
# decay / prior from experiments/adaptive_tune.py on SmolLM2 + its draft (docs/benchmarks.md).
ADAPTIVE_DEFAULTS = dict(decay=0.1, prior=0.5, forget=0.05, margin=0.0, threshold=0.4,
                         probe_margin=0.05)
# Where a position's estimate drifts while no entry tests it (``sj.Adaptive(drift=)``): toward the
# row's own first-position estimate (the default: "deeper drafts accept like the first", no
# draft-specific prior; the positions the runs tested ended near the first's, except where a
# text's copied spans lift the first: the pair's code edits at T = 0, 0.99, then 0.74, 0.67),
# or toward the fixed ``prior`` (on the benchmark pair, whose draft accepts ~0.75, the fixed 0.5
# held the rule at one draft at batch 1 where two to four paid; docs/benchmarks.md, session 44).
ADAPTIVE_DRIFTS = ("first", "prior")


RETRIEVAL_SAMPLES = 64  # ``sj.Retrieval(samples=)``'s default: occurrences counted per lookup


def depth_budget(depth: int, nodes: int, branches: int,
                 samples: int = RETRIEVAL_SAMPLES) -> int:
  """The nodes of a retrieval tree cut to ``depth`` levels (``sj.Retrieval.at_depth``, an
  ``sj.Adaptive`` tree menu's entry): ``branches`` a level within ``nodes``, at least ``depth``
  (one continuation) and at most ``samples x depth`` (what the continuations can fill)."""
  return max(depth, min(nodes, depth * branches, samples * depth))


def check_adaptive_menu(choices, field: str = "choices") -> None:
  """A menu of draft lengths (``sj.Adaptive(choices=)``, the runner's ``adaptive_choices``):
  integers >= 0, increasing, at least one >= 1; else a one-line ValueError naming ``field``
  and the value as given."""
  menu = list(choices)
  if not menu or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) and k >= 0
                         for k in menu):
    raise ValueError(f"{field} must be integers >= 0 (0: plain decoding), got {choices!r}")
  if menu != sorted(set(menu)):
    raise ValueError(f"{field} must be increasing without repeats, got {choices!r}")
  if menu[-1] < 1:
    raise ValueError(f"{field} must include a draft length >= 1, got {choices!r}")


def check_adaptive_drift(value, field: str = "drift") -> None:
  """One of ``ADAPTIVE_DRIFTS``, else a one-line ValueError naming ``field`` and the value."""
  if value not in ADAPTIVE_DRIFTS:
    raise ValueError(f"{field} must be one of {', '.join(ADAPTIVE_DRIFTS)}, got {value!r}")


def check_count(value, field: str, meaning: str = "observations") -> None:
  """A finite number >= 0 (observations: ``sj.Adaptive``'s ``prior_evidence``; a cost ratio:
  its ``probe_cost``); else a one-line ValueError naming ``field`` and the value."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if not ok or not math.isfinite(value) or value < 0:
    raise ValueError(f"{field} must be a finite number >= 0 ({meaning}), got {value!r}")


def check_probe_every(value, field: str = "probe_every") -> None:
  """``sj.Adaptive``'s ``probe_every`` (the runner's ``adaptive_probe_every``): 0 (off) or an
  integer >= 2 (1 would probe at every call); else a one-line ValueError naming ``field``."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(f"{field} must be an integer >= 0, got {value!r}")
  if value == 1:
    raise ValueError(f"{field}=1 would probe at every call, i.e. never skip: give 0 (off) or "
                     f">= 2")


def check_unit_number(value, field: str, open_at_zero: bool = False) -> None:
  """A number in [0, 1] (``(0, 1]`` with ``open_at_zero``): ``sj.Adaptive``'s decay, prior,
  forget and threshold; else a one-line ValueError naming ``field`` and the value."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
  if not ok or (open_at_zero and value == 0):
    raise ValueError(f"{field} must be a number in {'(0' if open_at_zero else '[0'}, 1], got "
                     f"{value!r}")
