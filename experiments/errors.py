"""The runner's one error type and its progress lines (their own module: the config checks, the
method table and the run's modules all use them, and none imports another for them)."""

import sys


class ConfigError(ValueError):
  """A config problem, reported as one line before any heavy work."""


def log(msg: str) -> None:
  """A progress line of the run, on stderr (stdout carries the report)."""
  print(msg, file=sys.stderr, flush=True)
