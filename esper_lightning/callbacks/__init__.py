"""Lightning callbacks: drop-in morphogenesis, the governor and a compute budget."""

from esper_lightning.callbacks.compute_budget import ComputeBudget
from esper_lightning.callbacks.governor import GovernorCallback
from esper_lightning.callbacks.morphogenesis import MorphogenesisCallback

__all__ = ["ComputeBudget", "GovernorCallback", "MorphogenesisCallback"]
