"""Lightning callbacks: drop-in morphogenesis and the governor."""

from esper_lightning.callbacks.governor import GovernorCallback
from esper_lightning.callbacks.morphogenesis import MorphogenesisCallback

__all__ = ["GovernorCallback", "MorphogenesisCallback"]
