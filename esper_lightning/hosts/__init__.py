"""Host networks with seed slots.

The shapes, presets and slot ids (`esper_lightning.hosts.presets`) are plain data; the host
classes are imported on first use (PEP 562), so the presets can be read without importing torch.
"""

from __future__ import annotations

from esper_lightning._lazy import lazy_exports
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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


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
