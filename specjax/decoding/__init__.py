"""The decoding loop, methods and ``generate``."""
