"""What one PPO round produced, every rank's merged into one run's, and the TensorBoard metrics
made of it (tags in docs/rl.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from esper_lightning.core.actions import LifecycleOp
from esper_lightning.core.telemetry import ROLLBACKS_TAG, morpho_metrics

#: RoundStats fields that are wall-clock times: ranks run side by side, so a round took the
#: longest rank's time (summing would count parallel seconds twice).
_SECONDS = ("env_seconds", "controller_seconds", "update_seconds")


@dataclass
class RoundStats:
    """Counters of one round.

    Attributes:
        returns: return of every episode of the round (a rollback does not end one).
        final_accuracies, seed_params, train_flops: of every episode, at its end.
        ops: executed ops by name; events: lifecycle events by kind over finished episodes.
        germinated: germinations by blueprint over finished episodes (which seeds the policy
            chose, where ``events`` says only how many).
        reward_sums: every reward component summed over all steps.
        rollbacks: governor rollbacks; steps: env steps (= env epochs) collected.
        env_seconds, controller_seconds, update_seconds: where the round's time went.
        ppo: the update's metrics (``losses/*``).
    """

    returns: list[float] = field(default_factory=list)
    final_accuracies: list[float] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    germinated: Counter[str] = field(default_factory=Counter)
    reward_sums: Counter[str] = field(default_factory=Counter)
    seed_params: list[float] = field(default_factory=list)
    train_flops: list[float] = field(default_factory=list)
    rollbacks: int = 0
    steps: int = 0
    env_seconds: float = 0.0
    controller_seconds: float = 0.0
    update_seconds: float = 0.0
    ppo: dict[str, float] = field(default_factory=dict)


def merge_stats(parts: list[RoundStats]) -> RoundStats:
    """One round's statistics of every rank as one run's: episodes and counters pooled, times
    of the slowest rank, the update's metrics (equal on every rank) from rank 0.

    Example:
        >>> merge_stats([RoundStats(steps=4), RoundStats(steps=4)]).steps
        8
    """
    merged = RoundStats(ppo=dict(parts[0].ppo))
    for part in parts:
        for f in fields(RoundStats):
            value, total = getattr(part, f.name), getattr(merged, f.name)
            if f.name == "ppo":
                continue
            if f.name in _SECONDS:
                setattr(merged, f.name, max(total, value))
            elif isinstance(value, Counter):
                total.update(value)  # adds negative sums too (reward components)
            elif isinstance(value, list):
                total.extend(value)
            else:
                setattr(merged, f.name, total + value)
    return merged


def round_metrics(stats: RoundStats, round_index: int, learning_rate: float,
                  blueprints: Sequence[str] = ()) -> dict[str, float]:
    """The scalars logged after round ``round_index`` (1-based), CleanRL names for the PPO
    ones; ``learning_rate`` is the policy's step size in the update. ``germinated/<name>``
    for each of ``blueprints`` (the run's germinable ones: a round that germinated none of
    one logs 0, so every tag has every round) and any other germinated.

    Example:
        >>> from collections import Counter
        >>> stats = RoundStats(germinated=Counter(lora=2), steps=4)
        >>> m = round_metrics(stats, 1, 3e-4, blueprints=("lora", "mlp"))
        >>> m["germinated/lora"], m["germinated/mlp"]
        (2.0, 0.0)
    """
    total = stats.env_seconds + stats.controller_seconds + stats.update_seconds
    steps = max(stats.steps, 1)
    metrics = {
        "charts/round": float(round_index),
        "charts/learning_rate": learning_rate,
        "charts/episodic_return": mean(stats.returns),
        "charts/final_accuracy": mean(stats.final_accuracies),
        "charts/env_epochs_per_sec": stats.steps / max(stats.env_seconds, 1e-9),
        "charts/controller_share": (stats.controller_seconds + stats.update_seconds)
        / max(total, 1e-9),
        **morpho_metrics(mean(stats.seed_params), stats.events,
                         train_flops=mean(stats.train_flops)),
        ROLLBACKS_TAG: float(stats.rollbacks),
    }
    for op in LifecycleOp:
        name = op.name.lower()
        metrics[f"actions/{name}"] = stats.ops[name] / steps
    for blueprint in dict.fromkeys([*blueprints, *sorted(stats.germinated)]):
        metrics[f"germinated/{blueprint}"] = float(stats.germinated[blueprint])
    for component, value in stats.reward_sums.items():
        metrics[f"rewards/{component}"] = value / steps
    for key, value in stats.ppo.items():
        metrics[f"losses/{key}"] = value
    return metrics


def mean(values: Sequence[float]) -> float:
    """Mean of ``values``; 0.0 for none (a round in which no episode ended)."""
    return float(np.mean(values)) if len(values) else 0.0
