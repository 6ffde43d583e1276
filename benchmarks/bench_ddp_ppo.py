"""DD-PPO scaling on one machine: the same PPO rounds on 1 and on N processes (CPU, gloo).

    python benchmarks/bench_ddp_ppo.py --threads 1
    python benchmarks/bench_ddp_ppo.py --data-dir ../shared/data/cifar10-subset --envs 4 --rounds 4

For each process count (``--processes``, default 1 2) the same run (``smoke`` preset, ``--envs``
envs in all, split evenly over the processes, started with Fabric's ``ddp_fork`` launcher) plays
``--rounds`` rounds; the first is a warm-up and is not timed. Per process count it prints:

* env-epochs/s: env epochs of every rank per second of round wall time (rank 0's clock);
* seconds per round, and of them the time rank 0 spent in collectives (the update's
  all-reduces and the statistics gather), which includes waiting for the slowest rank;
* a microbenchmark between the ranks: one all-reduce of the policy's gradient size, and one of
  a small statistics vector (median of 50 each);

and a projection of the collectives' share of a round as ranks and envs grow, from the measured
latency and bandwidth with a ring all-reduce model (docs/scaling.md explains it).

On a 2-core machine only 1 and 2 processes are meaningful. Pass ``--threads 1`` on a machine
other jobs use (two intra-op threads per process on shared cores make steps wait on a
descheduled thread).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from esper_lightning.app.config import PPORunConfig, load_config
from esper_lightning.app.ppo.metrics import merge_stats
from esper_lightning.app.ppo.ranks import Ranks
from esper_lightning.app.ppo.trainer import PPOTrainer
from esper_lightning.data import write_cifar10_fixture

MICRO_REPEATS = 50


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="CIFAR-10 folder (default: a fixture)")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--envs", type=int, default=4, help="envs in all (every process count)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the first one untimed")
    parser.add_argument("--episode-length", type=int, default=4)
    parser.add_argument("--train-subset", type=int, default=512)
    parser.add_argument("--val-subset", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch threads per process")
    return parser.parse_args()


def run_config(args: argparse.Namespace, data_dir: str, processes: int) -> PPORunConfig:
    values: dict[str, Any] = {
        "data_dir": data_dir, "envs": args.envs, "minibatch_envs": args.envs,
        "rounds": args.rounds, "episode_length": args.episode_length, "progress": False,
        "train_subset": args.train_subset, "val_subset": args.val_subset, "save": None,
        "logdir": tempfile.mkdtemp(prefix="bench_ddp_"),
    }
    if processes > 1:
        values.update(strategy="ddp_fork", devices=[str(processes)])
    return load_config("smoke", overrides=values)


def measure(fabric: L.Fabric | None, config: PPORunConfig) -> dict[str, Any] | None:
    """One process of a run: the timed rounds, then the collective microbenchmark."""
    ranks = Ranks.from_fabric(fabric) if fabric is not None else Ranks()
    trainer = PPOTrainer(config, ranks)
    rounds = []
    for index in range(config.rounds):
        comm, start = ranks.comm_seconds, time.perf_counter()
        stats = merge_stats(ranks.gather(trainer.run_round(index)[0]))
        trainer.round = index + 1
        rounds.append({"seconds": time.perf_counter() - start, "steps": stats.steps,
                       "comm": ranks.comm_seconds - comm, "update": stats.update_seconds,
                       "env": stats.env_seconds})
    n_params = sum(p.numel() for p in trainer.learners[0].policy.parameters())
    micro = microbenchmark(ranks, n_params) if ranks.world_size > 1 else {}
    return {"rounds": rounds[1:], "n_params": n_params, **micro} if ranks.is_zero else None


def microbenchmark(ranks: Ranks, n_params: int) -> dict[str, float]:
    """Median seconds of one all-reduce of the gradient size and of a small vector."""
    out = {}
    for name, size in (("t_grad", n_params), ("t_small", 10)):
        tensor, times = torch.zeros(size), []
        dist.barrier(group=ranks.group)
        for _ in range(MICRO_REPEATS):
            start = time.perf_counter()
            ranks.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)
    return out


def run(config: PPORunConfig, processes: int) -> dict[str, Any]:
    if processes == 1:
        result = measure(None, config)
    else:
        fabric = L.Fabric(accelerator="cpu", strategy="ddp_fork", devices=processes)
        result = fabric.launch(measure, config)
    assert result is not None
    return result


def collectives_per_round(config: PPORunConfig) -> tuple[int, int]:
    """(gradient-sized, small) all-reduces of one round when no update stops early."""
    minibatches = -(-config.envs // min(config.minibatch_envs, config.envs))
    steps = config.ppo_epochs * minibatches
    # normalisers 3 x 2, per step the counts and the advantage variance, per epoch the KL,
    # the metrics, explained variance 2 x 2, and the statistics gather
    small = 6 + 2 * steps + config.ppo_epochs + 1 + 4 + 1
    return steps, small


def project(result: dict[str, Any], single: dict[str, Any], config: PPORunConfig) -> None:
    """Ring all-reduce model t(P) = 2(P-1) alpha + 2(P-1)/P * bytes/beta, with alpha and
    bytes/beta from the 2-process microbenchmark (P = 2: t_small = 2 alpha, t_grad - t_small =
    bytes/beta), against the env time of one env-epoch measured on one process."""
    alpha = result["t_small"] / 2
    transfer = max(result["t_grad"] - result["t_small"], 0.0)
    env_epoch = sum(r["env"] for r in single["rounds"]) / sum(r["steps"] for r in
                                                               single["rounds"])
    big, small = collectives_per_round(config)
    print(f"\nprojection (same machine's alpha = {alpha * 1e6:.0f} us, gradient transfer = "
          f"{transfer * 1e6:.0f} us; one env-epoch = {env_epoch * 1e3:.0f} ms here; "
          f"{big} gradient + {small} small all-reduces per round):")
    print("| ranks | envs per rank | collectives s/round | env s/round | collectives share |")
    print("|---|---|---|---|---|")
    for p in (2, 8, 32, 128):
        t_small = 2 * (p - 1) * alpha
        t_grad = t_small + 2 * (p - 1) / p * transfer
        comm = big * t_grad + small * t_small
        for per_rank in (1, 4):
            env = per_rank * config.episode_length * env_epoch
            print(f"| {p} | {per_rank} | {comm:.4f} | {env:.2f} | {comm / (comm + env):.2%} |")


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    data_dir = args.data_dir
    if data_dir is None:
        data_dir = str(write_cifar10_fixture(Path(tempfile.mkdtemp()) / "cifar", n_train=2000,
                                             n_test=500, rng_seed=0))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"lightning {L.__version__}, threads {torch.get_num_threads()}, load "
          f"{os.getloadavg()[0]:.2f}; {args.envs} envs in all, episode length "
          f"{args.episode_length}, {args.rounds - 1} timed rounds")
    print("| processes | env-epochs/s | s/round | collectives s/round | collectives share "
          "| update s/round | all-reduce grad / small |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for processes in args.processes:
        results[processes] = result = run(run_config(args, data_dir, processes), processes)
        rounds = result["rounds"]
        seconds = sum(r["seconds"] for r in rounds)
        comm = sum(r["comm"] for r in rounds)
        micro = (f"{result['t_grad'] * 1e6:.0f} us / {result['t_small'] * 1e6:.0f} us"
                 if "t_grad" in result else "-")
        print(f"| {processes} | {sum(r['steps'] for r in rounds) / seconds:.2f} | "
              f"{seconds / len(rounds):.2f} | {comm / len(rounds):.4f} | "
              f"{comm / seconds:.2%} | {sum(r['update'] for r in rounds) / len(rounds):.3f} "
              f"| {micro} |")
    print(f"policy parameters: {results[args.processes[0]]['n_params']:,}")
    if 1 in results and 2 in results:
        project(results[2], results[1], run_config(args, data_dir, 1))


if __name__ == "__main__":
    main()
