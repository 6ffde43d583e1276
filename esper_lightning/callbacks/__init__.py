"""Lightning callbacks: drop-in morphogenesis, width growth, the governor and a compute
budget."""

from esper_lightning.callbacks.compute_budget import ComputeBudget
from esper_lightning.callbacks.governor import GovernorCallback
from esper_lightning.callbacks.morphogenesis import MorphogenesisCallback
from esper_lightning.callbacks.width_growth import WidthGrowthCallback

__all__ = ["ComputeBudget", "GovernorCallback", "MorphogenesisCallback", "WidthGrowthCallback"]
