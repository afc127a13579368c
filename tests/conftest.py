"""Shared pytest setup: one JAX compilation cache for the whole run.

Many tests compile the same programs (the autoregressive baselines on the shared law models, the
runner's tiny configs in subprocesses, the notebooks' kernels), on two pytest-xdist workers
(setup.cfg). The controller creates a fresh, empty cache directory for this run, which the
workers and every subprocess inherit through the environment, so an identical program compiles
once per run; the directory is removed at the end, so no run reuses another's work (set
JAX_COMPILATION_CACHE_DIR yourself to keep one).
"""

import os
import shutil
import tempfile

_OWNED = "SPECJAX_TEST_OWNS_JAX_CACHE"


def pytest_configure(config):
  del config
  if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return  # a worker (inherits the controller's), or the user's own cache
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="specjax-test-jax-cache-")
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
  os.environ[_OWNED] = "1"


def pytest_unconfigure(config):
  del config
  if os.environ.get("PYTEST_XDIST_WORKER") or not os.environ.pop(_OWNED, None):
    return
  shutil.rmtree(os.environ.pop("JAX_COMPILATION_CACHE_DIR"), ignore_errors=True)
