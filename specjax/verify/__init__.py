"""Exact acceptance rules over probability arrays; no model code (see ALGORITHMS.md).

Each function verifies ONE row; ``jax.vmap`` them over rows with one key per row.
"""

from specjax.verify.greedy import greedy_chain
from specjax.verify.tree import TreeVerdict, greedy_tree, sampled_tree, tree_core
from specjax.verify.rejection import (
    ChainCore,
    ChainVerdict,
    acceptance_ratio,
    chain_core,
    deterministic_chain,
    deterministic_core,
    deterministic_q,
    rejection_chain,
    residual,
)

__all__ = [
    "ChainCore",
    "ChainVerdict",
    "TreeVerdict",
    "acceptance_ratio",
    "chain_core",
    "deterministic_chain",
    "deterministic_core",
    "deterministic_q",
    "greedy_chain",
    "greedy_tree",
    "rejection_chain",
    "residual",
    "sampled_tree",
    "tree_core",
]
