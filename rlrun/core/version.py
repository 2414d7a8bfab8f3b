"""rlrun's version (the one place it is written besides pyproject.toml; a test compares them)."""

__version__ = "0.1.0"
