"""Algorithms: each module is a config schema + a registered loss + a postprocess fn + a thin Trainer."""
