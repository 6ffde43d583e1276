import copy
import math

import pytest
import torch
from lifecycle_mdp import (
    EPISODE_LENGTH,
    LifecycleMDP,
    collect_rollout,
)
from thread_ranks import run_ranks

from esper_lightning.core.actions import HEADS
from esper_lightning.rl import (
    FactoredRecurrentActorCritic,
    PolicyConfig,
    PPOConfig,
    RewardNormalizer,
    RolloutBuffer,
    RunningMeanStd,
    ValueNormalizer,
    explained_variance,
    make_optimizer,
    obs_dim,
    ppo_update,
)
from esper_lightning.rl.ppo import (
    batch_divergence,
    clipped_surrogate_loss,
    divergence_sums,
    masked_head_means,
    minibatches,
)

POLICY = PolicyConfig(n_slots=2, hidden_dim=16, head_hidden_dim=16)
METRICS = {
    "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance",
    "grad_norm", "epochs_run", "early_stopped", *(f"entropy/{h}" for h in HEADS),
}


def _setup(rng_seed: int = 0, n_envs: int = 4):
    torch.manual_seed(rng_seed)
    policy = FactoredRecurrentActorCritic(POLICY)
    buffer = RolloutBuffer(n_envs, EPISODE_LENGTH, POLICY)
    envs = [LifecycleMDP(("clean", "harmful")[i % 2]) for i in range(n_envs)]
    collect_rollout(policy, RunningMeanStd(shape=(obs_dim(2),)), envs, buffer)
    return policy, buffer


def _relevant(*rows: list[int]) -> torch.Tensor:
    return torch.tensor([rows], dtype=torch.float32)  # [1, T, heads]


# --- loss pieces on hand-made numbers ----------------------------------------------------------
def test_clipped_surrogate_counts_only_relevant_heads_and_clips():
    # Two steps, three heads. Step 0 (A = +1): ratios 1.5 (clipped to 1.2), 0.5, and an
    # irrelevant head with ratio 9 that must not count. Step 1 (A = -2): ratio 0.5 (clipped to
    # 0.8, pessimistic max picks the clipped one) and 1.1.
    ratio = torch.tensor([[[1.5, 0.5, 9.0], [0.5, 1.1, 1.0]]])
    advantages = torch.tensor([[1.0, -2.0]])
    relevant = _relevant([1, 1, 0], [1, 1, 0])
    loss = clipped_surrogate_loss(ratio, advantages, relevant, clip_coef=0.2)
    step0 = -(1.2 * 1.0) + -(0.5 * 1.0)  # min(r·A, clip(r)·A) per head, negated
    step1 = -(0.8 * -2.0) + -(1.1 * -2.0)
    assert float(loss) == pytest.approx((step0 + step1) / 2)


def test_joint_kl_sums_relevant_heads():
    logratio = torch.tensor([[[0.1, 0.2, 5.0], [-0.1, 0.0, 5.0]]])
    relevant = _relevant([1, 1, 0], [1, 0, 0])
    joint = torch.tensor([0.3, -0.1])
    expected = ((joint.exp() - 1) - joint).sum()
    kl_sum, steps = divergence_sums(logratio, relevant, 0.2)[:2].tolist()
    assert (kl_sum, steps) == (pytest.approx(float(expected)), 2.0)
    # Summing (joint) is larger than a per-head average would be.
    per_head = ((logratio.exp() - 1) - logratio)[..., :2].mean()
    assert kl_sum / steps > float(per_head)


def test_clip_fraction_and_masked_head_means():
    logratio = torch.tensor([[[1.5, 1.0, 3.0], [1.0, 0.7, 1.0]]]).log()
    relevant = _relevant([1, 1, 0], [1, 1, 0])
    # Ratios 1.5 and 0.7 left [0.8, 1.2]; the irrelevant head's 3.0 does not count.
    assert divergence_sums(logratio, relevant, 0.2)[2:].tolist() == [2.0, 4.0]
    values = torch.tensor([[[0.4, 0.9, 0.5], [0.6, 0.1, 0.5]]])
    relevant = _relevant([1, 0, 0], [1, 1, 0])
    means = masked_head_means(values, relevant, relevant.sum((0, 1)))
    torch.testing.assert_close(means, torch.tensor([0.5, 0.1, 0.0]))
    # Against counts of more steps (other ranks'), this rank's share of the mean.
    torch.testing.assert_close(masked_head_means(values, relevant, torch.tensor([4.0, 2.0, 0.0])),
                               torch.tensor([0.25, 0.05, 0.0]))


def test_explained_variance():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target) == 1.0
    assert explained_variance(torch.zeros(4), target) == pytest.approx(0.0)
    assert math.isnan(explained_variance(target, torch.ones(4)))


# --- the update -------------------------------------------------------------------------------
def test_update_returns_cleanrl_metrics_and_changes_the_policy():
    policy, buffer = _setup()
    before = [p.detach().clone() for p in policy.parameters()]
    config = PPOConfig(minibatch_envs=2, n_epochs=3, target_kl=None)
    value_norm = ValueNormalizer()
    metrics = ppo_update(policy, make_optimizer(policy, config), buffer, config, value_norm)
    assert set(metrics) == METRICS
    assert all(math.isfinite(v) for k, v in metrics.items() if k != "explained_variance")
    assert metrics["epochs_run"] == 3 and metrics["early_stopped"] == 0
    assert value_norm.stats.count == buffer.n_envs * buffer.n_steps  # one update per round
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    assert 0 <= metrics["entropy/op"] <= 1


def test_logged_kl_is_the_whole_batch_movement_after_the_update():
    """Unchanged parameters re-evaluate to the stored log-probs (KL 0, no clipping); the logged
    KL is the whole batch's divergence from the rollout policy after the last epoch, not the
    average of per-minibatch values measured before each step (whose first is always 0)."""
    policy, buffer = _setup()
    assert batch_divergence(policy, buffer, 0.2) == {"approx_kl": 0.0, "clipfrac": 0.0}
    config = PPOConfig(minibatch_envs=2, n_epochs=2, target_kl=None, learning_rate=1e-3)
    metrics = ppo_update(policy, make_optimizer(policy, config), buffer, config, ValueNormalizer())
    after = batch_divergence(policy, buffer, config.clip_coef)
    assert metrics["approx_kl"] == after["approx_kl"] > 0.0
    assert metrics["clipfrac"] == after["clipfrac"]


def test_target_kl_stops_the_update_early():
    policy, buffer = _setup()
    config = PPOConfig(minibatch_envs=1, n_epochs=4, target_kl=1e-9, learning_rate=1e-2)
    metrics = ppo_update(policy, make_optimizer(policy, config), buffer, config, ValueNormalizer())
    assert metrics["early_stopped"] == 1.0
    assert metrics["epochs_run"] == 1  # the whole-batch KL after the first epoch exceeds it


def test_update_is_reproducible_with_a_seed():
    results = []
    for _ in range(2):
        policy, buffer = _setup(rng_seed=5)
        config = PPOConfig(minibatch_envs=2)
        reward_norm = RewardNormalizer(config.gamma)
        metrics = ppo_update(
            policy, make_optimizer(policy, config), buffer, config, ValueNormalizer(), reward_norm
        )
        results.append((metrics, [p.detach().clone() for p in policy.parameters()]))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


def test_reward_normalizer_is_updated_once_and_applied():
    policy, buffer = _setup()
    buffer.rewards *= 1000.0
    reward_norm = RewardNormalizer(gamma=0.99)
    config = PPOConfig(target_kl=None)
    value_norm = ValueNormalizer()
    ppo_update(policy, make_optimizer(policy, config), buffer, config, value_norm, reward_norm)
    assert reward_norm.returns.count == buffer.n_envs * buffer.n_steps
    # Returns were computed from rescaled rewards: their scale is ~1, not ~1000.
    assert value_norm.std < 50


def test_value_head_does_not_jump_when_the_normaliser_moves():
    """PopArt-style output preservation: de-normalised predictions are unchanged by the
    statistics update alone (checked with a zero learning rate)."""
    policy, buffer = _setup()
    value_norm = ValueNormalizer()
    value_norm.update(torch.tensor([0.0, 1.0]))
    before = value_norm.denormalize(policy.evaluate(
        buffer.obs, buffer.blueprint_idx, buffer.actions, buffer.masks,
        (buffer.hidden_h[:, 0], buffer.hidden_c[:, 0]), buffer.episode_starts,
    ).values.detach())
    config = PPOConfig(learning_rate=0.0, target_kl=None)  # statistics update only
    ppo_update(policy, make_optimizer(policy, config), buffer, config, value_norm)
    assert value_norm.stats.count > 2
    after = value_norm.denormalize(policy.evaluate(
        buffer.obs, buffer.blueprint_idx, buffer.actions, buffer.masks,
        (buffer.hidden_h[:, 0], buffer.hidden_c[:, 0]), buffer.episode_starts,
    ).values.detach())
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_config_validation():
    with pytest.raises(ValueError, match="entropy_coefs"):
        PPOConfig(entropy_coefs={"op": 0.01})
    with pytest.raises(ValueError, match="minibatch_envs"):
        PPOConfig(minibatch_envs=0)
    with pytest.raises(ValueError, match="target_kl"):
        PPOConfig(target_kl=0.0)
    policy, buffer = _setup()
    buffer.reset()
    with pytest.raises(RuntimeError, match="0/"):
        ppo_update(policy, make_optimizer(policy, PPOConfig()), buffer, PPOConfig(),
                   ValueNormalizer())


def _envs_of(buffer: RolloutBuffer, envs: slice) -> RolloutBuffer:
    """The rollout of some envs only: what one rank of a data-parallel run collected."""
    part = copy.copy(buffer)
    for name, value in vars(buffer).items():
        if isinstance(value, torch.Tensor):
            setattr(part, name, value[envs])
    part.masks, part.n_envs = buffer.masks.index(envs), len(range(buffer.n_envs)[envs])
    return part


@pytest.mark.parametrize(("minibatch_envs", "target_kl"), [(4, None), (4, 0.004), (2, None),
                                                         (1, 0.004)])
def test_two_ranks_on_half_the_envs_each_update_like_one_process_on_all(minibatch_envs,
                                                                        target_kl):
    """DD-PPO: every rank ends with the policy of one process on the whole batch (float32
    rounding of sums taken in another order), takes as many steps (the KL stop is one decision)
    and logs the same metrics. Minibatches smaller than the batch mix the ranks' envs as one
    process would (`minibatches`); with one env per minibatch a rank often holds none."""
    policy, buffer = _setup(rng_seed=3)
    config = PPOConfig(minibatch_envs=minibatch_envs, n_epochs=3, target_kl=target_kl,
                       learning_rate=3e-3)
    start = copy.deepcopy(policy)
    alone = ppo_update(policy, make_optimizer(policy, config), buffer, config,
                       ValueNormalizer(), RewardNormalizer(config.gamma),
                       generator=torch.Generator().manual_seed(7))

    def rank(r: int, all_reduce):
        mine = copy.deepcopy(start)
        envs = _envs_of(buffer, slice(2 * r, 2 * r + 2))
        metrics = ppo_update(mine, make_optimizer(mine, config), envs, config, ValueNormalizer(),
                             RewardNormalizer(config.gamma), all_reduce, rank=r, world_size=2,
                             generator=torch.Generator().manual_seed(7))
        return mine, metrics

    ranks = run_ranks(2, rank)
    if target_kl is not None:
        assert alone["early_stopped"] == 1.0 and alone["epochs_run"] < 3  # the stop is tested
    for mine, metrics in ranks:
        assert metrics["epochs_run"] == alone["epochs_run"]
        for key, value in alone.items():
            assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        for a, b in zip(mine.parameters(), policy.parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for a, b in zip(*(m.parameters() for m, _ in ranks), strict=True):
        assert torch.equal(a, b)  # bitwise: every rank applied the same summed gradient


def test_minibatches_partition_every_ranks_envs_as_one_process_does():
    """Each global minibatch is one process's minibatch, split by rank; each rank gets every one
    of its envs exactly once per epoch."""
    whole = minibatches(6, 2, generator=torch.Generator().manual_seed(1))
    parts = [minibatches(2, 2, r, 3, generator=torch.Generator().manual_seed(1))
             for r in range(3)]
    assert [len(m) for m in whole] == [2, 2, 2]
    for i, batch in enumerate(whole):
        joined = [int(k) + 2 * r for r in range(3) for k in parts[r][i]]
        assert sorted(joined) == sorted(batch.tolist())
    for part in parts:
        assert sorted(int(k) for batch in part for k in batch) == [0, 1]
    # A minibatch of 2 envs spans at most 2 of the 3 ranks: the third holds none of it.
    assert all(min(len(parts[r][i]) for r in range(3)) == 0 for i in range(3))
