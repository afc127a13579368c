"""The runner's one error type (its own module: the config checks and the method table both raise
it, and neither imports the other's module for it)."""


class ConfigError(ValueError):
  """A config problem, reported as one line before any heavy work."""
