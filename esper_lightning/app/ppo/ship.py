"""Shipping a trained policy: ``esper-lightning ship CKPT --out policies/NAME.pt``.

A PPO checkpoint holds the whole training state (the policy optimizer, the reward and value
normalisers, the random-number states); a policy that a results table was measured with needs
only what acts (`rl.checkpoint.policy_entries`), what it was trained with (``config``) and how
(``commands``, ``training_cost``). `ship_policy` writes that much (343 KB for the grow124
timing policy, a third of its checkpoint), which ``policy:PATH`` and `PolicyController` read
like any checkpoint, and records it in the folder's ``manifest.json``: its SHA-256, the
command lines that trained it, what training cost (rounds, episodes, their training FLOPs, wall
time) and the code that shipped it. A policy table then reproduces without retraining, and a
shipped file is checked against its entry with ``sha256sum``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from esper_lightning.app.cli import own_parser, run_own
from esper_lightning.errors import ConfigError

__all__ = ["MANIFEST", "build_parser", "main", "ship_policy"]

#: The manifest every policy folder keeps beside its files.
MANIFEST = "manifest.json"
#: What a shipped file keeps of a checkpoint besides the policy's own entries.
_KEPT = ("round", "config", "run_config", "training_cost", "commands")


def ship_policy(checkpoint: str | Path, out: str | Path) -> dict[str, Any]:
    """Write the policy of ``checkpoint`` to ``out`` and record it in ``out``'s folder's
    manifest (module docstring); returns its manifest entry.

    Raises:
        ConfigError: an unreadable checkpoint, one without a recorded training cost or command
            (trained before they were recorded, or from Python rather than the command line),
            ``out`` a folder, the checkpoint itself or holding another policy already, a
            manifest that is unreadable or not a JSON object.
    """
    source, target = Path(checkpoint), Path(out)
    # Checked before the imports below load torch, so these mistakes are one line at once.
    if not source.is_file():
        what = "is a folder" if source.is_dir() else "does not exist"
        raise ConfigError(f"checkpoint '{checkpoint}' {what}; accepted: a PPO checkpoint (what "
                          "esper-lightning ppo --save wrote)")
    if target.is_dir():
        raise ConfigError(f"--out '{target}' is a folder; accepted: a file path such as "
                          f"{target / 'NAME.pt'}")
    if target.exists() and target.resolve() == source.resolve():
        raise ConfigError(f"--out '{target}' is the checkpoint itself; accepted: a new file "
                          "beside the manifest (e.g. policies/NAME.pt)")
    from esper_lightning.app.provenance import code_version
    from esper_lightning.errors import read_json_file
    from esper_lightning.rl.checkpoint import POLICY_ENTRY_KEYS, read_checkpoint, write_checkpoint

    state = read_checkpoint(checkpoint)
    missing = [key for key in ("training_cost", "commands") if not state.get(key)]
    if missing or not any(state["commands"]):
        raise ConfigError(f"checkpoint '{checkpoint}' records no "
                          f"{missing[0] if missing else 'command line'} (trained before it was "
                          "recorded, or not by esper-lightning ppo); a shipped policy says how "
                          "it was trained")
    manifest_path = target.parent / MANIFEST
    manifest = read_json_file(manifest_path, "manifest") if manifest_path.is_file() else {}
    if not isinstance(manifest, dict):  # before anything is written beside it
        raise ConfigError(f"manifest '{manifest_path}' holds a JSON {type(manifest).__name__}; "
                          "accepted: an object of shipped files (or no manifest yet)")
    shipped = {k: state[k] for k in (*POLICY_ENTRY_KEYS, *_KEPT) if k in state}
    tmp = target.with_name(target.name + ".new")
    write_checkpoint(shipped, tmp)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() != digest:
        tmp.unlink()
        raise ConfigError(f"'{target}' holds another policy already; ship to another name")
    tmp.replace(target)
    config = state["config"]
    entry = {"sha256": digest, "bytes": target.stat().st_size, "source": str(checkpoint),
             "rounds": state["round"], "commands": state["commands"],
             "training_cost": state["training_cost"], "task": config.get("task"),
             "host_preset": config.get("host_preset"), "slots": config.get("slots"),
             "blueprints": state.get("allowed_blueprints"), "rng_seed": config.get("rng_seed"),
             "shipped_by": code_version()}
    manifest[target.name] = entry
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    return entry


def build_parser() -> ArgumentParser:
    """``esper-lightning ship``'s parser (`cli.own_parser`: ``--config``, ``--print_config``)."""
    parser = own_parser("ship", "write a trained policy as a small file beside a manifest (its "
                        "SHA-256, the commands that trained it and what training cost), for "
                        "results tables to reproduce from")
    parser.add_argument("checkpoint", type=str, help="a PPO checkpoint (what ppo --save wrote)")
    parser.add_argument("--out", type=str, required=True,
                        help="the file to write; the manifest goes beside it")
    return parser


def main(argv: Sequence[str]) -> int:
    """``esper-lightning ship``: 0 on success, 2 with one line on a bad input."""
    return run_own("ship", build_parser(), argv, _ship)


def _ship(args: Namespace) -> int:
    entry = ship_policy(args.checkpoint, args.out)
    print(f"{args.out}: {entry['bytes']:,} bytes, sha256 {entry['sha256']}, "
          f"{entry['training_cost']['episodes']:,.0f} training episodes")
    return 0
