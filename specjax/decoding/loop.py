"""The one decoding loop: prefill, then ``jax.lax.while_loop`` over propose -> verify -> commit.

Everything runs inside one ``jit``; rows advance independently (ragged acceptance is expressed with
per-row lengths and masks, never with data-dependent shapes) and a finished row stops changing.

Randomness: row ``b`` uses ``fold_in(key, b)``; iteration ``t`` of that row uses
``fold_in(row_key, t)`` (``t = 0`` is the first token, drawn from the prefill). A row's tokens
therefore depend only on its prompt, its index in the batch and the key, never on its batch mates.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax import sampling as sampling_lib
from specjax import verify
from specjax.decoding.stats import DecodeStats
from specjax.models.kv_cache import KVCache, compact_path, init_cache
from specjax.models.transformer import FEATURE_AXES
from specjax.proposers import base
from specjax.proposers.base import CHAIN, TREE, Candidates, Outcome
from specjax.trees import Tree
from specjax.verify.typical import typical_tree


@flax.struct.dataclass
class LoopState:
  target_cache: KVCache
  proposer: Any  # the proposer's own state (a pytree; None for none)
  pending: jax.Array  # int32[B] last emitted token, not yet in the target cache
  out: jax.Array  # int32[B, max_new_tokens + D + 1] emitted tokens, -1 elsewhere
  done: jax.Array  # bool[B]
  step: jax.Array  # int32[]
  stats: DecodeStats


def _row_keys(key: jax.Array, batch: int) -> jax.Array:
  return jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(batch))


def _step_keys(row_keys: jax.Array, step: jax.Array, num: int) -> jax.Array:
  """key[B, num]: the keys of one iteration of each row."""
  step_keys = jax.vmap(jax.random.fold_in, (0, None))(row_keys, step)
  return jax.vmap(lambda k: jax.random.split(k, num))(step_keys)


def _draw_one(keys: jax.Array, logits: jax.Array, sampling) -> jax.Array:
  if sampling.is_greedy:
    return sampling_lib.greedy(logits)
  return jax.vmap(sampling_lib.sample_from_probs)(keys, sampling_lib.probabilities(logits, sampling))


@flax.struct.dataclass
class Verdict:
  """One iteration's outcome per row, whatever the candidates' shape."""

  path: jax.Array  # int32[B, D] accepted candidates from the root down, -1 after
  num_accepted: jax.Array  # int32[B]
  next_token: jax.Array  # int32[B]
  accept_prob: jax.Array | None  # float32[B, D] chains: beta per position (None for trees)


def _chain_verdict(verdict: verify.ChainVerdict, num: int) -> Verdict:
  j = jnp.arange(num, dtype=jnp.int32)[None, :]
  path = jnp.where(j < verdict.num_accepted[:, None], j, -1)
  return Verdict(path=path, num_accepted=verdict.num_accepted, next_token=verdict.next_token,
                 accept_prob=verdict.accept_prob)


def _verify(keys: jax.Array, logits: jax.Array, candidates: Candidates, sampling) -> Verdict:
  """The exact rule for these candidates, chosen at trace time from their shape and the sampling
  (ALGORITHMS.md): greedy match (chain) or greedy walk (tree) at temperature 0; otherwise
  rejection sampling against q for sampled chains, the one-hot rule for deterministic ones
  (q is None), the recursive multi-candidate rule for trees (§5); no candidates: a plain draw.
  Applied row by row (``verify`` functions take one row)."""
  drafts = candidates.tokens
  num = drafts.shape[1]
  if candidates.typical is not None and not sampling.is_greedy and num:  # lossy, opt-in
    if candidates.row_trees is not None:
      raise NotImplementedError("typical acceptance needs a static tree or a chain")
    tree = Tree.chains(num=1, depth=num) if candidates.kind == CHAIN else candidates.tree
    p = sampling_lib.probabilities(logits, sampling)
    out = jax.vmap(lambda key, p, tokens: typical_tree(key, p, tokens, tree, candidates.typical))(
        keys, p, drafts)
    return Verdict(path=out.path, num_accepted=out.num_accepted, next_token=out.next_token,
                   accept_prob=None)
  if candidates.kind == TREE:
    tree = candidates.structure
    depth = tree.max_depth
    # A static tree's table is closed over (numpy, as the multi-draft rules need); a per-row
    # table is mapped over with the rows.
    row_table = () if candidates.row_trees is None else (tree.children,)
    table = lambda row: row[0] if row else tree.children
    if sampling.is_greedy:
      fn = lambda argmax, tokens, *row: verify.greedy_tree(argmax, tokens, table(row), depth)
      out = jax.vmap(fn)(sampling_lib.greedy(logits), drafts, *row_table)
    else:
      p = sampling_lib.probabilities(logits, sampling)
      rule = candidates.rule
      fn = lambda key, p, tokens, q, *row: verify.sampled_tree(key, p, tokens, q, table(row),
                                                               depth, rule)
      q_axis = None if candidates.q is None else 0
      out = jax.vmap(fn, in_axes=(0, 0, 0, q_axis) + (0,) * len(row_table))(
          keys, p, drafts, candidates.q, *row_table)
    return Verdict(path=out.path, num_accepted=out.num_accepted, next_token=out.next_token,
                   accept_prob=None)
  if candidates.kind != CHAIN:
    raise NotImplementedError(f"no verifier for candidates of kind {candidates.kind!r}")
  if num == 0:
    token = _draw_one(keys, logits[:, 0], sampling)
    return Verdict(path=jnp.zeros((token.shape[0], 0), jnp.int32),
                   num_accepted=jnp.zeros(token.shape, jnp.int32), next_token=token,
                   accept_prob=jnp.zeros((token.shape[0], 0), jnp.float32))
  if sampling.is_greedy:
    return _chain_verdict(jax.vmap(verify.greedy_chain)(sampling_lib.greedy(logits), drafts), num)
  p = sampling_lib.probabilities(logits, sampling)
  if candidates.q is None:
    return _chain_verdict(jax.vmap(verify.deterministic_chain)(keys, p, drafts), num)
  return _chain_verdict(jax.vmap(verify.rejection_chain)(keys, p, candidates.q, drafts), num)


def _emit(state: LoopState, emitted: jax.Array, num_emitted: jax.Array, eos_ids, max_new: int):
  """Appends ``emitted[b, :num_emitted[b]]`` to each active row, cut at EOS and at the budget.

  Returns (out, generated, done).
  """
  batch, width = emitted.shape
  generated = state.stats.generated
  j = jnp.arange(width)[None, :]
  if eos_ids:
    is_eos = jnp.isin(emitted, jnp.asarray(eos_ids, jnp.int32)) & (j < num_emitted[:, None])
    first_eos = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1), width)
  else:
    first_eos = jnp.full((batch,), width)
  count = jnp.minimum(jnp.minimum(num_emitted, first_eos + 1), max_new - generated)
  count = jnp.where(state.done, 0, count)
  cols = jnp.where(j < count[:, None], generated[:, None] + j, state.out.shape[1])  # drop the rest
  out = state.out.at[jnp.arange(batch)[:, None], cols].set(emitted, mode="drop")
  generated = generated + count
  done = state.done | (first_eos < count) | (generated >= max_new)
  return out, generated, done


def committed_lengths(length: jax.Array, num_accepted: jax.Array, active: jax.Array) -> jax.Array:
  """int32[B] target cache lengths after an iteration: ``pending`` and the ``n`` accepted drafts
  join the context (``n + 1`` slots); the rejected drafts' slots are left past the length, which
  is the whole rollback. Finished rows keep their length."""
  return jnp.where(active, length + num_accepted + 1, length)


def run_choice(index: int, branches, state: LoopState) -> LoopState:
  """Runs ``branches[index](state)``, one iteration of menu entry ``index`` (each entry its own
  static pass shape; the loop runs entry ``index`` in a loop of its own, ``decode``'s ``stay``).
  Chosen before the branch runs, from the proposer's state alone (``Adaptive``): nothing of the
  iteration's own verdict can reach the choice. A test swaps in a rule that peeks."""
  return branches[index](state)


def decode(target_graphdef, target_state, proposer, proposer_params, prompt, prompt_lengths, key,
           *, sampling: sampling_lib.Sampling, max_new_tokens: int, eos_ids: tuple[int, ...],
           cache_length: int, placement=None):
  """Generates for a batch of right-padded prompts. Pure; jit it with the keyword args static.

  Args:
    proposer: static (hashable) proposer (``specjax.proposers.base.Proposer``); it proposes
      ``N = proposer.num_candidates`` tokens per iteration from its ``proposer_params`` (traced).
    prompt: int32[B, P] right-padded prompts; prompt_lengths: int32[B] (>= 1).
    placement: None (one device, or whatever the inputs' shardings say), or a
      ``specjax.sharding.Placement``: the target's cache is pinned to its rules and the outputs
      are replicated.
  Returns:
    (int32[B, max_new_tokens] tokens, -1 past each row's length; int32[B] lengths; DecodeStats)
  """
  target = nnx.merge(target_graphdef, target_state)
  num, depth = proposer.num_candidates, proposer.depth
  batch = prompt.shape[0]
  row_keys = _row_keys(key, batch)

  # Prefill: the whole prompt goes into the cache; the first token comes from its last logits
  # (the vocabulary projection runs for that token only).
  pin = (lambda c: c) if placement is None else placement.constrain_cache
  wanted = base.features(proposer)

  def score(tokens, cache, mask=None, depths=None, logits_at=None):
    """The target's pass: (logits, cache, the proposer's features or None)."""
    if not wanted:  # the plain call: nothing extra traced for proposers without features
      return target(tokens, cache, mask, depths, logits_at) + (None,)
    logits, cache, hidden = target(tokens, cache, mask, depths, logits_at, features=wanted)
    if placement is not None:
      hidden = jax.lax.with_sharding_constraint(hidden, placement.sharding(FEATURE_AXES))
    return logits, cache, hidden

  cache = pin(init_cache(target.config, batch, cache_length))
  logits, cache, hidden = score(prompt, cache, logits_at=prompt_lengths - 1)
  cache = pin(cache.with_lengths(prompt_lengths))
  first = _draw_one(_step_keys(row_keys, 0, 1)[:, 0], logits[:, 0], sampling)
  extra = {} if hidden is None else {"features": hidden}
  proposer_state = proposer.prefill(proposer_params, prompt, prompt_lengths, cache_length, **extra)
  menu = base.menu(proposer)
  typical = getattr(proposer, "typical", None)  # a lossy verifier, labelled in the stats
  verifier = "exact" if typical is None or sampling.is_greedy else typical.label
  stats = DecodeStats.zeros(batch, depth, 0 if menu is None else len(menu), verifier).replace(
      target_calls=jnp.int32(1), row_target_calls=jnp.ones((batch,), jnp.int32),
      draft_calls=jnp.int32(proposer.prefill_draft_calls))
  state = LoopState(target_cache=cache, proposer=proposer_state, pending=first,
                    out=jnp.full((batch, max_new_tokens + depth + 1), -1, jnp.int32),
                    done=jnp.zeros((batch,), bool), step=jnp.int32(1), stats=stats)
  out, generated, done = _emit(state, first[:, None], jnp.ones((batch,), jnp.int32), eos_ids,
                               max_new_tokens)
  state = state.replace(out=out, done=done, stats=stats.replace(generated=generated))

  def iteration(index: int, variant, keys: jax.Array, state: LoopState) -> LoopState:
    """One propose -> verify -> commit step of ``variant`` (the proposer itself, or the menu
    entry ``index`` of an adaptive one); ``keys``: key[B, 1 + variant.num_candidates]."""
    num, vdepth = variant.num_candidates, variant.depth
    active = ~state.done
    candidates, proposer_state = variant.propose(proposer_params, state.proposer, state.pending,
                                                 keys[:, 1:], sampling)
    drafts = candidates.tokens
    tree = candidates.structure
    # One pass over [pending, candidates, extras] (extras: scored, never accepted; ScoredExtra).
    scored = [state.pending[:, None], drafts]
    if candidates.extra is not None:
      scored.append(candidates.extra.tokens)
    mask, depths = candidates.pass_layout()
    logits, cache, hidden = score(jnp.concatenate(scored, axis=1), state.target_cache, mask,
                                  depths)
    verified = logits if candidates.extra is None else logits[:, :num + 1]
    verdict = _verify(keys[:, 0], verified, candidates, sampling)
    path, n, nxt = verdict.path, verdict.num_accepted, verdict.next_token
    j = jnp.arange(vdepth + 1)[None, :]
    on_path = jnp.take_along_axis(drafts, jnp.maximum(path, 0), axis=1)  # [B, D]
    on_path = jnp.concatenate([on_path, jnp.zeros((batch, 1), jnp.int32)], axis=1)
    emitted = jnp.where(j < n[:, None], on_path, jnp.where(j == n[:, None], nxt[:, None], -1))
    out, generated, done = _emit(state, emitted, n + 1, eos_ids, max_new_tokens)

    length = state.target_cache.lengths
    if tree is not None:  # the accepted path's entries move next to the pending token's
      cache = compact_path(cache, path)
    cache = pin(cache.with_lengths(committed_lengths(length, n, active)))
    proposer_state = variant.commit(
        proposer_params, proposer_state, candidates,
        Outcome(target_length=length, path=path, num_accepted=n, next_token=nxt, active=active,
                logits=logits, features=hidden, accept_prob=verdict.accept_prob,
                sampling=sampling))
    s = state.stats
    pos = jnp.arange(depth)[None, :]  # the loop's positions: a menu entry may use fewer
    accepted = (pos < n[:, None]) & active[:, None]
    stats = s.replace(
        target_calls=s.target_calls + 1, generated=generated,
        row_target_calls=s.row_target_calls + active,
        draft_calls=s.draft_calls + variant.draft_calls_per_iteration,
        proposed=s.proposed + num * active,
        accepted=s.accepted + jnp.where(active, n, 0),
        proposed_per_position=s.proposed_per_position + active.sum() * (pos[0] < vdepth),
        accepted_per_position=s.accepted_per_position + accepted.sum(0),
        accepted_length_counts=s.accepted_length_counts + jnp.sum(
            (n[:, None] == jnp.arange(depth + 1)[None, :]) & active[:, None], axis=0),
        choice_counts=s.choice_counts + (jnp.arange(s.choice_counts.size) == index))
    if verdict.accept_prob is not None and num:  # Leviathan's alpha: chains only
      verified = (pos[:, :num] <= n[:, None]) & active[:, None]  # positions whose test ran
      stats = stats.replace(
          alpha_sum=s.alpha_sum + jnp.sum(jnp.where(verified, verdict.accept_prob, 0.0)),
          alpha_count=s.alpha_count + verified.sum())
    return LoopState(target_cache=cache, proposer=proposer_state,
                     pending=jnp.where(active, nxt, state.pending), out=out, done=done,
                     step=state.step + 1, stats=stats)

  if menu is None:
    def body(state: LoopState) -> LoopState:
      return iteration(0, proposer, _step_keys(row_keys, state.step, num + 1), state)

    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  else:
    # The iteration's keys: drawn before the choice where ``choose`` draws (the confidence
    # rule's drafts), else by the entry chosen, as many as it uses (the same keys: a split's
    # first keys do not depend on its size under jax's default partitionable threefry). A
    # threefry split is a loop of small kernels on XLA:CPU: the largest entry's keys split in
    # a plain iteration were ~100 of its kernels (SmolLM2, batch 8; profiler counts).
    draws = getattr(proposer, "draws_in_choose", True)

    def choose(state: LoopState, after: int | None = None):
      """(menu index, the iteration's keys or None, state) of the coming iteration; ``after``:
      the entry whose iteration came before (static; None at the loop's start)."""
      keys = _step_keys(row_keys, state.step, num + 1) if draws else None  # the largest's
      index, proposer_state = proposer.choose(
          proposer_params, state.proposer, state.pending, None if keys is None else keys[:, 1:],
          sampling, ~state.done, max_new_tokens - state.stats.generated, after=after)
      return index, keys, state.replace(proposer=proposer_state)

    def chosen(index: int, keys, state: LoopState) -> LoopState:
      def entry(i, variant, state):
        width = 1 + variant.num_candidates
        mine = _step_keys(row_keys, state.step, width) if keys is None else keys[:, :width]
        return iteration(i, variant, mine, state)
      return run_choice(index, [functools.partial(entry, i, variant)
                                for i, variant in enumerate(menu)], state)

    def stay(index: int, carry):
      """Entry ``index``'s iterations for as long as it stays chosen (none when it is not): a
      loop of its own per entry, so no conditional runs per iteration. The carry holds the
      next choice, which leaves the loop when it differs."""
      def body(carry):
        _, keys, state = carry
        return choose(chosen(index, keys, state), after=index)
      return jax.lax.while_loop(lambda c: (c[0] == index) & ~jnp.all(c[2].done), body, carry)

    def between(carry):
      """The proposer's work that is not every iteration's, when its choice asks for it (index
      ``len(menu)``: the adaptive rule's look, ``proposer.between``), until it makes a choice:
      a stage of the sweep, entered when a look is due, not a conditional in every iteration."""
      def body(carry):
        _, keys, state = carry
        index, proposer_state = proposer.between(
            proposer_params, state.proposer, state.pending, sampling, ~state.done,
            max_new_tokens - state.stats.generated)
        return index, keys, state.replace(proposer=proposer_state)
      return jax.lax.while_loop(lambda c: (c[0] == len(menu)) & ~jnp.all(c[2].done), body,
                                carry)

    def sweep(carry):
      """Every entry's loop in menu order: a choice moves on to its entry's loop in this sweep
      (a longer entry) or the next (a shorter one). Loops in sequence rather than a
      ``lax.switch`` into them: XLA copied a switch's carry (the KV caches, 7.5 MB on SmolLM2)
      into the entry and again out of it at every change of choice (~0.05 target steps per
      resumption of a menu forced to alternate, CPU); loops in sequence update it in place."""
      if getattr(proposer, "between_iterations", False):
        carry = between(carry)
      for index in range(len(menu)):
        carry = stay(index, carry)
      return carry

    _, _, state = jax.lax.while_loop(lambda c: ~jnp.all(c[2].done), sweep, choose(state))
    estimates, evidence, tally = proposer.estimates(state.proposer)
    state = state.replace(stats=state.stats.replace(
        acceptance_estimates=estimates, acceptance_evidence=evidence, model_tally=tally))
  result = state.out[:, :max_new_tokens], state.stats.generated, state.stats
  return result if placement is None else placement.replicate(result)


decode_jit = jax.jit(decode, static_argnums=(0, 2), static_argnames=(
    "sampling", "max_new_tokens", "eos_ids", "cache_length", "placement"))
