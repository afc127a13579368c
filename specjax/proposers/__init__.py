"""Proposers: where candidate tokens come from (draft models, n-grams, ...)."""
