"""Adaptive speculation: a menu of draft lengths (0 = plain decoding), one chosen per iteration.

``sj.Adaptive`` (``specjax.decoding.adaptive_method``) wraps a chain method, or a tree method
whose menu cuts its tree to each depth (``Retrieval.at_depth``, draft-free;
``TreeSpeculative.at_depth`` / ``SpecTr.at_depth``, a draft's tree: a level's acceptance is then
estimated like a chain position's, from whether the level was reached, and an entry costs its
draft passes and its target pass); this proposer holds one proposer per menu entry, all sharing
one state (room for the largest entry), and the loop runs each entry in a loop of its own static
pass shape (``specjax.decoding.loop``); the model's arithmetic is
``specjax.proposers.adaptive_model``. The choice is made before the iteration from past
iterations only (and, for the confidence rule, from the draft's own proposals), never from the
target's verdict on the current iteration, so every iteration is an exact speculative step of
some length and the output law is the target's.

Rules (``RULES``):

* ``"cost"``: the entry that decodes the active rows' remaining tokens in the least modelled
  time, ``cost(k) x E[iterations until the slowest row is done]`` (``batch_iterations``; for one
  row the most tokens per unit of cost, ``E_b(k) / cost(k)``), with row b's tokens an iteration
  ``E_b(k) = 1 + sum_{i<k} prod_{j<=i} a_bj`` (Leviathan et al. 2023, arXiv 2211.17192, Eq. 1
  with a per-position acceptance) and their variance (``menu_moments``), and ``cost(k)`` from
  a measured ``sj.CostTable`` (``entry_cost``, in target steps: the loop's own iteration when
  calibrated, else k draft steps and a pass over k + 1 tokens; traced, ``AdaptiveParams``).
  In a batch, ragged acceptance makes early rows idle while the slowest
  finishes: one draft at acceptance 0.3 gives a row 1.3 tokens an iteration, four rows of 64
  tokens 1.24 (measured: rows busy in 0.91-0.96 of iterations at batch 4-8, SmolLM2). The rows'
  estimates are first pulled toward the batch's mean by as much as their own noise explains
  (``shrink``): the least of several noisy estimates is low, and it prices the batch.
  With ``correct`` (off by default) each entry's modelled drafts are then scaled by what its own
  recent iterations accepted over what the estimates expected of them (``entry_factors``):
  where a length's iterations fall in the text, which the per-position model does not see.
  ``a_bj`` is a per-row running estimate of the acceptance at position j: a running average (the
  prior, one value per position and an input of the loop (``AdaptiveParams``: a later call can start
  from an earlier one's ``estimates``), counting as ``PRIOR_WEIGHT`` + its evidence, then an
  exponential moving average of weight ``decay`` on the newest observation: ``kept_weight``) of the
  verifier's exact acceptance probability (T > 0: ``sum_x min(p, q)`` for sampled drafts, ``p(x)``
  for deterministic ones; T = 0: the match indicator) at the positions whose test ran; positions
  past the chosen entry's drafts drift toward the row's own first-position estimate
  (``drift="prior"``: back to ``prior``) at rate ``forget`` per iteration (what makes a longer
  entry worth a try again), while a position the entry drafted but did not reach keeps its
  estimate (drifting it would bias a hard text's estimates up). With choice 0 a draft-free
  proposer still makes its first guess (free) and the emitted token scores it (the deeper
  positions drift). A draft model is skipped (no draft step) and follows the text a span of plain
  tokens at a time (``look_span``: ``LOOK_SPAN`` x the largest choice, the ``look``; each look that
  leaves the rule plain doubles the next span, up to ``LOOK_BACKOFF`` x, until it speculates again):
  fed the plain tokens, its guesses after the last ``LOOK_SCORED`` of them are scored against the
  tokens the target drew (the match at T = 0; at T > 0 the acceptance ``sum_x min(p, q)`` itself,
  from the target's law p kept for those tokens (``record_plain``); a tree whose first level is the
  draft's top k: whether the token is among them, at T > 0 p's mass on them), and the choice is made
  with that; the deeper positions, which a look does not score, are capped at the first's new
  estimate (with ``drift="first"`` one never observed takes it). Its estimates do not drift in plain
  iterations: a resumption rests on what the draft would have done at the end of the stretch, at two
  draft passes per span (the catch-up it would need anyway, and the scored tokens).
* ``"schedule"``: Hugging Face's heuristic schedule (``num_assistant_tokens_schedule=
  "heuristic"``): +2 drafts after an iteration in which every active row accepted all its
  drafts, else -1 (never below the smallest positive entry), starting at the largest entry.
* ``"confidence"``: the draft stops after the first draft whose own probability falls below
  ``threshold`` in every active row (HF's ``assistant_confidence_threshold`` = 0.4; AdaEDL,
  SpecDec++), within the largest entry; then the pass over what was drafted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specjax import options
from specjax import sampling as sampling_lib
from specjax.proposers.adaptive_model import (entry_factors, menu_moments, menu_scores, observe,
                                              observe_many, tally)
from specjax.proposers.adaptive_plain import first_level, record_plain
from specjax.proposers.base import CHAIN, Candidates
from specjax.proposers.draft_chain import GammaChain
from specjax.proposers.draft_free import TokenHistory

RULES = options.ADAPTIVE_RULES
# A skipped draft looks (catches up and is scored) every LOOK_SPAN x the largest choice plain
# tokens, in passes that wide: on XLA:CPU SmolLM2's draft passes over 6 / 12 / 24 tokens cost
# 1.8 / 2.5 / 3.5 draft steps, so looks every 12 tokens cost ~0.2 target steps per 12 plain
# tokens where every 6 cost 0.3 (measured: looks every 6 were ~3% of plain decoding at T = 1),
# for a resumption at most 12 tokens late.
LOOK_SPAN = 2
# A look scores the draft's guesses after the last LOOK_SCORED tokens of its span only; the
# span's other tokens just catch the draft up, in a pass that needs no more than their keys and
# values (XLA then leaves out the last layer's attention and MLP and the head): on XLA:CPU a
# 12-token look of SmolLM2's draft at batch 8 took 19.3 ms scoring all 12, 13.3 scoring 4
# (~3.5% and ~2.5% of the 12 plain steps it follows).
LOOK_SCORED = 4
# A look after which the rule still decodes plainly puts the next one twice as far off, up to
# LOOK_BACKOFF x the first span, until the rule speculates again: where the draft does not pay,
# 128 plain tokens take 3 looks, not 10 (SmolLM2's draft at batch 8, forced plain decoding with
# both changes: 0.974 -> 0.985x autoregressive at T = 0, 0.948 -> 0.974x at T = 1;
# experiments/adaptive_upkeep.py), and a resumption comes at most 4 spans late.
LOOK_BACKOFF = 4
# At T > 0 a look scores a guess by its exact acceptance sum_x min(p, q), the target's law p
# kept by the plain iterations that drew the scored tokens (LOOK_SCORED laws a row, 3 MB at
# batch 4 for SmolLM2); False: by one draw's min(1, q(x) / p(x)), whose mean is the same and
# whose variance over SmolLM2's sampled answers (T = 1) is 1.8x the exact value's on chat and
# 2.4x on code edits (experiments/look_observations.py): each look then brings the rule ~2x the
# evidence.
KEEP_LAWS = True


@flax.struct.dataclass
class AdaptiveState:
  inner: Any  # the wrapped proposer's state (shared by every menu entry)
  text: TokenHistory  # the rows' committed text: what a skipped draft catches up with
  acceptance: jax.Array  # float32[B, G] per-row, per-position acceptance estimates
  seen: jax.Array  # float32[B, G] observations behind each estimate
  # float32[2, K] each entry's accepted drafts lately and what the estimates expected of them
  # (``tally``; rule "cost" with ``correct``)
  tally: jax.Array
  shadow: jax.Array  # int32[B, W] guesses a plain iteration scored (draft-free: ``first_level``)
  gamma: jax.Array  # int32[] the schedule's current draft length
  last: jax.Array  # int32[] the previous iteration's menu index (-1 before the first)
  plain_run: jax.Array  # int32[] plain iterations since the draft last caught up (``look``)
  look_every: jax.Array  # int32[] plain iterations between looks (``LOOK_BACKOFF``)
  drafts: jax.Array  # int32[B, G] the confidence rule's drafts of this iteration
  laws: jax.Array  # float32[B, G, V] their laws (confidence rule; [B, 0, 0] otherwise)
  # float32[B, L] at each text position the target's probability of its token when a plain
  # iteration drew it (0 elsewhere): what a skipped draft's guesses are scored against (rule
  # "cost" over a draft model: ``looks``; [B, 0] otherwise)
  plain_p: jax.Array
  # float32[B, S, V] the target's law where a plain iteration drew one of the tokens a look
  # will score (slot: text position mod S, ``scored``; T > 0) and int32[B, S] the position
  # each slot holds (-1: none): a look's exact observation (``looks``; [B, 0, 0], [B, 0] else)
  plain_laws: jax.Array
  law_cols: jax.Array


@flax.struct.dataclass
class AdaptiveParams:
  """The traced inputs of an ``AdaptiveProposer`` (the wrapped proposer's own, the prior, its
  weight, the entries' costs): a call warmed by an earlier one's estimates
  (``sj.Adaptive.warmed``) or priced by a calibrated table reuses the loop."""

  inner: Any  # the wrapped proposer's params (a draft's weights; None for most draft-free ones)
  prior: jax.Array  # float32[G] each position's starting estimate and drift target
  evidence: jax.Array  # float32[G] observations the prior counts as, beyond PRIOR_WEIGHT
  costs: jax.Array  # float32[K] entry k's iteration in target steps (rule "cost"; [0] else)
  tally: jax.Array  # float32[2, K] the entries' tally to start from (``AdaptiveState.tally``)


@dataclasses.dataclass(frozen=True)
class AdaptiveProposer:
  """The proposer of ``sj.Adaptive``. ``proposers[i]`` drafts ``choices[i]`` tokens (a tree
  method: a tree ``choices[i]`` deep; None for 0); ``shadow`` is the 1-deep proposer whose
  guesses a plain-decoding iteration scores (None when the inner proposer has a draft model,
  which is then skipped: ``syncs``). Compared and hashed (the compiled loop's key, every call)
  by ``key``: the entries with the model graph they share with the largest left out, so that
  one graph is hashed, not one per entry."""

  proposers: tuple = dataclasses.field(compare=False)
  choices: tuple[int, ...]
  rule: str
  decay: float
  forget: float
  threshold: float
  vocab_size: int
  margin: float = 0.0
  shadow: Any = None
  drift: str = options.ADAPTIVE_DRIFTS[0]  # where untested positions drift (``ADAPTIVE_DRIFTS``)
  correct: bool = False  # scale each entry's modelled drafts by its realized (``entry_factors``)
  key: tuple = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "key", entries_key(self.proposers))

  @property
  def largest(self):
    return self.proposers[-1]

  @property
  def syncs(self) -> bool:
    """The inner proposer follows the text through a draft model: skipped at choice 0."""
    return hasattr(self.largest, "sync")

  @property
  def looks(self) -> bool:
    """Rule "cost" over a skipped draft model: in plain stretches the draft catches up with the
    text ``look_span`` tokens at a time and its guesses at them are scored (``look``)."""
    return self.syncs and self.rule == "cost"

  @property
  def look_span(self) -> int:
    """Plain tokens before the first look of a plain stretch (later ones come up to
    ``LOOK_BACKOFF`` times as far apart), and the width of a look's draft passes
    (``LOOK_SPAN``)."""
    return LOOK_SPAN * self.choices[-1]

  @property
  def scored(self) -> int:
    """The tokens at the end of a look's span whose guesses it scores (``LOOK_SCORED``)."""
    return min(LOOK_SCORED, self.look_span)

  @property
  def num_candidates(self) -> int:
    """The most candidates of an entry (a tree method's: the deepest tree's nodes)."""
    return max(p.num_candidates for p in self.proposers if p is not None)

  @property
  def depth(self) -> int:
    return self.choices[-1]

  @property
  def draft_calls_per_iteration(self) -> int:
    return self.largest.draft_calls_per_iteration

  @property
  def prefill_draft_calls(self) -> int:
    return self.largest.prefill_draft_calls

  @property
  def variants(self) -> tuple:
    return tuple(MenuEntry(self, i) for i in range(len(self.choices)))

  def prefill(self, params, prompt, prompt_lengths, cache_length):
    batch, g = prompt.shape[0], self.depth
    laws = (batch, g, self.vocab_size) if self.rule == "confidence" else (batch, 0, 0)
    plain_p = (batch, cache_length if self.looks else 0)
    slots = self.scored if self.looks and KEEP_LAWS else 0
    return AdaptiveState(
        inner=self.largest.prefill(params.inner, prompt, prompt_lengths, cache_length),
        text=TokenHistory.of_prompt(prompt, prompt_lengths, cache_length),
        acceptance=jnp.broadcast_to(params.prior.astype(jnp.float32), (batch, g)),
        seen=jnp.broadcast_to(params.evidence.astype(jnp.float32), (batch, g)),
        tally=params.tally.astype(jnp.float32),
        shadow=jnp.full((batch, 1 if self.shadow is None else self.shadow.num_candidates), -1,
                        jnp.int32),
        gamma=jnp.int32(self.choices[-1]),
        last=jnp.int32(-1), plain_run=jnp.int32(0), look_every=jnp.int32(self.look_span),
        drafts=jnp.zeros((batch, g), jnp.int32), laws=jnp.zeros(laws, jnp.float32),
        plain_p=jnp.zeros(plain_p, jnp.float32),
        plain_laws=jnp.zeros((batch, slots, self.vocab_size if slots else 0), jnp.float32),
        law_cols=jnp.full((batch, slots), -1, jnp.int32))

  @property
  def draws_in_choose(self) -> bool:
    """``choose`` drafts (rule "confidence"), with the keys the loop then draws before it."""
    return self.rule == "confidence"

  def choose(self, params, state: AdaptiveState, pending, keys, sampling, active, remaining,
             after: int | None = None):
    """(int32[] menu index, state) for the coming iteration: from the estimates, the costs and
    the rows' ``remaining`` budgets (int32[B]), the schedule, or (confidence) the draft's own
    chain, drafted here; or ``len(choices)`` when a look is due (``between``). ``after``: the
    entry that ran the iteration before (static, None if unknown)."""
    choices = jnp.asarray(self.choices, jnp.int32)
    if self.rule == "cost":
      # A skipped draft follows the text a span at a time, scoring its guesses at the last
      # tokens (the look, ``between``): the evidence the choice to resume rests on. Plain
      # decoding holds until the look is due; then the index past the menu asks the loop for it.
      # After a plain iteration plain holds (known statically: the rule is not computed, small
      # kernels that XLA:CPU would run in every plain iteration).
      holds = self.between_iterations and after == 0
      best = jnp.int32(0) if holds else self.best_for(params, state, active, remaining)
      if not self.between_iterations:
        return best, state.replace(last=best)
      plain = state.last == 0
      due = plain & (state.plain_run >= state.look_every)
      best = jnp.where(plain, 0, best)
      state = state.replace(look_every=jnp.where(best > 0, self.look_span, state.look_every))
      return (jnp.where(due, len(self.choices), best).astype(jnp.int32),
              state.replace(last=jnp.where(due, state.last, best)))
    if self.rule == "schedule":
      return jnp.sum(choices <= state.gamma).astype(jnp.int32) - 1, state
    inner = self.sync_inner(params, state)
    count, drafts, laws, inner = self.largest.propose_confident(
        params.inner, inner, pending, keys, sampling, self.threshold, active)
    return jnp.argmax(choices == count).astype(jnp.int32), state.replace(
        inner=inner, drafts=drafts, laws=laws)

  @property
  def between_iterations(self) -> bool:
    """``choose`` may ask for ``between`` (index ``len(choices)``): rule "cost" over a skipped
    draft with plain decoding on the menu, whose looks the loop runs as a stage of their own
    (``specjax.decoding.loop``), so that an iteration that does not look runs no control flow
    for it (a ``lax.cond`` there made XLA copy the state in every iteration, ~2% of one at
    batch 1 on the benchmark pair; on a GPU each such conditional or loop is a host sync)."""
    return self.looks and self.choices[0] == 0

  def between(self, params, state: AdaptiveState, pending, sampling, active, remaining):
    """(int32[] menu index, state) after the look ``choose`` asked for: the draft caught up and
    scored (``look``), then the choice from the new estimates; a look after which the rule
    stays plain puts the next one twice as far off, up to ``LOOK_BACKOFF`` spans, and
    speculating brings the first span back."""
    state = self.look(params, state, pending, sampling, active)
    best = self.best_for(params, state, active, remaining)
    backed_off = jnp.minimum(2 * state.look_every, LOOK_BACKOFF * self.look_span)
    return best, state.replace(last=best, look_every=jnp.where(best > 0, self.look_span,
                                                               backed_off))

  def best_for(self, params, state: AdaptiveState, active, remaining) -> jax.Array:
    """``best`` at ``state``'s estimates, entry and (``correct``) ``entry_factors``."""
    factors = entry_factors(state.tally) if self.correct else None
    return self.best(params.costs, state.acceptance, state.seen, active, state.last, remaining,
                     factors)

  def best(self, costs: jax.Array, acceptance: jax.Array, seen: jax.Array, active: jax.Array,
           last: jax.Array, remaining: jax.Array, factors: jax.Array | None = None) -> jax.Array:
    """int32[]: the entry that decodes the active rows' ``remaining`` tokens (int32[B]) in the
    least modelled time, ``costs[k] x batch_iterations`` at entry k's tokens an iteration
    (rule "cost"; ties: the shorter entry): for one row, the most tokens per unit of cost; for
    a batch, the rows' ragged progress priced in (a row that finishes early idles). Unless it
    beats the ``last`` entry by no more than the factor ``1 + margin`` (hysteresis: estimates
    near a break-even do not flip the choice at every iteration; each switch has costs the
    model leaves out). The rows' estimates are first ``shrink``-ed toward the batch's mean by
    what the observations behind them (``seen``, float32[B, G]) leave as noise; each entry's
    modelled drafts are then scaled by ``factors`` (float32[K], ``entry_factors``) if given."""
    score = menu_scores(costs, acceptance, seen, active, remaining, self.choices, self.decay,
                        factors)
    top = jnp.argmax(score).astype(jnp.int32)
    keep = (last >= 0) & (score[top] <= (1.0 + self.margin) * score[jnp.maximum(last, 0)])
    return jnp.where(keep, last, top)

  def look(self, params, state: AdaptiveState, pending, sampling, active) -> AdaptiveState:
    """The skipped draft caught up with the text and its guess after each of the last
    ``LOOK_SCORED`` tokens scored against the plain token that came (pending included): position
    0's estimate gets one observation per scored token (``observe_many``), and a scored row's
    deeper estimates are capped at it (never observed, with ``drift="first"``: set to it). The
    observation is the acceptance that guess would have had: at T = 0 the match; at T > 0
    ``sum_x min(p, q)``, the acceptance of a draft drawn from q (Leviathan et al. 2023, Sec.
    3.1), from the target's law p that the plain iteration kept (``record_plain``), else (a
    token whose law was not kept) ``min(1, q(x) / p(x))`` for the token x the target drew from
    p, whose mean over the draw is the same, at a larger variance (``KEEP_LAWS``). A tree whose
    first level is the draft's guesses of given ranks (greedy, or top-k children at T > 0;
    ``first_guesses``): whether x is among them (p's mass on them where the law was kept),
    whose mean is p of those guesses, the level's acceptance under the one-hot rule (sampled
    children: the chain's value, the acceptance of one child). Past tokens only."""
    text = state.text.with_pending(pending)
    rows = jnp.arange(pending.shape[0])[:, None]
    # A tree's first level (the shallowest entry's): the draft's ranks it holds, if not drawn
    shallowest = next(p for p in self.proposers if p is not None)
    ranks = shallowest.first_guesses(sampling) if hasattr(shallowest, "first_guesses") else ()
    tree_hit = bool(ranks) and (ranks != (0,) or not sampling.is_greedy)

    slots = state.law_cols.shape[1]
    with_laws = not sampling.is_greedy and slots > 0

    def score(logits, guesses, cols, fed):
      nxt = jnp.minimum(cols + 1, text.tokens.shape[1] - 1)
      token = jnp.maximum(text.tokens[rows, nxt], 0)
      p = state.plain_p[rows, nxt]
      exact = with_laws and state.plain_laws.shape[-1] == logits.shape[-1]
      if exact:  # the target's law at the token, where its plain iteration kept it
        law = state.plain_laws[rows, nxt % slots]  # [B, W, V]
        kept = state.law_cols[rows, nxt % slots] == nxt
      if tree_hit:  # a tree's first level, the draft's guesses of those ranks: the hit
        guessed = jax.lax.top_k(logits, max(ranks) + 1)[1][..., list(ranks)]
        value = jnp.any(guessed == token[..., None], axis=-1).astype(jnp.float32)
        if exact:  # p's mass on the guesses (distinct ids: distinct ranks)
          value = jnp.where(kept, jnp.sum(jnp.take_along_axis(law, guessed, axis=-1), -1), value)
      elif sampling.is_greedy:  # the draft's greedy guess, as ``draft_chain.draw`` makes it
        value = (guesses == token).astype(jnp.float32)
      else:
        q = sampling_lib.probabilities(logits, sampling)
        value = jnp.minimum(1.0, jnp.take_along_axis(q, token[..., None], axis=-1)[..., 0]
                            / jnp.maximum(p, 1e-30))
        if exact:
          value = jnp.where(kept, jnp.sum(jnp.minimum(law, q), axis=-1), value)
      scored = fed & (p > 0) & active[:, None]
      return (jnp.sum(jnp.where(scored, value, 0.0), axis=1),
              jnp.sum(scored, axis=1, dtype=jnp.float32))

    inner, scored = state.inner, self.scored
    if self.look_span > scored:  # the span's first tokens, not scored
      inner = self.largest.sync(params.inner, inner, text.tokens, text.lengths - scored,
                                self.look_span - scored)
    inner, (total, count) = self.largest.sync(params.inner, inner, text.tokens, text.lengths,
                                              scored, score, sampling.is_greedy)
    first, seen = observe_many(state.acceptance[:, 0], state.seen[:, 0], count,
                               total / jnp.maximum(count, 1.0), self.decay)
    # The look scores first guesses only; a deeper position is taken to accept no more than the
    # first (capped at it: at an optimistic prior the rule resumed long chains on a noisy first
    # estimate, T = 1), and with drift="first" one never observed takes the first's estimate.
    deeper = jnp.where((state.seen > 0) | (self.drift != "first"),
                       jnp.minimum(state.acceptance, first[:, None]), first[:, None])
    capped = jnp.where((count > 0)[:, None], deeper, state.acceptance)
    return state.replace(inner=inner, acceptance=capped.at[:, 0].set(first),
                         seen=state.seen.at[:, 0].set(seen), plain_run=jnp.int32(0))

  def sync_inner(self, params, state: AdaptiveState):
    """The inner state caught up with the committed text (a skipped draft model)."""
    return state.inner if not self.syncs else self.largest.sync(
        params.inner, state.inner, state.text.tokens, state.text.lengths, self.depth)

  def estimates(self, state: AdaptiveState) -> tuple[jax.Array, jax.Array, jax.Array]:
    """float32[G] each: the rows' mean acceptance estimate per position where the call ended,
    and the observations behind it (a later call's prior and its weight, ``warmed``); and
    float32[2, K] the entries' tally there (``AdaptiveState.tally``)."""
    return jnp.mean(state.acceptance, axis=0), jnp.mean(state.seen, axis=0), state.tally


@dataclasses.dataclass(frozen=True)
class MenuEntry(GammaChain):
  """Entry ``index`` of an ``AdaptiveProposer``'s menu: a proposer of ``choices[index]`` drafts
  over the shared ``AdaptiveState``; its ``commit`` also updates the estimates and the text."""

  parent: AdaptiveProposer
  index: int

  @property
  def gamma(self) -> int:
    return self.parent.choices[self.index]

  @property
  def num_candidates(self) -> int:
    return 0 if self.gamma == 0 else self.parent.proposers[self.index].num_candidates

  @property
  def draft_calls_per_iteration(self) -> int:
    return 0 if self.gamma == 0 else self.parent.proposers[self.index].draft_calls_per_iteration

  prefill_draft_calls = 0

  def propose(self, params, state: AdaptiveState, pending, keys, sampling):
    parent = self.parent
    state = state.replace(text=state.text.with_pending(pending))
    batch = pending.shape[0]
    if self.gamma == 0:
      none = Candidates(tokens=jnp.zeros((batch, 0), jnp.int32), q=None, kind=CHAIN)
      if parent.shadow is None:  # a draft model: skipped, caught up when speculation resumes
        return none, state
      guess, inner = parent.shadow.propose(params.inner, state.inner, pending, keys, sampling)
      return none, state.replace(inner=inner, shadow=first_level(guess))
    if parent.rule == "confidence":  # drafted by ``choose``
      q = None if sampling.is_greedy else state.laws[:, :self.gamma]
      return Candidates(tokens=state.drafts[:, :self.gamma], q=q, kind=CHAIN), state
    candidates, inner = parent.proposers[self.index].propose(
        params.inner, parent.sync_inner(params, state), pending, keys, sampling)
    return candidates, state.replace(inner=inner)

  def commit(self, params, state: AdaptiveState, candidates, outcome):
    parent, g = self.parent, self.gamma
    active, n = outcome.active, outcome.num_accepted
    on_path = jnp.take_along_axis(candidates.tokens, jnp.maximum(outcome.path, 0), axis=1)
    text = state.text.commit(on_path, outcome)
    pos = jnp.arange(parent.depth)[None, :]
    # Positions past this entry's drafts drift back to the prior (what makes a longer entry
    # worth a try again); positions it tested but did not reach keep their estimate (no
    # evidence, and drifting them to the prior biases a hard text's estimates upward). A
    # skipped draft's plain iterations leave every estimate to the look.
    live = jnp.broadcast_to(active[:, None], state.acceptance.shape)
    drifting = live & (pos >= g) & (g > 0 or not parent.looks)
    if g == 0:
      inner, values = state.inner, jnp.zeros_like(state.acceptance)
      observed = jnp.zeros_like(drifting)
      if parent.looks:  # the drawn token's probability and law, for the look's scores
        # (the law only for the tokens the next look scores: the last before it is due)
        due = state.plain_run + parent.scored >= state.look_every
        state = state.replace(**record_plain(state, text.lengths, outcome, due))
      if parent.shadow is not None:  # the free guess, scored by the token the target emitted
        guess = Candidates(tokens=state.shadow, q=None, kind=CHAIN)
        inner = parent.shadow.commit(params.inner, state.inner, guess, outcome)
        hit = jnp.any(outcome.next_token[:, None] == state.shadow, axis=1).astype(jnp.float32)
        values = jnp.broadcast_to(hit[:, None], values.shape)
        observed = live & (pos == 0)
    else:
      inner = parent.proposers[self.index].commit(params.inner, state.inner, candidates,
                                                  outcome)
      # A chain's exact acceptance probabilities; a tree's level reached or not (the loop's
      # tree rules report none): each an unbiased observation of the level's acceptance.
      values = (pos < n[:, None]).astype(jnp.float32) if outcome.accept_prob is None else jnp.pad(
          outcome.accept_prob.astype(jnp.float32), ((0, 0), (0, parent.depth - g)))
      observed = live & (pos < jnp.minimum(n + 1, g)[:, None])
    sums = state.tally
    if parent.rule == "cost" and parent.correct:  # the model's check, before the update
      drafts = menu_moments(state.acceptance, (g,))[0][:, 0] - 1.0
      sums = tally(sums, self.index, n.astype(jnp.float32), drafts, active)
    acceptance, seen = observe(state.acceptance, state.seen, observed, values, parent.decay,
                               drifting, params.prior[None, :], parent.forget, parent.drift)
    gamma = state.gamma
    if parent.rule == "schedule":
      positive = min(k for k in parent.choices if k > 0)
      all_in = jnp.all(jnp.where(active, n == g, True)) & (g > 0)
      gamma = jnp.clip(jnp.where(all_in, gamma + 2, gamma - 1), positive, parent.choices[-1])
    plain_run = state.plain_run + 1 if g == 0 else jnp.int32(0)
    return state.replace(inner=inner, text=text, acceptance=acceptance, seen=seen, gamma=gamma,
                         plain_run=plain_run, tally=sums)


def entries_key(proposers: tuple) -> tuple:
  """What identifies a menu's entries: the largest whole, each other as its type and fields
  but for a ``graphdef`` that is the largest's own object (``methods.shared_splits``), which
  the largest's comparison covers."""
  shared = getattr(proposers[-1], "graphdef", None)

  def entry(p):
    if shared is None or p is proposers[-1] or getattr(p, "graphdef", None) is not shared:
      return p
    return (type(p),) + tuple((f.name, getattr(p, f.name)) for f in dataclasses.fields(p)
                              if f.compare and f.name != "graphdef")
  return tuple(entry(p) for p in proposers)
