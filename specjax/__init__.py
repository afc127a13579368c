"""specjax: speculative decoding for JAX/Flax, jit-compiled end to end. See DESIGN.md §2."""

from specjax import sharding
from specjax.decoding.generate import GenerateOutput, compile_generate, generate
from specjax.decoding.methods import (Autoregressive, Jacobi, Lookahead, PromptLookup,
                                      SelfSpeculative, SpecTr, Speculative, TreeSpeculative)
from specjax.decoding.stats import DecodeStats
from specjax.models.config import ModelConfig
from specjax.models.hf import load_model, load_tokenizer, save_model
from specjax.models.transformer import Transformer, forward, init_model
from specjax.retrieval import Datastore, Retrieval
from specjax.sampling import Sampling
from specjax.trees import DynamicTree, Tree

__all__ = [
    "Autoregressive", "Datastore", "DecodeStats", "DynamicTree", "GenerateOutput", "Jacobi",
    "Lookahead", "ModelConfig", "PromptLookup", "Retrieval", "Sampling", "SelfSpeculative",
    "SpecTr", "Speculative", "Transformer", "Tree", "TreeSpeculative", "compile_generate",
    "forward", "generate", "init_model", "load_model", "load_tokenizer", "save_model", "sharding",
]
