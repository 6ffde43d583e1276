"""Host networks with seed slots."""

from esper_lightning.hosts.cifar_cnn import PRESETS, CifarCNNConfig, CifarCNNHost, slot_ids

__all__ = ["PRESETS", "CifarCNNConfig", "CifarCNNHost", "slot_ids"]
