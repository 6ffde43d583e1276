import pytest
import torch
from lifecycle_mdp import make_report

from esper_lightning.core.slots import SeedSlot
from esper_lightning.rl import PolicyConfig, RolloutBuffer, compute_gae, stack_masks

GAMMA, LAMBDA = 0.9, 0.8  # gamma * lambda = 0.72


def _flags(*steps: int, n: int = 5) -> torch.Tensor:
    flags = torch.zeros(1, n, dtype=torch.bool)
    flags[0, list(steps)] = True
    return flags


def test_gae_matches_a_hand_computed_example():
    """Row 0: episode A = steps 0-1, ends with a governor rollback (terminated) at step 1;
    episode B = steps 2-4, cut at max epochs (truncated) at step 4 with V(s_5) = 4.
    Row 1: one episode of 5 steps with a terminal at the end and zero values."""
    rewards = torch.tensor([[1.0, 0.0, 2.0, 1.0, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    values = torch.tensor([[0.5, 1.0, 1.5, 0.5, 2.0], [0.0] * 5])
    terminated = torch.cat([_flags(1), _flags(4)])
    truncated = torch.cat([_flags(4), _flags()])
    bootstrap = torch.tensor([[0.0, 0.0, 0.0, 0.0, 4.0], [0.0] * 5])
    advantages, returns = compute_gae(
        rewards, values, bootstrap, terminated, truncated, GAMMA, LAMBDA
    )
    # Row 0, backwards:
    # t=4 truncated:  delta = 3 + 0.9*4.0 - 2.0 = 4.6            A = 4.6
    # t=3:            delta = 1 + 0.9*2.0 - 0.5 = 2.3            A = 2.3 + 0.72*4.6 = 5.612
    # t=2:            delta = 2 + 0.9*0.5 - 1.5 = 0.95           A = 0.95 + 0.72*5.612 = 4.99064
    # t=1 terminated: delta = 0 + 0 - 1.0 = -1.0 (no bootstrap)  A = -1.0 (B not added)
    # t=0:            delta = 1 + 0.9*1.0 - 0.5 = 1.4            A = 1.4 + 0.72*(-1.0) = 0.68
    # Row 1 (all deltas 1): A4 = 1, A3 = 1.72, A2 = 2.2384, A1 = 2.611648, A0 = 2.88038656.
    expected_adv = torch.tensor(
        [[0.68, -1.0, 4.99064, 5.612, 4.6], [2.88038656, 2.611648, 2.2384, 1.72, 1.0]]
    )
    torch.testing.assert_close(advantages, expected_adv)
    expected_returns = torch.tensor(
        [[1.18, 0.0, 6.49064, 6.112, 6.6], [2.88038656, 2.611648, 2.2384, 1.72, 1.0]]
    )
    torch.testing.assert_close(returns, expected_returns)


def test_rows_must_end_with_an_episode_end():
    zeros = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="terminated or truncated"):
        compute_gae(zeros, zeros, zeros, _flags(0, n=3), _flags(n=3), GAMMA, LAMBDA)


def _step_inputs(n_envs: int, config: PolicyConfig, **overrides):
    report = make_report([SeedSlot("r0c0", channels=2), SeedSlot("r0c1", channels=2)])
    inputs = dict(
        obs=torch.randn(n_envs, config.obs_dim),
        blueprint_idx=torch.full((n_envs, config.n_slots), -1),
        hidden=(torch.randn(n_envs, config.hidden_dim), torch.randn(n_envs, config.hidden_dim)),
        masks=stack_masks([report.masks] * n_envs),
        actions=torch.zeros(n_envs, 8, dtype=torch.long),
        log_probs=torch.randn(n_envs, 8),
        values=torch.randn(n_envs),
        rewards=torch.randn(n_envs),
        episode_starts=torch.zeros(n_envs, dtype=torch.bool),
        terminated=torch.zeros(n_envs, dtype=torch.bool),
        truncated=torch.zeros(n_envs, dtype=torch.bool),
    )
    inputs.update(overrides)
    return inputs


def test_buffer_stores_steps():
    config = PolicyConfig(n_slots=2, hidden_dim=8)
    buffer = RolloutBuffer(n_envs=2, n_steps=3, config=config)
    steps = [
        _step_inputs(2, config, episode_starts=torch.ones(2, dtype=torch.bool)),
        _step_inputs(2, config, terminated=torch.tensor([True, False])),
        _step_inputs(
            2, config, truncated=torch.tensor([True, True]),
            bootstrap_values=torch.tensor([0.5, -0.5]),
        ),
    ]
    for inputs in steps:
        buffer.add(**inputs)
    assert buffer.full
    torch.testing.assert_close(buffer.obs[:, 1], steps[1]["obs"])
    torch.testing.assert_close(buffer.hidden_c[:, 2], steps[2]["hidden"][1])
    assert torch.equal(buffer.masks.slot_by_op[:, 0], steps[0]["masks"].slot_by_op)
    assert buffer.bootstrap_values[:, :2].eq(0).all()
    with pytest.raises(RuntimeError, match="full"):
        buffer.add(**steps[0])
    buffer.reset()
    assert buffer.step == 0


def test_bootstrap_value_is_kept_only_where_truncated():
    config = PolicyConfig(n_slots=2, hidden_dim=8)
    buffer = RolloutBuffer(n_envs=2, n_steps=1, config=config)
    buffer.add(**_step_inputs(
        2, config, truncated=torch.tensor([True, False]), terminated=torch.tensor([False, True]),
        bootstrap_values=torch.tensor([7.0, 99.0]),
    ))
    assert buffer.bootstrap_values[:, 0].tolist() == [7.0, 0.0]


def test_buffer_rejects_inconsistent_episode_ends():
    config = PolicyConfig(n_slots=2, hidden_dim=8)
    buffer = RolloutBuffer(n_envs=1, n_steps=2, config=config)
    both = torch.tensor([True])
    with pytest.raises(ValueError, match="both"):
        buffer.add(**_step_inputs(1, config, terminated=both, truncated=both))
    with pytest.raises(ValueError, match="bootstrap"):
        buffer.add(**_step_inputs(1, config, truncated=both))


def test_the_episode_end_flags_are_documented_as_the_trainer_sets_them():
    """The module said ``terminated`` meant a governor rollback, which no longer ends an
    episode (`rl.episodes.is_terminal`: only the last decision does)."""
    from esper_lightning.rl import buffer, episodes

    terminated = buffer.__doc__.split("``terminated[n, t]``")[1].split("* ``truncated")[0]
    assert "is_terminal" in terminated and "a governor rollback is not an end" in terminated
    assert "A governor rollback is never an end" in episodes.is_terminal.__doc__
    truncated = buffer.__doc__.split("``truncated[n, t]``")[1]
    assert "max epochs" not in truncated.split("\n\n")[0]  # the last decision is a terminal
