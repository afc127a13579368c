"""Decoding methods: frozen dataclasses whose hyper-parameters are static under ``jit``.

A method only says *what* to do; ``specjax.decoding.loop`` does it. Every method runs through the
same loop (propose -> one target pass -> verify -> commit); ``Autoregressive`` is the loop with no
proposals.
"""

from __future__ import annotations

import dataclasses

from specjax.models.transformer import Transformer, check_model


@dataclasses.dataclass(frozen=True)
class Autoregressive:
  """Plain decoding: one target forward per token."""

  name = "autoregressive"


@dataclasses.dataclass(frozen=True, eq=False)
class Speculative:
  """Draft-then-verify with a smaller draft model (Leviathan et al. 2023, arXiv 2211.17192,
  Algorithm 1; Chen et al. 2023, arXiv 2302.01318).

  The draft proposes ``gamma`` tokens autoregressively, warped with the same ``Sampling`` as the
  target; the target scores all ``gamma + 1`` positions in one forward; the verifier accepts a
  prefix and emits one more token, so each iteration yields 1..gamma+1 tokens per row.
  """

  draft: Transformer
  gamma: int = 4
  name = "speculative"

  def __post_init__(self):
    if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
      raise ValueError(f"gamma must be an integer >= 1, got {self.gamma!r}")
    check_model(self.draft, "draft")
