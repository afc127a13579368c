"""The runner's methods, declared once: name -> how it is built, what it sweeps, what it needs,
how many tokens its target pass scores, and how its cost is modelled.

Config validation (``runconfig``), the settings sweep, the runner and the analysis all read
``METHODS``; adding a method to the runner is one ``Method`` entry (plus, for a new kind of tree
or lookahead spec, its grammar below). Importable without JAX: builders import ``specjax``'s
methods when they run, so that a bad config is refused in well under a second.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

from experiments.errors import ConfigError, log
from specjax import options

# ----------------------------------------------------------------------------------- spec grammar

# Tree kinds -> how many sizes their spec takes: full:DxB, chains:NxD, comb:DxW, dynamic:DxWxN,
# spectr / naive: KxL (SpecTr's K chains of L tokens, K-SEQ or the naive rule).
TREE_KINDS = {"full": 2, "chains": 2, "comb": 2, "dynamic": 3, "spectr": 2, "naive": 2}
STATIC_TREE_KINDS = ("full", "chains", "comb")


def parse_tree_spec(spec: str) -> tuple[str, tuple[int, ...], str | None]:
  """``"full:3x2"`` -> ``("full", (3, 2), None)``; a static kind may name how its children are
  drawn (``sj.TreeSpeculative(children=)``): ``"comb:4x4:top_k"`` -> ``("comb", (4, 4),
  "top_k")``. Checked (kinds and sizes: ``TREE_KINDS``; children: ``options.TREE_CHILDREN``)."""
  kind, _, rest = str(spec).partition(":")
  size, _, children = rest.partition(":")
  if kind not in TREE_KINDS:
    raise ConfigError(f"tree spec {spec!r}: unknown kind {kind!r} ({', '.join(TREE_KINDS)})")
  want = "DxWxN" if TREE_KINDS[kind] == 3 else "AxB"
  try:
    sizes = tuple(int(x) for x in size.split("x"))
  except ValueError:
    raise ConfigError(f"tree spec {spec!r}: expected KIND:{want}, e.g. full:3x2") from None
  if len(sizes) != TREE_KINDS[kind] or min(sizes) < 1:
    raise ConfigError(f"tree spec {spec!r}: expected KIND:{want} with sizes >= 1")
  if children and (kind not in STATIC_TREE_KINDS or children not in options.TREE_CHILDREN):
    raise ConfigError(f"tree spec {spec!r}: only static trees ({', '.join(STATIC_TREE_KINDS)}) "
                      f"take a children suffix, one of {', '.join(options.TREE_CHILDREN)}")
  return kind, sizes, children or None


def tree_nodes(spec: str) -> int:
  """Candidates a tree spec verifies per target pass (the cache room it needs)."""
  kind, sizes, _ = parse_tree_spec(spec)
  if kind == "full":
    return sum(sizes[1] ** d for d in range(1, sizes[0] + 1))
  if kind == "dynamic":
    return sizes[2]
  return sizes[0] * sizes[1]  # chains, comb, spectr, naive


def parse_lookahead_spec(spec: str) -> tuple[int, int, int]:
  """``"7x4x7"`` -> ``(window, ngram, guesses)`` = ``(7, 4, 7)``, checked (ngram >= 2)."""
  try:
    sizes = tuple(int(x) for x in str(spec).split("x"))
  except ValueError:
    sizes = ()
  if len(sizes) != 3 or min(sizes) < 1 or sizes[1] < 2:
    raise ConfigError(f"lookahead spec {spec!r}: expected WxNxG (window x n-gram size x guesses, "
                      f"N >= 2), e.g. 7x4x7")
  return sizes


def lookahead_tokens(spec: str) -> int:
  """Tokens a lookahead pass scores besides the pending one: G (N - 1) guesses + the window."""
  window, ngram, guesses = parse_lookahead_spec(spec)
  return (guesses + window) * (ngram - 1) - 1


# --------------------------------------------------------------------------------------- builders


def tree_of(spec: str):
  """(``sj.Tree`` or ``sj.DynamicTree``, children rule or None) of a spec (SpecTr's: its
  chains' tree)."""
  import specjax as sj
  kind, sizes, children = parse_tree_spec(spec)
  if kind == "dynamic":
    return sj.DynamicTree(depth=sizes[0], width=sizes[1], nodes=sizes[2]), None
  if kind in ("spectr", "naive"):
    return sj.Tree.chains(num=sizes[0], depth=sizes[1]), None
  if kind == "full":
    return sj.Tree.full(depth=sizes[0], branching=sizes[1]), children
  if kind == "chains":
    return sj.Tree.chains(num=sizes[0], depth=sizes[1]), children
  # comb: the draft's top-1 chain of depth D with W - 1 extra leaf siblings per depth
  d, w = sizes
  return sj.Tree.from_paths([(0,) * i for i in range(1, d + 1)]
                            + [(0,) * i + (r,) for i in range(d) for r in range(1, w)]), children


def tree_method(spec: str, draft):
  """(label, method, nodes verified per call) for a tree spec (``parse_tree_spec``):
  ``sj.TreeSpeculative`` over a static or dynamic tree, or ``sj.SpecTr`` (K-SEQ / naive)."""
  import specjax as sj
  kind, sizes, _ = parse_tree_spec(spec)
  if kind in ("spectr", "naive"):
    k, length = sizes
    return (f"spectr {'k_seq' if kind == 'spectr' else 'naive'} K={k} L={length}",
            sj.SpecTr(draft, num_drafts=k, gamma=length,
                      selection="k_seq" if kind == "spectr" else "naive"), k * length)
  tree, children = tree_of(spec)
  return (f"tree {spec} ({tree.num_nodes} nodes, depth {tree.max_depth})",
          sj.TreeSpeculative(draft, tree, children=children), tree.num_nodes)


# The sweep of EAGLE heads: every gamma (a chain) and every head_trees spec (a static tree,
# with its children rule, or an EAGLE-2 dynamic tree), one setting each.
HEAD_SWEEP = "gammas+head_trees"
HEAD_TREE_KINDS = STATIC_TREE_KINDS + ("dynamic",)


def parse_head_tree_spec(spec: str):
  """A ``head_trees`` spec: a tree spec (``parse_tree_spec``) of a kind a head can grow."""
  kind, sizes, children = parse_tree_spec(spec)
  if kind not in HEAD_TREE_KINDS:
    raise ConfigError(f"head_trees spec {spec!r}: an EAGLE head grows {', '.join(HEAD_TREE_KINDS)}"
                      f" trees, not {kind!r}")
  return kind, sizes, children


def head_method(s: dict, head):
  """``sj.Eagle`` (``sj.Medusa`` / ``sj.Hydra`` / ``sj.MTP`` for those heads) of setting ``s``
  with ``head``: a chain of ``s["gamma"]`` drafts or the tree of ``s["tree"]`` (``tree_method``'s
  shapes)."""
  import specjax as sj
  from specjax.heads.hydra import HydraHead
  from specjax.heads.medusa import MedusaHead
  from specjax.heads.mtp import MTPHead, MTPStack
  method = (sj.Medusa if isinstance(head, MedusaHead) else
            sj.Hydra if isinstance(head, HydraHead) else
            sj.MTP if isinstance(head, (MTPHead, MTPStack)) else sj.Eagle)
  try:
    lossy = {"verify": "typical"} if s.get("verify") == "typical" else {}
    if s["gamma"] is not None:
      return method(head, gamma=int(s["gamma"]), **lossy)
    tree, children = tree_of(s["tree"])
    return method(head, tree=tree, children=children, **lossy)
  except ValueError as e:  # e.g. a gamma or a tree deeper than the Medusa heads
    raise ConfigError(f"{method.__name__} with {s['gamma'] or s['tree']}: {e}") from None


def head_pass_tokens(config, s: dict) -> int:
  return int(s["gamma"]) if s["gamma"] is not None else tree_nodes(s["tree"])


NO_DATASTORE = "none"  # config.datastore for "suffix" on the rows' own text alone


@functools.lru_cache(maxsize=2)
def load_datastore(path: str):
  import specjax as sj
  t0 = time.perf_counter()
  store = sj.Datastore.load(path)
  log(f"[run] loaded {store} ({time.perf_counter() - t0:.1f}s)")
  return store


def retrieval_method(config, num_tokens: int, per_request: bool = False):
  """``sj.Retrieval`` over ``config.datastore`` (loaded once per directory; ``resolve_datastore``
  has set it; "none": no datastore) with the config's tree sizes: REST, or with ``per_request``
  SuffixDecoding (the rows' own text too, trees capped at ``max_spec_factor`` x the match)."""
  import specjax as sj
  none = config.datastore == NO_DATASTORE
  factor = float(config.max_spec_factor) if per_request and config.max_spec_factor else None
  return sj.Retrieval(None if none else load_datastore(config.datastore), num_tokens=num_tokens,
                      nodes=int(config.retrieval_nodes), branches=int(config.retrieval_branches),
                      max_suffix=int(config.max_suffix), per_request=per_request,
                      max_spec_factor=factor)


def _sj(name: str, **kwargs_of_setting: Callable[[Any, dict, dict], Any]):
  """A builder of ``sj.<name>(**kwargs)``, each kwarg computed from (config, setting, models)."""
  def build(config, s: dict, models: dict):
    import specjax as sj
    return getattr(sj, name)(**{k: f(config, s, models) for k, f in kwargs_of_setting.items()})
  return build


_gamma = lambda config, s, models: int(s["gamma"])


def _hf_assisted(config, s: dict, models: dict) -> dict:
  draft = models["draft"]
  # transformers 5.x reads these three from the *assistant's* generation_config (see
  # candidate_generator.AssistedCandidateGenerator.__init__); the constant schedule and a zero
  # confidence threshold make it draft exactly gamma tokens per iteration, like ours.
  draft.generation_config.num_assistant_tokens = int(s["gamma"])
  draft.generation_config.num_assistant_tokens_schedule = "constant"
  draft.generation_config.assistant_confidence_threshold = 0.0
  return dict(assistant_model=draft, num_assistant_tokens=int(s["gamma"]),
              num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)


# --------------------------------------------------------------------------------------- adaptive

# Method "adaptive" (``sj.Adaptive``): one setting per rule of ``adaptive_rules`` over the menu
# ``adaptive_choices`` of draft lengths of the base method ``adaptive_method``.
ADAPTIVE_SWEEP = "adaptive_rules"
ADAPTIVE_BASES = ("speculative", "self_speculative", "prompt_lookup", "jacobi", "retrieval",
                  "suffix", "tree")
# Tree methods: an entry k is their tree cut to depth k ("tree": config.adaptive_tree's)
TREE_BASES = ("retrieval", "suffix", "tree")
# The runner's rules: sj.Adaptive's, and "checked": the cost rule with its check of its own model
# (``sj.Adaptive(rule="cost", correct=True)``, off by default), so that a run sets the two side
# by side on one table (the cost rule's calibration prices both; ``run.py``).
ADAPTIVE_RULES = options.ADAPTIVE_RULES + ("checked",)
COST_RULES = ("cost", "checked")  # priced by the run's table (calibrated, warmed)
DRAFT_MODEL_BASES = ("speculative", "self_speculative")  # the confidence rule's: a draft's law


def adaptive_menu(choices, rule: str) -> tuple[int, ...]:
  """The menu a rule runs: ``choices``, except that the confidence rule stops its draft at any
  length up to the largest choice, so its menu is every length 1..max (``sj.Adaptive`` asks for
  that; plain decoding, 0, is never its pick)."""
  choices = tuple(int(k) for k in choices)
  return tuple(range(1, max(choices) + 1)) if rule == "confidence" else choices


def adaptive_passes(config, base: str, menu) -> tuple[int, ...]:
  """Each menu entry's candidate tokens (its pass is over them and the pending token): k for a
  chain method's k drafts, a tree method's nodes at depth k (``options.depth_budget``, as
  ``sj.Retrieval.at_depth`` cuts it)."""
  if base not in TREE_BASES:
    return tuple(int(k) for k in menu)
  if base == "tree":  # config.adaptive_tree cut to each depth (sj.Tree / sj.DynamicTree.at_depth)
    tree = tree_of(config.adaptive_tree)[0]
    return tuple(tree.at_depth(int(k)).num_nodes if k else 0 for k in menu)
  return tuple(options.depth_budget(int(k), int(config.retrieval_nodes),
                                    int(config.retrieval_branches)) if k else 0 for k in menu)


def adaptive_draft_widths(config, menu) -> tuple[tuple[int, ...], ...]:
  """Each entry's draft passes, by tokens, of a menu over ``config.adaptive_tree`` (base
  "tree"; ``sj.Tree.draft_pass_widths``): what the cost table prices besides the target pass."""
  tree = tree_of(config.adaptive_tree)[0]
  return tuple(tree.at_depth(int(k)).draft_pass_widths if k else () for k in menu)


def adaptive_table(cost: dict, base: str, temperature: float = 0.0) -> dict | None:
  """The ``CostTable`` (its ``to_dict``) measured for ``base``'s passes in the run's ``cost``
  dict (``timing.measure_run_costs``): at T > 0 the one timed at that sampling
  (``cost["sampled"]``) when there is one; else the chain pair's, the self-draft's, or the
  draft-free one (draft step 0). None when it was not measured."""
  sampled = (cost.get("sampled") or {}).get(f"{float(temperature):g}", {}).get(base)
  if temperature > 0 and sampled:
    return sampled
  where = {"speculative": cost, "tree": cost,
           "self_speculative": cost.get("self_speculative") or {}}
  return where.get(base, cost.get("draft_free") or {}).get("table")


def _adaptive(config, s: dict, models: dict):
  """``sj.Adaptive`` over the base method built by its own entry at the largest choice, with the
  run's measured table for that base (``s["cost_table"]``, set once the costs are measured) and
  the prior ``s["prior"]`` once the warm-up set it (``adaptive_warm``; rule "checked": also the
  check's tally, ``s["prior_tally"]``; and its call's cost over a skipped call's,
  ``s["probe_cost"]``), else ``adaptive_prior``."""
  import specjax as sj
  base = METHODS[s["base"]]
  table = s.get("cost_table")
  tree = s["base_tree"] if base.name == "tree" else s.get("tree")
  return sj.Adaptive(base.build(config, dict(s, method=base.name, tree=tree), models),
                     choices=tuple(s["choices"]),
                     rule="cost" if s["rule"] in COST_RULES else s["rule"],
                     correct=s["rule"] == "checked", prior_tally=s.get("prior_tally"),
                     costs=sj.CostTable.from_dict(table) if table else None,
                     decay=float(config.adaptive_decay),
                     prior=tuple(s.get("prior") or (float(config.adaptive_prior),)),
                     prior_evidence=tuple(s.get("prior_evidence") or (0.0,)),
                     forget=float(config.adaptive_forget),
                     threshold=float(config.adaptive_threshold),
                     margin=float(config.adaptive_margin), drift=str(config.adaptive_drift),
                     probe_every=probe_every(config, s),
                     probe_cost=float(s.get("probe_cost", 0.0)))


def probe_every(config, s: dict) -> int:
  """The call-level skip of adaptive setting ``s`` (``config.adaptive_probe_every``) where it
  applies (``sj.Adaptive``'s ``probe_every``: a cost rule over a draft model, plain decoding on
  the menu), else 0."""
  drafted = s["base"] in DRAFT_MODEL_BASES + ("tree",)
  applies = s["rule"] in COST_RULES and drafted and tuple(s["choices"])[0] == 0
  return int(config.adaptive_probe_every) if applies else 0


# ------------------------------------------------------------------------------------------ table

# How a method's speed is modelled from measured costs (``analysis``): CHAIN, Leviathan et al.'s
# Eq. 1 over a bare draft-chain iteration (the draft's costs measured with the target's; SELF:
# the target with layers skipped, measured apart); TREE, its verification pass in target steps;
# PASS, a draft-free method whose iteration is one pass over [pending, its tokens].
# HEAD, an EAGLE head's iteration: its drafting passes (gamma for a chain, the depth for a tree)
# at the head's measured step cost, then the target's pass over [pending, its tokens].
# ADAPTIVE, ``sj.Adaptive``: per iteration one entry of its menu, each at ``CostTable.entry_cost``
# of its base's table (``adaptive_table``; calibrated: the loop's own), weighed by the histogram.
CHAIN, SELF, TREE, PASS, HEAD, ADAPTIVE = "chain", "self", "tree", "pass", "head", "adaptive"


@dataclasses.dataclass(frozen=True)
class Method:
  """One runner method. ``build(config, setting, models)`` returns the ``sj`` method (``models``:
  role -> the loaded, placed model), or for transformers' methods (``hf``) the extra keyword
  arguments of its ``generate`` (``models``: role -> the torch model)."""

  name: str
  build: Callable[[Any, dict, dict], Any]
  doc: str
  sweep: str | None = None  # config field swept: "gammas" (setting["gamma"]), "trees" or
  # "lookahead" (setting["tree"]), HEAD_SWEEP (either), ADAPTIVE_SWEEP (setting["rule"]); None:
  # one setting per temperature
  role: str = "target"  # the model sj.generate decodes with
  needs_draft: bool = False
  head: str | None = None  # the role of the head it drafts with (config field of that name)
  head_passes: str = "depth"  # a head's passes per iteration: "depth" (EAGLE), "one" (Medusa)
  datastore: str | None = None  # "required" (REST) | "optional" (SuffixDecoding: own text too)
  hf: bool = False  # transformers' generate (torch, one device)
  batch_one: bool = False  # transformers' assisted generation refuses batches
  # Tokens the target's pass scores besides the pending one (0: one token per pass).
  pass_tokens: Callable[[Any, dict], int] = lambda config, s: 0
  cost_model: str | None = None  # CHAIN | SELF | TREE | PASS | HEAD | ADAPTIVE (see above)
  wraps: str | None = None  # config field naming the method it wraps (adaptive_method)
  counterpart: str | None = None  # transformers' method it is compared with (same gamma)


_M = [
    Method("autoregressive", _sj("Autoregressive"), "the target alone, one token per pass",
           counterpart="hf_autoregressive"),
    Method("draft_autoregressive", _sj("Autoregressive"), "the draft alone (its speed: the cost "
           "ratio c from whole runs)", role="draft", needs_draft=True),
    Method("speculative", _sj("Speculative", draft=lambda c, s, m: m["draft"], gamma=_gamma),
           "draft chain + rejection sampling (Leviathan et al. 2023)", sweep="gammas",
           needs_draft=True, pass_tokens=lambda c, s: int(s["gamma"]), cost_model=CHAIN,
           counterpart="hf_assisted"),
    Method("self_speculative", _sj("SelfSpeculative", skip=lambda c, s, m: tuple(c.skip),
                                   gamma=_gamma),
           "the target with layers config.skip left out drafts (Draft & Verify)", sweep="gammas",
           pass_tokens=lambda c, s: int(s["gamma"]), cost_model=SELF),
    Method("tree", lambda c, s, m: tree_method(s["tree"], m["draft"])[1],
           "draft token trees, EAGLE-2 dynamic trees, SpecTr (config.trees specs)", sweep="trees",
           needs_draft=True, pass_tokens=lambda c, s: tree_nodes(s["tree"]), cost_model=TREE),
    Method("prompt_lookup", _sj("PromptLookup", max_ngram=lambda c, s, m: int(c.max_ngram),
                                num_tokens=_gamma),
           "guesses copied from the row's own text (PLD)", sweep="gammas",
           pass_tokens=lambda c, s: int(s["gamma"]), cost_model=PASS,
           counterpart="hf_prompt_lookup"),
    Method("jacobi", _sj("Jacobi", block=_gamma), "the previous pass's own guesses (Santilli et "
           "al. 2023)", sweep="gammas", pass_tokens=lambda c, s: int(s["gamma"]),
           cost_model=PASS),
    Method("lookahead", lambda c, s, m: _lookahead(s["tree"]), "2-D window + n-gram pool (Fu et "
           "al. 2024; config.lookahead WxNxG specs)", sweep="lookahead",
           pass_tokens=lambda c, s: lookahead_tokens(s["tree"]), cost_model=PASS),
    Method("retrieval", lambda c, s, m: retrieval_method(c, int(s["gamma"])),
           "REST: continuations of the longest matching suffix in a datastore", sweep="gammas",
           datastore="required", pass_tokens=lambda c, s: int(c.retrieval_nodes),
           cost_model=PASS),
    Method("suffix", lambda c, s, m: retrieval_method(c, int(s["gamma"]), per_request=True),
           "SuffixDecoding: the datastore and the row's own text", sweep="gammas",
           datastore="optional", pass_tokens=lambda c, s: int(c.retrieval_nodes),
           cost_model=PASS),
    Method("adaptive", _adaptive, "a draft length per iteration from a menu, 0 = plain decoding "
           "(sj.Adaptive over adaptive_method; one setting per adaptive_rules rule)",
           sweep=ADAPTIVE_SWEEP, pass_tokens=lambda c, s: max(s["passes"]),
           cost_model=ADAPTIVE, wraps="adaptive_method"),
    Method("eagle", lambda c, s, m: head_method(s, m["eagle_head"]),
           "EAGLE-1/2 head on the target's final features (chains; head_trees: static and "
           "EAGLE-2 dynamic trees)", sweep=HEAD_SWEEP, head="eagle_head",
           pass_tokens=head_pass_tokens, cost_model=HEAD),
    Method("eagle3", lambda c, s, m: head_method(s, m["eagle3_head"]),
           "EAGLE-3 head: fused low/middle/high features, reduced vocabulary (chains; "
           "head_trees)", sweep=HEAD_SWEEP, head="eagle3_head", pass_tokens=head_pass_tokens,
           cost_model=HEAD),
    Method("mtp", lambda c, s, m: head_method(s, m["mtp_head"]),
           "DeepSeek-V3 MTP module (sj.MTP): an EAGLE-1-shaped head with input norms, its own "
           "final norm, chained on its own output (chains; head_trees)", sweep=HEAD_SWEEP,
           head="mtp_head", pass_tokens=head_pass_tokens, cost_model=HEAD),
    Method("medusa", lambda c, s, m: head_method(s, m["medusa_heads"]),
           "Medusa heads on the target's final state (chains up to the heads; static "
           "head_trees)", sweep=HEAD_SWEEP, head="medusa_heads", head_passes="one",
           pass_tokens=head_pass_tokens, cost_model=HEAD),
    Method("hydra", lambda c, s, m: head_method(s, m["hydra_heads"]),
           "Hydra heads: Medusa's, each also reading the candidate's path (chains up to the "
           "heads; static head_trees)", sweep=HEAD_SWEEP, head="hydra_heads",
           pass_tokens=head_pass_tokens, cost_model=HEAD),
    Method("hf_autoregressive", lambda c, s, m: {}, "transformers' greedy/sampling generate",
           hf=True),
    Method("hf_assisted", _hf_assisted, "transformers' assisted generation with the same draft",
           sweep="gammas", needs_draft=True, hf=True, batch_one=True),
    Method("hf_prompt_lookup", lambda c, s, m: dict(prompt_lookup_num_tokens=int(s["gamma"]),
                                                    max_matching_ngram_size=int(c.max_ngram)),
           "transformers' prompt lookup (its PromptLookupCandidateGenerator)", sweep="gammas",
           hf=True, batch_one=True),
]
METHODS: dict[str, Method] = {m.name: m for m in _M}


def _lookahead(spec: str):
  import specjax as sj
  w, n, g = parse_lookahead_spec(spec)
  return sj.Lookahead(window=w, ngram=n, guesses=g)


def base_of(config, name: str) -> Method:
  """The entry whose model roles ``name`` needs: the method it wraps (adaptive), else its own."""
  entry = METHODS[name]
  return METHODS[config[entry.wraps]] if entry.wraps else entry


def named(**fields) -> tuple[str, ...]:
  """The names of the methods whose fields equal ``fields`` (e.g. ``named(hf=True)``)."""
  return tuple(m.name for m in _M if all(getattr(m, k) == v for k, v in fields.items()))
