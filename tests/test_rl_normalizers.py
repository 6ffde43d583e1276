
import numpy as np
import pytest
import torch
from helpers import torch_round_trip
from thread_ranks import run_ranks

from esper_lightning.rl import RewardNormalizer, RunningMeanStd, ValueNormalizer


def test_exact_running_stats_equal_the_stats_of_all_data():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (5, 17, 1, 40)]
    rms = RunningMeanStd(shape=(4,))
    for batch in batches:
        rms.update(torch.from_numpy(batch))
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-10)
    assert rms.count == len(data)


def test_first_update_is_exact_then_ema_of_batch_moments():
    rms = RunningMeanStd(shape=(), momentum=0.9)
    rms.update(torch.tensor([1.0, 3.0]))
    assert float(rms.mean) == 2.0 and float(rms.var) == 1.0  # no (0, 1) prior mixed in
    rms.update(torch.tensor([10.0, 10.0]))
    assert float(rms.mean) == pytest.approx(0.9 * 2 + 0.1 * 10)
    assert float(rms.var) == pytest.approx(0.9 * 1 + 0.1 * 0 + 0.9 * 0.1 * 8**2)


def test_normalize_centres_scales_and_clips():
    rms = RunningMeanStd(shape=(2,), epsilon=0.0, clip=5.0)
    rms.update(torch.tensor([[0.0, 10.0], [2.0, 30.0]]))  # mean (1, 20), std (1, 10)
    out = rms.normalize(torch.tensor([[3.0, 0.0], [101.0, 20.0]], dtype=torch.float32))
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), [[2.0, -2.0], [5.0, 0.0]])


def test_frozen_statistics_refuse_updates_and_stay_put():
    rms = RunningMeanStd(shape=(3,))
    rms.update(torch.randn(8, 3))
    before = rms.state_dict()
    x = torch.randn(2, 3)
    first = rms.normalize(x)
    rms.freeze()
    with pytest.raises(RuntimeError, match="frozen"):
        rms.update(torch.randn(8, 3) + 100)
    assert torch.equal(rms.normalize(x), first)
    assert torch.equal(rms.mean, before["mean"]) and rms.count == before["count"]
    rms.unfreeze()
    rms.update(torch.randn(8, 3) + 100)
    assert rms.count == 16


def test_bad_updates_raise():
    rms = RunningMeanStd(shape=(2,))
    with pytest.raises(ValueError, match="empty"):
        rms.update(torch.zeros(0, 2))
    with pytest.raises(ValueError, match="non-finite"):
        rms.update(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="momentum"):
        RunningMeanStd(momentum=1.0)


def test_running_mean_std_state_dict_round_trip():
    rms = RunningMeanStd(shape=(3,), momentum=0.5)
    rms.update(torch.randn(10, 3))
    rms.update(torch.randn(4, 3))
    rms.freeze()
    restored = RunningMeanStd(shape=(3,), momentum=0.5)
    restored.load_state_dict(torch_round_trip(rms.state_dict()))
    assert torch.equal(restored.mean, rms.mean) and torch.equal(restored.var, rms.var)
    assert restored.count == rms.count and restored.frozen
    x = torch.randn(5, 3)
    assert torch.equal(restored.normalize(x), rms.normalize(x))
    with pytest.raises(ValueError, match="shape"):
        RunningMeanStd(shape=(4,)).load_state_dict(rms.state_dict())


def test_reward_normalizer_scales_by_the_std_of_discounted_returns():
    norm = RewardNormalizer(gamma=0.5, epsilon=0.0)
    rewards = torch.tensor([[1.0, 2.0, 4.0, 1.0]])
    starts = torch.tensor([[True, False, True, False]])
    norm.update(rewards, starts)
    # Discounted returns, reset at the episode start of step 2: 1, 2 + 0.5, 4, 1 + 2.
    returns = np.array([1.0, 2.5, 4.0, 3.0])
    assert float(norm.returns.mean) == pytest.approx(returns.mean())
    assert float(norm.returns.var) == pytest.approx(returns.var())
    scaled = norm.normalize(rewards)
    np.testing.assert_allclose(scaled.numpy(), rewards.numpy() / returns.std(), rtol=1e-6)
    with pytest.raises(ValueError, match="episode start"):
        norm.update(rewards, torch.zeros_like(starts))


def test_reward_normalizer_clips_and_round_trips():
    norm = RewardNormalizer(gamma=0.9, clip=2.0)
    norm.update(torch.tensor([[0.1, -0.1, 0.1]]), torch.tensor([[True, False, False]]))
    assert float(norm.normalize(torch.tensor(1000.0))) == 2.0
    restored = RewardNormalizer(gamma=0.9, clip=2.0)
    restored.load_state_dict(torch_round_trip(norm.state_dict()))
    x = torch.tensor([0.3, -0.2])
    assert torch.equal(restored.normalize(x), norm.normalize(x))
    with pytest.raises(ValueError, match="gamma"):
        RewardNormalizer(gamma=0.99).load_state_dict(norm.state_dict())
    norm.freeze()
    with pytest.raises(RuntimeError):
        norm.update(torch.ones(1, 2), torch.tensor([[True, False]]))


def _terminal_only(n_episodes: int, decisions: int, rounds: int = 5):
    """The auditor's setting: an outcome (30 ± 3 points) at each episode's last step only."""
    torch.manual_seed(0)
    norm = RewardNormalizer(gamma=0.995)
    rewards = torch.zeros(n_episodes, decisions)
    rewards[:, -1] = 30 + 3 * torch.randn(n_episodes)
    starts = torch.zeros(n_episodes, decisions, dtype=torch.bool)
    starts[:, 0] = True
    for _ in range(rounds):
        norm.update(rewards, starts)
    return norm, rewards[:, -1], norm.normalize(rewards)[:, -1]


@pytest.mark.parametrize("decisions", [149, 400])
def test_a_terminal_only_reward_does_not_saturate_in_long_episodes(decisions):
    """The scaled terminal reward is about sqrt(T): at a fixed ±10 every outcome of 149-step
    episodes clipped to the same 10 and the outcome taught PPO nothing."""
    norm, outcomes, scaled = _terminal_only(16, decisions)
    assert len(set(scaled.tolist())) == 16 and bool((scaled.abs() < norm.effective_clip).all())
    assert torch.equal(scaled.argsort(), outcomes.argsort())  # better outcome, more reward
    assert norm.effective_clip == pytest.approx(10.0 * (decisions / 30) ** 0.5)


def test_the_clip_stays_at_its_bound_for_the_presets_episode_lengths():
    for decisions in (4, 11, 29, 30):
        assert _terminal_only(4, decisions, rounds=1)[0].effective_clip == 10.0
    assert RewardNormalizer(gamma=0.9).effective_clip == 10.0  # nothing seen yet
    norm = _terminal_only(4, 149, rounds=1)[0]
    restored = RewardNormalizer(gamma=0.995)
    restored.load_state_dict(torch_round_trip(norm.state_dict()))
    assert restored.effective_clip == norm.effective_clip
    older = {k: v for k, v in norm.state_dict().items() if k not in ("steps", "episodes")}
    restored.load_state_dict(older)  # a checkpoint from before: counted from the next update
    assert restored.effective_clip == 10.0


def test_value_normalizer_uses_mean_and_std():
    norm = ValueNormalizer(momentum=0.9, epsilon=0.0)
    returns = torch.tensor([10.0, 12.0, 14.0, 16.0])
    norm.update(returns)
    targets = norm.normalize(returns)
    assert float(targets.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(targets.std(unbiased=False)) == pytest.approx(1.0)
    assert torch.allclose(norm.denormalize(targets), returns)


def test_value_normalizer_round_trip_and_freeze():
    norm = ValueNormalizer()
    norm.update(torch.tensor([1.0, 5.0, 2.0]))
    norm.update(torch.tensor([-3.0, 0.0]))
    restored = ValueNormalizer()
    restored.load_state_dict(torch_round_trip(norm.state_dict()))
    assert (restored.mean, restored.std) == (norm.mean, norm.std)
    norm.freeze()
    with pytest.raises(RuntimeError):
        norm.update(torch.ones(3))


def test_moments_merged_over_ranks_equal_those_of_all_rows():
    rng = np.random.default_rng(1)
    shards = [torch.from_numpy(rng.normal(5.0, 3.0, size=(n, 3))) for n in (7, 2, 30)]
    # Two rounds on two ranks (uneven rows) against one process that saw every row.
    whole = RunningMeanStd(shape=(3,))
    whole.update(torch.cat(shards[:2]))
    whole.update(torch.cat(shards[2:]))

    def ranks(r: int, all_reduce) -> RunningMeanStd:
        rms = RunningMeanStd(shape=(3,))
        rms.update(torch.cat(shards[:2])[r::2], all_reduce)  # 9 rows split 5 / 4
        rms.update(shards[2][r::2], all_reduce)
        return rms

    for rms in run_ranks(2, ranks):
        np.testing.assert_allclose(rms.mean.numpy(), whole.mean.numpy(), rtol=1e-12)
        np.testing.assert_allclose(rms.var.numpy(), whole.var.numpy(), rtol=1e-12)
        assert rms.count == whole.count == 39

    returns = RewardNormalizer(gamma=0.9)
    rewards = torch.from_numpy(rng.normal(size=(4, 5)))
    starts = torch.zeros(4, 5, dtype=torch.bool)
    starts[:, 0] = starts[1, 3] = True
    returns.update(rewards, starts)
    merged = run_ranks(2, lambda r, reduce: _reward_update(rewards[2 * r:2 * r + 2],
                                                           starts[2 * r:2 * r + 2], reduce))
    for normalizer in merged:
        assert float(normalizer.returns.var) == pytest.approx(float(returns.returns.var),
                                                              rel=1e-12)
        assert (normalizer.steps, normalizer.episodes) == (returns.steps, returns.episodes)


def _reward_update(rewards, starts, all_reduce) -> RewardNormalizer:
    normalizer = RewardNormalizer(gamma=0.9)
    normalizer.update(rewards, starts, all_reduce)
    return normalizer
