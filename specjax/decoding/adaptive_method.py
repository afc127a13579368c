"""``sj.Adaptive``: a method run with a draft length (a tree's depth) chosen per iteration from a
menu, 0 (plain decoding) included; the proposer and its rules: ``specjax.proposers.adaptive``."""

from __future__ import annotations

import dataclasses
from typing import Any

from specjax import options
from specjax.decoding.methods import Jacobi, PromptLookup, SelfSpeculative, Speculative
from specjax.models.transformer import Transformer
from specjax.proposers import adaptive as adaptive_lib
from specjax.proposers.adaptive import AdaptiveProposer
from specjax.proposers.jacobi import JacobiProposer

# The field that sets a chain method's draft length, for ``Adaptive``.
ADAPTIVE_LENGTH = {Speculative: "gamma", SelfSpeculative: "gamma", PromptLookup: "num_tokens",
                   Jacobi: "block"}


@dataclasses.dataclass(frozen=True, eq=False)
class Adaptive:
  """Speculate only as much as pays: ``method`` (a chain method: ``Speculative``,
  ``SelfSpeculative``, ``PromptLookup`` or ``Jacobi``; or a tree method with ``at_depth``:
  ``Retrieval``, ``TreeSpeculative`` or ``SpecTr``, its tree cut to a depth) run with a draft
  length (a tree's depth) chosen before each iteration from the menu ``choices`` (0: plain
  decoding), all entries compiled into the one loop (a loop per entry, each of its own static
  pass shape; ``specjax.proposers.adaptive``).

  ``rule``: ``"cost"`` (default) picks the entry with the most modelled tokens per unit of
  ``costs`` (an ``sj.CostTable`` measured on the device, batch and context the run uses), from
  per-row running estimates of the acceptance at each position (a running mean with ``prior`` as
  two observations, then an EMA of weight ``decay``; drift at rate ``forget`` for positions past
  the chosen entry's drafts, back to ``prior`` or, with ``drift="first"``, to the row's own
  first-position estimate; a skipped draft follows the text and is scored
  over the plain tokens), keeping the last entry unless the best beats it by the factor
  ``1 + margin``; ``"schedule"`` is
  Hugging Face's +2/-1 heuristic; ``"confidence"`` stops the draft when its own probability of
  its guess falls below ``threshold`` (HF's 0.4; draft models only). The choice depends only on
  past iterations and the draft's own proposals, so every rule is lossless (``sj.Sampling``'s
  law, greedy tokens at T = 0).
  """

  method: Any
  choices: tuple[int, ...] = (0, 1, 2, 3, 4, 6)
  costs: Any = None
  rule: str = "cost"
  decay: float = options.ADAPTIVE_DEFAULTS["decay"]
  prior: float = options.ADAPTIVE_DEFAULTS["prior"]
  forget: float = options.ADAPTIVE_DEFAULTS["forget"]
  threshold: float = options.ADAPTIVE_DEFAULTS["threshold"]
  margin: float = options.ADAPTIVE_DEFAULTS["margin"]
  drift: str = options.ADAPTIVE_DRIFTS[0]  # "prior"
  name = "adaptive"

  def __post_init__(self):
    if type(self.method) not in ADAPTIVE_LENGTH and not hasattr(self.method, "at_depth"):
      names = ", ".join(sorted(m.__name__ for m in ADAPTIVE_LENGTH))
      raise ValueError(f"sj.Adaptive wraps a chain method ({names}) or a tree method with "
                       f"at_depth (Retrieval, TreeSpeculative, SpecTr), got "
                       f"{type(self.method).__name__}")
    object.__setattr__(self, "choices", adaptive_lib.check_menu(self.choices, self.rule))
    adaptive_lib.check_settings(self.decay, self.prior, self.forget, self.threshold,
                                self.margin, self.drift)
    if self.rule == "confidence" and not isinstance(self.method, (Speculative, SelfSpeculative)):
      raise ValueError(f"the confidence rule stops a draft model by its own probabilities; "
                       f"{type(self.method).__name__} has none")
    adaptive_lib.menu_costs(self.costs, self.choices, self.rule, self.tree_nodes,
                            self.draft_widths)

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

    built = [build(k) for k in self.choices if k > 0]
    proposers = (None,) * (self.choices[0] == 0) + tuple(p for p, _ in built)
    shadow = None if hasattr(built[-1][0], "sync") else build(1)[0]
    return AdaptiveProposer(
        proposers=proposers, choices=self.choices, rule=self.rule,
        costs=adaptive_lib.menu_costs(self.costs, self.choices, self.rule, self.tree_nodes,
                                      self.draft_widths),
        decay=float(self.decay), prior=float(self.prior), forget=float(self.forget),
        threshold=float(self.threshold), vocab_size=target.config.vocab_size,
        margin=float(self.margin), shadow=shadow, drift=self.drift), built[-1][1]
