"""The outcome of an episode: what a controller is judged by, in training and in comparisons.

One definition serves both the PPO reward's terminal term (`rl.rewards`) and the comparison tool
(`app.compare.runner`), so a learned controller is trained on exactly the quantity it is
evaluated on:

    outcome = mean validation accuracy of the last `OUTCOME_EPOCHS` epochs (percent)
              − param_cost × mean seed parameters of those epochs / host parameters  (points)

A single epoch's accuracy on a small validation set is noisy (about 6 points from one epoch to
the next at a plateau); the mean of the last three is far steadier while still measuring where
the episode ended. The parameter cost prices growth: with ``param_cost = 1`` seeds as large as
the host cost one accuracy point; 0 makes the outcome pure accuracy.

Accuracy and size are averaged over the same epochs: each epoch's accuracy is paid for with the
seeds present when it was measured. Charging the final seed count alone let an instant PRUNE at
the last decision keep two thirds of a seed's accuracy (two of the three epochs were measured
with it) at no cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from esper_lightning.core.report import EpochReport

#: Epochs averaged at the end of an episode.
OUTCOME_EPOCHS = 3
#: What an episode's outcome measures: ``accuracy`` (the default, above) or ``bits``, for
#: budgeted language-model runs judged by their final validation loss (`bits_outcome`).
OUTCOMES = ("accuracy", "bits")
#: Outcome points per bit: one point per centibit of final loss, the size of an accuracy point
#: in the terminal reward (a schedule worth 0.01 bits per byte earns 1 point).
POINTS_PER_BIT = 100.0


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


def parameter_cost(seed_params: Sequence[float], host_params: float, param_cost: float,
                   last: int = OUTCOME_EPOCHS) -> float:
    """Points charged for the mean of the last ``last`` seed parameter counts on a host of
    ``host_params`` parameters.

    Raises:
        ValueError: fewer than ``last`` counts.

    Example:
        >>> parameter_cost([0, 600, 600, 0], host_params=1000, param_cost=1.0)
        0.4
    """
    if len(seed_params) < last:
        raise ValueError(f"the parameter cost needs the seed parameters of the last {last} "
                         f"epochs, got {len(seed_params)}")
    return param_cost * math.fsum(seed_params[-last:]) / last / max(host_params, 1)


def episode_outcome(
    accuracies: Sequence[float], seed_params: Sequence[float], host_params: float,
    param_cost: float,
) -> float:
    """The outcome defined above, from the episode's validation accuracies and the seed
    parameters present when each was measured (aligned, oldest first; only the last
    `OUTCOME_EPOCHS` of each are read).

    Example:
        >>> episode_outcome([40.0, 44.0, 45.0, 46.0], seed_params=[0, 500, 500, 500],
        ...                 host_params=1000, param_cost=1.0)
        44.5
    """
    return (accuracy_outcome(accuracies)
            - parameter_cost(seed_params, host_params, param_cost))


def bits_outcome(final_loss: float, seed_params: Sequence[float], host_params: float,
                 param_cost: float) -> float:
    """The ``bits`` outcome: ``−POINTS_PER_BIT ×`` the final validation loss in bits per token,
    minus the same parameter cost. Under a compute budget every schedule ends fully decayed at
    its budget, so the last epoch's loss is the run's result (what `esper-lightning compare`
    judges budgeted runs by, ``final_bits``), not a mean over a plateau.

    Example:
        >>> round(bits_outcome(math.log(4), [0, 0, 0], host_params=1000, param_cost=1.0), 6)
        -200.0
    """
    return (-POINTS_PER_BIT * final_loss / math.log(2.0)
            - parameter_cost(seed_params, host_params, param_cost))


def report_outcome(report: EpochReport, param_cost: float, kind: str = "accuracy") -> float:
    """The outcome of an episode that ended at ``report``, of kind ``kind`` (`OUTCOMES`): its
    accuracy (or final loss) and seed-parameter histories (`EpochReport.accuracy_history`,
    `EpochReport.seed_params_history`). What the PPO terminal reward pays; `esper-lightning
    compare` records the accuracy kind as ``outcome`` and the loss as ``final_bits``.

    Raises:
        ValueError: an unknown kind; the report has no validation accuracy (or loss), or too
            short a history.
    """
    if kind == "bits":
        if report.val_loss is None:
            raise ValueError(f"epoch {report.epoch}: the bits outcome needs a validation loss")
        return bits_outcome(report.val_loss, report.seed_params_history, report.host_params,
                            param_cost)
    if kind != "accuracy":
        raise ValueError(f"unknown outcome kind {kind!r}; accepted: {', '.join(OUTCOMES)}")
    if report.val_accuracy is None:
        raise ValueError(f"epoch {report.epoch}: the outcome needs a validation accuracy")
    return episode_outcome(report.accuracy_history, report.seed_params_history,
                           report.host_params, param_cost)
