"""Host networks with seed slots."""

from esper_lightning.hosts.cifar_cnn import PRESETS, CifarCNNConfig, CifarCNNHost, slot_ids
from esper_lightning.hosts.gpt import PRESETS as GPT_PRESETS
from esper_lightning.hosts.gpt import GPTConfig, GPTHost

__all__ = [
    "GPT_PRESETS",
    "PRESETS",
    "CifarCNNConfig",
    "CifarCNNHost",
    "GPTConfig",
    "GPTHost",
    "slot_ids",
]
