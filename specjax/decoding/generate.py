"""``sj.generate``: validates at the API boundary, then runs the jitted loop."""

from __future__ import annotations

import inspect
import warnings
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import sharding as sharding_lib
from specjax.decoding import loop
from specjax.decoding.methods import Autoregressive, Speculative, TreeSpeculative
from specjax.decoding.stats import DecodeStats
from specjax.models.transformer import Transformer, check_context, check_model
from specjax.proposers.base import num_extra
from specjax.sampling import Sampling

PROMPT_BUCKET = 16  # prompts are right-padded to a multiple of this, to share compilations


@flax.struct.dataclass
class GenerateOutput:
  tokens: jax.Array  # int32[B, max_new_tokens]; -1 past each row's length
  lengths: jax.Array  # int32[B]
  stats: DecodeStats


def pad_prompts(prompts, vocab_size: int, bucket: int = PROMPT_BUCKET, width: int | None = None):
  """Ragged prompts -> (int32[B, P] right-padded with 0, int32[B] lengths), validated.

  P is ``width`` (default: the longest prompt) rounded up to a multiple of ``bucket``."""
  if isinstance(prompts, (np.ndarray, jax.Array)):
    arr = np.asarray(prompts)
    if arr.ndim != 2:
      raise ValueError(f"prompts array must be [batch, length], got shape {arr.shape}")
    rows = list(arr)
  else:
    rows = [np.asarray(r) for r in prompts]
  if not rows:
    raise ValueError("prompts is empty: give at least one prompt")
  for i, r in enumerate(rows):
    if r.ndim != 1 or r.size == 0:
      raise ValueError(f"prompt {i} is empty (or not a flat list of token ids); every prompt needs "
                       f"at least one token")
    if not np.issubdtype(r.dtype, np.integer):
      raise ValueError(f"prompt {i} holds {r.dtype} values; token ids must be integers")
    bad = r[(r < 0) | (r >= vocab_size)]
    if bad.size:
      raise ValueError(f"prompt {i}: token id {int(bad[0])} is outside the vocabulary "
                       f"[0, {vocab_size})")
  lengths = np.array([r.size for r in rows], np.int32)
  longest = int(lengths.max())
  if width is None:
    width = longest
  elif isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < longest:
    raise ValueError(f"prompt_width must be an integer >= the longest prompt ({longest} tokens), "
                     f"got {width!r}")
  width = -(-int(width) // bucket) * bucket
  padded = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    padded[i, :r.size] = r
  return padded, lengths


def generate(
    model: Transformer,
    prompts: Sequence[Sequence[int]] | np.ndarray | jax.Array,
    method: Autoregressive | Speculative | TreeSpeculative = Autoregressive(),
    sampling: Sampling = Sampling(temperature=0.0),
    max_new_tokens: int = 32,
    key: jax.Array | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    prompt_width: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    sharding_rules: sharding_lib.Rules | None = None,
    draft_sharding: str = "rules",
) -> GenerateOutput:
  """Generates up to ``max_new_tokens`` per prompt with ``method``; see DESIGN.md §2.

  ``sampling`` defaults to greedy. A row stops at the first ``eos_token_id`` (emitted, then the
  row is finished) or after ``max_new_tokens``; ``None`` means no EOS stopping. Compiled once per
  (models, method, sampling, batch size, padded prompt width, max_new_tokens, eos ids). Prompts
  are right-padded to the next multiple of 16 at or above the longest prompt, or above
  ``prompt_width`` when given (at least the longest prompt; ``prompt_width + max_new_tokens`` must
  fit the model's context), so that batches of different prompt lengths share one compilation.
  Padded columns are masked out of attention.

  ``mesh`` (axes ``("data", "model")``, ``specjax.sharding.make_mesh``) runs the same loop
  sharded: the target's weights and KV cache split by ``sharding_rules`` (default
  ``specjax.sharding.RULES``: heads, kv heads, MLP units and vocabulary over ``model``), the
  batch over ``data`` (which must divide the number of prompts); the draft's weights split the
  same way (``draft_sharding="rules"``) or whole on every device (``"replicated"``). Tokens and
  statistics are those of the unsharded run; in a multi-host run every process passes the same
  arguments and receives the whole (replicated) output.
  """
  args, kwargs, skipped = _loop_arguments(model, prompts, method, sampling, max_new_tokens, key,
                                          eos_token_id, prompt_width, mesh, sharding_rules,
                                          draft_sharding)
  tokens, out_lengths, stats = loop.decode_jit(*args, **kwargs)
  if skipped:  # sj.Adaptive's call-level skip ran plain decoding: said in the stats
    stats = stats.replace(draft_skipped=True)
  return GenerateOutput(tokens=tokens, lengths=out_lengths, stats=stats)


def compile_generate(*args, **kwargs) -> jax.stages.Compiled:
  """The compiled loop ``generate`` runs for these arguments (compiled now, or taken from the
  cache if ``generate`` already ran them): its ``memory_analysis()`` (bytes of arguments, i.e.
  weights and prompts, outputs and temporaries, i.e. KV caches and activations, per device),
  ``cost_analysis()`` and ``as_text()`` (the partitioned HLO under a mesh). Takes exactly
  ``generate``'s arguments."""
  bound = inspect.signature(generate).bind(*args, **kwargs)
  bound.apply_defaults()
  loop_args, loop_kwargs, _ = _loop_arguments(**bound.arguments)
  return loop.decode_jit.lower(*loop_args, **loop_kwargs).compile()


def _loop_arguments(model, prompts, method, sampling, max_new_tokens, key, eos_token_id,
                    prompt_width, mesh, sharding_rules, draft_sharding):
  """Validates ``generate``'s arguments (one-line ValueErrors, before anything compiles) and
  returns the jitted loop's ``(args, kwargs)`` and whether the method skips its draft in this
  call (``sj.Adaptive``'s ``for_call``: the loop is then plain decoding's)."""
  check_model(model, "target")
  if not all(callable(getattr(method, name, None)) for name in ("proposer", "validate")):
    raise ValueError(f"unknown decoding method {method!r}: give an sj method such as "
                     f"sj.Autoregressive() or sj.Speculative(draft, gamma)")
  if not isinstance(sampling, Sampling):
    raise ValueError(f"sampling must be an sj.Sampling, got {type(sampling).__name__}")
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
  max_new_tokens = int(max_new_tokens)
  if key is None:
    if not sampling.is_greedy:
      raise ValueError(f"sampling with temperature {sampling.temperature} needs a PRNG key: pass "
                       f"key=jax.random.key(seed)")
    key = jax.random.key(0)
  if isinstance(eos_token_id, (int, np.integer)):
    eos_ids = (int(eos_token_id),)
  else:
    eos_ids = tuple(int(e) for e in (eos_token_id or ()))
  vocab = model.config.vocab_size
  for e in eos_ids:
    if not 0 <= e < vocab:
      raise ValueError(f"eos_token_id {e} is outside the vocabulary [0, {vocab})")
  prompt, lengths = pad_prompts(prompts, vocab, width=prompt_width)
  # The widest prompt the caller asked for (pad_prompts checked prompt_width >= longest prompt).
  width, what = ((int(lengths.max()), "prompt length") if prompt_width is None else
                 (int(prompt_width), "prompt_width"))
  check_context(model, "target", width, max_new_tokens, what)
  method.validate(model, width, max_new_tokens, what)
  table = getattr(method, "costs", None)  # sj.Adaptive's rule "cost" decides by a CostTable
  timed = getattr(table, "sampling", sampling)
  if (getattr(method, "rule", None) == "cost" and timed != sampling
      and not (timed.is_greedy and sampling.is_greedy)):
    warnings.warn(f"sj.Adaptive's cost table was measured at {table.sampling}, this run samples "
                  f"at {sampling}: sampled iterations cost more than greedy ones, so the rule "
                  f"decides by costs that are not this run's (measure the table with "
                  f"sj.CostTable.measure(..., sampling=))", stacklevel=2)

  placement = None
  if mesh is not None or sharding_rules is not None or draft_sharding != "rules":
    if mesh is None:
      raise ValueError("sharding_rules and draft_sharding need a mesh=")
    placement = sharding_lib.placement(mesh, sharding_rules, draft_sharding)
    if prompt.shape[0] % placement.data_size:
      raise ValueError(f"{prompt.shape[0]} prompts do not divide the mesh's data axis of size "
                       f"{placement.data_size}: give a multiple of {placement.data_size} prompts "
                       f"or a mesh with a smaller data axis")

  call_method = getattr(method, "for_call", lambda batch, length: method)(
      prompt.shape[0], max_new_tokens)
  proposer, proposer_params = call_method.proposer(model)
  target_graphdef, target_state = nnx.split(model)
  if placement is not None:
    mesh = placement.mesh
    draft = getattr(call_method, "draft", None)
    sharding_lib.check_divisible(model.config, target_state, mesh, placement.rules, "target")
    sharding_lib.check_divisible(getattr(draft, "config", model.config), proposer_params, mesh,
                                 placement.draft_rules, "draft")
    target_state = sharding_lib.place(target_state, mesh, placement.rules)
    proposer_params = sharding_lib.place(proposer_params, mesh, placement.draft_rules)
    prompt = sharding_lib.put(prompt, placement.batch(2))
    lengths = sharding_lib.put(lengths, placement.batch(1))
    key = sharding_lib.put(key, placement.replicated)
  args = (target_graphdef, target_state, proposer, proposer_params, jnp.asarray(prompt),
          jnp.asarray(lengths), key)
  kwargs = dict(sampling=sampling, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                cache_length=prompt.shape[1] + max_new_tokens + proposer.num_candidates
                + num_extra(proposer) + 1, placement=placement)
  return args, kwargs, call_method is not method
