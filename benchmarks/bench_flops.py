"""What FLOP metering costs an episode: the same episodes with the meter and with a stub.

    python benchmarks/bench_flops.py --text ../shared/data/shakespeare/shakespeare.txt

One env plays the growth-at-equal-compute task (preset ``lm-grow``: the one-block GPT of width 32,
4 heads, 32-byte blocks, batch 32; by default an episode of its length) for ``--epochs`` epochs
of ``--batches`` batches,
under a controller that grows a ``lora`` seed through every stage (germinated, incubating,
blending, holding, fossilized: each stage is a new architecture to measure), in two
configurations played in interleaved repeats:

* ``metered``: the env as it is: every training step looks its architecture signature up in the
  meter's cache (`core.flops.signature`; the architecture itself is read once per epoch), and
  each new signature costs one meta forward/backward (`FlopMeter`); validation and the
  counterfactual are metered too;
* ``stub``: the meter's methods return 0 at once (no signature, no measurement).

``cold``: a fresh env per episode, so its meter measures every signature again (the first
episode of a run); ``warm``: the same env for every episode, its cache filled by the first (every
later episode of a run: a pool's envs keep their meters). Within each metered episode every
meter call and architecture read is timed, side by side with the rest of the episode, so
``episode / (episode - meter)`` is the metering's cost measured within the same run (target:
<= 1.01); the end-to-end ratio against the stub is printed too, but on a shared machine its
noise is larger than the effect. Also printed: the meta passes per episode and the cost of one
step's meter reading against one training step.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

from esper_lightning.controllers import GrowerController
from esper_lightning.core.flops import FlopMeter, structure
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.envs import EnvPool, EnvSpec
from esper_lightning.envs import env as env_module
from esper_lightning.envs.tasks import TextTask

METHODS = ("training_step", "forward", "counterfactual")


@contextmanager
def patched_meter(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Any:
    """Every `FlopMeter` reading and the env's architecture read replaced by ``wrap`` of
    itself, restored on exit."""
    saved = {name: getattr(FlopMeter, name) for name in METHODS}
    for name, method in saved.items():
        setattr(FlopMeter, name, wrap(method))
    env_module.structure = wrap(structure)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(FlopMeter, name, method)
        env_module.structure = structure


def stubbed_meter() -> Any:
    """Every `FlopMeter` reading returns 0 without looking at the module, and the env reads no
    architecture."""
    return patched_meter(lambda fn: lambda *args, **kwargs: 0 if fn is not structure else None)


def clocked_meter(clock: list[float]) -> Any:
    """Every meter reading and architecture read, timed: their seconds add up in ``clock[0]``
    (the metering's whole cost inside the episode, side by side with the rest of it)."""
    def timed_call(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock[0] += time.perf_counter() - start
        return call

    return patched_meter(timed_call)


def make_pool(text: str, args: argparse.Namespace) -> EnvPool:
    task = TextTask(block_size=32, train_blocks=32 * args.batches, val_blocks=args.val_blocks)
    spec = EnvSpec(task=task, host_preset="w32l1", slots=("r0c0",), batch_size=32,
                   host_lr=8e-3, episode_length=args.epochs,
                   seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=2)))
    return EnvPool(spec, *task.load(text), [args.device])


def play(pool: EnvPool, rng_seed: int) -> tuple[float, int]:
    """One episode: its wall seconds and the meta passes its meter ran."""
    env = pool.envs[0]
    before = env.ledger.meter.measurements
    controller = GrowerController("lora", slots=(0,), topology="transformer")
    start = time.perf_counter()
    observations = pool.reset([rng_seed])
    for _ in range(pool.spec.episode_length - 1):
        (step,) = pool.step([controller.decide(observations[0].report)])
        observations = [step.observation]
    return time.perf_counter() - start, env.ledger.meter.measurements - before


def timed(fn: Callable[[], Any], repeats: int = 200) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def lookup_vs_step(pool: EnvPool) -> tuple[float, float, float]:
    """Seconds of a step's meter reading (the architecture read once per epoch, then a cache
    lookup), of reading the architecture (`structure`, once per epoch) and of one training
    step of the env's host."""
    env = pool.envs[0]
    pool.reset([0])
    env.start_epoch()
    x = torch.zeros(32, 32, dtype=torch.long, device=env.device)
    lookup = timed(lambda: env.ledger.meter.training_step(env.host, x, arch=env._arch))
    arch = timed(lambda: structure(env.host))
    step = timed(env.train_batch, repeats=min(50, len(env.loader) - 2))
    return lookup, arch, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", required=True, help="a text file (Shakespeare)")
    # The defaults are an episode of preset lm-grow: 20 epochs of its budget, about 17,500
    # batches of the one-block host, and its 1,024 validation blocks.
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batches", type=int, default=875, help="training batches per epoch")
    parser.add_argument("--val-blocks", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warm = make_pool(args.text, args)
    play(warm, 0)  # warm-up: imports, allocator, and the warm env's cache
    times: dict[str, list[float]] = {k: [] for k in ("cold", "warm", "stub")}
    inside: dict[str, list[float]] = {"cold": [], "warm": []}
    passes: dict[str, list[int]] = {"cold": [], "warm": []}
    for repeat in range(args.repeats):
        for kind in ("cold", "warm", "stub"):
            pool = warm if kind == "warm" else make_pool(args.text, args)
            clock = [0.0]
            with stubbed_meter() if kind == "stub" else clocked_meter(clock):
                seconds, measured = play(pool, 1 + repeat)
            times[kind].append(seconds)
            if kind != "stub":
                inside[kind].append(clock[0])
                passes[kind].append(measured)
    report(args, times, inside, passes, lookup_vs_step(warm))


def report(args: argparse.Namespace, times: dict[str, list[float]],
           inside: dict[str, list[float]], passes: dict[str, list[int]],
           costs: tuple[float, float, float]) -> None:
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
          f"{args.threads} thread(s), device {args.device}, load {os.getloadavg()[0]:.1f}")
    print(f"episode: {args.epochs} epochs x {args.batches} batches of 32 x 32 bytes, "
          f"{args.val_blocks} validation blocks, one lora seed grown; {args.repeats} repeats")
    print("| episode | episode time | inside the meter | episode / (episode - meter) | "
          "end to end: metered / stub | meta passes |")
    print("|---|---|---|---|---|---|")
    for kind in ("cold", "warm"):
        ratios = [t / (t - m) for t, m in zip(times[kind], inside[kind], strict=True)]
        print(f"| {kind} | {median[kind]:.2f} s | {statistics.median(inside[kind]):.3f} s | "
              f"**{statistics.median(ratios):.4f}** | {median[kind] / median['stub']:.3f} "
              f"(stub {median['stub']:.2f} s) | {statistics.median(passes[kind]):.0f} |")
    lookup, arch, step = costs
    print(f"per step: meter reading {lookup * 1e6:.1f} us against a training step of "
          f"{step * 1e3:.2f} ms ({lookup / step:.3%}); per epoch: reading the architecture "
          f"{arch * 1e6:.1f} us")


if __name__ == "__main__":
    main()
