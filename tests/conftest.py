"""Shared pytest setup: one JAX compilation cache for the whole run, and quick compilation.

Many tests compile the same programs (the autoregressive baselines on the shared law models, the
runner's tiny configs in subprocesses, the notebooks' kernels), on two pytest-xdist workers
(setup.cfg). The controller creates a fresh, empty cache directory for this run, which the
workers and every subprocess inherit through the environment, so an identical program compiles
once per run; the directory is removed at the end, so no run reuses another's work (set
JAX_COMPILATION_CACHE_DIR yourself to keep one).

Most test programs are compiled once and then run for milliseconds (tiny models, a few tokens),
so LLVM's optimisation of the generated CPU code costs the suite more than it saves: with
``--xla_backend_optimization_level=0`` (set here for the run and every subprocess, unless
XLA_FLAGS already names a level) the sharding cases took 149 CPU-s instead of 235, a tree law
test 60 instead of 77, and even the run-heavy law and GGUF files 344 instead of 370. The flag
changes how fast the compiled code runs, not what it computes (no fast-math: the same IEEE
operations in the same order), and no test times a speedup against a floor.
"""

import os
import shutil
import tempfile

_OWNED = "SPECJAX_TEST_OWNS_JAX_CACHE"
QUICK_COMPILE = "--xla_backend_optimization_level=0"

if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {QUICK_COMPILE}".strip()

# Float32 matrix products at full float32 precision on every backend (and in every subprocess):
# on GPUs JAX's default runs them as TF32 (~1e-3 relative), which the tests' 1e-5 comparisons
# against transformers and NumPy references reject (tests/test_laws.py on an H200, 2026-12-04).
# On a CPU float32 products are float32 anyway: nothing changes there.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

# The longest files (minutes each), collected first, longest first, so that the two workers
# finish together instead of one starting a long file while the other sits idle at the end.
# pytest-xdist --dist loadfile hands out whole files in collection order only with
# --no-loadscope-reorder (setup.cfg): by default it reorders files by their number of tests,
# which put test_sharding.py (one test, ~3 minutes) and test_multihost.py last. Order: the
# per-file seconds of a 2-worker run on the 2-core box, the default run's tests (not slow) first,
# with the slow run's long single tests (test_sharding.py, test_multihost.py) early (update when
# a file's time changes a lot).
LONGEST_FIRST = ("test_adaptive.py", "test_run.py", "test_sharding.py", "test_eagle.py",
                 "test_run_adaptive.py", "test_multihost.py", "test_mtp.py", "test_dynamic_tree.py",
                 "test_medusa.py", "test_families.py", "test_hydra.py", "test_generate.py",
                 "test_tree_verify.py", "test_train_eagle.py", "test_models.py", "test_eagle3.py",
                 "test_spectr.py", "test_smollm2_draft.py", "test_laws.py")


def pytest_collection_modifyitems(session, config, items):
  del session, config
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))


def pytest_configure(config):
  del config
  if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return  # a worker (inherits the controller's), or the user's own cache
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="specjax-test-jax-cache-")
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
  # The owner is this process: a pytest started in a subprocess by a test (test_sharding.py)
  # inherits the environment, and must not remove the run's cache when it ends.
  os.environ[_OWNED] = str(os.getpid())


def pytest_unconfigure(config):
  del config
  if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(_OWNED) != str(os.getpid()):
    return
  del os.environ[_OWNED]
  shutil.rmtree(os.environ.pop("JAX_COMPILATION_CACHE_DIR"), ignore_errors=True)
