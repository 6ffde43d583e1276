"""PPO learns the known optimal policy of the scripted lifecycle MDP (`lifecycle_mdp`).

Nothing is stubbed: Obs V3 features from real `EpochReport`s, the observation normaliser frozen
during each rollout and updated once after it, the recurrent factored policy sampling under the
real masks, the rollout buffer, the running-std reward normaliser, the value normaliser and
`ppo_update`. Run with ``-s`` to see the number of updates each seed needed.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch
from lifecycle_mdp import (
    EPISODE_LENGTH,
    OPTIMAL_RETURN,
    SLOT_IDS,
    LifecycleMDP,
    collect_rollout,
    optimal_actions,
)

from esper_lightning.core.actions import Action
from esper_lightning.rl import (
    FactoredRecurrentActorCritic,
    PolicyConfig,
    PPOConfig,
    RewardNormalizer,
    RolloutBuffer,
    RunningMeanStd,
    ValueNormalizer,
    batch_observations,
    make_optimizer,
    obs_dim,
    ppo_update,
)

N_ENVS = 16  # half clean, half harmful starts; one episode each per round
#: Of rng seeds 0-14 (`train_until_solved`, one at a time), 14 solve, median 18.5 updates: seeds
#: 0-8 after 23, 14, 51, 17, 15, 11, 75, 30 and 18, seeds 9-14 after 23, 27, 9, never, 19 and
#: 17. So seed 6 solves only 5 updates inside this limit and seed 12 not within it; the five
#: seeds the test runs need at most 51. Float rounding moves a seed's trajectory, so they are a
#: sample of that distribution, not a guarantee for every seed.
MAX_UPDATES = 80
SOLVED_FRACTION = 0.9
# Tuned for speed on this tiny MDP (defaults are for real hosts): a larger step size, whole
# halves of the batch per minibatch, and a looser KL stop.
PPO = PPOConfig(
    learning_rate=2e-3, gamma=0.99, gae_lambda=0.95, n_epochs=4, minibatch_envs=8, target_kl=0.1
)
POLICY = PolicyConfig(n_slots=len(SLOT_IDS), hidden_dim=64, head_hidden_dim=64)


@pytest.fixture(autouse=True)
def _isolated_numerics():
    """Every generator and the thread count this test's numbers depend on, set here, so the
    result is the same alone and in any test order (other tests may change either)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.random.fork_rng():
        yield
    torch.set_num_threads(threads)


class Agent:
    """Policy, optimiser and normalisers of one training run."""

    def __init__(self, rng_seed: int) -> None:
        random.seed(rng_seed)
        np.random.seed(rng_seed)
        torch.manual_seed(rng_seed)
        self.policy = FactoredRecurrentActorCritic(POLICY)
        self.optimizer = make_optimizer(self.policy, PPO)
        self.obs_rms = RunningMeanStd(shape=(obs_dim(len(SLOT_IDS)),))
        self.reward_norm = RewardNormalizer(gamma=PPO.gamma)
        self.value_norm = ValueNormalizer()

    def greedy_return(self) -> float:
        """Mean return of the deterministic (argmax) policy over the starts, played side by
        side as one batch (half the policy calls of one start after the other)."""
        envs = [LifecycleMDP(start) for start in OPTIMAL_RETURN]
        reports = [env.reset() for env in envs]
        hidden = self.policy.initial_state(len(envs))
        total = 0.0
        for t in range(EPISODE_LENGTH):
            raw, indices, masks = batch_observations(reports)
            out = self.policy.act(
                self.obs_rms.normalize(raw), indices, masks, hidden,
                deterministic=True, episode_starts=torch.full((len(envs),), t == 0),
            )
            steps = [env.step(Action.from_indices(a)) for env, a in
                     zip(envs, out.actions.tolist(), strict=True)]
            reports = [report for report, _, _ in steps]
            total += sum(reward for _, reward, _ in steps)
            hidden = out.hidden
        return total / len(envs)


def train_until_solved(rng_seed: int) -> tuple[int | None, list[float]]:
    """PPO updates until the greedy policy earns >= 90% of the optimal mean return.

    Returns the number of updates it took (None if not within `MAX_UPDATES`) and the greedy
    mean return after each update.
    """
    agent = Agent(rng_seed)
    envs = [LifecycleMDP(start) for start in ["clean", "harmful"] * (N_ENVS // 2)]
    buffer = RolloutBuffer(N_ENVS, EPISODE_LENGTH, POLICY)
    target = SOLVED_FRACTION * sum(OPTIMAL_RETURN.values()) / len(OPTIMAL_RETURN)
    greedy: list[float] = []
    for update in range(1, MAX_UPDATES + 1):
        collect_rollout(agent.policy, agent.obs_rms, envs, buffer)
        ppo_update(agent.policy, agent.optimizer, buffer, PPO, agent.value_norm, agent.reward_norm)
        greedy.append(agent.greedy_return())
        if greedy[-1] >= target:
            return update, greedy
    return None, greedy


def test_scripted_optimal_policy_earns_the_optimal_return():
    for start, optimum in OPTIMAL_RETURN.items():
        env = LifecycleMDP(start)
        env.reset()
        total = sum(env.step(action)[1] for action in optimal_actions(start))
        assert total == pytest.approx(optimum)


def test_pruning_before_germinating_is_worse():
    """The ordering the agent has to discover: an early prune embargoes germination."""
    env = LifecycleMDP("harmful")
    env.reset()
    plan = optimal_actions("harmful")
    plan[0], plan[1] = plan[1], plan[0]  # PRUNE first: GERMINATE is then illegal
    _, reward, _ = env.step(plan[0])
    assert not env.report.masks.op[int(plan[1].op)]
    assert reward == pytest.approx(0.6)


def test_untrained_policy_is_far_from_optimal():
    agent = Agent(rng_seed=0)
    greedy = agent.greedy_return()
    assert greedy < 0.5 * sum(OPTIMAL_RETURN.values()) / len(OPTIMAL_RETURN)


@pytest.mark.parametrize("rng_seed", [0, 1, 2, 3, 4])
def test_ppo_reaches_90_percent_of_the_optimal_return(rng_seed):
    began = time.perf_counter()
    updates, greedy = train_until_solved(rng_seed)
    elapsed = time.perf_counter() - began
    curve = ", ".join(f"{g:.2f}" for g in greedy)
    print(f"\nrng seed {rng_seed}: solved after {updates} PPO updates in {elapsed:.1f}s; "
          f"greedy: {curve}")
    assert updates is not None, f"not solved within {MAX_UPDATES} updates: {curve}"
