"""When an episode ends, and what that means for the return: one rule for every rollout.

A controller's episode is a finite-horizon problem whose horizon is part of the observation (the
epoch fraction), so reaching the last decision is a true terminal: the next state has no value,
nothing is bootstrapped, and the shaping potential there is 0. A governor rollback does not end
an episode: the env restores its last snapshot and the episode goes on, the penalty is charged
at the rollback's step and the outcome is scored at the end — in PPO, in `esper-lightning
compare` and in a Trainer alike (docs/rl.md says why). Only one cut is not an end: when a
rollout stops while an env is mid-episode, the return is bootstrapped with V(s') of the real
next state — a truncation (the trainer's rollouts are whole episodes, so it never cuts one).

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
    """Per env: the episode reached its last decision (``terminated``), or the rollout cut it
    short (``truncated``)."""

    terminated: Tensor  # [n] bool
    truncated: Tensor  # [n] bool


def step_ends(
    decisions_taken: Sequence[int],
    decisions_per_episode: int,
    rollout_over: bool,
) -> StepEnds:
    """Episode ends after one step of every env (a governor rollback is not one).

    Args:
        decisions_taken: decisions each env's current episode has taken, this one included.
        decisions_per_episode: decisions of a full episode (the horizon).
        rollout_over: this is the rollout's last step.

    Example:
        >>> step_ends([3, 1], 3, rollout_over=True).truncated.tolist()
        [False, True]
    """
    terminated = torch.tensor([n >= decisions_per_episode for n in decisions_taken],
                              dtype=torch.bool)
    truncated = torch.full_like(terminated, rollout_over) & ~terminated
    return StepEnds(terminated, truncated)
