"""Decoding methods whose proposer is a trained head on the target's own hidden states: EAGLE
(``Eagle``), DeepSeek-V3's MTP modules (``MTP``), Medusa (``Medusa``) and Hydra (``Hydra``).
Same protocol as ``specjax.decoding.methods``."""

from __future__ import annotations

import dataclasses

from flax import nnx

from specjax.decoding.methods import check_count, check_guesses, check_ranks, tree_children
from specjax.heads.eagle import EagleHead
from specjax.heads.eagle3 import Eagle3Head
from specjax.heads.layout import check_head
from specjax.heads.hydra import HydraHead
from specjax.heads.medusa import MedusaHead, check_medusa
from specjax.heads.mtp import MTPHead, MTPStack
from specjax.models.transformer import Transformer
from specjax.proposers.eagle import EagleChain, EagleDynamicTree, EagleTree
from specjax.proposers.hydra import HydraTree
from specjax.proposers.medusa import MedusaChain, MedusaTree
from specjax.proposers.mtp import MTPStackChain
from specjax.trees import DynamicTree, Tree
from specjax.verify.typical import Typical

VERIFIERS = ("exact", "typical")


def head_graphs(head, target: Transformer) -> tuple[dict, tuple]:
  """(the graph definitions and feature layers every head proposer takes, its params ``(head
  state, target state)``: the target's arrays are the loop's own buffers)."""
  head_graphdef, head_state = nnx.split(head)
  target_graphdef, target_state = nnx.split(target)
  return (dict(head_graphdef=head_graphdef, target_graphdef=target_graphdef,
               features=head.target_features(target.config)), (head_state, target_state))


@dataclasses.dataclass(frozen=True, eq=False)
class Eagle:
  """EAGLE (Li et al. 2024, arXiv 2401.15077; EAGLE-2 trees, arXiv 2406.16858): a small head
  drafts on the target's own features (its last hidden state after the final norm), the
  target's LM head turning its guesses into draft logits.

  ``gamma``: a chain of that many drafts (default 4), verified by the exact chain rule
  (ALGORITHMS.md §1-3: drafts sampled from the head's warped law at T > 0, greedy drafts matched
  at T = 0); or ``tree``: a static ``sj.Tree`` whose ``children`` are ``"sampled"`` (default:
  without replacement from the head's warped law, the recursive rule §5), ``"top_k"`` (one-hot
  rule §4) or ``"iid"``, or an ``sj.DynamicTree`` (EAGLE-2: the head's top-k, reranked per row
  by confidence; one-hot rule). ``head``: an EAGLE-1/2 ``specjax.heads.eagle.EagleHead`` or an
  EAGLE-3 ``specjax.heads.eagle3.Eagle3Head`` (Li et al. 2025, arXiv 2503.01840: fused low/middle/
  high target features, its own reduced-vocabulary LM head, its q exactly 0 outside that
  vocabulary), e.g. from ``sj.load_head``. The target must be an ``sj.Transformer`` whose hidden
  size and vocabulary the head shares.
  """

  head: EagleHead | Eagle3Head
  gamma: int | None = None
  tree: Tree | DynamicTree | None = None
  children: str | None = None  # None: "sampled" for a static tree, "top_k" for a dynamic one
  name = "eagle"

  HEADS = (EagleHead, Eagle3Head)
  WHAT = "an EAGLE-1/2 or EAGLE-3 head (sj.load_head)"

  def __post_init__(self):
    if not isinstance(self.head, self.HEADS):
      raise ValueError(f"head must be {self.WHAT}, got "
                       f"{type(self.head).__name__}")
    if self.tree is None:
      object.__setattr__(self, "gamma", 4 if self.gamma is None else self.gamma)
      check_count(self.gamma, "gamma", "drafts per iteration")
      return
    if self.gamma is not None:
      raise ValueError(f"give gamma (a chain) or tree, not both: gamma={self.gamma!r}")
    object.__setattr__(self, "children", tree_children(self.tree, self.children, "head"))
    object.__setattr__(self, "gamma", self.tree.max_depth)  # the most accepted per iteration

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    del width, max_new_tokens, what  # the head's cache is sized like the target's
    if not isinstance(target, Transformer):
      raise ValueError(f"{self.name.upper()} drafts on an sj.Transformer target's features, "
                       f"got {type(target).__name__}")
    check_head(self.head, target)
    check_guesses(self.gamma, "gamma", target)
    if self.tree is not None:
      check_ranks(self.tree, target.config.vocab_size)

  def proposer(self, target: Transformer):
    graphs, params = head_graphs(self.head, target)
    if self.tree is None:
      proposer = EagleChain(**graphs, gamma=self.gamma)
    elif isinstance(self.tree, DynamicTree):
      proposer = EagleDynamicTree(**graphs, spec=self.tree)
    else:
      proposer = EagleTree(**graphs, tree=self.tree, children=self.children)
    return proposer, params


@dataclasses.dataclass(frozen=True, eq=False)
class MTP(Eagle):
  """DeepSeek-V3's multi-token prediction (DeepSeek-AI 2024, arXiv 2412.19437 §2.2) as a drafter.

  ``sj.MTP(module, gamma=...)`` chains one MTP module (``specjax.heads.mtp.MTPHead``, e.g. from
  ``sj.load_head`` of a checkpoint with ``num_nextn_predict_layers: 1``) ``gamma`` times on its
  own output, as vLLM does with one module; its first step reads the target's final-norm state.
  The module is an EAGLE-1 head with input norms and its own final norm, so everything else is
  ``Eagle``'s: ``gamma`` (default 4) or a static ``tree`` / ``sj.DynamicTree`` with ``children``,
  the same proposers, verifiers and exactness.

  ``sj.MTP(stack, gamma=...)`` with an ``MTPStack`` of ``D`` modules (``num_nextn_predict_layers:
  D``) drafts DeepSeek's way: draft ``k`` from module ``k`` (``specjax.proposers.mtp``), so
  ``gamma <= D`` (default D), chains only.
  The target must be an ``sj.Transformer`` with the modules' hidden size and vocabulary and
  ``N`` layers (module ``k`` is checkpoint layer ``N + k - 1``).
  """

  head: MTPHead | MTPStack
  name = "mtp"

  HEADS = (MTPHead, MTPStack)
  WHAT = "an MTP module or stack (sj.load_head of a checkpoint with num_nextn_predict_layers)"

  def __post_init__(self):
    if not isinstance(self.head, MTPStack):
      super().__post_init__()
      return
    d = self.head.num_modules
    if self.tree is not None:
      raise ValueError(f"a stack of {d} MTP modules drafts a chain (gamma <= {d}), not a tree; "
                       f"trees chain one module on itself: sj.MTP(stack.modules[0], tree=...)")
    gamma = d if self.gamma is None else self.gamma
    check_count(gamma, "gamma", "drafts per iteration")
    if gamma > d:
      raise ValueError(f"gamma {gamma} exceeds the stack's {d} MTP modules (module k drafts the "
                       f"k-th token)")
    object.__setattr__(self, "gamma", gamma)

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    if not isinstance(self.head, MTPStack):
      super().validate(target, width, max_new_tokens, what)
      return
    if not isinstance(target, Transformer):
      raise ValueError(f"MTP drafts on an sj.Transformer target's features, got "
                       f"{type(target).__name__}")
    for module in self.head.modules:
      check_head(module, target)
    check_guesses(self.gamma, "gamma", target)

  def proposer(self, target: Transformer):
    if not isinstance(self.head, MTPStack):
      return super().proposer(target)
    graphs, params = head_graphs(self.head, target)
    return MTPStackChain(**graphs, gamma=self.gamma), params


@dataclasses.dataclass(frozen=True, eq=False)
class Medusa:
  """Medusa (Cai et al. 2024, arXiv 2401.10774): ``K`` heads on the target's normed last hidden
  state guess the next ``K`` tokens at once (``specjax.heads.medusa``; ``sj.load_head`` reads
  the released ``medusa_lm_head`` files).

  ``gamma``: a chain of the first ``gamma`` heads' guesses (default: all K heads); or ``tree``:
  a static ``sj.Tree`` of depth <= K whose depth-``d`` nodes are head ``d``'s candidates
  (Medusa's Cartesian top-k pruned by a path list: ``sj.Tree.medusa(name)`` for the released
  ones, ``sj.Tree.from_accuracies`` for the paper's greedy construction), ``children``
  ``"sampled"`` (default: without replacement from the head's warped law, verified by the
  recursive rule, ALGORITHMS.md §5), ``"top_k"`` (one-hot rule, §4) or ``"iid"``.

  ``verify``: ``"exact"`` (default, lossless) or ``"typical"``: Medusa's typical acceptance
  (§2.3.1, ``epsilon``/``delta``, ALGORITHMS.md §11), which is **lossy** at T > 0 (its runs
  carry ``DecodeStats.verifier`` = its label); its tree children default to the heads' top-k,
  as in the Medusa repository.
  """

  heads: MedusaHead
  gamma: int | None = None
  tree: Tree | None = None
  children: str | None = None
  verify: str = "exact"
  epsilon: float = 0.09
  delta: float = 0.3
  name = "medusa"

  HEADS = MedusaHead

  def __post_init__(self):
    if not isinstance(self.heads, self.HEADS):
      raise ValueError(f"heads must be {self.name.capitalize()} heads (sj.load_head of a "
                       f"{self.name.capitalize()} directory, or specjax.heads.{self.name}."
                       f"init_{self.name}), got {type(self.heads).__name__}")
    if self.verify not in VERIFIERS:
      raise ValueError(f"verify must be one of {VERIFIERS}, got {self.verify!r}")
    Typical(self.epsilon, self.delta)  # checks them
    k = self.heads.num_heads
    if self.tree is None:
      object.__setattr__(self, "gamma", k if self.gamma is None else self.gamma)
      check_count(self.gamma, "gamma", "drafts per iteration")
      if self.gamma > k:
        raise ValueError(f"gamma {self.gamma} exceeds the {k} {self.name.capitalize()} heads (one "
                       f"per draft)")
      return
    if self.gamma is not None:
      raise ValueError(f"give gamma (a chain) or tree, not both: gamma={self.gamma!r}")
    if isinstance(self.tree, DynamicTree):
      raise ValueError(f"{self.name.capitalize()} drafts a static sj.Tree, got an "
                       f"sj.DynamicTree")
    children = self.children
    if children is None and self.verify == "typical":
      children = "top_k"
    object.__setattr__(self, "children", tree_children(self.tree, children, "heads"))
    if self.tree.max_depth > k:
      raise ValueError(f"the tree's depth {self.tree.max_depth} exceeds the {k} "
                       f"{self.name.capitalize()} heads (one per depth)")
    object.__setattr__(self, "gamma", self.tree.max_depth)

  @property
  def typical(self) -> Typical | None:
    """The lossy verifier's parameters, None for the exact rules."""
    return Typical(self.epsilon, self.delta) if self.verify == "typical" else None

  def validate(self, target: Transformer, width: int, max_new_tokens: int, what: str) -> None:
    del width, max_new_tokens, what
    if not isinstance(target, Transformer):
      raise ValueError(f"{self.name.capitalize()} heads read an sj.Transformer target's hidden "
                       f"state, got {type(target).__name__}")
    check_medusa(self.heads, target)
    check_guesses(self.gamma if self.tree is None else self.tree.num_nodes, "candidates", target)
    if self.tree is not None:
      check_ranks(self.tree, target.config.vocab_size)

  def proposer(self, target: Transformer):
    graphs, params = head_graphs(self.heads, target)
    if self.tree is None:
      proposer = MedusaChain(**graphs, gamma=self.gamma, typical=self.typical)
    else:
      proposer = MedusaTree(**graphs, tree=self.tree, children=self.children,
                            typical=self.typical)
    return proposer, params


@dataclasses.dataclass(frozen=True, eq=False)
class Hydra(Medusa):
  """Hydra (Ankner et al. 2024, arXiv 2402.05109): Medusa heads made sequentially dependent,
  head ``k`` also reading the embeddings of the candidate's path (``specjax.heads.hydra``;
  ``sj.load_head`` reads the released ``hydra_lm_head`` files). The same arguments as ``Medusa``:
  ``gamma`` (a chain of the first ``gamma`` heads, each drawn given the ones before) or a static
  ``tree`` whose children at depth ``d`` come from head ``d`` given their parent's path,
  ``children``, and the lossy ``verify="typical"`` option. Drafting costs one small pass of a
  head per depth; heads with Hydra++'s prefix layer (``init_hydra(prefix_layer=True)``, the
  repository's ``prefix-mlp`` files) add one pass of that layer per iteration over the accepted
  positions (``proposers.hydra``)."""

  heads: HydraHead
  name = "hydra"
  HEADS = HydraHead

  def proposer(self, target: Transformer):
    graphs, params = head_graphs(self.heads, target)
    tree = self.tree if self.tree is not None else Tree.chains(num=1, depth=self.gamma)
    children = self.children or ("top_k" if self.verify == "typical" else "sampled")
    return HydraTree(**graphs, tree=tree, children=children, typical=self.typical,
                     prefix=self.heads.has_prefix), params
