"""Rollout storage ``[n_envs, n_steps]`` and generalised advantage estimation.

Episode ends are stored with two flags, because they mean different things for the return:

* ``terminated[n, t]``: the episode really ended after step t: its last decision
  (`rl.episodes.is_terminal`; a governor rollback is not an end, the episode goes on). The next
  state has no value: no bootstrap, and the terminal outcome is in ``rewards[n, t]``.
* ``truncated[n, t]``: the trajectory stops after step t but the MDP did not end (a rollout that
  stops mid-episode, `rl.episodes.step_ends`). The return is bootstrapped with
  ``bootstrap_values[n, t]`` = V(s_{t+1}) of the real next state.

Either flag cuts the advantage recursion (step t+1, if any, belongs to the next episode). Every
row must end with one of them, so no value is ever read past the end of the buffer.
"""

from __future__ import annotations

from dataclasses import fields

import torch
from torch import Tensor

from esper_lightning.rl.distributions import MaskBatch, empty_mask_batch
from esper_lightning.rl.policy import Hidden, PolicyConfig


class RolloutBuffer:
    """Pre-allocated storage for one round of ``n_envs`` × ``n_steps`` transitions.

    Fields (all ``[n_envs, n_steps, ...]``): ``obs`` (normalised, as the policy saw them),
    ``blueprint_idx``, ``hidden_h``/``hidden_c`` (pre-step state passed to `act`), ``masks``
    (unconditioned `MaskBatch`), ``actions``, ``log_probs`` (per head), ``values`` (critic output,
    normalised scale), ``rewards`` (raw), ``episode_starts``, ``terminated``, ``truncated``,
    ``bootstrap_values`` (normalised scale; read only where truncated).
    """

    def __init__(self, n_envs: int, n_steps: int, config: PolicyConfig) -> None:
        self.n_envs, self.n_steps = n_envs, n_steps
        shape = (n_envs, n_steps)
        n_heads = len(config.head_sizes)
        self.obs = torch.zeros(*shape, config.obs_dim)
        self.blueprint_idx = torch.zeros(*shape, config.n_slots, dtype=torch.long)
        self.hidden_h = torch.zeros(*shape, config.hidden_dim)
        self.hidden_c = torch.zeros(*shape, config.hidden_dim)
        self.masks: MaskBatch = empty_mask_batch(shape, config.n_slots, config.head_sizes)
        self.actions = torch.zeros(*shape, n_heads, dtype=torch.long)
        self.log_probs = torch.zeros(*shape, n_heads)
        self.values = torch.zeros(shape)
        self.rewards = torch.zeros(shape)
        self.episode_starts = torch.zeros(shape, dtype=torch.bool)
        self.terminated = torch.zeros(shape, dtype=torch.bool)
        self.truncated = torch.zeros(shape, dtype=torch.bool)
        self.bootstrap_values = torch.zeros(shape)
        self.step = 0

    def add(
        self,
        *,
        obs: Tensor,
        blueprint_idx: Tensor,
        hidden: Hidden,
        masks: MaskBatch,
        actions: Tensor,
        log_probs: Tensor,
        values: Tensor,
        rewards: Tensor,
        episode_starts: Tensor,
        terminated: Tensor,
        truncated: Tensor,
        bootstrap_values: Tensor | None = None,
    ) -> None:
        """Store step ``self.step`` for every env (all arguments have leading dim n_envs).

        ``bootstrap_values`` is required when any env is truncated at this step.
        """
        if self.step >= self.n_steps:
            raise RuntimeError(f"RolloutBuffer is full ({self.n_steps} steps)")
        if bool((terminated & truncated).any()):
            raise ValueError("a step cannot be both terminated and truncated")
        if bootstrap_values is None and bool(truncated.any()):
            raise ValueError("truncated steps need bootstrap_values (V of the next state)")
        t = self.step
        self.obs[:, t] = obs
        self.blueprint_idx[:, t] = blueprint_idx
        self.hidden_h[:, t], self.hidden_c[:, t] = hidden
        for f in fields(MaskBatch):
            getattr(self.masks, f.name)[:, t] = getattr(masks, f.name)
        self.actions[:, t] = actions
        self.log_probs[:, t] = log_probs
        self.values[:, t] = values
        self.rewards[:, t] = rewards
        self.episode_starts[:, t] = episode_starts
        self.terminated[:, t] = terminated
        self.truncated[:, t] = truncated
        if bootstrap_values is not None:
            self.bootstrap_values[:, t] = torch.where(truncated, bootstrap_values, 0.0)
        self.step += 1

    @property
    def full(self) -> bool:
        return self.step == self.n_steps

    def reset(self) -> None:
        """Start filling again from step 0 (storage is overwritten)."""
        self.step = 0


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    bootstrap_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation with separate terminal and truncation flags.

    For each step (all tensors ``[N, T]``, values on the same scale as rewards)::

        next_value_t = 0                      if terminated_t
                     = bootstrap_values_t     if truncated_t
                     = values_{t+1}           otherwise
        delta_t      = rewards_t + gamma * next_value_t - values_t
        advantages_t = delta_t + gamma * lambda * (1 - done_t) * advantages_{t+1}
        returns_t    = advantages_t + values_t

    with ``done = terminated | truncated``.

    Returns:
        ``(advantages, returns)``, each ``[N, T]``.

    Raises:
        ValueError: if a row's last step is neither terminated nor truncated.
    """
    done = terminated | truncated
    if not bool(done[:, -1].all()):
        raise ValueError("every row must end terminated or truncated (bootstrap the cut)")
    n_steps = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(n_steps)):
        following = values[:, t + 1] if t + 1 < n_steps else torch.zeros_like(values[:, t])
        next_value = torch.where(truncated[:, t], bootstrap_values[:, t], following)
        next_value = torch.where(terminated[:, t], 0.0, next_value)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        continues = (~done[:, t]).to(rewards.dtype)
        next_advantage = delta + gamma * gae_lambda * continues * next_advantage
        advantages[:, t] = next_advantage
    return advantages, advantages + values
