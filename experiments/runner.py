"""Runs one setting of an experiment on one batch (specjax's ``generate`` or transformers'), and
sums the calls' ``DecodeStats``."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from experiments import runconfig
from experiments.methods import METHODS
from experiments.models import Models


HF_PAD = 0  # transformers' left padding (masked out; any id works)


class Runner:
  """Runs one setting on one batch; returns (seconds, tokens int32[B, N] with -1 padding, stats)."""

  def __init__(self, config, models: Models, prompt_width: int):
    import jax
    import specjax as sj
    self.jax, self.sj = jax, sj
    self.config = config
    self.models = models
    self.prompt_width = prompt_width  # every batch padded alike: one compilation per setting
    self.eos = None
    if config.stop_at_eos:
      self.eos = getattr(models.tokenizer, "eos_token_id", None)
    self.methods = {}
    self.meshes = {}  # mesh spec -> jax Mesh
    self.placed = {"": models.sj}  # mesh spec -> {role: the model placed on that mesh}

  def mesh(self, spec: str):
    """The mesh of a ``meshes`` entry (None for "": one device)."""
    if spec and spec not in self.meshes:
      from specjax import sharding
      data, model = runconfig.parse_mesh_spec(spec)
      self.meshes[spec] = sharding.make_mesh(data, model)  # run_experiment checked the size
    return self.meshes.get(spec)

  def models_on(self, spec: str) -> dict:
    """The models placed on mesh ``spec`` (copies: the one-device models stay where they are)."""
    if spec not in self.placed:
      from flax import nnx

      from specjax import sharding
      mesh, placed = self.mesh(spec), {}
      for role, model in self.models.sj.items():
        rules = (sharding.REPLICATED if role == "draft" and
                 self.config.draft_sharding == "replicated" else sharding.RULES)
        placed[role] = sharding.shard_model(nnx.clone(model), mesh, rules, role)
      self.placed[spec] = placed
    return self.placed[spec]

  def method(self, s: dict):
    """(role, sj method) of setting ``s``: its ``METHODS`` entry built once per (sweep value,
    mesh) on the models placed on that mesh, and per temperature for an adaptive setting (its
    cost table is the one timed at its temperature; calibrated or not) and per prior
    (``adaptive_warm``: the warm-up's estimates and the check's tally; traced: the same loop)."""
    table = s.get("cost_table")
    key = (s["method"], s["gamma"], s.get("tree"), s.get("mesh", ""), s.get("rule"),
           None if table is None else (s["temperature"], str(table.get("loop"))),
           tuple(s.get("prior") or ()), tuple(s.get("prior_evidence") or ()),
           str(s.get("prior_tally")), s.get("probe_cost"))
    if key not in self.methods:
      entry = METHODS[s["method"]]
      self.methods[key] = (entry.role,
                           entry.build(self.config, s, self.models_on(s.get("mesh", ""))))
    return self.methods[key]

  def _generate_args(self, s: dict, batch: list[list[int]], key_seed: tuple[int, int]):
    """``sj.generate``'s (args, kwargs) for setting ``s`` on ``batch``."""
    jax, sj = self.jax, self.sj
    role, method = self.method(s)
    sampling = sj.Sampling(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"])
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.config.seed), key_seed[0]),
                             key_seed[1])
    mesh = s.get("mesh", "")
    return (self.models_on(mesh)[role], batch), dict(
        method=method, sampling=sampling, max_new_tokens=int(self.config.max_new_tokens),
        key=key, eos_token_id=self.eos, prompt_width=self.prompt_width, mesh=self.mesh(mesh),
        draft_sharding=self.config.draft_sharding if mesh else "rules")

  def calibrate(self, s: dict, batch: list[list[int]]) -> dict:
    """Adaptive setting ``s``'s cost table priced by its own loop on ``batch``
    (``sj.Adaptive.calibrated``, ``config.adaptive_calibration`` repeats: each menu entry's
    iteration timed in the loop held there), as ``CostTable.to_dict``; at the run's arguments
    but EOS (every row decodes its budget: without ``stop_at_eos`` the run reuses the loop)."""
    (model, prompts), kwargs = self._generate_args(s, batch, (0, 0))
    method, sampling = kwargs.pop("method"), kwargs.pop("sampling")
    del kwargs["eos_token_id"]
    calibrated = method.calibrated(model, prompts, sampling=sampling,
                                   repeats=int(self.config.adaptive_calibration), **kwargs)
    return calibrated.costs.to_dict()

  def memory(self, s: dict, batch: list[list[int]]) -> dict | None:
    """Bytes per device of the setting's compiled loop (``sj.compile_generate``: after the
    warm-up a cache hit, no second compilation)."""
    if METHODS[s["method"]].hf:
      return None
    args, kwargs = self._generate_args(s, batch, (0, 0))
    stats = self.sj.compile_generate(*args, **kwargs).memory_analysis()
    if stats is None:
      return None
    return {"argument_bytes": int(stats.argument_size_in_bytes),
            "output_bytes": int(stats.output_size_in_bytes),
            "temp_bytes": int(stats.temp_size_in_bytes),
            "alias_bytes": int(stats.alias_size_in_bytes)}

  def __call__(self, s: dict, batch: list[list[int]], key_seed: tuple[int, int]):
    if METHODS[s["method"]].hf:
      return self._hf(s, batch, key_seed)
    jax, sj = self.jax, self.sj
    args, kwargs = self._generate_args(s, batch, key_seed)
    if self.skips_draft(s, batch):
      return self._skip_cycle(s, args, kwargs)
    t0 = time.perf_counter()
    out = sj.generate(*args, **kwargs)
    jax.block_until_ready(out.tokens)
    seconds = time.perf_counter() - t0
    return seconds, np.asarray(out.tokens), out.stats

  def skips_draft(self, s: dict, batch: list[list[int]]) -> bool:
    """Whether setting ``s``'s next call on ``batch`` skips its draft (``sj.Adaptive``'s
    ``skips_draft``; False for every other method)."""
    if METHODS[s["method"]].hf:
      return False
    skips = getattr(self.method(s)[1], "skips_draft", None)
    return skips is not None and skips(len(batch), int(self.config.max_new_tokens))

  def _skip_cycle(self, s: dict, args, kwargs):
    """A call of an adaptive setting whose estimates skip the draft (``sj.Adaptive``'s
    ``probe_every``), timed as what a user's run of such calls is: ``probe_every - 1`` calls
    of plain decoding, the draft skipped, then the probe (the rule), each call starting from the
    last's ``warmed`` state. Returns the probe's tokens and stats with the cycle's seconds per
    token (its seconds scaled by the probe's share of its tokens); ``s["draft_skips"]`` counts
    [skipped calls, calls]."""
    jax, sj = self.jax, self.sj
    method, seconds, made = kwargs.pop("method"), 0.0, 0
    while True:
      t0 = time.perf_counter()
      out = sj.generate(*args, method=method, **kwargs)
      jax.block_until_ready(out.tokens)
      seconds += time.perf_counter() - t0
      tokens = np.asarray(out.tokens)
      emitted = int(np.sum(tokens >= 0))
      made += emitted
      counts = s.setdefault("draft_skips", [0, 0])
      counts[0] += int(out.stats.draft_skipped)
      counts[1] += 1
      if not out.stats.draft_skipped:  # the probe ends the cycle
        return seconds * emitted / max(made, 1), tokens, out.stats
      method = method.warmed(out.stats)

  def _hf(self, s: dict, batch: list[list[int]], key_seed: tuple[int, int]):
    """transformers' generate on ``batch``, left-padded (its convention for decoder-only
    batches), with the EOS handling of ours: stop at the tokenizer's EOS (``stop_at_eos``) or
    decode through every EOS (never ``min_new_tokens``, which forbids EOS where ours emits it)."""
    import torch
    target = self.models.hf["target"]
    n = int(self.config.max_new_tokens)
    # On the model's own generation config: one passed to generate() has its unset (None)
    # fields filled back from the model's (transformers 5), EOS included.
    target.generation_config.eos_token_id = self.eos
    kwargs: dict[str, Any] = dict(max_new_tokens=n, pad_token_id=HF_PAD)
    if s["temperature"] > 0:
      kwargs.update(do_sample=True, temperature=s["temperature"], top_k=s["top_k"],
                    top_p=s["top_p"])
      torch.manual_seed(hash(key_seed) % (1 << 31) + self.config.seed)
    else:
      kwargs.update(do_sample=False)
    kwargs.update(METHODS[s["method"]].build(self.config, s, self.models.hf))
    width = max(len(p) for p in batch)
    ids = torch.tensor([[HF_PAD] * (width - len(p)) + list(p) for p in batch], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], dtype=torch.long)
    t0 = time.perf_counter()
    with torch.no_grad():
      out = target.generate(ids, attention_mask=mask, **kwargs)
    seconds = time.perf_counter() - t0
    new = out[:, width:].numpy().astype(np.int32)
    tokens = np.full((len(batch), n), -1, np.int32)
    tokens[:, :new.shape[1]] = new[:, :n]
    if self.eos is not None:  # a finished row's later columns are transformers' padding: ours
      is_eos = tokens == self.eos  # mark them -1 (nothing generated)
      tokens[np.cumsum(is_eos, axis=1) - is_eos > 0] = -1
    return seconds, tokens, None


class StatsSum:
  """Sums ``sj.DecodeStats`` over calls, so that rates are exact ratios of totals."""

  def __init__(self):
    self.n = 0
    self.sums: dict[str, Any] = {}

  def add(self, stats) -> None:
    if stats is None:
      return
    self.n += 1
    fields = dict(rows=np.size(stats.generated),
                  target_calls=stats.target_calls, draft_calls=stats.draft_calls,
                  row_target_calls=np.sum(stats.row_target_calls),
                  generated=np.sum(stats.generated), proposed=np.sum(stats.proposed),
                  accepted=np.sum(stats.accepted), alpha_sum=stats.alpha_sum,
                  alpha_count=stats.alpha_count,
                  accepted_per_position=stats.accepted_per_position,
                  proposed_per_position=stats.proposed_per_position,
                  accepted_length_counts=stats.accepted_length_counts,
                  choice_counts=stats.choice_counts)  # int32[K]: sj.Adaptive's; K = 0 else
    for k, v in fields.items():
      v = np.asarray(v, np.float64)
      self.sums[k] = self.sums[k] + v if k in self.sums else v

  def summary(self) -> dict:
    nan = float("nan")
    if not self.n:
      return dict(acceptance_rate=nan, expected_alpha=nan, tokens_per_target_call=nan,
                  tokens_per_iteration=nan, row_utilisation=nan,
                  acceptance_by_position=[], accepted_length_histogram=[], target_calls=None,
                  draft_calls=None)
    s = self.sums
    div = lambda a, b: float(a) / float(b) if float(b) else nan
    by_pos = [div(a, p) for a, p in zip(s["accepted_per_position"], s["proposed_per_position"])]
    return dict(acceptance_rate=div(s["accepted"], s["proposed"]),
                expected_alpha=div(s["alpha_sum"], s["alpha_count"]),
                tokens_per_target_call=div(s["generated"], s["row_target_calls"]),
                # Without the prefill (one call, one token per row): the iterations of Eq. 1.
                tokens_per_iteration=div(s["generated"] - s["rows"],
                                         s["row_target_calls"] - s["rows"]),
                # Candidates the target verified per iteration (gamma; a tree's node count).
                nodes_per_call=div(s["proposed"], s["row_target_calls"] - s["rows"]),
                acceptance_by_position=by_pos,
                # Share of row-iterations that accepted exactly n drafts, n = 0..gamma.
                accepted_length_histogram=[div(c, sum(s["accepted_length_counts"]))
                                           for c in s["accepted_length_counts"]],
                # Busy rows per loop iteration / batch size: a batch iterates until its slowest
                # row is done, so ragged acceptance leaves rows idle (1.0 = none ever idle).
                row_utilisation=div(s["row_target_calls"] - s["rows"],
                                    (s["target_calls"] - self.n) * s["rows"] / self.n),
                target_calls=int(s["target_calls"]) // self.n,
                draft_calls=int(s["draft_calls"]) // self.n,
                proposed=int(s["proposed"]) // self.n, accepted=int(s["accepted"]) // self.n,
                # Loop iterations of every call (prefills out), and the tokens a row got from
                # them: what an adaptive setting's histogram of choices is weighed against.
                iterations=int(s["target_calls"]) - self.n,
                new_tokens_per_row=div(s["generated"] - s["rows"], s["rows"]),
                calls=self.n, **({"choice_counts": [int(c) for c in s["choice_counts"]]}
                                 if np.size(s["choice_counts"]) else {}))
