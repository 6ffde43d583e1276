"""The outcome of an episode: what a controller is judged by, in training and in comparisons.

One definition serves both the PPO reward's terminal term (`rl.rewards`) and the comparison tool
(`app.compare`), so a learned controller is trained on exactly the quantity it is evaluated on:

    outcome = mean validation accuracy of the last `OUTCOME_EPOCHS` epochs (percent)
              − param_cost × seed parameters / host parameters          (points)

A single epoch's accuracy on a small validation set is noisy (about 6 points from one epoch to
the next at a plateau); the mean of the last three is far steadier while still measuring where
the episode ended. The parameter cost prices growth: with ``param_cost = 1`` seeds as large as
the host cost one accuracy point; 0 makes the outcome pure accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Epochs averaged at the end of an episode.
OUTCOME_EPOCHS = 3


def accuracy_outcome(accuracies: Sequence[float], last: int = OUTCOME_EPOCHS) -> float:
    """Mean of the last ``last`` validation accuracies (percent).

    Raises:
        ValueError: ``last`` < 1 or fewer than ``last`` accuracies.

    Example:
        >>> accuracy_outcome([50.0, 60.0, 62.0, 64.0, 66.0])
        64.0
    """
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    if len(accuracies) < last:
        raise ValueError(f"outcome needs at least {last} epochs, got a curve of {len(accuracies)}")
    return math.fsum(accuracies[-last:]) / last


def parameter_cost(seed_params: float, host_params: float, param_cost: float) -> float:
    """Points charged for ``seed_params`` on a host of ``host_params`` parameters."""
    return param_cost * seed_params / max(host_params, 1)


def episode_outcome(
    accuracies: Sequence[float], seed_params: float, host_params: float, param_cost: float
) -> float:
    """The outcome defined above, from the episode's validation accuracies and final sizes.

    Example:
        >>> episode_outcome([40.0, 44.0, 45.0, 46.0], seed_params=500, host_params=1000,
        ...                 param_cost=1.0)
        44.5
    """
    return accuracy_outcome(accuracies) - parameter_cost(seed_params, host_params, param_cost)
