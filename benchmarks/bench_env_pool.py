"""Env-pool throughput, the controller's share of a PPO round and (on CUDA) stream/precision costs.

    python benchmarks/bench_env_pool.py --data-dir ../shared/data/cifar10-subset
    python benchmarks/bench_env_pool.py --data-dir ~/data --train-subset 0 --val-subset 0  # GPU

Everything is measured side by side in one run:

1. Pool throughput. For 1, 2 and 4 envs, env-epochs per second of `EnvPool.step` (lockstep: for
   each batch index every env steps; no per-env CUDA streams, the default) against the same
   `MorphogenesisEnv` objects run one after another (sequential: each env does ``apply`` +
   ``start_epoch`` + every ``train_batch`` + ``validate`` + ``observe`` before the next starts).
   With ``--actions seed`` (default) every env first germinates a conv_light seed in ``r0c1``
   and advances it to BLENDING during the untimed warm-up, so the timed epochs train the seed and
   run the counterfactual validation over 2 configurations (in the device's default mode,
   `core.counterfactual.DEFAULT_MODES`: separate passes on CPU and CUDA); ``--actions wait``
   times bare hosts. Timed epochs use WAIT actions. Pool and sequential repeats are interleaved
   (the order rotates every repeat) over the same envs; medians are reported.
2. Controller + PPO update share of a round: a short `PPOTrainer` run (``smoke`` preset, the same
   data) and ``(controller + update) / (env + controller + update)`` seconds from its
   `RoundStats` (target <= 5%).
3. Only where CUDA is available: fp32 without per-env streams (the default) against fp32 with
   them, bf16-mixed and 16-mixed (each env's own GradScaler), and the baseline host's epoch
   time on the loaded data (target <= 1 s on full CIFAR-10).

Data: ``--data-dir`` (default: a generated 2,000/500-image fixture in a temp dir), cut to
``--train-subset``/``--val-subset`` images (0: all). The default run takes under a minute on 2
idle CPU cores. On a busy machine pass ``--threads 1``: two intra-op threads on two cores that
another process also uses make every step wait on a descheduled thread (epochs 10x slower and
erratic), which swamps the ratios measured here.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence

import lightning as L
import torch
from torch import Tensor

from esper_lightning.app.config import load_config
from esper_lightning.app.ppo.trainer import PPOTrainer
from esper_lightning.core.actions import Action, LifecycleOp, Tempo
from esper_lightning.core.counterfactual import make_plan
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.data import load_cifar10_subset, write_cifar10_fixture
from esper_lightning.envs import EnvPool, EnvSpec, MorphogenesisEnv, Observation, episode_rng_seed

Split = tuple[Tensor, Tensor]
FULL_CIFAR10 = (50_000, 10_000)
SEED_SLOT = "r0c1"
MAX_WARMUP_EPOCHS = 6


# --- data and machine -----------------------------------------------------------------------------
def machine_line(device: str) -> str:
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    return (f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"torch {torch.__version__}, lightning {L.__version__}, threads "
            f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}, {cuda}; envs on {device}")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --- drivers --------------------------------------------------------------------------------------
def sequential_epoch(envs: Sequence[MorphogenesisEnv],
                     actions: Sequence[Action]) -> list[Observation]:
    """The same work as `EnvPool.step`, but each env finishes its epoch before the next starts."""
    observations = []
    for env, action in zip(envs, actions, strict=True):
        env.execute(action)
        for _ in range(env.start_epoch()):
            env.train_batch()
        env.validate()
        observations.append(env.observe())
    return observations


def pool_epoch(pool: EnvPool, actions: Sequence[Action]) -> list[Observation]:
    return [step.observation for step in pool.step(actions)]


def timed(driver: Callable[[], list[Observation]], epochs: int, device: str) -> float:
    """Seconds for ``epochs`` calls of ``driver`` (CUDA work included)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(epochs):
        driver()
    sync(device)
    return time.perf_counter() - start


def scripted_action(env: MorphogenesisEnv) -> Action:
    """Germinate a conv_light seed, advance it to TRAINING then BLENDING, then wait."""
    assert env.engine is not None
    slot = env.engine.slots[SEED_SLOT]
    if slot.seed is None and slot.stage in (SeedStage.DORMANT, SeedStage.UNKNOWN):
        return Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light",
                      tempo=Tempo.FAST)
    if slot.stage in (SeedStage.GERMINATED, SeedStage.TRAINING):
        return Action(LifecycleOp.ADVANCE, 0)
    return Action()


def plan_sizes(envs: Sequence[MorphogenesisEnv]) -> list[int]:
    """Counterfactual configurations per validation batch, per env (1: no seed blends in)."""
    return [make_plan(env.engine.slots).size for env in envs if env.engine is not None]


def make_pool(spec: EnvSpec, train: Split, val: Split, device: str, n: int, mode: str,
              streams: bool = False) -> EnvPool:
    """A reset pool, warmed up with untimed epochs (the seed script, or one WAIT epoch)."""
    pool = EnvPool(spec, train, val, [device] * n, cuda_streams=streams)
    pool.reset([episode_rng_seed(0, 0, i) for i in range(n)])
    if mode == "wait":
        pool_epoch(pool, [Action()] * n)
    else:
        for _ in range(MAX_WARMUP_EPOCHS):
            pool_epoch(pool, [scripted_action(env) for env in pool.envs])
            if min(plan_sizes(pool.envs)) > 1:
                break
    sync(device)
    return pool


def interleaved(drivers: dict[str, Callable[[], list[Observation]]], epochs: int, repeats: int,
                device: str) -> dict[str, list[float]]:
    """Seconds per repeat of each driver; the order rotates every repeat."""
    names = list(drivers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timed(drivers[name], epochs, device))
    return times


def spread(seconds: list[float], digits: int = 2) -> str:
    return f"{min(seconds):.{digits}f}-{max(seconds):.{digits}f} s"


# --- 1. pool throughput ---------------------------------------------------------------------------
def bench_pool(args: argparse.Namespace, spec: EnvSpec, train: Split, val: Split) -> None:
    counts = sorted({int(n) for n in args.envs.split(",")})
    print(f"\n[1] pool throughput: {args.epochs} epoch(s) x {args.repeats} repeats per "
          f"measurement, pool and sequential interleaved over the same envs")
    if args.actions == "seed":
        print(f"    actions: scripted warm-up (GERMINATE conv_light in {SEED_SLOT}, ADVANCE to "
              "BLENDING), then WAIT: seed trained, counterfactual validation")
    else:
        print("    actions: WAIT only (bare hosts, one validation configuration)")
    pools = {n: make_pool(spec, train, val, args.device, n, args.actions) for n in counts}
    drivers: dict[str, Callable[[], list[Observation]]] = {}
    for n, pool in pools.items():
        wait = [Action()] * n
        drivers[f"pool{n}"] = lambda pool=pool, wait=wait: pool_epoch(pool, wait)
        drivers[f"seq{n}"] = lambda pool=pool, wait=wait: sequential_epoch(pool.envs, wait)
    times = interleaved(drivers, args.epochs, args.repeats, args.device)
    print(f"    {'envs':>4}  {'pool env-ep/s':>13}  {'seq env-ep/s':>12}  {'pool/seq':>8}  "
          f"{'pool range':>14}  {'seq range':>14}  K per val batch")
    for n, pool in pools.items():
        pool_s = statistics.median(times[f"pool{n}"])
        seq_s = statistics.median(times[f"seq{n}"])
        pool_rate, seq_rate = n * args.epochs / pool_s, n * args.epochs / seq_s
        sizes = ",".join(str(k) for k in plan_sizes(pool.envs))
        print(f"    {n:>4}  {pool_rate:>13.3f}  {seq_rate:>12.3f}  {pool_rate / seq_rate:>8.3f}  "
              f"{spread(times[f'pool{n}']):>14}  {spread(times[f'seq{n}']):>14}  {sizes}")


# --- 2. controller + PPO share --------------------------------------------------------------------
def bench_ppo_share(args: argparse.Namespace, data_dir: str, train: Split, val: Split) -> None:
    with tempfile.TemporaryDirectory(prefix="esper_bench_ppo_") as logdir:
        config = load_config("smoke", overrides={
            "data_dir": data_dir, "envs": args.ppo_envs, "episode_length": args.ppo_episode,
            "rounds": args.ppo_rounds, "progress": False, "logdir": logdir,
            "device": args.device, "batch_size": args.batch_size,
            "train_subset": len(train[1]), "val_subset": len(val[1]),  # the same images
        })
        start = time.perf_counter()
        history = PPOTrainer(config).train()
        wall = time.perf_counter() - start
    print(f"\n[2] controller + PPO update share of a round: PPOTrainer 'smoke' preset, "
          f"{config.envs} envs x {config.episode_length} epochs, {config.rounds} rounds, "
          f"slots {','.join(config.slots)}, policy_hidden {config.policy_hidden}, "
          f"{wall:.1f} s wall")
    totals = [0.0, 0.0, 0.0]
    for index, stats in enumerate(history):
        parts = (stats.env_seconds, stats.controller_seconds, stats.update_seconds)
        totals = [t + p for t, p in zip(totals, parts, strict=True)]
        share = (parts[1] + parts[2]) / sum(parts)
        print(f"    round {index}: env {parts[0]:.2f} s, controller {parts[1]:.3f} s, "
              f"update {parts[2]:.3f} s, share {share:.2%}")
    share = (totals[1] + totals[2]) / sum(totals)
    print(f"    all rounds: env {totals[0]:.2f} s, controller {totals[1]:.3f} s, update "
          f"{totals[2]:.3f} s, share {share:.2%} (target <= 5%)")


# --- 3. CUDA only ---------------------------------------------------------------------------------
def bench_cuda(args: argparse.Namespace, spec: EnvSpec, train: Split, val: Split,
               full: bool) -> None:
    if not args.device.startswith("cuda"):
        print("\n[3] streams / precision / host epoch time: skipped (no CUDA device)")
        return
    n = args.gpu_envs
    print(f"\n[3] CUDA: {n} envs, {args.epochs} epoch(s) x {args.repeats} repeats, interleaved")
    precisions = ["32-true", "bf16-mixed", "16-mixed"]
    if not torch.cuda.is_bf16_supported():
        print("    bf16-mixed: skipped (not supported by this GPU)")
        precisions.remove("bf16-mixed")
    # The library's default (no per-env streams) is the base; streams are the opt-in compared.
    configs: dict[str, tuple[str, bool]] = {"fp32": ("32-true", False),
                                            "fp32 streams": ("32-true", True)}
    configs.update({p: (p, False) for p in precisions if p != "32-true"})
    pools: dict[str, EnvPool] = {}
    for name, (precision, streams) in configs.items():
        try:
            pools[name] = make_pool(dataclasses.replace(spec, precision=precision), train, val,
                                    args.device, n, args.actions, streams)
        except Exception as err:  # report and go on: one precision must not stop the run
            print(f"    {name}: skipped ({type(err).__name__}: {err})")
    wait = [Action()] * n
    drivers = {name: (lambda pool=pool: pool_epoch(pool, wait)) for name, pool in pools.items()}
    times = interleaved(drivers, args.epochs, args.repeats, args.device)
    base = statistics.median(times["fp32"]) if "fp32" in times else None
    for name, seconds in times.items():
        median = statistics.median(seconds)
        ratio = f", time ratio to fp32 {median / base:.3f}" if base else ""
        print(f"    {name:>15}: {n * args.epochs / median:.3f} env-epochs/s (median {median:.2f} "
              f"s, range {spread(seconds)}){ratio}")
    del pools, drivers
    kind = "full CIFAR-10" if full else "NOT full CIFAR-10"
    print(f"    baseline host epoch (1 env: start_epoch + {len(train[1]) // args.batch_size} "
          f"train_batch + validate + observe), {len(train[1])} train / {len(val[1])} val "
          f"images, {kind}, batch {args.batch_size}:")
    for precision in precisions[:2]:
        pool = make_pool(dataclasses.replace(spec, precision=precision), train, val,
                         args.device, 1, "wait")
        seconds = [timed(lambda pool=pool: sequential_epoch(pool.envs, [Action()]), 1,
                         args.device) for _ in range(max(args.repeats, 3))]
        print(f"    {precision:>15}: median {statistics.median(seconds):.3f} s per epoch "
              f"(range {spread(seconds, 3)}; target <= 1 s on full CIFAR-10)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None,
                        help="CIFAR-10 folder (default: a generated 2,000/500-image fixture)")
    parser.add_argument("--train-subset", type=int, default=512, help="train images (0: all)")
    parser.add_argument("--val-subset", type=int, default=256, help="val images (0: all)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--envs", default="1,2,4", help="pool sizes, comma-separated")
    parser.add_argument("--actions", choices=("seed", "wait"), default="seed")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--gpu-envs", type=int, default=4, help="envs per CUDA measurement")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--ppo-envs", type=int, default=2)
    parser.add_argument("--ppo-episode", type=int, default=5, help="epochs per PPO episode")
    parser.add_argument("--ppo-rounds", type=int, default=2)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    for name in ("lightning.fabric", "lightning.fabric.utilities.rank_zero",
                 "lightning.pytorch.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)  # Fabric's per-env "Using ..." lines
    with tempfile.TemporaryDirectory(prefix="esper_bench_fixture_") as fixture:
        data_dir = args.data_dir or str(write_cifar10_fixture(fixture, 2000, 500))
        train = load_cifar10_subset(data_dir, True, args.train_subset or None, at_most=True)
        val = load_cifar10_subset(data_dir, False, args.val_subset or None, at_most=True)
        full = (len(train[1]), len(val[1])) == FULL_CIFAR10
        print(machine_line(args.device))
        print(f"data: {args.data_dir or 'generated fixture'}, {len(train[1])} train, "
              f"{len(val[1])} val images ({'' if full else 'not '}full CIFAR-10), "
              f"batch {args.batch_size} ({len(train[1]) // args.batch_size} batches/epoch)")
        gates = GateConfig(min_training_epochs=0)  # the scripted seed blends after one epoch
        spec = EnvSpec(slots=(SEED_SLOT,), batch_size=args.batch_size,
                       seeding=SeedingConfig(gate_config=gates))
        bench_pool(args, spec, train, val)
        bench_ppo_share(args, data_dir, train, val)
        bench_cuda(args, spec, train, val, full)


if __name__ == "__main__":
    main()
