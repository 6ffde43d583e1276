"""User-facing error types shared across layers.

Each carries a one-line message naming the bad value and what is accepted; the command line
prints it and exits with status 2 (no traceback).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A bad configuration value or an unusable checkpoint."""


def read_json_file(path: str | Path, what: str) -> Any:
    """The JSON in the file ``path``, the ``what`` of a command (a plan, a growth lookup):
    a missing or unreadable file is a one-line `ConfigError` naming it."""
    file = Path(path)
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} '{file}' not found") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read {what} '{file}': {' '.join(str(err).split())}") from None
