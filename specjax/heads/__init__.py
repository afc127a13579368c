"""Drafting heads on the target's features (EAGLE), and their published layouts on disk."""
