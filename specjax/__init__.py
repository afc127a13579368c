"""specjax: speculative decoding for JAX/Flax, jit-compiled end to end. See DESIGN.md §2.

The public names are re-exported lazily (PEP 562): ``import specjax`` imports no JAX, so that the
runner refuses a bad config in well under a second and ``specjax.options`` is readable without
JAX; the first use of a name (``sj.generate``) imports its module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module that defines it (a module name alone: the name is that submodule).
_EXPORTS = {
    "Adaptive": "specjax.decoding.adaptive_method", "Autoregressive": "specjax.decoding.methods",
    "Eagle": "specjax.decoding.head_methods", "Hydra": "specjax.decoding.head_methods",
    "Medusa": "specjax.decoding.head_methods", "MTP": "specjax.decoding.head_methods",
    "Jacobi": "specjax.decoding.methods",
    "Lookahead": "specjax.decoding.methods", "PromptLookup": "specjax.decoding.methods",
    "SelfSpeculative": "specjax.decoding.methods", "SpecTr": "specjax.decoding.methods",
    "Speculative": "specjax.decoding.methods", "TreeSpeculative": "specjax.decoding.methods",
    "CostTable": "specjax.costs",
    "GenerateOutput": "specjax.decoding.generate", "compile_generate": "specjax.decoding.generate",
    "generate": "specjax.decoding.generate",
    "DecodeStats": "specjax.decoding.stats",
    "load_head": "specjax.heads.layout", "save_head": "specjax.heads.layout",
    "ModelConfig": "specjax.models.config",
    "load_model": "specjax.models.hf", "load_tokenizer": "specjax.models.hf",
    "save_model": "specjax.models.hf",
    "Transformer": "specjax.models.transformer", "forward": "specjax.models.transformer",
    "init_model": "specjax.models.transformer",
    "Datastore": "specjax.retrieval", "Retrieval": "specjax.retrieval",
    "Sampling": "specjax.sampling",
    "DynamicTree": "specjax.trees", "Tree": "specjax.trees",
    "sharding": "specjax.sharding",
    "training": "specjax.training",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f"module 'specjax' has no attribute {name!r}")
  imported = importlib.import_module(module)
  value = imported if module == f"specjax.{name}" else getattr(imported, name)
  globals()[name] = value  # later lookups skip __getattr__
  return value


def __dir__() -> list[str]:
  return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, eagerly
  from specjax import sharding, training
  from specjax.costs import CostTable
  from specjax.decoding.generate import GenerateOutput, compile_generate, generate
  from specjax.decoding.head_methods import MTP, Eagle, Hydra, Medusa
  from specjax.decoding.adaptive_method import Adaptive
  from specjax.decoding.methods import (Autoregressive, Jacobi, Lookahead, PromptLookup,
                                        SelfSpeculative, SpecTr, Speculative, TreeSpeculative)
  from specjax.decoding.stats import DecodeStats
  from specjax.heads.layout import load_head, save_head
  from specjax.models.config import ModelConfig
  from specjax.models.hf import load_model, load_tokenizer, save_model
  from specjax.models.transformer import Transformer, forward, init_model
  from specjax.retrieval import Datastore, Retrieval
  from specjax.sampling import Sampling
  from specjax.trees import DynamicTree, Tree
