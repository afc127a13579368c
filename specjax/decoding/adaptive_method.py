"""``sj.Adaptive``: a method run with a draft length (a tree's depth) chosen per iteration from a
menu, 0 (plain decoding) included; the proposer and its rules: ``specjax.proposers.adaptive``."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import options
from specjax.decoding import methods
from specjax.decoding.methods import (Jacobi, PromptLookup, SelfSpeculative, Speculative, SpecTr,
                                      TreeSpeculative)
from specjax.models.transformer import Transformer
from specjax.proposers import adaptive as adaptive_lib
from specjax.proposers.adaptive import AdaptiveParams, AdaptiveProposer
from specjax.proposers.adaptive_model import entry_factors, menu_scores
from specjax.proposers.jacobi import JacobiProposer

# The field that sets a chain method's draft length, for ``Adaptive``.
ADAPTIVE_LENGTH = {Speculative: "gamma", SelfSpeculative: "gamma", PromptLookup: "num_tokens",
                   Jacobi: "block"}
# The methods with a draft model, whose upkeep a call-level skip saves (``probe_every``).
DRAFTED = (Speculative, SelfSpeculative, TreeSpeculative, SpecTr)


@dataclasses.dataclass(frozen=True, eq=False)
class Adaptive:
  """Speculate only as much as pays: ``method`` (a chain method: ``Speculative``,
  ``SelfSpeculative``, ``PromptLookup`` or ``Jacobi``; or a tree method with ``at_depth``:
  ``Retrieval``, ``TreeSpeculative`` or ``SpecTr``, its tree cut to a depth) run with a draft
  length (a tree's depth) chosen before each iteration from the menu ``choices`` (0: plain
  decoding), all entries compiled into the one loop (a loop per entry, each of its own static
  pass shape; ``specjax.proposers.adaptive``).

  ``rule``: ``"cost"`` (default) picks the entry with the most modelled tokens per unit of
  ``costs`` (an ``sj.CostTable`` measured on the device, batch and context the run uses;
  ``calibrated`` prices each entry by this loop's own iteration), from
  per-row running estimates of the acceptance at each position (a running mean with ``prior`` as
  two observations, then an EMA of weight ``decay``; drift at rate ``forget`` for positions past
  the chosen entry's drafts, toward the row's own first-position estimate or, with
  ``drift="prior"``, back to ``prior``; a skipped draft follows the text and is scored
  over the plain tokens), each entry's modelled drafts scaled by what its own recent iterations
  accepted over what the estimates expected (``correct``, off by default: measured mixed, it
  fixed a miss at batch 4 and cost 2-7% at batch 1; ``adaptive_model.TALLY_KEEP``), keeping
  the last entry unless the best beats it by the factor ``1 + margin``. ``prior`` is one
  value, or one per position (the largest choice's many), and counts as two observations plus
  ``prior_evidence`` (one value or one per position; 0: a guess); ``warmed(stats)`` starts
  from where an earlier call's estimates ended, with the observations behind them and the
  check's tally (``prior_tally``), as a server carries them from request to request, and runs
  the same compiled loop (all traced, not compiled in); ``"schedule"`` is Hugging Face's +2/-1
  heuristic; ``"confidence"`` stops the draft when its own probability of
  its guess falls below ``threshold`` (HF's 0.4; draft models only). The choice depends only on
  past iterations and the draft's own proposals, so every rule is lossless (``sj.Sampling``'s
  law, greedy tokens at T = 0).

  ``probe_every`` (0: off; rule ``"cost"`` over a draft model with 0 on the menu): a call whose
  starting estimates (``warmed``; never a call without evidence) make plain decoding the
  model's best entry, by more than the factor ``1 + margin``, runs as ``Autoregressive()``: the
  draft skipped altogether (no prefill, no looks: the upkeep that lets the draft resume within
  a call, 1-3% of a plain call; docs/benchmarks.md, session 49), except that after
  ``probe_every - 1`` such calls in a row the next runs the rule (the probe: its looks bring
  new evidence). A call also skips where the last call that ran the rule cost more, by the
  table, than plain decoding of its tokens would have, by more than the factor
  ``1 + probe_margin`` (``probe_cost``, set by ``warmed``: the rule's realized iterations, its
  choices priced by the table, over the iterations a skipped call would run at
  ``CostTable.skipped_step``): the estimates where a call ends are the text's last stretch, and
  a rule that drafts where it does not pay shows in the call's own outcome. ``probe_margin``
  (0.05) is the calibrated prices' own spread (a skipped call's iteration 0.957-1.000 of the
  loop's plain one over four calibrations of SmolLM2's chat cell at batch 4; one call's outcome
  at 1.006 skipped batch-1 code edits where two drafts paid 9%: docs/benchmarks.md, session
  52): a wrong skip costs the draft's whole gain, a missed one a few percent. The decision from
  the estimates prices plain decoding at the menu's own plain entry. ``warmed`` counts the
  skipped calls (``skipped_calls``; ``DecodeStats``'s ``draft_skipped``) and a probe restarts
  the count. vLLM switches its drafts off by batch size
  (``speculative_disable_by_batch_size``); this one decides by the measured model.
  """

  method: Any
  choices: tuple[int, ...] = (0, 1, 2, 3, 4, 6)
  costs: Any = None
  rule: str = "cost"
  decay: float = options.ADAPTIVE_DEFAULTS["decay"]
  prior: float | tuple[float, ...] = options.ADAPTIVE_DEFAULTS["prior"]
  forget: float = options.ADAPTIVE_DEFAULTS["forget"]
  threshold: float = options.ADAPTIVE_DEFAULTS["threshold"]
  margin: float = options.ADAPTIVE_DEFAULTS["margin"]
  drift: str = options.ADAPTIVE_DRIFTS[0]  # "first"
  prior_evidence: float | tuple[float, ...] = 0.0
  correct: bool = False
  prior_tally: Any = None  # the check's tally to start from: [made, modelled], K values each
  probe_every: int = 0  # the call-level skip: every probe_every-th call probes (0: never skip)
  skipped_calls: int = 0  # calls skipped in a row before this one (``warmed`` counts them)
  probe_cost: float = 0.0  # the last rule call's cost over a skipped call's (0: none yet)
  probe_margin: float = options.ADAPTIVE_DEFAULTS["probe_margin"]  # what probe_cost must beat
  name = "adaptive"

  def __post_init__(self):
    if type(self.method) not in ADAPTIVE_LENGTH and not hasattr(self.method, "at_depth"):
      names = ", ".join(sorted(m.__name__ for m in ADAPTIVE_LENGTH))
      raise ValueError(f"sj.Adaptive wraps a chain method ({names}) or a tree method with "
                       f"at_depth (Retrieval, TreeSpeculative, SpecTr), got "
                       f"{type(self.method).__name__}")
    object.__setattr__(self, "choices", check_menu(self.choices, self.rule))
    object.__setattr__(self, "prior", per_position(self.prior, self.gamma, "prior"))
    object.__setattr__(self, "prior_evidence", per_position(
        self.prior_evidence, self.gamma, "prior_evidence", options.check_count,
        "a finite number >= 0"))
    check_settings(self.decay, self.forget, self.threshold, self.margin, self.drift)
    if not isinstance(self.correct, bool):
      raise ValueError(f"correct must be True or False, got {self.correct!r}")
    if self.prior_tally is not None:  # None: nothing tallied, for any menu
      object.__setattr__(self, "prior_tally", check_tally(self.prior_tally, len(self.choices)))
    if self.rule == "confidence" and not isinstance(self.method, (Speculative, SelfSpeculative)):
      raise ValueError(f"the confidence rule stops a draft model by its own probabilities; "
                       f"{type(self.method).__name__} has none")
    menu_costs(self.costs, self.choices, self.rule, self.tree_nodes, self.draft_widths)
    check_probing(self.probe_every, self.skipped_calls, self.rule, self.choices, self.method)
    options.check_count(self.probe_cost, "probe_cost", "a cost ratio")
    options.check_unit_number(self.probe_margin, "probe_margin")

  @property
  def tree_nodes(self) -> tuple[int, ...] | None:
    """Each entry's tree nodes (0 for plain decoding) for a tree method, whose target pass is
    over them and the pending token (``CostTable.entry_cost``); None for a chain method."""
    if type(self.method) in ADAPTIVE_LENGTH:
      return None
    return tuple(self.at(k).nodes if k else 0 for k in self.choices)

  @property
  def draft_widths(self) -> tuple[tuple[int, ...], ...] | None:
    """Each entry's draft passes, by tokens (``()`` for plain decoding and a draft-free tree),
    for a tree method (``CostTable.entry_cost``); None for a chain method."""
    if type(self.method) in ADAPTIVE_LENGTH:
      return None
    return tuple(tuple(getattr(self.at(k), "draft_pass_widths", ())) if k else ()
                 for k in self.choices)

  @property
  def gamma(self) -> int:
    """The most drafts one iteration can accept (the largest choice)."""
    return self.choices[-1]

  @classmethod
  def passes(cls, method, choices=(0, 1, 2, 3, 4, 6)) -> dict:
    """What ``sj.CostTable.measure`` must time for ``method`` over the menu ``choices`` (the
    cost rule's prices), as its keyword arguments: ``widths`` (target passes: k + 1 tokens for
    k drafts, a tree's nodes + 1), ``gammas`` (a draft model's chains: bare iterations; for
    ``SelfSpeculative`` measure with its layer-skipping view as the draft) and
    ``draft_widths`` (a draft's tree: its wider passes)::

        costs = sj.CostTable.measure(target, draft, batch=1, context=256, cache_length=320,
                                     **sj.Adaptive.passes(method, choices))
    """
    menu = cls(method, choices, rule="schedule")  # the checks, and the entries' shapes
    nodes = menu.tree_nodes or menu.choices
    drafted = menu.draft_widths or ()
    return {"widths": tuple(sorted({1, *(n + 1 for n in nodes if n)})),
            "gammas": tuple(k for k in menu.choices if k)
            if isinstance(method, (Speculative, SelfSpeculative)) else (),
            "draft_widths": tuple(sorted({w for entry in drafted for w in entry if w > 1}))}

  def warmed(self, stats) -> "Adaptive":
    """This method with ``prior`` set to the acceptance estimates an earlier call's ``stats``
    (``sj.DecodeStats``, or its ``acceptance_estimates``) ended with, and ``prior_evidence``
    to the observations behind them (``acceptance_evidence``; 0 from a bare array): the next
    call starts from the evidence already seen instead of the fixed prior (which, where the
    draft rarely pays, has the first iterations speculate until the estimates come down), and
    weighs it as such (counted as two observations, a warmed estimate fell a third of the way
    to 0 at its first miss: on the benchmark pair at batch 4 the rule then decoded plainly in
    79% of iterations where one draft paid 7%; docs/benchmarks.md, session 42). Lossless like
    any prior: it depends on earlier calls only. With ``DecodeStats`` of rule "cost", also
    ``probe_cost``: that call's iterations priced by the table (``choice_counts``) over the
    plain iterations its longest row's tokens take at ``CostTable.skipped_step``."""
    if getattr(stats, "draft_skipped", False):  # a skipped call: nothing new but the count
      return dataclasses.replace(self, skipped_calls=self.skipped_calls + 1)
    estimates = getattr(stats, "acceptance_estimates", stats)
    values = tuple(float(x) for x in np.asarray(estimates, np.float64).reshape(-1))
    if len(values) != self.gamma:
      raise ValueError(f"warmed needs {self.gamma} acceptance estimates (one per position of "
                       f"the largest choice), got {len(values)}: stats of another method?")
    evidence = np.asarray(getattr(stats, "acceptance_evidence", 0.0), np.float64).reshape(-1)
    tally = getattr(stats, "model_tally", None)
    return dataclasses.replace(self, prior=values, prior_tally=tally, skipped_calls=0,
                               prior_evidence=tuple(float(x) for x in evidence),
                               probe_cost=self.call_cost(stats))

  def call_cost(self, stats) -> float:
    """A rule call's iterations priced by the table (``DecodeStats.choice_counts``, entry costs)
    over what plain decoding of its tokens costs without the draft: as many iterations as its
    longest row emitted tokens after the prefill's first, at ``CostTable.skipped_step``; 0
    where there is nothing to compare (not rule "cost", no counts, a single token)."""
    counts = np.asarray(getattr(stats, "choice_counts", ()), np.int64).reshape(-1)
    plain = int(np.max(np.asarray(getattr(stats, "generated", 0)), initial=0)) - 1
    if self.rule != "cost" or len(counts) != len(self.choices) or plain < 1:
      return 0.0
    cost = self.costs.menu_cost(self.choices, counts, self.tree_nodes, self.draft_widths)
    return cost / (plain * self.costs.skipped_step())

  def skips_draft(self, batch: int, max_new_tokens: int) -> bool:
    """Whether a call of ``batch`` rows and ``max_new_tokens`` skips the draft (``probe_every``):
    not a probe, evidence behind the estimates, and either the last rule call's ``probe_cost``
    above ``1 + probe_margin`` or, at the call's start, plain decoding's modelled tokens per
    unit of cost (``adaptive_model.menu_scores``: the rule's first choice, every row active;
    plain decoding at the menu's own price, which the calibration fits jointly with the
    drafting entries: the bare loop's own fit scattered 0.87-1.11x of it between runs, and at
    ``margin`` 0 that would flip this decision) above ``1 + margin`` times every drafting
    entry's."""
    if (not self.probe_every or self.skipped_calls + 1 >= self.probe_every
        or not any(self.prior_evidence)):
      return False
    if self.probe_cost > 1.0 + self.probe_margin:
      return True
    gamma = self.gamma
    factors = (None if not self.correct or self.prior_tally is None
               else entry_factors(jnp.asarray(self.prior_tally, jnp.float32)))
    scores = np.asarray(start_scores(
        jnp.asarray(menu_costs(self.costs, self.choices, self.rule, self.tree_nodes,
                               self.draft_widths), jnp.float32),
        jnp.broadcast_to(jnp.asarray(self.prior, jnp.float32), (batch, gamma)),
        jnp.broadcast_to(jnp.asarray(self.prior_evidence, jnp.float32), (batch, gamma)),
        jnp.full((batch,), max(int(max_new_tokens) - 1, 1), jnp.int32), factors,
        choices=self.choices, decay=float(self.decay)))
    return bool(scores[0] > (1.0 + self.margin) * np.max(scores[1:]))

  def for_call(self, batch: int, max_new_tokens: int) -> Any:
    """The method a call of ``batch`` rows runs: ``Autoregressive()`` where it skips the draft
    (``skips_draft``), else this one (``sj.generate`` asks, and marks the skip in the stats)."""
    return methods.Autoregressive() if self.skips_draft(batch, max_new_tokens) else self

  def calibrated(self, target: Transformer, prompts, *, sampling, max_new_tokens: int,
                 key=None, repeats: int = 3, **generate_kwargs) -> "Adaptive":
    """This method priced by its own loop: ``costs`` with each menu entry's iteration timed in
    this method's compiled loop held at that entry (``CostTable.loop``), on ``prompts`` at
    ``sampling`` and ``max_new_tokens`` as the run will use them (``generate_kwargs``: the rest
    of ``sj.generate``'s but ``eos_token_id``; a run without EOS then reuses the compiled loop,
    the costs being traced). The bare passes leave out the loop's own work, which weighs on the
    entries unequally (``specjax.decoding.adaptive_calibration``). Lossless like any table: the
    timing depends on no token of the run."""
    from specjax.decoding import adaptive_calibration
    return dataclasses.replace(self, costs=adaptive_calibration.calibrate(
        self, target, prompts, sampling=sampling, max_new_tokens=max_new_tokens, key=key,
        repeats=repeats, **generate_kwargs))

  def at(self, gamma: int):
    """The wrapped method with ``gamma`` drafts per iteration (a tree method: ``gamma`` deep)."""
    if type(self.method) not in ADAPTIVE_LENGTH:
      return self.method.at_depth(gamma)
    return dataclasses.replace(self.method, **{ADAPTIVE_LENGTH[type(self.method)]: gamma})

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    self.at(self.gamma).validate(target, width, max_new_tokens, what)

  def proposer(self, target: Transformer):
    room = self.gamma

    def build(k):
      proposer, params = self.at(k).proposer(target)
      return (dataclasses.replace(proposer, room=room) if isinstance(proposer, JacobiProposer)
              else proposer), params

    with methods.shared_splits():  # one split of the draft for every entry
      built = [build(k) for k in self.choices if k > 0]
      shadow = None if hasattr(built[-1][0], "sync") else build(1)[0]
    proposers = (None,) * (self.choices[0] == 0) + tuple(p for p, _ in built)
    costs = menu_costs(self.costs, self.choices, self.rule, self.tree_nodes, self.draft_widths)
    return AdaptiveProposer(
        proposers=proposers, choices=self.choices, rule=self.rule,
        decay=float(self.decay), forget=float(self.forget),
        threshold=float(self.threshold), vocab_size=target.config.vocab_size,
        margin=float(self.margin), shadow=shadow, drift=self.drift,
        correct=self.correct), AdaptiveParams(
            inner=built[-1][1], prior=jnp.asarray(self.prior, jnp.float32),
            evidence=jnp.asarray(self.prior_evidence, jnp.float32),
            costs=jnp.asarray(costs, jnp.float32),
            tally=jnp.zeros((2, len(self.choices)), jnp.float32) if self.prior_tally is None
            else jnp.asarray(self.prior_tally, jnp.float32))


def check_menu(choices, rule: str) -> tuple[int, ...]:
  """The menu as a tuple (``options.check_adaptive_menu``'s checks, and the confidence rule's
  every length up to the largest), or a one-line ValueError naming what is wrong."""
  if rule not in adaptive_lib.RULES:
    raise ValueError(f"rule must be one of {adaptive_lib.RULES}, got {rule!r}")
  try:
    menu = tuple(choices)
  except TypeError:
    raise ValueError(f"choices must be a sequence of draft lengths, got {choices!r}") from None
  options.check_adaptive_menu(choices)
  if rule == "confidence" and not set(range(1, menu[-1] + 1)) <= set(menu):
    raise ValueError(f"the confidence rule stops the draft at any length up to the largest "
                     f"choice, so choices must include 1..{menu[-1]}, got {choices!r}")
  return tuple(int(k) for k in menu)


def per_position(given, depth: int, name: str, check=options.check_unit_number,
                 kind: str = "a number in [0, 1]") -> tuple[float, ...]:
  """``sj.Adaptive``'s ``name`` (the prior; its evidence), one value or ``depth`` of them (one per
  position), each passing ``check(value, name)`` (``kind`` says what it accepts), as ``depth``
  floats; else a one-line ValueError naming the value."""
  given = given.tolist() if hasattr(given, "tolist") else given  # numpy / jax values
  values = (given,) if isinstance(given, (int, float, str)) else given
  try:
    values = tuple(values)
  except TypeError:
    raise ValueError(f"{name} must be {kind} or {depth} of them (one per position), "
                     f"got {given!r}") from None
  if len(values) not in (1, depth):
    raise ValueError(f"{name} must be one value or {depth} (one per position of the largest "
                     f"choice), got {len(values)}: {given!r}")
  for value in values:
    check(value, name)
  return tuple(float(v) for v in values) * (depth if len(values) == 1 else 1)


@functools.partial(jax.jit, static_argnames=("choices", "decay"))
def start_scores(costs, prior, evidence, remaining, factors, *, choices, decay):
  """``menu_scores`` at a call's start, every row active (jitted: one dispatch a call)."""
  active = jnp.ones(remaining.shape, bool)
  return menu_scores(costs, prior, evidence, active, remaining, choices, decay, factors)


def check_probing(probe_every, skipped_calls, rule: str, choices: tuple[int, ...],
                  method) -> None:
  """``sj.Adaptive``'s call-level skip settings, or a one-line ValueError: counts (ints >= 0),
  and a skip only where it has something to skip (a draft model's upkeep) and a model that
  says when (rule "cost", plain decoding on the menu)."""
  options.check_probe_every(probe_every)
  methods.check_count(skipped_calls, "skipped_calls", "calls skipped in a row", 0)
  if probe_every and (rule != "cost" or choices[0] != 0 or not isinstance(method, DRAFTED)):
    raise ValueError(f"probe_every skips a draft model's calls where the cost rule prices plain "
                     f"decoding best: it needs rule 'cost', 0 on the menu and a method with a "
                     f"draft model, got rule {rule!r}, choices {choices!r}, "
                     f"{type(method).__name__}")


def check_tally(given, entries: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """``sj.Adaptive``'s ``prior_tally`` as two tuples of ``entries`` finite numbers >= 0
  (``DecodeStats.model_tally``'s shape), else a one-line ValueError."""
  try:
    values = np.asarray(given, np.float64)
  except (TypeError, ValueError):
    values = None
  if values is None or values.shape != (2, entries) or not np.all(np.isfinite(values)
                                                                  & (values >= 0)):
    raise ValueError(f"prior_tally must be 2 x {entries} finite numbers >= 0 (made, modelled: "
                     f"DecodeStats.model_tally of this menu), got {given!r}")
  return tuple(tuple(float(x) for x in row) for row in values)


def check_settings(decay, forget, threshold, margin=0.0,
                   drift=options.ADAPTIVE_DRIFTS[0]) -> None:
  """The estimator's, the cost rule's and the confidence rule's settings (the prior:
  ``per_position``), or a one-line ValueError."""
  options.check_adaptive_drift(drift)
  options.check_unit_number(decay, "decay", open_at_zero=True)
  for field, value in (("forget", forget), ("threshold", threshold), ("margin", margin)):
    options.check_unit_number(value, field)


def menu_costs(costs, choices: tuple[int, ...], rule: str,
               tree_nodes: tuple[int, ...] | None = None,
               draft_widths: tuple[tuple[int, ...], ...] | None = None) -> tuple[float, ...]:
  """Each entry's iteration cost in target steps from ``costs`` (an ``sj.CostTable``'s
  ``entry_cost``: a chain's, or a tree's draft passes over ``draft_widths[i]`` tokens and its
  target pass over ``tree_nodes[i]`` nodes, ``sj.Adaptive.tree_nodes`` / ``draft_widths``) for
  the cost rule (``()`` for the others), or a one-line ValueError (a pass the table lacks: its
  own)."""
  if rule != "cost":
    return ()
  if not callable(getattr(costs, "entry_costs", None)):
    raise ValueError(f"rule 'cost' needs costs=sj.CostTable measured for this run "
                     f"(sj.CostTable.measure), got {costs!r}")
  return costs.entry_costs(choices, tree_nodes, draft_widths)
