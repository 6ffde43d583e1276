"""The ``esper-lightning`` command line.

    esper-lightning ppo --preset smoke --data-dir ../shared/data/cifar10-subset

Every user mistake (bad flag, unknown config key, bad slot, missing data, incompatible
checkpoint) prints one line naming the bad value and what is accepted, and exits with status 2;
nothing already written is touched.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from esper_lightning.app.config import PRESETS, ConfigError, load_config
from esper_lightning.data import DataError

#: Flags of ``ppo`` that map one-to-one onto `PPORunConfig` fields.
_PPO_FLAGS: dict[str, dict[str, Any]] = {
    "data_dir": {"help": "folder with cifar-10-batches-py/ (default: $ESPER_DATA_DIR)"},
    "download": {"action": "store_const", "const": True, "help": "download CIFAR-10 if missing"},
    "envs": {"type": int, "help": "parallel environments (host models)"},
    "rounds": {"type": int, "help": "PPO rounds (one episode per env, then one update)"},
    "episode_length": {"type": int, "help": "host epochs per episode"},
    "slots": {"nargs": "+", "help": "slot ids, e.g. r0c1 r0c2"},
    "host_preset": {"help": "baseline, impaired or scale"},
    "reward": {"help": "shaped, simplified or sparse"},
    "device": {"help": "cpu, cuda or cuda:N for every env"},
    "devices": {"nargs": "+", "help": "one device per env (cycled)"},
    "precision": {"help": "32-true, bf16-mixed or 16-mixed"},
    "logdir": {"help": "TensorBoard root folder"},
    "save": {"help": "checkpoint written after every round"},
    "resume": {"help": "checkpoint to continue from"},
    "rng_seed": {"type": int, "help": "root random-number seed"},
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line (no usage dump) with exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="esper-lightning", description="Morphogenetic training tools.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ppo = commands.add_parser("ppo", help="train the lifecycle controller with PPO")
    ppo.add_argument("--preset", help=f"one of {', '.join(PRESETS)}")
    ppo.add_argument("--config", help="JSON or YAML file of config keys (strict)")
    ppo.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                     help="hide the progress bar")
    for name, options in _PPO_FLAGS.items():
        ppo.add_argument("--" + name.replace("_", "-"), dest=name, default=None, **options)
    return parser


def run_ppo(args: argparse.Namespace) -> int:
    from esper_lightning.app.trainer import PPOTrainer  # heavy imports only for this command

    overrides = {k: getattr(args, k) for k in (*_PPO_FLAGS, "progress")
                 if getattr(args, k) is not None}
    config = load_config(args.preset, args.config, overrides)
    history = PPOTrainer(config).train()
    if history:
        last = history[-1]
        accuracy = sum(last.final_accuracies) / max(len(last.final_accuracies), 1)
        print(f"done: {config.rounds} rounds, last round final accuracy {accuracy:.2f}%")
    if config.save:
        print(f"checkpoint: {config.save}")
    print(f"TensorBoard: tensorboard --logdir {config.logdir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run_ppo(args)
    except (ConfigError, DataError) as err:
        print(f"{parser.prog} {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
