"""The names of options the library's methods accept, importable without JAX.

The runner (``experiments/``) checks a config against these before JAX starts, so that a bad
config is refused in well under a second; the library modules that take the options import them
from here. Nothing in this module may import jax (``specjax/__init__.py`` is lazy for this).
"""

# How a static draft tree's children are drawn (``sj.TreeSpeculative(children=)``,
# ``specjax.proposers.draft_tree``): without replacement from the draft's law, its top-k, or
# i.i.d. with replacement.
TREE_CHILDREN = ("sampled", "top_k", "iid")

# How a draft model is placed on a mesh (``sj.generate(draft_sharding=)``, ``specjax.sharding``):
# split by the target's partition rules, or replicated on every device.
DRAFT_SHARDINGS = ("rules", "replicated")
