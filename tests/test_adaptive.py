"""``sj.Adaptive``: a menu of draft lengths chosen per iteration (``specjax.proposers.adaptive``).

1. Greedy: the wrapped chain methods under the rules (Speculative: cost, confidence; PromptLookup:
   cost; Jacobi: schedule; SelfSpeculative and the schedule on a draft in 2.) and the tree menus
   (Retrieval's; TreeSpeculative's static and dynamic trees) return ``Autoregressive``'s tokens
   (ragged batch, EOS); the choice histogram counts every iteration.
2. Choices: the cost rule follows the costs (prohibitive drafts: plain decoding only; free
   drafts that are always right: the largest entry only); a draft skipped at choice 0 catches up
   with the text (a self-draft, q = p, forced to alternate 0 and 3 still has every draft
   accepted; the same with the catch-up removed does not); before it resumes, the catch-up
   scores the draft's guesses at the plain tokens against a one-pass reference (T = 0 and > 0;
   a draft's tree: whether the token is among its first level's top guesses); a skipped tree
   draft's cache equals one pass over the text;
   the margin keeps the last choice; the schedule moves +2/-1.
3. Law: the harness over gamma_max + 3 tokens, every row its own batch of one so that the
   choices follow each row's own past, with a menu that really switches (histogram asserted),
   for the cost, schedule and confidence rules, and tree menus (draft-free; a draft's tree with
   sampled children); a rule that peeks at this iteration's verdict
   before choosing is rejected by the same test.
4. Errors: one line each, naming the bad value.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
import pytest

import specjax as sj
from specjax import metrics
from specjax import sampling as sampling_lib
from specjax.decoding import loop
from specjax.decoding import methods as methods_lib
from specjax.models.kv_cache import init_cache
from specjax.proposers import adaptive as adaptive_lib
from specjax.proposers import adaptive_model
from specjax.proposers.base import Outcome
from specjax.proposers import draft_chain

try:  # tests/ as a package, or tests/ on sys.path (pytest rootdir insertion)
  from tests import lawcheck
  from tests.test_laws import patched
  from tests.test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed,
                                      greedy_reference, noisy_copy, random_transformer,
                                      tabular_pair, truncate_at_eos)
except ImportError:  # pragma: no cover
  import lawcheck
  from test_laws import patched
  from test_speculative import (GREEDY_NEW, GREEDY_PROMPTS, TF_CONFIG, _seed, greedy_reference,
                                noisy_copy, random_transformer, tabular_pair, truncate_at_eos)

S = sj.Sampling
MENU = (0, 1, 2, 3)


def choose(proposer, params, state, pending, keys, sampling, active, remaining):
  """The choice as the loop makes it: ``choose``, then the look it asks for when one is due
  (index ``len(choices)``: ``between``)."""
  index, state = proposer.choose(params, state, pending, keys, sampling, active, remaining)
  if int(index) == len(proposer.choices):
    index, state = proposer.between(params, state, pending, sampling, active, remaining)
  return index, state


def table(verify=(1.0, 1.3, 1.6, 1.9), draft_step=0.1) -> sj.CostTable:
  """A cost table by hand: v(T) for T = 1.., a draft step of ``draft_step`` target steps."""
  return sj.CostTable(verify={t + 1: v for t, v in enumerate(verify)}, draft_step=draft_step,
                      batch=1, context=8, target_step_ms=1.0, device="by hand")


def tree_table(slope: float = 0.1, draft_step: float = 0.1, sampling=S(0.0)) -> sj.CostTable:
  """A table by hand for trees of up to 15 nodes: v(T) = 1 + slope (T - 1), a draft pass over T
  tokens ``draft_step`` (1 + 0.1 (T - 1))."""
  widths = range(1, 17)
  return sj.CostTable(verify={t: 1.0 + slope * (t - 1) for t in widths}, draft_step=draft_step,
                      draft_pass={t: draft_step * (1 + 0.1 * (t - 1)) for t in widths if t > 1},
                      batch=1, context=8, target_step_ms=1.0, device="by hand",
                      sampling=sampling)


DRAFT_TREES = {"static": sj.Tree.full(depth=3, branching=2),  # 2, 6, 14 nodes at depths 1-3
               "dynamic": sj.DynamicTree(depth=3, width=2, nodes=6)}  # 2, 4, 6 nodes
FLAT = table((1.0, 1.0, 1.0, 1.0), 0.0)  # drafting is free: the largest entry always pays
PROHIBITIVE = table((1.0, 9.0, 9.0, 9.0), 5.0)  # never pays


def methods():
  target = random_transformer(TF_CONFIG, 0)
  draft = noisy_copy(TF_CONFIG, 0)
  return target, {"speculative": sj.Speculative(draft, gamma=1),
                  "self_speculative": sj.SelfSpeculative(skip=(1,)),
                  "prompt_lookup": sj.PromptLookup(max_ngram=2),
                  "jacobi": sj.Jacobi()}


class GreedyTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("speculative_cost", "speculative", "cost"),
      ("speculative_confidence", "speculative", "confidence"),
      ("prompt_lookup_cost", "prompt_lookup", "cost"),
      ("jacobi_schedule", "jacobi", "schedule"))
  def test_matches_autoregressive(self, name, rule):
    self.check_matches_autoregressive(name, rule)

  @pytest.mark.slow  # ~12 s; the default drift stays in the default run
  def test_matches_autoregressive_with_the_prior_drift(self):
    self.check_matches_autoregressive("speculative", "cost", drift="prior")

  def check_matches_autoregressive(self, name, rule, drift="first"):
    """A ragged batch (row 0 stops at EOS early) returns ``Autoregressive``'s tokens; the
    histogram counts every iteration once."""
    target, inner = methods()
    choices = MENU[1:] if rule == "confidence" else MENU
    method = sj.Adaptive(inner[name], choices=choices, costs=table(), rule=rule, drift=drift)
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    eos = int(expected[0, 4])  # row 0 stops early; the others run on
    out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW,
                      eos_token_id=eos)
    np.testing.assert_array_equal(np.asarray(out.tokens), truncate_at_eos(expected, eos))
    counts = np.asarray(out.stats.choice_counts)
    self.assertLen(counts, len(choices))
    self.assertEqual(counts.sum(), int(out.stats.target_calls) - 1)  # every iteration, once

  @parameterized.named_parameters(("cost", "cost"), ("schedule", "schedule"))
  def test_tree_menu_matches_autoregressive(self, rule):
    """Retrieval's per-request trees cut to depths 1, 2 and 3 (2, 4 and 6 nodes): a ragged batch
    (row 2 stops at EOS after two tokens, the others run on repeating text) returns
    ``Autoregressive``'s tokens, through more than one entry of the menu."""
    trees = sj.Retrieval(None, num_tokens=3, nodes=6, branches=2, samples=8, per_request=True)
    method = sj.Adaptive(trees, choices=MENU, costs=table(tuple(1.0 + 0.1 * t for t in range(7)),
                                                          0.0), rule=rule)
    out, counts = self.greedy_tree_menu(method)
    self.assertGreaterEqual(int(np.sum(counts > 0)), 2, msg=str(counts))
    self.assertGreater(int(np.sum(out.stats.accepted)), 0)

  def test_draft_tree_menu_matches_autoregressive(self, kind="static"):
    """``TreeSpeculative``'s static tree (and, slow, its dynamic tree and SpecTr's 2 chains) cut
    to depths 1-3: a ragged batch (row 2 stops at EOS early) returns ``Autoregressive``'s tokens
    through more than one entry, plain decoding among them (the skipped draft catching up)."""
    draft = noisy_copy(TF_CONFIG, 0)
    trees = (sj.SpecTr(draft, num_drafts=2, gamma=3) if kind == "spectr" else
             sj.TreeSpeculative(draft, DRAFT_TREES[kind]))
    _, counts = self.greedy_tree_menu(sj.Adaptive(trees, choices=MENU,
                                                  costs=tree_table(0.15, 0.05)))
    self.assertGreater(counts[0], 0, msg=str(counts))
    self.assertGreater(counts[1:].sum(), 0, msg=str(counts))

  @pytest.mark.slow  # ~35 s: two more trees' menus; the static tree's stays in the default run
  def test_dynamic_and_spectr_draft_tree_menus_match_autoregressive(self):
    for kind in ("dynamic", "spectr"):
      with self.subTest(kind):
        self.test_draft_tree_menu_matches_autoregressive(kind)

  def greedy_tree_menu(self, method):
    """(output, choice histogram) of ``method`` on a ragged batch (row 2 stops at EOS after two
    tokens), its tokens ``Autoregressive``'s and its histogram counting every iteration."""
    target = random_transformer(TF_CONFIG, 0)
    expected = greedy_reference(TF_CONFIG, 2 * GREEDY_NEW)
    eos = int(expected[2, 1])
    out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=2 * GREEDY_NEW,
                      eos_token_id=eos)
    np.testing.assert_array_equal(np.asarray(out.tokens), truncate_at_eos(expected, eos))
    counts = np.asarray(out.stats.choice_counts)
    self.assertEqual(counts.sum(), int(out.stats.target_calls) - 1)
    return out, counts


class ChoiceTest(absltest.TestCase):

  def test_costs_decide(self):
    target, inner = methods()
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    never = sj.Adaptive(inner["speculative"], choices=MENU, costs=PROHIBITIVE)
    out = sj.generate(target, GREEDY_PROMPTS, never, max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(np.asarray(out.tokens), expected)
    np.testing.assert_array_equal(np.asarray(out.stats.choice_counts), [GREEDY_NEW - 1, 0, 0, 0])
    self.assertEqual(int(out.stats.draft_calls), 1)  # the prefill: a skipped draft never drafts

    always = sj.Adaptive(sj.SelfSpeculative(skip=()), choices=MENU, costs=FLAT)
    out = sj.generate(target, GREEDY_PROMPTS, always, max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(np.asarray(out.tokens), expected)
    counts = np.asarray(out.stats.choice_counts)
    self.assertEqual(counts[:3].sum(), 0, msg=str(counts))
    self.assertEqual(int(np.sum(out.stats.accepted)), int(np.sum(out.stats.proposed)))

  @pytest.mark.slow  # ~10 s: two compiled loops
  def test_warns_when_its_table_was_timed_at_another_sampling(self):
    """Sampled iterations cost more than greedy ones: a run whose sampling is not the cost
    table's gets a warning saying so (greedy settings that differ only in top-k are alike)."""
    import warnings
    target, inner = methods()
    hot = S(1.0)

    def warned(costs, sampling):
      method = sj.Adaptive(inner["prompt_lookup"], choices=(0, 1), costs=costs)
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sj.generate(target, GREEDY_PROMPTS[:1], method, sampling, 2, key=jax.random.key(0))
      return [str(w.message) for w in caught if "cost table" in str(w.message)]

    message = warned(table(), hot)
    self.assertLen(message, 1)
    self.assertIn("measured at Sampling(temperature=0.0, top_k=0, top_p=1.0), this run samples "
                  "at Sampling(temperature=1.0", message[0])
    self.assertEqual(warned(dataclasses.replace(table(), sampling=hot), hot), [])
    self.assertEqual(warned(table(), S(0.0, top_k=3)), [])

  def test_skipped_draft_catches_up(self):
    """A self-draft (q = p) accepts everything only if its cache holds exactly the text: forced
    to alternate plain decoding and 3 drafts, every draft is still accepted (the catch-up feeds
    what the skipped iterations committed); without the catch-up, drafts are rejected."""
    target = random_transformer(TF_CONFIG, 0)

    def alternate(self, params, state, pending, keys, sampling, active, remaining, after=None):
      del self, params, pending, keys, sampling, active, remaining, after
      # 3 drafts (+4 tokens when all are accepted) where the length is 2, 3 or 4 mod 5, else 0
      return jnp.where(state.text.lengths[0] % 5 < 2, 0, 1).astype(jnp.int32), state

    def run(sampling, *patches):
      costs = dataclasses.replace(FLAT, sampling=sampling)  # timed at the run's sampling
      method = sj.Adaptive(sj.SelfSpeculative(skip=()), choices=(0, 3), costs=costs)
      with patched(((adaptive_lib.AdaptiveProposer, "choose", alternate),) + patches):
        return sj.generate(target, GREEDY_PROMPTS, method, sampling, 3 * GREEDY_NEW,
                           key=jax.random.key(0))

    out = run(S(0.0))
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_reference(TF_CONFIG,
                                                                           3 * GREEDY_NEW))
    counts = np.asarray(out.stats.choice_counts)
    self.assertGreater(counts[0], 2, msg=str(counts))
    self.assertGreater(counts[1], 2, msg=str(counts))
    # At T = 1, q = p (every position's sum min(p, q) = 1 up to float round-off between pass
    # shapes) needs the draft's cache to hold exactly the target's context.
    sampled = run(S(1.0))
    self.assertGreater(sampled.stats.expected_alpha, 1 - 1e-5)
    self.assertGreater(lawcheck.self_draft_pvalue(sampled), 1e-3)
    real = draft_chain.sync

    def no_catch_up(draft, state, text, lengths, width, score=None, greedy=False):
      # the catch-up gone; a look's scoring pass (traced, never run here) kept
      return state if score is None else real(draft, state, text, lengths, width, score, greedy)
    stale = run(S(1.0), (draft_chain, "sync", no_catch_up))
    self.assertLess(stale.stats.expected_alpha, 0.999)

  @pytest.mark.slow  # ~48 s; the chain draft's catch-up stays in the default run
  def test_skipped_tree_draft_catches_up(self):
    """A draft-model tree's skipped draft: ``sync`` feeds its cache the committed text it lacks
    (static and dynamic trees' proposers; keys and values equal to one pass over the text);
    end to end, with the target as the draft and the rule forced to alternate plain decoding
    and the 3-deep static tree, every tree iteration of every row accepts all 3 levels (T = 0,
    top-k children; T = 1, sampled children, the first accepted with probability
    min(1, p / q) = 1)."""
    target = random_transformer(TF_CONFIG, 0)
    rng = np.random.default_rng(5)
    capacity, prompt_lengths, lengths = 24, np.asarray([3, 5]), np.asarray([11, 9])
    text = rng.integers(0, TF_CONFIG.vocab_size, (2, capacity)).astype(np.int32)
    full = target(jnp.asarray(text), init_cache(TF_CONFIG, 2, capacity))[1]
    for kind in DRAFT_TREES:
      with self.subTest(kind=kind):
        method = sj.Adaptive(sj.TreeSpeculative(target, DRAFT_TREES[kind]), choices=MENU,
                             costs=tree_table())
        proposer, params = method.proposer(target)
        state = proposer.prefill(params, jnp.asarray(text[:, :5]), jnp.asarray(prompt_lengths),
                                 capacity).inner
        synced = proposer.largest.sync(params.inner, state, jnp.asarray(text), jnp.asarray(lengths),
                                       4).cache
        np.testing.assert_array_equal(np.asarray(synced.lengths), lengths)
        for b in range(2):
          for got, want in zip(synced.k + synced.v, full.k + full.v):
            np.testing.assert_allclose(np.asarray(got)[b, :, :lengths[b]],
                                       np.asarray(want)[b, :, :lengths[b]], atol=1e-5)

    def alternate(self, params, state, pending, keys, sampling, active, remaining, after=None):
      del self, params, pending, keys, sampling, active, remaining, after
      return jnp.where(state.text.lengths[0] % 5 < 2, 0, 3).astype(jnp.int32), state

    for sampling in (S(0.0), S(1.0)):
      method = sj.Adaptive(sj.TreeSpeculative(random_transformer(TF_CONFIG, 0),
                                              DRAFT_TREES["static"]),
                           choices=MENU, costs=dataclasses.replace(tree_table(),
                                                                   sampling=sampling))
      with patched(((adaptive_lib.AdaptiveProposer, "choose", alternate),)):
        out = sj.generate(target, GREEDY_PROMPTS, method, sampling, 3 * GREEDY_NEW,
                          key=jax.random.key(0))
      counts = np.asarray(out.stats.choice_counts)
      self.assertGreater(counts[0], 2, msg=str(counts))
      self.assertGreater(counts[3], 2, msg=str(counts))
      self.assertEqual(int(np.asarray(out.stats.accepted_length_counts)[3]),
                       len(GREEDY_PROMPTS) * int(counts[3]))
      if sampling.is_greedy:
        np.testing.assert_array_equal(np.asarray(out.tokens),
                                      greedy_reference(TF_CONFIG, 3 * GREEDY_NEW))

  def test_look_scores_the_skipped_drafts_guesses(self):
    """In a plain stretch (rule "cost") a skipped draft catches up with the text and its guess
    after each of the last ``LOOK_SCORED`` tokens is scored against the plain token that came;
    position 0's estimate takes them as ``count`` EMA steps to their mean. Reference: the
    draft's logits from one pass over the whole text; scored: of the last ``LOOK_SCORED`` tokens
    it had not seen, those whose successor a plain iteration drew (p > 0), the pending one
    included (T = 0: the match; T > 0: sum_x min(p, q) where the target's law was kept, else
    min(1, q(x) / p(x))); the entries past position 0 capped at position 0's new estimate; the
    inactive row unchanged."""
    target, draft = random_transformer(TF_CONFIG, 0), noisy_copy(TF_CONFIG, 0)
    method = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, costs=table(), decay=0.2)

    def chain_value(logits, token, p, sampling, law=None):
      if sampling.is_greedy:
        return float(np.argmax(logits) == token)
      q = np.asarray(sampling_lib.probabilities(jnp.asarray(logits), sampling))
      return min(1.0, q[token] / p) if law is None else float(np.minimum(law, q).sum())

    proposer, params, state, pending, active, lengths = self.check_look(
        target, draft, method, chain_value)
    self.check_look_schedule(target, draft, proposer, params, state, pending, active, lengths)

  @pytest.mark.slow  # ~26 s; the chain draft's look stays in the default run
  def test_look_scores_a_trees_first_level(self):
    """A draft-model tree's look: where the first level is the draft's guesses of given ranks
    (top-k children at any temperature, every tree at T = 0), a guess scores whether the
    target's token is among them (its mean: the level's acceptance under the one-hot rule):
    ranks 0 and 1 for the full binary tree, 0 and 2 for a tree whose ranks skip one, 0-1 for the
    dynamic tree; sampled children at T > 0 score as a chain's one draft."""
    target, draft = random_transformer(TF_CONFIG, 0), noisy_copy(TF_CONFIG, 0)

    def among(ranks):
      def value(logits, token, p, sampling, law=None):
        guessed = np.argsort(-logits, kind="stable")[list(ranks)]
        return float(token in guessed) if law is None else float(law[guessed].sum())
      return value

    skipping = sj.Tree.from_paths([(0,), (2,), (0, 0), (2, 0), (0, 0, 0)])
    for tree, children, ranks in ((DRAFT_TREES["static"], "top_k", (0, 1)),
                                  (skipping, "top_k", (0, 2)),
                                  (DRAFT_TREES["dynamic"], None, (0, 1)),
                                  (DRAFT_TREES["static"], "sampled", (0, 1))):
      with self.subTest(tree=tree, children=children):
        method = sj.Adaptive(sj.TreeSpeculative(draft, tree, children=children), choices=MENU,
                             costs=tree_table(), decay=0.2)
        value = among(ranks)
        if children == "sampled":  # at T > 0, drawn: the chain's value
          def value(logits, token, p, sampling, law=None, hit=value):
            if sampling.is_greedy:
              return hit(logits, token, p, sampling)
            q = np.asarray(sampling_lib.probabilities(jnp.asarray(logits), sampling))
            return min(1.0, q[token] / p) if law is None else float(np.minimum(law, q).sum())
        self.check_look(target, draft, method, value)

  def check_look(self, target, draft, method, value):
    """``method``'s look against the reference (``value(logits float[V], token, p, sampling,
    law=None)``: a scored guess's value, ``law`` the target's law where its plain iteration
    kept it) at T = 0, 1 and 0.8 with top-k 5, at T > 0 once with no law kept and once with
    the laws of all scored tokens but row 0's last; returns (proposer, params, state, pending,
    active, lengths)."""
    proposer, params = method.proposer(target)
    rng = np.random.default_rng(3)
    capacity, prompt_lengths, lengths = 24, np.asarray([3, 5, 4]), np.asarray([14, 11, 12])
    text = rng.integers(0, TF_CONFIG.vocab_size, (3, capacity)).astype(np.int32)
    state = proposer.prefill(params, jnp.asarray(text[:, :5]), jnp.asarray(prompt_lengths),
                             capacity)
    plain_p = rng.uniform(0.05, 1.0, (3, capacity)).astype(np.float32)
    plain_p[np.arange(capacity)[None, :] < prompt_lengths[:, None]] = 0.0
    plain_p[:, 8] = 0.0  # a token a speculating iteration emitted: not scored
    pending = text[np.arange(3), lengths]
    state = state.replace(
        text=state.text.replace(tokens=jnp.asarray(np.where(
            np.arange(capacity)[None, :] < lengths[:, None], text, -1))),
        acceptance=jnp.full(state.acceptance.shape, 0.5, jnp.float32),
        seen=jnp.full(state.seen.shape, 50.0, jnp.float32),  # past the warm-up: an EMA
        plain_p=jnp.asarray(plain_p))
    state = state.replace(text=state.text.replace(lengths=jnp.asarray(lengths, jnp.int32)))
    active = jnp.asarray([True, True, False])
    logits = np.asarray(draft(jnp.asarray(text), init_cache(TF_CONFIG, 3, capacity))[0])
    slots = proposer.scored
    laws = rng.dirichlet(np.full(TF_CONFIG.vocab_size, 0.3), (3, slots)).astype(np.float32)
    law_cols = np.full((3, slots), -1, np.int32)
    for b in range(3):
      law_cols[b, np.arange(lengths[b] - slots + 1, lengths[b] + 1) % slots] = np.arange(
          lengths[b] - slots + 1, lengths[b] + 1)
    law_cols[0, lengths[0] % slots] = -1  # row 0's last: not kept (the draw's estimate)
    lawful = state.replace(plain_laws=jnp.asarray(laws), law_cols=jnp.asarray(law_cols))
    for sampling, with_laws in ((S(0.0), False), (S(1.0), False), (S(0.8, top_k=5), False),
                                (S(1.0), True), (S(0.8, top_k=5), True)):
      looked = proposer.look(params, lawful if with_laws else state, jnp.asarray(pending),
                             sampling, active)
      got = np.asarray(looked.acceptance)
      for b in range(2):
        values = []
        first = max(prompt_lengths[b], lengths[b] - adaptive_lib.LOOK_SCORED) + 1
        for t in range(first, lengths[b] + 1):
          if plain_p[b, t] == 0:
            continue
          law = laws[b, t % slots] if with_laws and law_cols[b, t % slots] == t else None
          values.append(value(logits[b, t - 1], text[b, t], plain_p[b, t], sampling, law))
        kept = 0.8 ** len(values)
        self.assertEqual(len(values), (4, 3)[b])  # row 1's token 8 came from speculation
        np.testing.assert_allclose(got[b, 0], kept * 0.5 + (1 - kept) * np.mean(values),
                                   rtol=1e-5, err_msg=f"row {b}, {sampling}")
        self.assertEqual(int(looked.inner.cache.lengths[b]), lengths[b])  # caught up
        # deeper positions (not scored by a look) capped at the first's estimate
        np.testing.assert_allclose(got[b, 1:], min(0.5, got[b, 0]), rtol=1e-6)
      np.testing.assert_array_equal(got[2], 0.5)  # the inactive row: nothing scored
    # Deeper positions never observed (seen 0): with drift "first" they take the first's new
    # estimate (here above their own), with drift "prior" they are capped like the rest
    unseen = state.replace(seen=state.seen.at[:, 2:].set(0.0),
                           acceptance=state.acceptance.at[:, 2:].set(0.2))
    for drift in ("first", "prior"):
      got = np.asarray(dataclasses.replace(proposer, drift=drift).look(
          params, unseen, jnp.asarray(pending), S(0.0), active).acceptance)
      for b in range(2):
        np.testing.assert_allclose(got[b, 1], min(0.5, got[b, 0]), rtol=1e-6)
        np.testing.assert_allclose(got[b, 2:], got[b, 0] if drift == "first" else 0.2,
                                   rtol=1e-6, err_msg=drift)
      np.testing.assert_array_equal(got[2, 2:], np.float32(0.2))  # the inactive row
    return proposer, params, state, pending, active, lengths

  def check_look_schedule(self, target, draft, proposer, params, state, pending, active,
                          lengths):
    # In the loop a skipped draft follows the text ``look_span`` plain tokens (twice the
    # largest choice) at a time, whatever the estimates say: before that the rule stays plain
    # without a catch-up however good resuming looks; then it looks however bad.
    keys = jnp.zeros((3, MENU[-1], 2), jnp.uint32)
    span = proposer.look_span
    self.assertEqual(span, 2 * MENU[-1])
    for estimate, run, looks in ((0.95, span - 1, False), (0.95, span, True), (0.0, span, True)):
      start = state.replace(acceptance=jnp.full(state.acceptance.shape, estimate),
                            last=jnp.int32(0), plain_run=jnp.int32(run))
      asked, unlooked = proposer.choose(params, start, jnp.asarray(pending), keys, S(0.0),
                                        active, jnp.full((3,), 64, jnp.int32))
      self.assertEqual(int(asked) == len(MENU), looks)  # a due look: asked of the loop
      self.assertEqual(int(unlooked.plain_run), run)  # and not done by ``choose``
      # The loop's static hint that a plain iteration came before (the rule not computed)
      # changes nothing: plain holds there anyway.
      held, held_state = proposer.choose(params, start, jnp.asarray(pending), keys, S(0.0),
                                         active, jnp.full((3,), 64, jnp.int32), after=0)
      self.assertEqual(int(held), int(asked))
      for field in ("last", "look_every", "plain_run"):
        self.assertEqual(int(getattr(held_state, field)), int(getattr(unlooked, field)), field)
      index, after = choose(proposer, params, start, jnp.asarray(pending), keys, S(0.0), active,
                            jnp.full((3,), 64, jnp.int32))
      caught_up = np.asarray(after.inner.cache.lengths)[:2] == lengths[:2]
      self.assertEqual(bool(caught_up.all()), looks, msg=f"plain run {run}, {estimate}")
      self.assertEqual(int(after.plain_run), 0 if looks else run)
      if not looks:
        self.assertEqual(int(index), 0)
      # A look that leaves the rule plain doubles the span to the next; speculating resets it.
      self.assertEqual(int(after.look_every), span if not looks or index > 0 else 2 * span)
    # Backing off: where speculation never pays, each look puts the next twice as far off, up
    # to LOOK_BACKOFF spans; a plain run short of the current span does not look; a
    # speculating iteration (FLAT: drafting is free) brings the first span back.
    hopeless, priced = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU,
                                   costs=PROHIBITIVE, decay=0.2).proposer(target)
    priced = params.replace(costs=priced.costs)  # the entries' costs are traced
    cap = adaptive_lib.LOOK_BACKOFF * span
    for every, run, after_every in ((span, span, 2 * span), (2 * span, 2 * span, 4 * span),
                                    (cap, cap, cap), (2 * span, span, 2 * span)):
      start = state.replace(last=jnp.int32(0), plain_run=jnp.int32(run),
                            look_every=jnp.int32(every))
      index, after = choose(hopeless, priced, start, jnp.asarray(pending), keys, S(0.0), active,
                            jnp.full((3,), 64, jnp.int32))
      self.assertEqual((int(index), int(after.look_every)), (0, after_every), msg=f"{every}")
      self.assertEqual(int(after.plain_run), 0 if run >= every else run)
    free, priced = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, costs=FLAT,
                               decay=0.2).proposer(target)
    index, after = choose(free, params.replace(costs=priced.costs),
                          start.replace(plain_run=jnp.int32(cap)),
                          jnp.asarray(pending), keys, S(0.0), active,
                          jnp.full((3,), 64, jnp.int32))
    self.assertEqual((int(index), int(after.look_every)), (3, span))

  @pytest.mark.slow  # ~37 s: three compiled loops
  def test_each_entry_draws_its_own_keys(self):
    """The loop hands ``choose`` keys only where it drafts (the confidence rule); otherwise the
    entry chosen draws its own, as many as it uses (a plain iteration: one, not the largest
    entry's), the same keys as the bare method's (a split's first keys do not depend on its
    size), so a menu held at gamma 3 reproduces ``sj.Speculative(gamma=3)`` at T = 1."""
    target, draft = random_transformer(TF_CONFIG, 0), noisy_copy(TF_CONFIG, 0)
    real, handed = adaptive_lib.AdaptiveProposer.choose, {}

    def recording(self, params, state, pending, keys, *args, **kwargs):
      handed[self.rule] = keys is not None
      return real(self, params, state, pending, keys, *args, **kwargs)

    free = dataclasses.replace(FLAT, sampling=S(1.0))
    with patched(((adaptive_lib.AdaptiveProposer, "choose", recording),)):
      held = sj.generate(target, GREEDY_PROMPTS,
                         sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, costs=free),
                         S(1.0), 3 * GREEDY_NEW, key=jax.random.key(4))
      sj.generate(target, GREEDY_PROMPTS,
                  sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, rule="confidence"),
                  S(1.0), GREEDY_NEW, key=jax.random.key(4))
    self.assertEqual(handed, {"cost": False, "confidence": True})
    self.assertEqual(np.asarray(held.stats.choice_counts).tolist()[:-1], [0] * (len(MENU) - 1))
    bare = sj.generate(target, GREEDY_PROMPTS, sj.Speculative(draft, gamma=3), S(1.0),
                       3 * GREEDY_NEW, key=jax.random.key(4))
    np.testing.assert_array_equal(np.asarray(held.tokens), np.asarray(bare.tokens))

  def test_a_plain_iteration_keeps_the_law_a_look_will_score(self):
    """At T > 0 a plain iteration keeps the target's law of the token it drew (slot: the
    token's text position mod the look's scored tokens, tagged with the position) when it
    draws one of the tokens the next look scores (``plain_run + scored >= look_every``), not
    before; an inactive row keeps nothing; at T = 0 nothing but the mark in ``plain_p``."""
    target, draft = random_transformer(TF_CONFIG, 0), noisy_copy(TF_CONFIG, 0)
    method = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, costs=table())
    proposer, params = method.proposer(target)
    lengths = jnp.asarray([3, 4, 3], jnp.int32)
    state = proposer.prefill(params, jnp.asarray([[3, 4, 5, 0], [6, 7, 8, 9], [1, 2, 3, 0]]),
                             lengths, 16)
    entry, slots, span = proposer.variants[0], proposer.scored, proposer.look_span
    pending, active = jnp.asarray([9, 10, 11], jnp.int32), jnp.asarray([True, True, False])
    keys = jax.random.split(jax.random.key(0), (3, MENU[-1]))
    logits = 3.0 * jax.random.normal(jax.random.key(1), (3, 1, TF_CONFIG.vocab_size))
    drawn = jnp.asarray([5, 6, 7], jnp.int32)
    for sampling in (S(1.0), S(0.7, top_k=4), S(0.0)):
      law = np.asarray(sampling_lib.probabilities(logits[:, 0], sampling))
      outcome = Outcome(target_length=lengths, path=jnp.full((3, 1), -1, jnp.int32),
                        num_accepted=jnp.zeros((3,), jnp.int32), next_token=drawn,
                        active=active, logits=logits, sampling=sampling)
      for run in (span - slots - 1, span - slots, span - 1):
        start = state.replace(plain_run=jnp.int32(run), last=jnp.int32(0))
        candidates, proposed = entry.propose(params, start, pending, keys, sampling)
        got = entry.commit(params, proposed, candidates, outcome)
        at = np.asarray(got.text.lengths)  # the drawn token's text position (the new pending)
        np.testing.assert_array_equal(at, np.asarray(lengths) + [1, 1, 0])
        due = not sampling.is_greedy and run + slots >= span
        cols = np.asarray(got.law_cols)
        for b in range(3):
          kept = due and b < 2
          self.assertEqual(cols[b, at[b] % slots], at[b] if kept else -1, msg=f"{run} {b}")
          np.testing.assert_allclose(np.asarray(got.plain_laws)[b, at[b] % slots],
                                     law[b] if kept else 0.0, rtol=1e-6)
        self.assertEqual(int((cols >= 0).sum()), 2 if due else 0)
        p = np.asarray(got.plain_p)[np.arange(2), at[:2]]
        np.testing.assert_allclose(p, 1.0 if sampling.is_greedy else law[[0, 1], [5, 6]],
                                   rtol=1e-6)
    # A plain stretch through ``choose``: when its look comes due, every token it will score
    # has its law kept.
    sampling, s = S(1.0), state.replace(last=jnp.int32(0))
    for i in range(span):
      index, s = choose(proposer, params, s, pending, keys, sampling, active,
                        jnp.full((3,), 64, jnp.int32))
      self.assertEqual((int(index), int(s.plain_run)), (0, i))  # held plain, no look yet
      candidates, s = entry.propose(params, s, pending, keys, sampling)
      s = entry.commit(params, s, candidates, Outcome(
          target_length=s.text.lengths, path=jnp.full((3, 1), -1, jnp.int32),
          num_accepted=jnp.zeros((3,), jnp.int32), next_token=drawn + i, active=active,
          logits=logits, sampling=sampling))
    self.assertEqual(int(s.plain_run), int(s.look_every))  # the next choice looks
    at = np.asarray(s.text.lengths)
    for b in range(2):
      self.assertEqual(sorted(np.asarray(s.law_cols)[b]), list(range(at[b] - slots + 1,
                                                                      at[b] + 1)))

  def test_commit_observes_the_tested_positions_and_drifts_the_rest(self):
    """After a speculating iteration of 2 drafts: the positions whose test ran take an EMA step
    to the verifier's acceptance; a position the entry drafted but did not reach keeps its
    estimate (no evidence); positions past the entry drift toward the prior. A skipped draft's
    plain iteration leaves every estimate to the look."""
    target, draft = random_transformer(TF_CONFIG, 0), noisy_copy(TF_CONFIG, 0)
    method = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, costs=table(), decay=0.2,
                         prior=0.5, forget=0.1, drift="prior")
    proposer, params = method.proposer(target)
    prompt = jnp.asarray([[3, 4, 5], [6, 7, 8]], jnp.int32)
    lengths = jnp.asarray([3, 3], jnp.int32)
    state = proposer.prefill(params, prompt, lengths, 16)
    state = state.replace(acceptance=jnp.full(state.acceptance.shape, 0.3, jnp.float32),
                          seen=jnp.full(state.seen.shape, 50.0, jnp.float32))  # an EMA
    pending = jnp.asarray([9, 10], jnp.int32)
    keys = jax.random.split(jax.random.key(0), (2, MENU[-1]))
    vocab = TF_CONFIG.vocab_size
    for entry, n in ((proposer.variants[2], (0, 1)), (proposer.variants[0], (0, 0))):
      g = entry.gamma
      candidates, proposed = entry.propose(params, state, pending, keys, S(1.0))
      outcome = Outcome(target_length=lengths, path=jnp.full((2, max(g, 1)), -1, jnp.int32),
                        num_accepted=jnp.asarray(n, jnp.int32), next_token=pending,
                        active=jnp.asarray([True, True]),
                        logits=jnp.zeros((2, 1 + g, vocab), jnp.float32),
                        accept_prob=jnp.asarray([[0.2, 0.9], [0.6, 0.7]])[:, :g],
                        sampling=S(1.0))
      got = np.asarray(entry.commit(params, proposed, candidates, outcome).acceptance)
      if g == 0:
        np.testing.assert_allclose(got, 0.3)
        continue
      ema = lambda value: 0.8 * 0.3 + 0.2 * value
      drifted = 0.3 + 0.1 * (0.5 - 0.3)
      np.testing.assert_allclose(got, [[ema(0.2), 0.3, drifted], [ema(0.6), ema(0.7), drifted]],
                                 rtol=1e-6)
      # drift="first": the untested position moves toward the row's new first estimate instead
      first = dataclasses.replace(proposer, drift="first")
      got = np.asarray(first.variants[2].commit(params, proposed, candidates, outcome).acceptance)
      to_first = lambda first_estimate: 0.3 + 0.1 * (first_estimate - 0.3)
      np.testing.assert_allclose(got, [[ema(0.2), 0.3, to_first(ema(0.2))],
                                       [ema(0.6), ema(0.7), to_first(ema(0.6))]], rtol=1e-6)

  @pytest.mark.slow  # ~12 s; the chain's observations stay in the default run
  def test_a_tree_entry_observes_the_levels_it_reached(self):
    """A tree menu (Retrieval cut to depths): after a 2-deep tree the levels whose test ran take
    an EMA step to whether they were reached (the tree rules give no acceptance probability),
    the level past the entry drifts; a plain iteration scores its token against the whole first
    level of the 1-deep tree (a hit when any of its nodes is that token)."""
    target = random_transformer(TF_CONFIG, 0)
    trees = sj.Retrieval(None, num_tokens=3, nodes=6, branches=2, samples=8, per_request=True)
    method = sj.Adaptive(trees, choices=MENU, costs=table(tuple(1.0 + 0.1 * t for t in range(7)),
                                                          0.0), decay=0.2, prior=0.5, forget=0.1,
                         drift="prior")
    proposer, params = method.proposer(target)
    # "1 3" came before 4 and 5: a first level of two nodes; row 1 likewise
    prompt = jnp.asarray([[1, 3, 4, 1, 3, 5, 1], [2, 6, 7, 2, 6, 8, 2]], jnp.int32)
    lengths = jnp.asarray([7, 7], jnp.int32)
    state = proposer.prefill(params, prompt, lengths, 24)
    state = state.replace(acceptance=jnp.full(state.acceptance.shape, 0.3, jnp.float32),
                          seen=jnp.full(state.seen.shape, 50.0, jnp.float32))  # an EMA
    pending, on = jnp.asarray([3, 6], jnp.int32), jnp.asarray([True, True])
    keys = jax.random.split(jax.random.key(0), (2, proposer.num_candidates))
    entry = proposer.variants[2]
    candidates, proposed = entry.propose(params, state, pending, keys, S(0.0))
    self.assertEqual(candidates.tokens.shape, (2, 4))
    outcome = Outcome(target_length=lengths, path=jnp.asarray([[0, -1], [0, 1]], jnp.int32),
                      num_accepted=jnp.asarray([1, 2], jnp.int32), next_token=pending,
                      active=on, logits=jnp.zeros((2, 5, TF_CONFIG.vocab_size)),
                      sampling=S(0.0))
    got = np.asarray(entry.commit(params, proposed, candidates, outcome).acceptance)
    ema = lambda value: 0.8 * 0.3 + 0.2 * value
    drifted = 0.3 + 0.1 * (0.5 - 0.3)
    np.testing.assert_allclose(got, [[ema(1), ema(0), drifted], [ema(1), ema(1), drifted]],
                               rtol=1e-6)
    plain = proposer.variants[0]
    _, proposed = plain.propose(params, state, pending, keys, S(0.0))
    first = np.asarray(proposed.shadow)
    self.assertEqual(first.shape, (2, 2))  # the 1-deep tree: 2 nodes, both on the first level
    np.testing.assert_array_equal(np.sort(first, axis=1), [[4, 5], [7, 8]])
    miss = next(t for t in range(TF_CONFIG.vocab_size) if t not in first[1])
    emitted = jnp.asarray([first[0, 1], miss], jnp.int32)  # row 0: its second node's token
    outcome = outcome.replace(path=jnp.zeros((2, 0), jnp.int32), next_token=emitted,
                              num_accepted=jnp.zeros((2,), jnp.int32),
                              logits=jnp.zeros((2, 1, TF_CONFIG.vocab_size)))
    got = np.asarray(plain.commit(params, proposed, candidates.replace(
        tokens=jnp.zeros((2, 0), jnp.int32)), outcome).acceptance)
    np.testing.assert_allclose(got[:, 0], [ema(1), ema(0)], rtol=1e-6)

  def test_margin_keeps_the_last_choice(self):
    """Hysteresis: at acceptance 0.5 under ``table()`` one draft models 1.5 / 1.4 = 1.071
    tokens per step against plain decoding's 1.0 and two drafts' 1.75 / 1.8 = 0.972."""
    target, inner = methods()
    a, on = jnp.full((1, 3), 0.5), jnp.asarray([True])
    for margin, last, want in ((0.0, 0, 1), (0.05, 0, 1), (0.1, 0, 0), (0.1, 2, 1),
                               (0.1, -1, 1), (1.0, 3, 3)):
      proposer, params = sj.Adaptive(inner["speculative"], choices=MENU, costs=table(),
                                     margin=margin).proposer(target)
      got = proposer.best(params.costs, a, jnp.zeros_like(a), on, jnp.int32(last),
                          jnp.asarray([64]))
      self.assertEqual(int(got), want, msg=f"margin {margin}, last {last}")

  @pytest.mark.slow  # ~22 s; the schedule's law and greedy runs stay in the default run
  def test_schedule_moves_plus_two_minus_one(self):
    target = random_transformer(TF_CONFIG, 0)
    exact = sj.Adaptive(sj.SelfSpeculative(skip=()), choices=MENU, rule="schedule")
    out = sj.generate(target, [GREEDY_PROMPTS[0]], exact, max_new_tokens=GREEDY_NEW)
    counts = np.asarray(out.stats.choice_counts)  # starts at the largest and never leaves it
    self.assertEqual(counts[3], counts.sum(), msg=str(counts))
    noisy = sj.Adaptive(sj.Speculative(noisy_copy(TF_CONFIG, 0)), choices=MENU, rule="schedule")
    out = sj.generate(target, [GREEDY_PROMPTS[0]], noisy, max_new_tokens=3 * GREEDY_NEW)
    counts = np.asarray(out.stats.choice_counts)  # falls after each miss, never to 0
    self.assertEqual(counts[0], 0, msg=str(counts))
    self.assertGreater(counts[1:3].sum(), 0, msg=str(counts))

  def test_estimates(self):
    a = jnp.asarray([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0]])
    np.testing.assert_allclose(adaptive_model.expected_tokens(a, 3), [1.875, 3.0])
    for alpha in (0.0, 0.3, 0.9):  # equal positions: Leviathan's closed form
      np.testing.assert_allclose(adaptive_model.expected_tokens(jnp.full((4,), alpha), 4),
                                 metrics.expected_tokens_per_iteration(alpha, 4), rtol=1e-6)
    np.testing.assert_allclose(adaptive_model.expected_tokens(a, 0), [1.0, 1.0])
    observed = jnp.asarray([[True, False, False], [True, True, False]])
    drifting = jnp.asarray([[True] * 3, [False] * 3])
    many = jnp.full(a.shape, 50.0)  # past the warm-up: EMA steps of weight decay
    new, seen = adaptive_model.observe(a, many, observed, jnp.zeros_like(a), 0.5, drifting, 0.9,
                                     0.1)
    np.testing.assert_allclose(new, [[0.25, 0.54, 0.54], [0.5, 0.5, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(seen, many + observed)
    # A fresh estimate: a running mean with the prior as PRIOR_WEIGHT observations until the
    # weight 1 / (n + PRIOR_WEIGHT + 1) falls to decay, then the EMA; many at once = one by one.
    w, decay = adaptive_model.PRIOR_WEIGHT, 0.1
    est, seen, values = jnp.asarray([0.6]), jnp.asarray([0.0]), [1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1]
    by_hand, n = 0.6, 0
    for v in values:
      est, seen = adaptive_model.observe(est, seen, jnp.asarray([True]), jnp.asarray([float(v)]),
                                       decay, jnp.asarray([True]), 0.6, 0.05)
      weight = max(decay, 1 / (n + w + 1))
      by_hand, n = by_hand + weight * (v - by_hand), n + 1
      np.testing.assert_allclose(float(est[0]), by_hand, rtol=1e-5)
    for count in (3.0, 7.0, 20.0):  # equal observations: the batch form equals the steps
      one = (jnp.asarray([0.6]), jnp.asarray([1.0]))
      for _ in range(int(count)):
        one = adaptive_model.observe(*one, jnp.asarray([True]), jnp.asarray([0.2]), decay,
                                   jnp.asarray([True]), 0.6, 0.05)
      batch = adaptive_model.observe_many(jnp.asarray([0.6]), jnp.asarray([1.0]),
                                        jnp.asarray([count]), jnp.asarray([0.2]), decay)
      np.testing.assert_allclose(np.asarray(batch), np.asarray(one), rtol=1e-5)

  def test_token_moments_by_enumeration(self):
    """Mean and variance of an iteration's tokens against the chain's law written out: the
    first i drafts pass and the next fails with probability s_i (1 - a_{i+1}); one gamma at a
    time, and a menu's gammas at once (``menu_moments``, the rule's: every entry in one go)."""
    for a in ([0.3, 0.8, 0.5], [1.0, 1.0, 1.0], [0.0, 0.9, 0.9], [0.7, 0.2, 1.0]):
      menu_mean, menu_var = adaptive_model.menu_moments(jnp.asarray(a), (0, 1, 2, 3))
      for gamma in range(4):
        law, survive = [], 1.0
        for i in range(gamma):
          law.append(survive * (1.0 - a[i]))  # exactly i drafts accepted
          survive *= a[i]
        law.append(survive)
        tokens = np.arange(1, gamma + 2)
        mean = float(np.dot(law, tokens))
        variance = np.dot(law, tokens ** 2) - mean ** 2
        one = adaptive_model.token_moments(jnp.asarray(a), gamma)
        for mean_got, var_got in (one, (menu_mean[gamma], menu_var[gamma])):
          np.testing.assert_allclose(float(mean_got), mean, rtol=1e-6, atol=1e-6)
          np.testing.assert_allclose(float(var_got), variance, rtol=1e-5, atol=1e-6,
                                     err_msg=f"{a}, gamma {gamma}")

  def test_batch_iterations(self):
    """One row: R / mu exactly (0 once it is done). Rows without spread: the longest. Two equal
    rows of spread s: the mean plus s / sqrt(pi) (the expected maximum of two standard
    normals). Four rows of one draft at acceptance 0.3 and 64 tokens: a simulation of the
    chains (the renewal model's error is within 1%). Inactive rows do not count."""
    f = lambda r, m, v, on=None: float(adaptive_model.batch_iterations(
        jnp.asarray(r, jnp.float32), jnp.asarray(m, jnp.float32), jnp.asarray(v, jnp.float32),
        jnp.ones(len(r), bool) if on is None else jnp.asarray(on)))
    self.assertEqual(f([64.0], [1.6], [0.3]), float(np.float32(64.0) / np.float32(1.6)))
    self.assertEqual(f([64.0], [1.6], [0.3], [False]), 0.0)
    self.assertAlmostEqual(f([64.0, 10.0, 30.0], [1.0, 1.0, 1.0], [0.0] * 3), 64.0, places=4)
    centre, spread = 64 / 1.5, np.sqrt(64 * 0.25 / 1.5 ** 3)
    self.assertAlmostEqual(f([64.0] * 2, [1.5] * 2, [0.25] * 2),
                           centre + spread / np.sqrt(np.pi), delta=1e-3 * centre)
    self.assertAlmostEqual(f([64.0, 99.0], [1.5, 1.0], [0.25, 0.0], [True, False]), centre,
                           places=3)
    rng = np.random.default_rng(0)
    steps = rng.random((20000, 4, 64)) < 0.3  # 1 + Bernoulli(0.3) tokens an iteration
    done_at = np.argmax(np.cumsum(1 + steps, axis=2) >= 64, axis=2) + 1
    simulated = done_at.max(axis=1).mean()
    modelled = f([64.0] * 4, [1.3] * 4, [0.21] * 4)
    self.assertAlmostEqual(modelled, simulated, delta=0.01 * simulated)
    self.assertGreater(modelled, 64 / 1.3 + 2.0)  # the wait for the slowest row

  def test_cost_rule_prices_the_wait_for_the_slowest_row(self):
    """One draft at acceptance 0.3 for an iteration of 1.25 target steps: 1.3 / 1.25 = 1.04
    tokens a step, so one row speculates; four rows of 64 tokens wait for the slowest (51.8
    iterations, not 49.2: 1.236 / 1.25 = 0.989 tokens a step) and decode plain; with 512 tokens
    left each the wait is a smaller share (1.277 tokens an iteration) and they speculate."""
    target, inner = methods()
    proposer, params = sj.Adaptive(inner["speculative"], choices=(0, 1),
                                   costs=table((1.0, 1.23), 0.02)).proposer(target)
    for rows, left, want in ((1, 64, 1), (4, 64, 0), (4, 512, 1)):
      a, on = jnp.full((rows, 1), 0.3), jnp.ones((rows,), bool)
      got = proposer.best(params.costs, a, jnp.zeros_like(a), on, jnp.int32(-1),
                          jnp.full((rows,), left, jnp.int32))
      self.assertEqual(int(got), want, msg=f"{rows} rows, {left} tokens left")

    # In the loop the rule is handed each row's tokens left: max_new_tokens less those emitted
    # (the prefill's first token before the first choice). A rule that speculates only at that
    # first choice runs one iteration of 3 drafts.
    def first_only(self, params, state, pending, keys, sampling, active, remaining, after=None):
      del self, params, pending, keys, sampling, active, after
      return jnp.where(jnp.all(remaining == GREEDY_NEW - 1), 1, 0).astype(jnp.int32), state

    method = sj.Adaptive(sj.SelfSpeculative(skip=()), choices=(0, 3), costs=FLAT)
    with patched(((adaptive_lib.AdaptiveProposer, "choose", first_only),)):
      out = sj.generate(target, GREEDY_PROMPTS, method, max_new_tokens=GREEDY_NEW)
    np.testing.assert_array_equal(np.asarray(out.stats.choice_counts), [GREEDY_NEW - 5, 1])

  def test_noise_share_follows_the_estimators_weights(self):
    """``noise_share``: the squared weights of the observations behind an estimate, replayed
    one ``observe`` at a time (the estimate's derivative in each observation): exact where the
    running mean hands over to the EMA at a whole observation (decay 0.1), within 1% where the
    hand-over falls inside one (decay 0.3)."""
    for decay in (0.1, 0.3):
      for n in (1, 3, 7, 8, 20, 60):
        grads = jax.grad(lambda xs: estimate_after(xs, decay))(
            jnp.full((n,), 0.5))
        np.testing.assert_allclose(float(adaptive_model.noise_share(jnp.float32(n), decay)),
                                   float(jnp.sum(grads ** 2)),
                                   rtol=1e-5 if decay == 0.1 else 1e-2,
                                   err_msg=f"decay {decay}, {n} observations")
    self.assertEqual(float(adaptive_model.noise_share(jnp.float32(0), 0.1)), 0.0)

  def test_shrink_removes_the_least_estimates_noise(self):
    """Eight rows of one true acceptance 0.6, each estimated from 30 matches (T = 0): the least
    raw estimate is low by ~0.14 on average, the least shrunk one by under a third of that,
    and the shrunk rows are closer to the truth. Rows whose acceptance really differs (0.2 and
    0.9) stay apart; one row, or rows without observations, are left as they are."""
    rng = np.random.default_rng(0)
    hits = rng.random((400, 8, 30)) < 0.6
    raw = jax.vmap(jax.vmap(lambda xs: estimate_after(xs, 0.1)))(
        jnp.asarray(hits, jnp.float32))  # [400, 8]
    seen, on = jnp.full((8, 1), 30.0), jnp.ones((8,), bool)
    shrunk = jax.vmap(lambda a: adaptive_model.shrink(a[:, None], seen, on, 0.1)[:, 0])(raw)
    low_raw, low_shrunk = 0.6 - float(raw.min(axis=1).mean()), 0.6 - float(
        shrunk.min(axis=1).mean())
    self.assertGreater(low_raw, 0.1)
    self.assertLess(low_shrunk, low_raw / 3, msg=f"raw {low_raw:.3f}, shrunk {low_shrunk:.3f}")
    self.assertLess(float(jnp.mean((shrunk - 0.6) ** 2)), float(jnp.mean((raw - 0.6) ** 2)))
    apart = jnp.asarray([[0.2], [0.9], [0.2], [0.9]])
    got = adaptive_model.shrink(apart, jnp.full((4, 1), 30.0), jnp.ones((4,), bool), 0.1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(apart), atol=0.03)
    one = jnp.asarray([[0.3, 0.8]])
    np.testing.assert_array_equal(np.asarray(adaptive_model.shrink(
        one, jnp.full((1, 2), 30.0), jnp.ones((1,), bool), 0.1)), np.asarray(one))
    fresh = jnp.asarray([[0.5], [0.5], [0.4]])
    np.testing.assert_array_equal(np.asarray(adaptive_model.shrink(
        fresh, jnp.zeros((3, 1)), jnp.ones((3,), bool), 0.1)), np.asarray(fresh))
    # an inactive row neither moves nor counts toward the mean
    mixed = jnp.asarray([[0.4], [0.6], [0.0]])
    got = adaptive_model.shrink(mixed, jnp.full((3, 1), 30.0), jnp.asarray([True, True, False]),
                              0.1)
    got = np.asarray(got)[:, 0]
    self.assertEqual(got[2], 0.0)
    self.assertAlmostEqual(got[0] + got[1], 1.0, places=5)  # toward their own mean, 0.5
    self.assertTrue(0.4 < got[0] < 0.5, msg=str(got))

  def test_cost_rule_shrinks_before_pricing_the_slowest_row(self):
    """Four rows of 64 tokens, one draft for 1.25 target steps: at a common acceptance 0.4 one
    draft pays (1.4 tokens an iteration); estimates 0.4 +- 0.15 of 10 observations each
    (within the spread their noise gives: 0.13) priced as they are make the 0.25 row the
    slowest and plain decoding the choice; shrunk, the rule speculates."""
    target, inner = methods()
    proposer, params = sj.Adaptive(inner["speculative"], choices=(0, 1),
                                   costs=table((1.0, 1.23), 0.02)).proposer(target)
    a, on = jnp.asarray([[0.25], [0.4], [0.4], [0.55]]), jnp.ones((4,), bool)
    left = jnp.full((4,), 64, jnp.int32)
    unseen, seen = jnp.zeros((4, 1)), jnp.full((4, 1), 10.0)  # none behind them: as they are
    best = lambda a, seen: int(proposer.best(params.costs, a, seen, on, jnp.int32(-1), left))
    self.assertEqual(best(jnp.full((4, 1), 0.4), seen), 1)
    self.assertEqual(best(a, unseen), 0)
    self.assertEqual(best(a, seen), 1)


def estimate_after(observations: jax.Array, decay: float, prior: float = 0.5) -> jax.Array:
  """float32[]: one position's estimate after ``observe`` of each of ``observations`` in turn."""
  one = lambda value: jnp.full((1, 1), value, jnp.float32)

  def step(carry, x):
    a, seen = adaptive_model.observe(*carry, jnp.ones((1, 1), bool), one(x), decay,
                                   jnp.zeros((1, 1), bool), prior, 0.0)
    return (a, seen), None

  (a, _), _ = jax.lax.scan(step, (one(prior), one(0.0)), observations)
  return a[0, 0]


def law_pair():
  target, draft = tabular_pair("mixed", 3)
  return target, draft


def peeking(index, branches, state):
  """A mutant ``loop.run_choice``: runs the longest entry first and keeps it only if its verdict
  accepted a draft in every active row, otherwise plain decoding: a choice made from this
  iteration's target logits."""
  del index
  longest = branches[-1](state)
  accepted = longest.stats.accepted - state.stats.accepted
  good = jnp.all(jnp.where(state.done, True, accepted > 0))
  return jax.lax.cond(good, lambda: longest, lambda: branches[0](state))


class LawTest(absltest.TestCase):
  """Every row its own batch of one (``lawcheck.generate_rowwise``): the choices then follow each
  row's own acceptance, so they differ between rows and iterations."""

  def law(self, method, name: str, sampling=S(1.0)):
    target, _ = law_pair()
    return lawcheck.check_law(target, method, sampling, [(2, 1)], method.gamma + 3,
                              seed=_seed(name), rowwise=True)

  def assert_switches(self, result, least: int = 3):
    counts = np.asarray(result.out.stats.choice_counts).sum(axis=0)
    self.assertGreaterEqual(int(np.sum(counts > 0.02 * counts.sum())), least, msg=str(counts))
    return counts

  def assert_lossless_unless_peeking(self, method, name: str, mutant_name: str):
    """The law holds with a menu that switches; the ``peeking`` mutant breaks it."""
    clean = self.law(method, name)
    self.assertGreater(clean.pvalue, lawcheck.CLEAN_FLOOR, msg=clean.summary())
    self.assert_switches(clean)
    with patched(((loop, "run_choice", peeking),)):
      mutant = self.law(method, mutant_name)
    self.assertLess(mutant.pvalue, lawcheck.MUTANT_CEILING, msg=mutant.summary())

  def test_cost_rule_and_a_peeking_rule(self):
    _, draft = law_pair()
    # every entry near the best at this acceptance; timed at the law run's sampling
    close = dataclasses.replace(table((1.0, 1.1, 1.2, 1.3), 0.05), sampling=S(1.0))
    method = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, costs=close, prior=0.6)
    self.assert_lossless_unless_peeking(method, "adaptive_cost", "adaptive_peeking")

  @pytest.mark.slow  # ~50 s; the cost rule's law and its peeking control stay in the default run
  def test_tree_menu_and_a_peeking_rule(self):
    """A draft-free tree method (SuffixDecoding's per-request trees) cut to depths 1-3: the
    cost rule switches between trees, and the law holds; peeking at the verdict breaks it."""
    target, _ = law_pair()
    trees = sj.Retrieval(None, num_tokens=3, nodes=6, branches=2, samples=8, per_request=True)
    close = dataclasses.replace(table(tuple(1.0 + 0.07 * t for t in range(7)), 0.0),
                                sampling=S(1.0))
    method = sj.Adaptive(trees, choices=MENU, costs=close, prior=0.6)
    self.assertEqual(method.tree_nodes, (0, 2, 4, 6))  # passes over 1, 3, 5 and 7 tokens
    self.assert_lossless_unless_peeking(method, "adaptive_tree", "adaptive_tree_peeking")

  @pytest.mark.slow  # ~36 s; as above
  def test_draft_tree_menu_and_a_peeking_rule(self):
    """A static tree drafted by a model, sampled children (the recursive rule), cut to depths
    1-3: the cost rule switches between plain decoding and trees, and the law holds; peeking
    at the verdict breaks it."""
    _, draft = law_pair()
    trees = sj.TreeSpeculative(draft, sj.Tree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)]))
    method = sj.Adaptive(trees, choices=MENU, costs=tree_table(0.15, 0.05, S(1.0)), prior=0.6)
    self.assertEqual(method.tree_nodes, (0, 2, 3, 4))
    self.assertEqual(method.draft_widths, ((), (1, 3), (1, 3, 4), (1, 3, 4, 5)))
    self.assert_lossless_unless_peeking(method, "adaptive_draft_tree",
                                        "adaptive_draft_tree_peeking")

  @pytest.mark.slow  # ~18 s; as above
  def test_spectr_menu(self):
    """SpecTr's 2 i.i.d. chains (K-SEQ) cut to lengths 1-3: the menu switches and the law
    holds."""
    _, draft = law_pair()
    method = sj.Adaptive(sj.SpecTr(draft, num_drafts=2, gamma=3), choices=MENU,
                         costs=tree_table(0.1, 0.05, S(1.0)), prior=0.6)
    self.assertEqual(method.tree_nodes, (0, 2, 4, 6))
    result = self.law(method, "adaptive_spectr")
    self.assertGreater(result.pvalue, lawcheck.CLEAN_FLOOR, msg=result.summary())
    self.assert_switches(result)

  @pytest.mark.slow  # ~16 s; as above
  def test_dynamic_tree_menu(self):
    """The draft's EAGLE-2 dynamic tree (the one-hot rule) grown 1-3 levels (2, 4, 6 nodes):
    the menu switches and the law holds."""
    _, draft = law_pair()
    trees = sj.TreeSpeculative(draft, DRAFT_TREES["dynamic"])
    method = sj.Adaptive(trees, choices=MENU, costs=tree_table(0.1, 0.05, S(1.0)), prior=0.6)
    self.assertEqual(method.tree_nodes, (0, 2, 4, 6))
    result = self.law(method, "adaptive_dynamic_tree")
    self.assertGreater(result.pvalue, lawcheck.CLEAN_FLOOR, msg=result.summary())
    self.assert_switches(result)

  def test_schedule_and_confidence_rules(self):
    _, draft = law_pair()
    schedule = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, rule="schedule")
    result = self.law(schedule, "adaptive_schedule", S(0.8, top_k=3))
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    self.assert_switches(result)
    confidence = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU[1:],
                             rule="confidence", threshold=0.5)
    result = self.law(confidence, "adaptive_confidence")
    self.assertGreater(result.pvalue, lawcheck.P_FLOOR, msg=result.summary())
    self.assert_switches(result)


class PassesTest(absltest.TestCase):

  def test_what_a_table_must_time(self):
    """``sj.Adaptive.passes``: the target passes, bare iterations and draft passes a menu's
    prices need, as ``CostTable.measure``'s arguments; a table measured with them prices every
    entry."""
    target, inner = methods()
    draft = inner["speculative"].draft
    self.assertEqual(sj.Adaptive.passes(inner["speculative"], MENU),
                     dict(widths=(1, 2, 3, 4), gammas=(1, 2, 3), draft_widths=()))
    self.assertEqual(sj.Adaptive.passes(inner["prompt_lookup"], (0, 2)),
                     dict(widths=(1, 3), gammas=(), draft_widths=()))
    self.assertEqual(sj.Adaptive.passes(inner["self_speculative"], (0, 2)),
                     dict(widths=(1, 3), gammas=(2,), draft_widths=()))
    trees = sj.TreeSpeculative(draft, DRAFT_TREES["static"])
    self.assertEqual(sj.Adaptive.passes(trees, MENU),
                     dict(widths=(1, 3, 7, 15), gammas=(), draft_widths=(3, 7, 15)))
    costs = sj.CostTable.measure(target, draft, batch=1, context=4, cache_length=24,
                                 steps_per_call=2, min_seconds=0.0, max_iters=5,
                                 **sj.Adaptive.passes(trees, MENU))
    self.assertLen(sj.Adaptive(trees, choices=MENU, costs=costs).proposer(target)[1].costs, 4)
    with self.assertRaisesRegex(ValueError, "wraps a chain method"):
      sj.Adaptive.passes(sj.Lookahead())


class WarmTest(absltest.TestCase):
  """A call started from where an earlier one's estimates ended (``sj.Adaptive.warmed``)."""

  def test_warmed_starts_from_the_estimates_in_the_same_compiled_loop(self):
    target, inner = methods()
    expected = greedy_reference(TF_CONFIG, GREEDY_NEW)
    cold = sj.Adaptive(inner["speculative"], choices=MENU, costs=table())
    out = sj.generate(target, GREEDY_PROMPTS, cold, max_new_tokens=GREEDY_NEW)
    estimates = np.asarray(out.stats.acceptance_estimates)
    self.assertEqual(estimates.shape, (MENU[-1],))
    self.assertTrue(np.all((estimates >= 0) & (estimates <= 1)), msg=str(estimates))
    self.assertFalse(np.allclose(estimates, cold.prior), msg=str(estimates))  # it learned
    self.assertEqual(out.stats.summary()["acceptance_estimates"], estimates.tolist())
    evidence = np.asarray(out.stats.acceptance_evidence)  # the observations behind them
    self.assertEqual(evidence.shape, (MENU[-1],))
    self.assertGreater(evidence[0], 0.0)
    self.assertEqual(out.stats.summary()["acceptance_evidence"], evidence.tolist())
    warm = cold.warmed(out.stats)
    np.testing.assert_allclose(warm.prior, estimates, rtol=1e-6)
    np.testing.assert_allclose(warm.prior_evidence, evidence, rtol=1e-6)
    self.assertEqual(cold.warmed(estimates).prior_evidence, (0.0,) * MENU[-1])
    compiled = loop.decode_jit._cache_size()
    again = sj.generate(target, GREEDY_PROMPTS, warm, max_new_tokens=GREEDY_NEW)
    self.assertEqual(loop.decode_jit._cache_size(), compiled)  # the prior is traced
    np.testing.assert_array_equal(np.asarray(again.tokens), expected)
    fixed = sj.generate(target, GREEDY_PROMPTS, inner["speculative"], max_new_tokens=4)
    self.assertEqual(np.asarray(fixed.stats.acceptance_estimates).shape, (0,))

  def test_the_prior_is_the_first_estimate_and_the_drift_target(self):
    """Per position: the prefilled estimates are the prior's; the first choice follows them
    (hopeless: plain decoding; certain: the largest entry); an untested position drifts
    toward its own prior value."""
    target, draft = random_transformer(TF_CONFIG, 0), noisy_copy(TF_CONFIG, 0)
    prompt = jnp.asarray([[3, 4, 5], [6, 7, 8]], jnp.int32)
    lengths = jnp.asarray([3, 3], jnp.int32)
    pending = jnp.asarray([9, 10], jnp.int32)
    keys = jax.random.split(jax.random.key(0), (2, MENU[-1]))
    active, budget = jnp.asarray([True, True]), jnp.full((2,), 64, jnp.int32)
    for prior, first in (((0.0, 0.0, 0.0), 0), ((1.0, 1.0, 1.0), 3), ((0.9, 0.5, 0.2), None)):
      method = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, costs=table(),
                           prior=prior, forget=0.5, drift="prior")
      proposer, params = method.proposer(target)
      state = proposer.prefill(params, prompt, lengths, 16)
      np.testing.assert_allclose(np.asarray(state.acceptance), [prior, prior], rtol=1e-6)
      index, _ = proposer.choose(params, state, pending, keys, S(0.0), active, budget)
      if first is not None:
        self.assertEqual(int(index), first, msg=str(prior))
        continue
      entry = proposer.variants[1]  # one draft: positions 2 and 3 drift
      state = state.replace(acceptance=jnp.full(state.acceptance.shape, 0.6, jnp.float32))
      candidates, proposed = entry.propose(params, state, pending, keys, S(0.0))
      outcome = Outcome(target_length=lengths, path=jnp.full((2, 1), -1, jnp.int32),
                        num_accepted=jnp.zeros((2,), jnp.int32), next_token=pending,
                        active=active, logits=jnp.zeros((2, 2, TF_CONFIG.vocab_size)),
                        accept_prob=None, sampling=S(0.0))
      got = np.asarray(entry.commit(params, proposed, candidates, outcome).acceptance)
      np.testing.assert_allclose(got[:, 1:], [[0.55, 0.4]] * 2, rtol=1e-6)  # 0.6 + 0.5 (p - 0.6)

  def test_the_prior_counts_as_its_evidence(self):
    """``prior_evidence`` observations stand behind the prior (the prefilled ``seen``): a
    first miss at position 0 moves a 0.6 estimate to 0.54 (an EMA of weight 0.1 already) with
    7 of them, to 0.4 (a running mean over the prior's two) with none."""
    target, draft = random_transformer(TF_CONFIG, 0), noisy_copy(TF_CONFIG, 0)
    prompt = jnp.asarray([[3, 4, 5], [6, 7, 8]], jnp.int32)
    lengths, pending = jnp.asarray([3, 3], jnp.int32), jnp.asarray([9, 10], jnp.int32)
    keys = jax.random.split(jax.random.key(0), (2, MENU[-1]))
    for evidence, after_miss in (((7.0, 0.0, 2.0), 0.54), (0.0, 0.4)):
      method = sj.Adaptive(sj.Speculative(draft, gamma=1), choices=MENU, costs=table(),
                           prior=0.6, prior_evidence=evidence)
      proposer, params = method.proposer(target)
      state = proposer.prefill(params, prompt, lengths, 16)
      np.testing.assert_array_equal(np.asarray(state.seen), [method.prior_evidence] * 2)
      entry = proposer.variants[1]
      candidates, proposed = entry.propose(params, state, pending, keys, S(0.0))
      outcome = Outcome(target_length=lengths, path=jnp.full((2, 1), -1, jnp.int32),
                        num_accepted=jnp.zeros((2,), jnp.int32), next_token=pending,
                        active=jnp.asarray([True, True]),
                        logits=jnp.zeros((2, 2, TF_CONFIG.vocab_size)), accept_prob=None,
                        sampling=S(0.0))
      got = entry.commit(params, proposed, candidates, outcome)
      np.testing.assert_allclose(np.asarray(got.acceptance)[:, 0], [after_miss] * 2, rtol=1e-5)
      np.testing.assert_array_equal(np.asarray(got.seen)[:, 0],
                                    [method.prior_evidence[0] + 1] * 2)


class MenuKeyTest(absltest.TestCase):
  """What a call costs on the host: the menu's entries come from one split of the draft, and
  the compiled loop's key (hashed and compared every call) holds one graph, not one per entry
  (``methods.shared_splits``, ``adaptive.entries_key``)."""

  def test_one_split_and_one_graph_hashed_per_call(self):
    target, inner = methods()
    trees = sj.TreeSpeculative(inner["speculative"].draft, DRAFT_TREES["static"])
    for name, method in (("speculative", inner["speculative"]),
                         ("self_speculative", inner["self_speculative"]), ("tree", trees)):
      menu = sj.Adaptive(method, choices=MENU, costs=tree_table() if name == "tree" else table())
      proposer, _ = menu.proposer(target)
      graph = proposer.largest.graphdef
      self.assertTrue(all(p.graphdef is graph for p in proposer.proposers[1:]), msg=name)
      again, _ = dataclasses.replace(menu).proposer(target)  # another call's: the same key
      self.assertEqual(again, proposer, msg=name)
      self.assertEqual(hash(again), hash(proposer), msg=name)
      graphs = type(graph)
      calls = []
      with mock.patch.object(graphs, "__hash__", lambda g: calls.append(g) or 0):
        hash(proposer)
      self.assertLen(calls, 1, msg=name)
      shorter, _ = dataclasses.replace(menu, choices=(0, 1, 3)).proposer(target)
      self.assertNotEqual(shorter, proposer, msg=name)
    draft = inner["speculative"].draft
    self.assertIsNot(methods_lib.split(draft)[0], methods_lib.split(draft)[0])
    with methods_lib.shared_splits():
      self.assertIs(methods_lib.split(draft)[0], methods_lib.split(draft)[0])
      self.assertIsNot(methods_lib.split(target, (1,))[0], methods_lib.split(target)[0])

  def test_a_fresh_menu_of_the_same_settings_reuses_the_compiled_loop(self):
    target, inner = methods()
    make = lambda: sj.Adaptive(inner["speculative"], choices=MENU, costs=table())
    sj.generate(target, GREEDY_PROMPTS, make(), max_new_tokens=4)
    compiled = loop.decode_jit._cache_size()
    sj.generate(target, GREEDY_PROMPTS, make(), max_new_tokens=4)
    self.assertEqual(loop.decode_jit._cache_size(), compiled)


class ErrorTest(absltest.TestCase):

  def test_errors(self):
    _, inner = methods()
    spec = inner["speculative"]
    trees = sj.Retrieval(None, num_tokens=3, nodes=6, branches=2, per_request=True)
    drafted = sj.TreeSpeculative(spec.draft, sj.Tree.full(depth=2, branching=2))
    cases = [
        (dict(method=sj.Lookahead()), "wraps a chain method .*got Lookahead"),
        (dict(method=spec, rule="greedy"), "rule must be one of .*'greedy'"),
        (dict(method=spec, choices=(0,)), "draft length >= 1, got \\(0,\\)"),
        (dict(method=spec, choices=(2, 1)), "increasing without repeats, got \\(2, 1\\)"),
        (dict(method=spec, choices=(0, -1)), "integers >= 0 .*-1"),
        (dict(method=spec, choices=(1, 3), rule="confidence"), "must include 1..3"),
        (dict(method=spec, decay=0.0, costs=FLAT), "decay must be a number in \\(0, 1\\], got 0.0"),
        (dict(method=spec, prior=1.5, costs=FLAT), "prior must be .* got 1.5"),
        (dict(method=spec, choices=MENU, prior=(0.5, 1.2, 0.1), costs=table()),
         "prior must be .* got 1.2"),
        (dict(method=spec, choices=MENU, prior=(0.5, 0.5), costs=table()),
         "prior must be one value or 3 .* got 2"),
        (dict(method=spec, prior="high", costs=FLAT), "prior must be a number"),
        (dict(method=spec, prior_evidence=-1.0, costs=FLAT),
         "prior_evidence must be a finite number >= 0 .* got -1.0"),
        (dict(method=spec, prior_evidence=(1.0, float("nan")) * 3, costs=FLAT),
         "prior_evidence must be .* got nan"),
        (dict(method=spec, prior_evidence=(1.0, 2.0), costs=FLAT),
         "prior_evidence must be one value or 6 .* got 2"),
        (dict(method=spec, margin=-0.1, costs=FLAT), "margin must be .* got -0.1"),
        (dict(method=spec, drift="last", costs=FLAT),
         "drift must be one of first, prior, got 'last'"),
        (dict(method=spec, correct="yes", costs=FLAT), "correct must be True or False, got 'yes'"),
        (dict(method=spec), "rule 'cost' needs costs=sj.CostTable"),
        (dict(method=spec, choices=(0, 1, 6), costs=FLAT), "7"),  # no pass over 7 tokens
        (dict(method=inner["prompt_lookup"], choices=(1, 2), rule="confidence"),
         "confidence rule .*PromptLookup has none"),
        (dict(method=drafted, choices=(0, 1, 2), costs=table()),
         "no measured draft pass over 3 tokens"),  # depth 1: the root, then it and 2 nodes
        (dict(method=drafted, choices=(0, 3), costs=tree_table()),
         "depth 3 exceeds the tree's depth 2"),
        (dict(method=drafted, choices=(1, 2), rule="confidence"),
         "confidence rule .*TreeSpeculative has none"),
        (dict(method=trees, choices=(0, 1, 3), costs=table()),
         "no measured pass over 7 tokens"),  # depth 3: 6 nodes and the pending token
        (dict(method=trees, choices=(1, 2), rule="confidence"),
         "confidence rule .*Retrieval has none"),
    ]
    for kwargs, message in cases:
      with self.subTest(message):
        with self.assertRaisesRegex(ValueError, message):
          sj.Adaptive(**kwargs)
    with self.assertRaisesRegex(ValueError, "warmed needs 3 acceptance estimates .* got 0"):
      sj.Adaptive(spec, choices=MENU, costs=table()).warmed(np.zeros((0,)))


if __name__ == "__main__":
  absltest.main()
