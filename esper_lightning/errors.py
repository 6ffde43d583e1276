"""User-facing error types shared across layers.

Each carries a one-line message naming the bad value and what is accepted; the command line
prints it and exits with status 2 (no traceback).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value or an unusable checkpoint."""
