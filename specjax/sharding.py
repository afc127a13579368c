"""Meshes and partition rules: a tensor-parallel target and a data-parallel batch on JAX's SPMD
partitioner (DESIGN.md §4; Megatron-style splitting, Shoeybi et al. 2019, arXiv 1909.08053).

Every parameter carries logical axis names (``vocab``, ``embed``, ``heads``, ``kv_heads``,
``mlp``; ``specjax.models.transformer``) and every KV buffer ``("batch", "kv_heads", "length",
"head_dim")``. ``RULES`` maps those names onto a mesh with axes ``("data", "model")``: attention
heads, kv heads, the MLP's hidden units and the vocabulary split over ``model``, the batch over
``data``. Placed that way, XLA's partitioner (GSPMD) turns the very loop that runs on one device
into the tensor-parallel program: column-split q/k/v and gate/up projections, row-split output and
down projections followed by one all-reduce each, a vocabulary-split head. No code path differs
between one device and many; ``sj.generate(..., mesh=)`` only places the inputs and pins the
target's cache (``Placement``).

A name mapped to ``None`` (or absent from the rules) is replicated. Splitting must respect whole
heads: a ``heads`` dimension stores ``num_heads * head_dim`` columns, and it is the head count that
must divide the mesh axis (3 kv heads do not split over 4 devices even though 3 * 64 columns do),
which ``check_divisible`` enforces with a suggestion of a mesh that works.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from specjax import options
from specjax.models.kv_cache import CACHE_AXES, KVCache

DATA, MODEL = "data", "model"
AXES = (DATA, MODEL)

Rules = tuple[tuple[str, str | None], ...]
# Logical axis -> mesh axis (None: replicated).
RULES: Rules = (
    ("batch", DATA),
    ("vocab", MODEL),
    ("heads", MODEL),
    ("kv_heads", MODEL),
    ("mlp", MODEL),
    ("embed", None),
    ("length", None),
    ("head_dim", None),
)
REPLICATED: Rules = (("batch", DATA),)  # a model replicated over ``model`` (its batch still split)
DRAFT_SHARDINGS = options.DRAFT_SHARDINGS  # what sj.generate(draft_sharding=) accepts


def make_mesh(data: int = 1, model: int | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ``(data, model)`` mesh over ``devices`` (default: every device of every process).

  ``model=None`` takes the devices ``data`` leaves. The axes are ``Auto``: shardings propagate
  through the loop by XLA's partitioner, which is what lets one program serve every mesh.
  """
  devices = list(jax.devices() if devices is None else devices)
  for name, value in (("data", data), ("model", model)):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                              or value < 1):
      raise ValueError(f"mesh {name} size must be an integer >= 1, got {value!r}")
  if model is None:
    if len(devices) % data:
      raise ValueError(f"mesh data={data} does not divide the {len(devices)} devices")
    model = len(devices) // data
  if data * model != len(devices):
    raise ValueError(f"mesh data={data} x model={model} = {data * model} devices, but there are "
                     f"{len(devices)}; {_suggest(len(devices))}")
  return jax.make_mesh((data, model), AXES, axis_types=(AxisType.Auto,) * 2, devices=devices)


def _suggest(num_devices: int, model_divides: int | None = None) -> str:
  """A mesh that fits ``num_devices`` (and splits ``model_divides`` units evenly)."""
  model = num_devices if model_divides is None else math.gcd(num_devices, model_divides)
  return (f"try specjax.sharding.make_mesh(data={num_devices // model}, model={model})")


def check_mesh(mesh: Any) -> Mesh:
  """``mesh`` as an ``Auto``-typed mesh with axes exactly ``("data", "model")``, or a ValueError."""
  if not isinstance(mesh, Mesh):
    raise ValueError(f"mesh must be a jax.sharding.Mesh with axes {AXES} "
                     f"(specjax.sharding.make_mesh), got {type(mesh).__name__}")
  if tuple(mesh.axis_names) != AXES:
    raise ValueError(f"mesh axes must be {AXES} (in this order), got {tuple(mesh.axis_names)}; "
                     f"build it with specjax.sharding.make_mesh(data=, model=)")
  if any(t != AxisType.Auto for t in mesh.axis_types):
    mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * 2)
  return mesh


def check_rules(rules: Any) -> Rules:
  """``rules`` as a tuple of ``(logical name, "data" | "model" | None)`` pairs, or a ValueError."""
  try:
    rules = tuple((name, axis) for name, axis in rules)
  except (TypeError, ValueError):
    raise ValueError(f"sharding rules must be (logical name, mesh axis) pairs, got {rules!r}")
  seen = set()
  for name, axis in rules:
    if not isinstance(name, str) or (axis is not None and axis not in AXES):
      raise ValueError(f"sharding rule ({name!r}, {axis!r}): the mesh axis must be one of {AXES} "
                       f"or None")
    if name in seen:
      raise ValueError(f"sharding rules map {name!r} twice")
    seen.add(name)
  return rules


def logical_spec(axes: Sequence[str | None], rules: Rules) -> PartitionSpec:
  """The mesh ``PartitionSpec`` of an array whose dimensions have logical names ``axes``."""
  table = dict(rules)
  return PartitionSpec(*(table.get(a) if a is not None else None for a in axes))


def _units(config, name: str, size: int) -> tuple[int, str]:
  """How many indivisible units a dimension of logical name ``name`` and ``size`` holds."""
  if name == "heads":
    return config.num_heads, "attention heads"
  if name == "kv_heads":
    return config.num_kv_heads, "kv heads"
  return size, "entries"


def _param_axes(state) -> list[tuple[str, tuple[str | None, ...], tuple[int, ...]]]:
  """(path, logical axes, shape) of every variable of a pytree (an nnx state, or any pytree
  holding some) that names its axes."""
  leaves = jax.tree_util.tree_flatten_with_path(
      state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
  out = []
  for path, var in leaves:
    axes = var.get_metadata().get("out_sharding") if isinstance(var, nnx.Variable) else None
    if axes:
      name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
      value = var.get_value()
      out.append((name, tuple(axes), tuple(getattr(value, "shape", np.shape(value)))))
  return out


def check_divisible(config, state, mesh: Mesh | AbstractMesh, rules: Rules,
                    role: str = "target") -> None:
  """Raises a ValueError naming the first tensor of ``state`` (the model ``config``'s) whose
  split dimension does not divide the mesh axis it is mapped to, with a mesh that would work."""
  sizes = dict(mesh.shape)
  table = dict(rules)
  split = [(path, name, table[name], *_units(config, name, size))
           for path, axes, shape in _param_axes(state) for name, size in zip(axes, shape)
           if table.get(name) is not None and sizes[table[name]] > 1]
  for path, name, axis, units, what in split:
    if units % sizes[axis]:
      common = math.gcd(*(u for _, _, a, u, _ in split if a == axis))
      suggestion = _suggest(math.prod(sizes.values()), common)
      raise ValueError(
          f"{role} tensor {path}: its {name!r} dimension ({units} {what}) does not divide the "
          f"mesh axis {axis!r} of size {sizes[axis]}; {suggestion}, or map {name!r} to None in "
          f"the rules")


def check_config(config, data: int, model: int, rules: Rules = RULES,
                 role: str = "model") -> None:
  """``check_divisible`` for a model of ``config`` on a ``data`` x ``model`` mesh, before any
  weight is loaded or device touched (shapes only)."""
  from specjax.models.transformer import Transformer  # here: the models import this package
  state = nnx.state(nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0))))
  check_divisible(config, state, AbstractMesh((data, model), AXES), check_rules(rules), role)


def shardings(state, mesh: Mesh, rules: Rules):
  """A pytree like ``state`` (an nnx state or any pytree of arrays) of ``NamedSharding``s:
  variables that name their axes get them mapped by ``rules`` (names the rules leave out are
  replicated); every other array is replicated."""
  specs = nnx.get_partition_spec(state)  # the logical names, as the variables declare them
  return jax.tree.map(lambda p: NamedSharding(mesh, logical_spec(p or (), rules)), specs,
                      is_leaf=lambda x: isinstance(x, PartitionSpec) or x is None)


def put(x, sharding: NamedSharding) -> jax.Array:
  """``x`` (an array with the same value in every process) placed with ``sharding``.

  Each device receives its own shard only; an array already placed so stays where it is (no
  copy). In a multi-process run, a value held by this process (a numpy array, or a jax array on
  its own devices) becomes one global array, each process filling its own devices' shards from
  its copy (``jax.make_array_from_callback``); PRNG keys travel as their key data."""
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    return jax.random.wrap_key_data(put(jax.random.key_data(x), sharding),
                                    impl=jax.random.key_impl(x))
  if (sharding.is_fully_addressable or (isinstance(x, jax.Array) and (
      x.sharding == sharding or not x.is_fully_addressable))):
    return jax.device_put(x, sharding)
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place(tree, mesh: Mesh, rules: Rules):
  """``tree`` (an nnx state or a pytree of arrays) on ``mesh`` by ``rules`` (see ``shardings``
  and ``put``)."""
  if tree is None:
    return None
  return jax.tree.map(put, tree, shardings(tree, mesh, rules))


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules = RULES, role: str = "model"):
  """Places an already loaded model's variables on ``mesh`` by ``rules``, in place (views of it,
  such as ``skip_layers``'s, follow), and returns it. The draft too: ``rules=REPLICATED`` keeps a
  whole copy on every ``model`` device instead."""
  mesh, rules = check_mesh(mesh), check_rules(rules)
  state = nnx.state(model)
  check_divisible(model.config, state, mesh, rules, role)
  nnx.update(model, place(state, mesh, rules))
  return model


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where one ``sj.generate`` call runs: the mesh and the rules of its target and draft.

  Hashable (a static argument of the jitted loop). Inside the loop it pins the target's KV
  cache to its rules (batch on ``data``, kv heads on ``model``) and makes the outputs replicated,
  so that every process of a multi-host run can read them; everything else propagates from the
  placed inputs.
  """

  mesh: Mesh
  rules: Rules = RULES
  draft_rules: Rules = RULES

  @property
  def data_size(self) -> int:
    return int(self.mesh.shape[DATA])

  def sharding(self, axes: Sequence[str | None]) -> NamedSharding:
    """The target's rules applied to an array whose dimensions have logical names ``axes``."""
    return NamedSharding(self.mesh, logical_spec(axes, self.rules))

  def batch(self, ndim: int) -> NamedSharding:
    """Arrays whose leading dimension is the batch: split on ``data``."""
    return self.sharding(("batch",) + (None,) * (ndim - 1))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  def constrain_cache(self, cache: KVCache) -> KVCache:
    spec = self.sharding(CACHE_AXES)
    pin = lambda bufs: tuple(jax.lax.with_sharding_constraint(b, spec) for b in bufs)
    return cache.replace(k=pin(cache.k), v=pin(cache.v),
                         lengths=jax.lax.with_sharding_constraint(cache.lengths, self.batch(1)))

  def replicate(self, tree):
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, self.replicated), tree)


def placement(mesh: Mesh, rules: Rules | None = None, draft: str = "rules") -> Placement:
  """A validated ``Placement``: ``draft="rules"`` shards the draft like the target,
  ``"replicated"`` keeps a whole draft on every device of the ``model`` axis."""
  mesh = check_mesh(mesh)
  rules = RULES if rules is None else check_rules(rules)
  if draft not in DRAFT_SHARDINGS:
    raise ValueError(f"draft_sharding must be one of {DRAFT_SHARDINGS}, got {draft!r}")
  return Placement(mesh, rules, rules if draft == "rules" else REPLICATED)
