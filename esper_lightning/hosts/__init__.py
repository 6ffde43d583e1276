"""Host networks with seed slots.

The shapes, presets and slot ids (`esper_lightning.hosts.presets`) are plain data; the host
classes are imported on first use (PEP 562), so the presets can be read without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from esper_lightning.hosts.presets import (
    GPT_PRESETS,
    PRESETS,
    CifarCNNConfig,
    GPTConfig,
    gpt_slot_ids,
    slot_ids,
)

#: Host classes, resolved lazily from their modules.
_LAZY = {"CifarCNNHost": "esper_lightning.hosts.cifar_cnn", "GPTHost": "esper_lightning.hosts.gpt"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'esper_lightning.hosts' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "GPT_PRESETS",
    "PRESETS",
    "CifarCNNConfig",
    "CifarCNNHost",
    "GPTConfig",
    "GPTHost",
    "gpt_slot_ids",
    "slot_ids",
]
