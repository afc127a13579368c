"""The draft of self-speculative decoding: the target with some layers left out (Draft & Verify,
Zhang et al. 2023, arXiv 2309.08168; SWIFT, Xia et al. 2024, arXiv 2410.06916)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from flax import nnx

from specjax.models.transformer import Transformer


def skip_layers(model: Transformer, skip: Sequence[int]) -> Transformer:
  """``model`` with the layers ``skip`` left out: the residual stream passes them by unchanged.

  The draft of self-speculative decoding (Draft & Verify, Zhang et al. 2023, arXiv 2309.08168;
  SWIFT, Xia et al. 2024, arXiv 2410.06916). A view, not a copy: new module objects holding the
  very variables of ``model`` (kept blocks, embeddings, final norm, head; a value set through one
  is set in the other), whose ``config.num_layers`` counts the kept layers, so that a cache for
  it has one buffer per kept layer. The config does not record which layers were kept: no layer
  depends on its index, so every skip set of one size has the same graph definition (one
  compilation for all of them). A per-layer setting travels in the config: Gemma's
  ``layer_types`` keeps the kept layers' kinds (sets that keep the same kinds in the same order
  share a compilation). Others (Qwen2's ``max_window_layers``, GPT-2's
  ``scale_attn_by_inverse_layer_idx``; both refused on load today) would have to as well.
  """
  check_skip(skip, model.config.num_layers)
  skip = {int(i) for i in skip}
  view = nnx.merge(*nnx.split(model))
  kept = [i for i in range(model.config.num_layers) if i not in skip]
  view.layers = nnx.List([view.layers[i] for i in kept])
  view.config = model.config.keep_layers(kept)
  return view


def check_skip(skip: Sequence[int], num_layers: int) -> None:
  """Raises unless ``skip`` names distinct layers in ``[0, num_layers)`` and keeps at least one."""
  for i in skip:
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < num_layers:
      raise ValueError(f"skip index {i!r} is not a layer of the {num_layers}-layer target "
                       f"(indices 0..{num_layers - 1})")
  skip = tuple(int(i) for i in skip)
  twice = [i for j, i in enumerate(skip) if i in skip[:j]]
  if twice:
    raise ValueError(f"skip lists layer {twice[0]} twice: {skip}")
  if len(skip) == num_layers:
    raise ValueError(f"skip {skip} leaves none of the target's {num_layers} layers")
