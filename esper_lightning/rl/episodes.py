"""When an episode ends, and what that means for the return: one rule for every rollout.

A controller's episode is a finite-horizon problem whose horizon is part of the observation (the
epoch fraction), so reaching the last decision is a true terminal: the next state has no value,
nothing is bootstrapped, and the shaping potential there is 0. A governor rollback ends the
episode too, with its penalty. Only one cut is not an end: when a round of rollouts stops while an
env is mid-episode (an env that started a new episode after a rollback), the return is
bootstrapped with V(s') of the real next state — a truncation.

Treating the max-epoch end as a truncation (bootstrapping V of a state the critic never trains
on) made the last-step target feed on itself towards r/(1−γ): on a scripted lifecycle problem
PPO then solved 0 of 3 seeds in 50 updates, against 3 of 3 in under 30 with true terminals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


class StepEnds(NamedTuple):
    """Per env: the episode really ended (``terminated``; ``at_horizon`` when it reached its
    last decision rather than a rollback), or the rollout cut it (``truncated``)."""

    terminated: Tensor  # [n] bool
    truncated: Tensor  # [n] bool
    at_horizon: Tensor  # [n] bool, implies terminated


def step_ends(
    decisions_taken: Sequence[int],
    decisions_per_episode: int,
    rollbacks: Sequence[bool],
    rollout_over: bool,
) -> StepEnds:
    """Episode ends after one step of every env.

    Args:
        decisions_taken: decisions each env's current episode has taken, this one included.
        decisions_per_episode: decisions of a full episode (the horizon).
        rollbacks: whether the governor rolled back during this step.
        rollout_over: this is the rollout's last step.

    Example:
        >>> step_ends([3, 1], 3, [False, False], rollout_over=True).truncated.tolist()
        [False, True]
    """
    at_horizon = torch.tensor([n >= decisions_per_episode for n in decisions_taken])
    rolled_back = torch.tensor(list(rollbacks), dtype=torch.bool)
    terminated = at_horizon | rolled_back
    truncated = torch.full_like(terminated, rollout_over) & ~terminated
    return StepEnds(terminated, truncated, at_horizon & ~rolled_back)
