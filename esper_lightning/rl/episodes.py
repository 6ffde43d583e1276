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


def decisions_per_episode(episode_length: int) -> int:
    """Decisions of an episode of ``episode_length`` epochs: the first epoch trains before the
    first decision, as in a Trainer."""
    return episode_length - 1


def is_terminal(decisions_taken: int, episode_length: int) -> bool:
    """Whether the episode is over after ``decisions_taken`` decisions (this one included): the
    env's ``terminated`` (`envs.Step`). A governor rollback is never an end."""
    return decisions_taken >= decisions_per_episode(episode_length)


def step_ends(terminated: Sequence[bool], rollout_over: bool) -> StepEnds:
    """Episode ends after one step of every env: ``terminated`` as the envs returned it
    (`is_terminal`), ``truncated`` where the rollout stops while an episode goes on.

    Args:
        terminated: per env, whether its step ended the episode.
        rollout_over: this is the rollout's last step.

    Example:
        >>> step_ends([True, False], rollout_over=True).truncated.tolist()
        [False, True]
    """
    done = torch.tensor(list(terminated), dtype=torch.bool)
    truncated = torch.full_like(done, rollout_over) & ~done
    return StepEnds(done, truncated)
