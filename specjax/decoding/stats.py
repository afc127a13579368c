"""Decoding statistics accumulated inside the jitted loop (``sj.DecodeStats``).

Counters are per row where rows can differ (a finished row stops counting), so that figures of a
batch are exact sums over rows rather than estimates.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class DecodeStats:
  """What one ``sj.generate`` call did.

  ``target_calls`` counts target forward passes over the batch (prefill included, so plain
  autoregressive decoding of N tokens makes N calls); ``row_target_calls[b]`` counts the passes in
  which row b was still active. ``expected_alpha`` is Leviathan et al.'s alpha estimated with lower
  variance than counting: the mean over verified draft positions of ``beta = sum_x min(p(x), q(x))``.
  """

  target_calls: jax.Array  # int32[]
  draft_calls: jax.Array  # int32[]
  row_target_calls: jax.Array  # int32[B]
  generated: jax.Array  # int32[B] tokens emitted per row (== output lengths)
  proposed: jax.Array  # int32[B] draft tokens (tree nodes) proposed per row
  accepted: jax.Array  # int32[B] draft tokens accepted per row (before budget/EOS truncation)
  # G = the most drafts one iteration can accept: gamma for a chain, the depth for a tree
  # (position i = a tree's depth i + 1).
  accepted_per_position: jax.Array  # int32[G] row-iterations in which draft position i was accepted
  proposed_per_position: jax.Array  # int32[G] row-iterations in which position i was proposed
  accepted_length_counts: jax.Array  # int32[G + 1] row-iterations that accepted exactly n drafts
  alpha_sum: jax.Array  # float32[] sum of beta over verified positions
  alpha_count: jax.Array  # int32[] number of verified positions
  # int32[K] iterations that ran menu entry k of an adaptive method (``sj.Adaptive``; K = 0
  # for a fixed method).
  choice_counts: jax.Array
  # float32[G] an adaptive method's per-position acceptance estimates where the call ended, the
  # rows' mean (``sj.Adaptive.warmed`` starts a later call from them; G = 0 for a fixed method).
  acceptance_estimates: jax.Array
  # float32[G] the observations behind each (the rows' mean; ``warmed``'s ``prior_evidence``).
  acceptance_evidence: jax.Array
  # float32[2, K] its entries' accepted drafts lately and what its estimates expected of them
  # (``specjax.proposers.adaptive_model.tally``; ``warmed``'s ``prior_tally``; K = 0 if fixed).
  model_tally: jax.Array
  # "exact" for every lossless method; a lossy verifier's label (Medusa's typical acceptance at
  # T > 0: ``specjax.verify.typical``) otherwise, so no report mistakes its run for a lossless one.
  verifier: str = flax.struct.field(pytree_node=False, default="exact")
  # True where ``sj.Adaptive``'s call-level skip (``probe_every``) ran the call as plain
  # decoding, its draft skipped (``warmed`` counts such calls).
  draft_skipped: bool = flax.struct.field(pytree_node=False, default=False)

  @classmethod
  def zeros(cls, batch: int, gamma: int, choices: int = 0,
            verifier: str = "exact") -> "DecodeStats":
    zi = lambda *s: jnp.zeros(s, jnp.int32)
    return cls(target_calls=zi(), draft_calls=zi(), row_target_calls=zi(batch),
               generated=zi(batch), proposed=zi(batch), accepted=zi(batch),
               accepted_per_position=zi(gamma), proposed_per_position=zi(gamma),
               accepted_length_counts=zi(gamma + 1),
               alpha_sum=jnp.zeros((), jnp.float32), alpha_count=zi(), choice_counts=zi(choices),
               acceptance_estimates=jnp.zeros((gamma if choices else 0,), jnp.float32),
               acceptance_evidence=jnp.zeros((gamma if choices else 0,), jnp.float32),
               model_tally=jnp.zeros((2, choices), jnp.float32), verifier=verifier)

  @property
  def acceptance_rate(self) -> float:
    """Accepted / proposed draft tokens over the whole batch (nan when nothing was proposed)."""
    proposed = int(np.sum(self.proposed))
    return float(np.sum(self.accepted)) / proposed if proposed else float("nan")

  @property
  def tokens_per_target_call(self) -> float:
    """Emitted tokens per target forward pass, summed over rows (block efficiency)."""
    calls = int(np.sum(self.row_target_calls))
    return float(np.sum(self.generated)) / calls if calls else float("nan")

  @property
  def nodes_per_call(self) -> float:
    """Candidates the target verified per iteration (a chain's gamma, a tree's node count): the
    width of each verification pass, the prefill excluded."""
    iterations = int(np.sum(self.row_target_calls)) - int(np.size(self.row_target_calls))
    return float(np.sum(self.proposed)) / iterations if iterations > 0 else float("nan")

  @property
  def expected_alpha(self) -> float:
    count = int(self.alpha_count)
    return float(self.alpha_sum) / count if count else float("nan")

  @property
  def acceptance_by_position(self) -> np.ndarray:
    """float64[G]: P(position i accepted | position i proposed); for a tree, position i is depth
    i + 1 and this is P(the accepted path reaches depth i + 1)."""
    proposed = np.asarray(self.proposed_per_position, np.float64)
    return np.divide(np.asarray(self.accepted_per_position), proposed,
                     out=np.full_like(proposed, np.nan), where=proposed > 0)

  @property
  def accepted_length_histogram(self) -> np.ndarray:
    """float64[G + 1]: the fraction of row-iterations that accepted exactly n drafts, n = 0..G."""
    counts = np.asarray(self.accepted_length_counts, np.float64)
    total = counts.sum()
    return counts / total if total else np.full_like(counts, np.nan)

  def summary(self) -> dict:
    """Plain-Python figures, for reports and JSON."""
    return dict(target_calls=int(self.target_calls), draft_calls=int(self.draft_calls),
                generated=int(np.sum(self.generated)), proposed=int(np.sum(self.proposed)),
                accepted=int(np.sum(self.accepted)), acceptance_rate=self.acceptance_rate,
                tokens_per_target_call=self.tokens_per_target_call,
                nodes_per_call=self.nodes_per_call, expected_alpha=self.expected_alpha,
                acceptance_by_position=[float(x) for x in self.acceptance_by_position],
                accepted_length_counts=[int(x) for x in np.asarray(self.accepted_length_counts)],
                choice_counts=[int(x) for x in np.asarray(self.choice_counts)],
                acceptance_estimates=[float(x) for x in np.asarray(self.acceptance_estimates)],
                acceptance_evidence=[float(x) for x in np.asarray(self.acceptance_evidence)],
                model_tally=np.asarray(self.model_tally, np.float64).tolist(),
                verifier=self.verifier, lossless=self.verifier == "exact")
