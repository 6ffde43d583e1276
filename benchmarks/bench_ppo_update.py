"""What one PPO update costs (`rl.ppo.ppo_update`), in this checkout and in others, side by
side.

    python benchmarks/bench_ppo_update.py                                 # this checkout
    python benchmarks/bench_ppo_update.py --root /tmp/before --repeats 5  # and another one

The update the PPO trainer runs after each rollout, on the same batches in every checkout: the
default `PolicyConfig` and `PPOConfig` (four epochs of minibatches of two env sequences) with
the KL early stop off, so every checkout does the same number of minibatch steps. The rollouts
are the lifecycle MDP's of the tests (`tests/lifecycle_mdp.py`, this checkout's): ``--envs``
envs, one whole episode of 12 decisions per env and rollout, as the trainer collects them.
Each checkout runs in a fresh interpreter of its own (its package first on ``sys.path``, one
torch thread), the checkouts interleaved over the repeats, their order reversed every other
repeat: it collects a rollout and updates, ``--updates`` times, timing the updates only. The
medians of the per-update times are printed, with each other checkout's over this one's, and
how far the first update's metrics (losses, entropies, gradient norm, KL) are from this
checkout's (the same work up to float rounding).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Runs in a fresh interpreter with a checkout first on ``sys.path``; ``argv[1]``: the envs,
#: ``argv[2]``: the updates. Prints the seconds of each update and the first one's metrics.
UPDATE = """
import json, sys, time
import torch
from lifecycle_mdp import EPISODE_LENGTH, SLOT_IDS, LifecycleMDP, collect_rollout
from esper_lightning.rl import (FactoredRecurrentActorCritic, PolicyConfig, PPOConfig,
    RewardNormalizer, RolloutBuffer, RunningMeanStd, ValueNormalizer, make_optimizer, obs_dim,
    ppo_update)
torch.set_num_threads(1)
torch.manual_seed(0)
n_envs, updates = int(sys.argv[1]), int(sys.argv[2])
policy_config, ppo_config = PolicyConfig(n_slots=len(SLOT_IDS)), PPOConfig(target_kl=None)
policy = FactoredRecurrentActorCritic(policy_config)
optimizer = make_optimizer(policy, ppo_config)
obs_rms = RunningMeanStd(shape=(obs_dim(len(SLOT_IDS)),))
reward_norm, value_norm = RewardNormalizer(gamma=ppo_config.gamma), ValueNormalizer()
envs = [LifecycleMDP(start) for start in ["clean", "harmful"] * (n_envs // 2)]
buffer = RolloutBuffer(n_envs, EPISODE_LENGTH, policy_config)
seconds, first = [], None
for _ in range(updates):
    collect_rollout(policy, obs_rms, envs, buffer)
    began = time.perf_counter()
    metrics = ppo_update(policy, optimizer, buffer, ppo_config, value_norm, reward_norm)
    seconds.append(time.perf_counter() - began)
    first = metrics if first is None else first
print(json.dumps([seconds, first]))
"""


def update_in(root: Path, n_envs: int, updates: int) -> tuple[list[float], dict[str, float]]:
    """Seconds of each update and the first update's metrics with ``root``'s package."""
    path = [str(root), str(ROOT / "tests")]
    code = f"import sys; sys.path[:0] = {path!r}\n" + UPDATE
    done = subprocess.run([sys.executable, "-c", code, str(n_envs), str(updates)],
                          capture_output=True, text=True, check=True)
    seconds, first = json.loads(done.stdout)
    return seconds, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", default=[], type=Path,
                        help="another checkout to time beside this one (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--updates", type=int, default=5)
    args = parser.parse_args()
    if args.envs < 2 or args.envs % 2:
        parser.error(f"--envs {args.envs}: an even number >= 2 is accepted (half clean starts)")
    roots = [ROOT, *args.root]
    seconds: dict[Path, list[float]] = {root: [] for root in roots}
    first: dict[Path, dict[str, float]] = {}
    for repeat in range(args.repeats):
        for root in roots if repeat % 2 == 0 else roots[::-1]:
            taken, first[root] = update_in(root, args.envs, args.updates)
            seconds[root].extend(taken)
    mine = statistics.median(seconds[ROOT])
    print(f"{args.envs} envs x 12 decisions, {args.updates} updates x {args.repeats} repeats; "
          f"median seconds an update")
    for root in roots:
        median = statistics.median(seconds[root])
        worst = max(abs(first[root][key] - value) for key, value in first[ROOT].items())
        print(f"{root}: {median:.3f} s, {median / mine:.2f}x this checkout's; the first "
              f"update's metrics within {worst:.1e} of this checkout's")


if __name__ == "__main__":
    main()
