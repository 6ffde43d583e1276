"""The ``esper-lightning`` command line, on jsonargparse.

    esper-lightning ppo --preset smoke --data_dir ../shared/data/cifar10-subset
    esper-lightning compare --controllers static heuristic --seeds 10 --preset cpu --out cmp
    esper-lightning ppo --preset smoke --strategy ddp --devices 2 --minibatch_envs 2
    esper-lightning ppo --preset lm-smoke --data_dir ../shared/data/shakespeare/shakespeare.txt
    esper-lightning ppo --preset smoke --print_config > run.yaml
    esper-lightning ppo --config run.yaml

Every config field is a flag with its default, type and choices in ``--help`` (the help text is
the config dataclass's docstring). Layers apply in this order (`config.from_layers`): defaults,
a ``--resume``d checkpoint's values, ``--preset``, then what the command line sets (its
``--config`` files and flags, in the order given, as one layer). ``--print_config`` writes the
configuration the command would run, the layer rules applied (a flag's ``budget_steps`` clears
a preset's ``budget_flops``): a file that ``--config`` reads back, as is the ``hparams.yaml`` a
PPO run logs. Flags may be spelled with dashes too (``--data-dir``), ``--no-progress`` means
``--progress false``, a bare boolean flag means true, and a list flag takes space-separated
values (``--slots r0c1 r0c2``), one value (``--slots=r0c1``) or a bracketed list (``--slots
[r0c1,r0c2]``).

The commands whose input is folders and files rather than a configuration (``frontier`` and its
subcommands, ``lookup``, ``ship``: `OWN_PARSER`) are built alike (`own_parser`,
`own_subcommand`, `run_own`): jsonargparse, the same help, ``--config``/``--print_config`` of
their own flags and arguments, the same spellings (``--no-progress``) and the same errors::

    esper-lightning frontier run STUDY --text plays.txt --workers 2 --print_config > run.yaml
    esper-lightning frontier run --config run.yaml

Every user mistake (bad flag, unknown config key, bad slot, missing or too short data,
incompatible checkpoint, unknown controller) prints one line naming the bad value and what is
accepted and exits with status 2; nothing already written is touched. Parsing and checking the
configuration, and the paths it names (data, ``--resume``, ``init_policy``: `check_paths`),
import neither torch nor Lightning, so ``--help`` and these errors come at once; a command
imports what it runs after its configuration is known to be good.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import select
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

from esper_lightning import __version__
from esper_lightning.app.config import (
    PRESETS,
    REWARD_MODES,
    CompareConfig,
    PPORunConfig,
    TaskConfig,
    from_layers,
    layered,
    policy_checkpoint,
    preset_values,
    read_config_file,
    saved_values,
)
from esper_lightning.app.console import fail, missing_lab
from esper_lightning.app.ppo.paths import (  # torch-free
    checkpoint_path,
    logger_name,
    refuse_overwrite,
)
from esper_lightning.data.files import DataError  # plain Python: no torch
from esper_lightning.errors import ConfigError

PROG = "esper-lightning"
VERSION = f"{PROG} {__version__}"


@dataclass(frozen=True)
class Command:
    """One ``esper-lightning`` command: its config class, its one-line summary, what runs it,
    what ``--help`` adds from the command's registries (None: nothing; it may import torch,
    so it runs for ``--help`` only), and what it refuses before it imports what it runs (None:
    nothing beyond the config's own checks; torch-free, so a bad name is one line at once)."""

    config: type[TaskConfig]
    summary: str
    run: Callable[[TaskConfig, Sequence[str]], int]
    describe: Callable[[ArgumentParser], None] | None = None
    check: Callable[[TaskConfig], None] | None = None


def run_ppo(config: TaskConfig, argv: Sequence[str] = ()) -> int:
    from esper_lightning.app.ppo.trainer import PPOTrainer  # heavy imports only for this command

    assert isinstance(config, PPORunConfig)
    if config.strategy != "auto":  # data-parallel: Fabric starts or joins the processes
        from esper_lightning.app.ppo.distributed import launch_ppo

        history = launch_ppo(config, [PROG, "ppo", *argv])
        if history is None:  # not rank 0: rank 0 reports
            return 0
    else:
        history = PPOTrainer(config, command=[PROG, "ppo", *argv]).train()
    if history:
        accuracies = history[-1].final_accuracies
        accuracy = sum(accuracies) / max(len(accuracies), 1)
        rounds = f"{config.rounds} round{'s' if config.rounds != 1 else ''}"
        print(f"done: {rounds}, last round final accuracy {accuracy:.2f}%")
    for mode in config.reward_modes if config.save else ():  # an A/B run saves one per mode
        print(f"checkpoint: {checkpoint_path(config.save, config, mode)}")
    print(f"TensorBoard: tensorboard --logdir {config.logdir}"
          + (f" (one run per policy: {', '.join(logger_name(config, m) for m in config.ab)})"
             if config.ab else ""))
    return 0


def run_compare(config: TaskConfig, argv: Sequence[str] = ()) -> int:
    from esper_lightning.app.compare.runner import Comparison

    assert isinstance(config, CompareConfig)
    comparison = Comparison(config, command=[PROG, "compare", *argv])
    comparison.run()
    print((comparison.out / "summary.md").read_text())
    print(f"episodes: {comparison.episodes_csv}; plots and summary in {comparison.out}")
    return 0


def describe_arms(parser: ArgumentParser) -> None:
    """``--controllers``' help: every registered arm kind and what it plays."""
    from esper_lightning.app.compare.arms import arm_kinds

    kinds = "; ".join(f"{kind.usage}: {kind.about}" for kind in arm_kinds().values())
    parser._option_string_actions["--controllers"].help = f"controllers to compare. {kinds}"


def check_arms(config: TaskConfig) -> None:
    """Every ``--controllers`` entry is a registered arm kind written as it takes, and the file
    of a kind whose argument is a path (``policy:PATH``, ``lookup:PATH``) exists: a wrong path
    is one line at once. `Comparison` checks each argument's content when it builds the arm,
    after torch and Lightning have loaded."""
    from esper_lightning.app.compare.arms import (  # the registry imports no torch
        arm_kinds,
        parse_controller,
    )

    assert isinstance(config, CompareConfig)
    for text in config.controllers:
        spec = parse_controller(text)
        usage = arm_kinds()[spec.kind].usage if spec.kind in arm_kinds() else ""
        if usage.endswith(":PATH") and not Path(str(spec.argument)).is_file():
            raise ConfigError(f"controller {text!r}: '{spec.argument}' does not exist; "
                              f"accepted: {usage} naming an existing file")


COMMANDS = {
    "ppo": Command(PPORunConfig, "learn the lifecycle controller with PPO", run_ppo,
                   check=refuse_overwrite),
    "compare": Command(CompareConfig, "compare controllers on paired episodes", run_compare,
                       describe_arms, check_arms),
}
#: Commands with a parser of their own (their input is a folder, not a configuration), built
#: in the same style (`own_parser`, `run_own`): the summary, and the module whose
#: ``build_parser()`` and ``main(argv)`` they are.
OWN_PARSER = {
    "frontier": ("train and report the compute-optimal frontier (a study folder)",
                 "esper_lightning.app.frontier.command"),
    "lookup": ("tune a per-budget growth lookup from a comparison of stack arms",
               "esper_lightning.app.compare.lookup"),
    "ship": ("write a trained policy as a small file with its manifest entry",
             "esper_lightning.app.ppo.ship"),
}
#: The lab's commands (the comparison and frontier harness): they need the ``lab`` extra, and
#: say so in one line without it (`console.missing_lab`).
LAB_COMMANDS = frozenset({"compare", "frontier", "lookup"})


def build_parser(command: str, preset: str | None = None,
                 base: dict[str, Any] | None = None) -> ArgumentParser:
    """The parser of one command; ``base`` (a resumed run's saved values), then a preset,
    become its defaults."""
    cls = COMMANDS[command].config
    parser = ArgumentParser(
        prog=f"{PROG} {command}", exit_on_error=False, version=__version__,
        description=f"{COMMANDS[command].summary}.",
        epilog="presets: " + "; ".join(
            f"{name}: {json.dumps(preset_values(name, cls))}" for name in PRESETS),
    )
    # Listed for --help only: _pop_preset takes it out of the arguments before they are parsed,
    # because its values are the defaults every other layer overrides.
    parser.add_argument("--preset", choices=list(PRESETS), default=argparse.SUPPRESS,
                        help="set the defaults of a preset (listed below) before any --config "
                        "file or flag, wherever it appears")
    parser.add_argument("--config", action=ActionConfigFile,
                        help="YAML or JSON file of config keys (what --print_config writes)")
    parser.add_class_arguments(cls, as_group=False)
    for name in _LIST_METAVARS.keys() & {f.name for f in fields(cls)}:
        parser._option_string_actions[f"--{name}"].metavar = _LIST_METAVARS[name]
    if base is not None:
        parser.set_defaults(base)
    if preset is not None:
        parser.set_defaults(preset_values(preset, cls))
    return parser


#: The usage line of each list flag: what `normalize_argv` accepts (brackets work too).
_LIST_METAVARS = {name: f"{item} [{item} ...]" for name, item in (
    ("slots", "SLOT"), ("devices", "DEVICE"), ("controllers", "CONTROLLER"), ("ab", "MODE"),
    ("arm_lr", "NAME=LR"), ("tune_lr", "LR"), ("budget_scales", "SCALE"),
    ("blueprints", "BLUEPRINT"), ("arm_groups", "NAME=ARM,ARM"), ("group_pairs", "A=B"))} | {
        "budget_range": "LOW HIGH"}


def parse_config(command: str, argv: Sequence[str]) -> TaskConfig:
    """Parse one command's arguments into its config (strict; `ConfigError` on bad values).

    ``ppo --resume PATH`` starts from the configuration saved in the checkpoint instead of the
    defaults (reading it imports torch); a preset, ``--config`` files and flags override it.
    """
    cls = COMMANDS[command].config
    preset, rest = _pop_preset(argv)
    normalized = normalize_argv(rest, cls)
    argv = [a for a in normalized if not _is_print_config(a)]  # printed once all layers apply
    values = _parse_values(command, preset, argv)
    base = None
    if command == "ppo" and values.get("resume"):
        base = saved_run(values["resume"], values["ab"])
        values = _parse_values(command, preset, argv, base)
    given = set(given_keys(argv, cls))
    layers = [base or {}, preset_values(preset, cls) if preset else {},
              {k: v for k, v in values.items() if k in given}]
    config = from_layers(layers, cls)  # a configuration the run would refuse is not printed
    printing = [a for a in normalized if _is_print_config(a)]
    if printing:
        print_config(command, layered(layers, cls), printing[-1], base)
    return config


def _is_print_config(token: str) -> bool:
    return token == "--print_config" or token.startswith("--print_config=")


def print_config(command: str, values: dict[str, Any], flag: str,
                 base: dict[str, Any] | None = None) -> typing.NoReturn:
    """Print ``values`` (`config.layered`: the layer rules applied, so a preset's budget_flops
    that a flag's budget_steps cleared is null) as jsonargparse's ``flag`` (``--print_config``,
    with its options) writes them, and exit. Not the raw parse: that holds both keys of such a
    pair, which ``--config`` refuses. ``base`` (a resumed run's saved values) are the defaults
    that ``skip_default`` leaves out, as reading the file back starts from them again; the
    preset's are not, since the file is read back without it."""
    parser = build_parser(command, base=base)
    parser.parse_args(["--config", json.dumps(values), flag])  # tuples: JSON lists
    raise AssertionError(f"{flag} did not print the configuration")  # jsonargparse exits


def given_keys(argv: Sequence[str], cls: type[TaskConfig]) -> list[str]:
    """The config keys the command line sets, by a flag or in a ``--config`` file (or string),
    of a `normalize_argv`-ed ``argv``: the last layer of the configuration (`from_layers`),
    whose keys win over the checkpoint's and the preset's even where the values are equal."""
    names = {f.name for f in fields(cls)}
    keys: list[str] = []
    for i, token in enumerate(argv):
        key, eq, value = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        if key in names:
            keys.append(key)
        elif key == "config":
            source = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            keys += [k for k in _config_keys(source) if k in names]
    return keys


def _config_keys(source: str) -> list[str]:
    """The keys of a ``--config`` argument: a file, or the YAML/JSON text itself."""
    try:
        data = read_config_file(source) if Path(source).is_file() else yaml.safe_load(source)
    except (ConfigError, yaml.YAMLError, OSError, ValueError):
        return []  # the parser reads it first and refuses what it cannot read
    return list(data) if isinstance(data, dict) else []


def _parse_values(command: str, preset: str | None, argv: list[str],
                  base: dict[str, Any] | None = None) -> dict[str, Any]:
    parser = build_parser(command, preset, base)
    describe = COMMANDS[command].describe
    if describe is not None and ("-h" in argv or "--help" in argv):
        describe(parser)
    namespace = parser.parse_args(argv)
    values = {k: v for k, v in namespace.as_dict().items() if k not in ("config", "__path__")}
    if "preset" in values:  # only a --config file can bring it here
        raise ConfigError(f"a --config file cannot set preset ({values['preset']!r}); pass "
                          f"--preset {values['preset']} on the command line")
    return values


def saved_run(resume: str, ab: Sequence[str]) -> dict[str, Any]:
    """The configuration a checkpoint's run was started with (`saved_values`). An A/B run saved
    one checkpoint per reward mode (``ckpt.shaped.pt``): ``resume`` names them by ``ckpt.pt``.

    Raises:
        ConfigError: no such checkpoint (before torch loads), or one that cannot be read.
    """
    candidates = [Path(resume), *(policy_checkpoint(resume, mode) for mode in ab or REWARD_MODES)]
    if not any(p.exists() for p in candidates):  # checked here: reading one imports torch
        per_mode = ", ".join(f"'{p}'" for p in candidates[1:])
        raise ConfigError(f"checkpoint '{resume}' does not exist (nor an A/B run's {per_mode}); "
                          "pass --resume the --save path of an earlier run")
    from esper_lightning.rl.checkpoint import read_checkpoint  # imports torch: resuming only

    state = read_checkpoint(next((p for p in candidates if p.is_file()), resume))
    return saved_values(state.get("run_config", state["config"]), PPORunConfig)


def normalize_argv(argv: Sequence[str], cls: type[TaskConfig]) -> list[str]:
    """Accept the spellings people type: dashes for underscores, ``--no-<flag>``, a bare
    boolean flag, a negative number after a flag (``--budget_flops -1e9``, which argparse would
    read as a flag), and a list flag's values space-separated, as one ``--flag=value`` or in
    brackets (``[a,b]``, also split by the shell as ``[a, b]``)."""
    hints = typing.get_type_hints(cls)
    return _normalized(argv, {f.name: _kind(hints[f.name]) for f in fields(cls)})


def _normalized(argv: Sequence[str], kinds: dict[str, str]) -> list[str]:
    """`normalize_argv` for the flags ``kinds`` names, each ``"bool"``, ``"list"`` (its values
    gathered into one JSON list) or ``"value"``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token, i = argv[i], i + 1
        name, eq, value = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        key = name.replace("-", "_")
        if key.startswith("no_") and kinds.get(key[3:]) == "bool" and not eq:
            out.append(f"--{key[3:]}=false")
        elif kinds.get(key) == "bool" and not eq and _no_value(argv, i):
            out.append(f"--{key}=true")
        elif kinds.get(key) == "list":
            items = [value] if eq else []
            while not eq and i < len(argv) and not argv[i].startswith("--"):
                items.append(argv[i])
                i += 1
            out.append(f"--{key}={json.dumps(_list_values(items))}")
        elif kinds.get(key) == "value" and not eq and i < len(argv) and _number(argv[i]):
            out.append(f"--{key}={argv[i]}")  # '-1e9' is a value, not a flag
            i += 1
        elif key in kinds or key in ("print_config", "config"):
            out.append(f"--{key}{eq}{value}")
        else:
            out.append(token)
    return out


def _kind(hint: object) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: the X
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if hint is bool:
        return "bool"
    return "list" if typing.get_origin(hint) is tuple else "value"


def _list_values(tokens: list[str]) -> list[str] | None:
    """A list flag's values: the tokens, or the items of one bracketed list; ``null`` alone is
    None (the task's default slots)."""
    text = " ".join(tokens).strip()
    if text == "null":
        return None
    if text.startswith("[") and text.endswith("]"):
        return [item.strip() for item in text[1:-1].split(",") if item.strip()]
    return tokens


def _number(token: str) -> bool:
    """Whether ``token`` reads as a number (``-1e9``, ``-0.5``), which argparse would take for
    a flag when it starts with a dash."""
    try:
        float(token)
    except ValueError:
        return False
    return True


def _no_value(argv: Sequence[str], i: int) -> bool:
    return i >= len(argv) or argv[i].startswith("--")


def _pop_preset(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    preset, rest = None, []
    tokens = iter(argv)
    for token in tokens:
        if token == "--preset":
            preset = next(tokens, None)
            if preset is None or preset.startswith("--"):
                raise ConfigError(f"--preset needs a name; accepted: {', '.join(PRESETS)}")
        elif token.startswith("--preset="):
            preset = token.partition("=")[2]
        else:
            rest.append(token)
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; accepted: {', '.join(PRESETS)}")
    return preset, rest


def check_paths(config: TaskConfig) -> None:
    """The files a run reads, checked before torch and Lightning load, with the error the run
    would raise on reading them: the task's data (unless it is to be downloaded), long enough
    for its blocks, and a PPO run's ``init_policy``. What needs torch to check (a file's
    content) the run checks.

    Raises:
        DataError: no data where ``data_dir`` points, or a text too short for its blocks.
        ConfigError: no file at ``init_policy``.
    """
    if not config.download:  # the task's own check (`TaskSpec`)
        spec = config.task_spec
        spec.check_data(config.data_dir,
                        spec.run_block_size(str(config.host_preset), config.block_size))
    init = getattr(config, "init_policy", None)
    if init is not None and getattr(config, "resume", None) is None and not Path(init).exists():
        raise ConfigError(f"init_policy '{init}' does not exist; accepted: a PPO checkpoint or "
                          f"a policy shipped from one ({PROG} ship)")


# --- the commands with a parser of their own, in the same style -----------------------------------
#: What ``--config`` reads, in every command's help.
_CONFIG_HELP = "YAML or JSON file of config keys (what --print_config writes)"


def own_parser(command: str, description: str, config: bool = True) -> ArgumentParser:
    """The parser of a command with a parser of its own (`OWN_PARSER`), in the style of ``ppo``
    and ``compare``: jsonargparse's, named ``esper-lightning COMMAND``, with ``--version``, each
    option's type and default in ``--help``, errors raised for `run_own` to print in one line
    (never an exit), and ``--config``/``--print_config`` unless ``config`` is False (a command
    of subcommands: each has its own, `own_subcommand`).

    Example::

        parser = own_parser("ship", "write a trained policy as a small file")
        parser.add_argument("checkpoint", type=str, help="a PPO checkpoint")
    """
    parser = ArgumentParser(prog=f"{PROG} {command}", exit_on_error=False, version=__version__,
                            description=description)
    if config:
        parser.add_argument("--config", action=ActionConfigFile, help=_CONFIG_HELP)
    return parser


def own_subcommand(parser: ArgumentParser, name: str, summary: str) -> ArgumentParser:
    """A subcommand ``name`` of ``parser`` (one is required; the parsed namespace names it as
    ``subcommand``, its arguments under its own name) with its own ``--config`` and
    ``--print_config``, named ``esper-lightning COMMAND NAME`` in its usage line, ``summary``
    its line in the command's help and its description.

    Example::

        run = own_subcommand(parser, "run", "train the study's pending units")
        run.add_argument("study", type=str, help="the study folder")
    """
    subcommands = next((a for a in parser._actions
                        if isinstance(a, argparse._SubParsersAction)), None)
    if subcommands is None:
        subcommands = parser.add_subcommands(dest="subcommand", required=True)
    sub = ArgumentParser(exit_on_error=False, description=summary)
    sub.add_argument("--config", action=ActionConfigFile, help=_CONFIG_HELP)
    subcommands.add_subcommand(name, sub, help=summary)
    sub.prog = f"{parser.prog} {name}"  # jsonargparse's own: 'PROG [options] NAME'
    return sub


def run_own(command: str, parser: ArgumentParser, argv: Sequence[str],
            act: Callable[[Namespace], int], refused: tuple[type[Exception], ...] = ()) -> int:
    """The ``main`` of a command with a parser of its own: ``argv`` parsed by ``parser`` (the
    spellings `normalize_argv` accepts, such as ``--no-progress``), then ``act`` run on what it
    parsed, its status returned. ``--help``, ``--version`` and ``--print_config`` answer with
    status 0; a bad command line, and a `ConfigError`, `DataError` or one of ``refused`` that
    ``act`` raises, is one line and status 2 (`console.fail`), never a traceback.

    Example::

        return run_own("ship", build_parser(), argv, _ship)
    """
    prog = f"{PROG} {command}"
    actions = own_actions(parser)
    kinds = {action.option_strings[-1][2:]: _own_kind(action)
             for options in actions.values() for action in options.values()
             if action.option_strings}
    try:
        args = parser.parse_args(_normalized(argv, kinds))
    except SystemExit as done:  # --help, --version, --print_config
        return int(done.code or 0)
    except (argparse.ArgumentError, ConfigError) as err:
        return fail(prog, _own_line(err, actions))
    try:
        return act(args)
    except (ConfigError, DataError, *refused) as err:
        return fail(prog, err)


def own_actions(parser: ArgumentParser) -> dict[str, dict[str, argparse.Action]]:
    """The options and positional arguments of ``parser`` (key ``""``) and of each of its
    subcommands (keyed by name), each by its config key; what every parser has (``--help``,
    ``--version``, ``--config``, ``--print_config``) left out."""
    found: dict[str, dict[str, argparse.Action]] = {"": {}}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = own_actions(sub)[""]
        elif action.dest not in ("help", "version", "config", "print_config"):
            found[""][action.dest] = action
    return found


def _own_kind(action: argparse.Action) -> str:
    """What `_normalized` makes of an option: a bool (``--no-progress``, a bare ``--progress``)
    or a value (an option given more than once, such as ``--with``, repeats as it is)."""
    return "bool" if getattr(action, "_typehint", action.type) is bool else "value"


def _own_line(err: Exception, actions: dict[str, dict[str, argparse.Action]]) -> str:
    """`_one_line` for a command with a parser of its own (``actions``: `own_actions`), whose
    subcommands' messages name what they lack as jsonargparse does (``run.text``)."""
    message = " ".join(str(err).split())
    unknown = re.fullmatch(r"Subcommand '(\w+)' does not accept option '([^']+)'", message)
    if unknown:
        return _one_line(f"Option '{unknown.group(2)}' is not accepted",
                         list(actions[unknown.group(1)]))
    required = re.fullmatch(r"the following arguments are required: (.*)", message)
    if required:
        names = [_written(actions, key) for key in required.group(1).split(", ")]
        return f"the following arguments are required: {', '.join(names)}"
    choice = re.fullmatch(r"argument \w+: invalid choice: '(.*)' \(choose from (.*)\)", message)
    missing = re.fullmatch(r'expected "\w+" to be one of \{(.*)\}, but it was not provided\.',
                           message)
    if choice or missing:
        names = [name for name in actions if name]
        given = f"unknown subcommand {choice.group(1)!r}" if choice else "no subcommand"
        return f"{given}; accepted: {', '.join(names)}"
    return _one_line(message, list(actions[""]))


def _written(actions: dict[str, dict[str, argparse.Action]], key: str) -> str:
    """How the command line writes config key ``key`` (``run.text``: ``--text``)."""
    sub, _, dest = key.rpartition(".")
    action = actions.get(sub, {}).get(dest)
    if action is None:
        return key
    return action.option_strings[-1] if action.option_strings else action.metavar or dest


def attach_log_handler() -> None:
    """One line per lifecycle event and per round on stderr (the package logs on
    ``esper_lightning``; a user's own logging setup takes precedence)."""
    logger = logging.getLogger("esper_lightning")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


#: The status when stdout's reader closed the pipe: 128 + SIGPIPE, what a shell reports for a
#: tool the closed pipe stopped (``yes | head -1``), so a script with ``set -o pipefail`` sees
#: this command as it sees any other; 0 would say the whole table reached a reader that left.
READER_GONE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """``esper-lightning``'s status: the command's (`COMMANDS`, `OWN_PARSER`), 2 with one line on
    a bad input, and `READER_GONE`, quietly, when the reader of its output closed the pipe
    (``esper-lightning frontier select STUDY | head -1``)."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here at latest, while it is still caught
    except BrokenPipeError:
        if not _reader_gone():
            raise  # another pipe of the command's (a worker's): a fault to see, not a reader
        _stdout_to_devnull()
        return READER_GONE
    return status


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader closed it (poll reports an error on its write
    end); True where that cannot be asked (no descriptor, no ``select.poll``)."""
    try:
        descriptor = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):
        return True
    poller.register(descriptor, select.POLLERR)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def _stdout_to_devnull() -> None:
    """Point stdout's file descriptor at devnull: what is still buffered for the closed pipe
    goes nowhere when Python flushes at exit, instead of raising there again (a traceback
    after the command returned). A stdout without a descriptor (a caller's in-process stream)
    has no such flush to silence."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)


def _main(argv: Sequence[str] | None) -> int:
    """`main` before its guard against a closed pipe."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        names = [*COMMANDS, *OWN_PARSER]
        lines = [f"usage: {PROG} {{{','.join(names)}}} [--help] ...", f"       {PROG} --version",
                 ""]
        lines += [f"  {name:8s} {command.summary}" for name, command in COMMANDS.items()]
        lines += [f"  {name:8s} {summary}" for name, (summary, _) in OWN_PARSER.items()]
        print("\n".join(lines))
        return 0 if argv else 2
    if argv[0] == "--version":
        print(VERSION)
        return 0
    command = argv[0]
    missing = missing_lab(f"{PROG} {command}") if command in LAB_COMMANDS else None
    if missing is not None:
        return fail(f"{PROG} {command}", missing)
    if command in OWN_PARSER:
        import importlib

        return int(importlib.import_module(OWN_PARSER[command][1]).main(argv[1:]))
    if command not in COMMANDS:
        accepted = ", ".join([*COMMANDS, *OWN_PARSER])
        return fail(PROG, f"unknown command {command!r}; accepted: {accepted}")
    check = COMMANDS[command].check
    try:
        config = parse_config(command, argv[1:])
        if check is not None:
            check(config)
        check_paths(config)
    except (ConfigError, DataError, argparse.ArgumentError) as err:
        return fail(f"{PROG} {command}", _one_line(err, _config_names(command)))
    attach_log_handler()
    from tqdm.contrib.logging import logging_redirect_tqdm

    try:  # log lines go above the progress bar, never onto its line
        with logging_redirect_tqdm(loggers=[logging.getLogger("esper_lightning")]):
            return COMMANDS[command].run(config, argv[1:])
    except (ConfigError, DataError) as err:
        return fail(f"{PROG} {command}", _one_line(err, _config_names(command)))


def _config_names(command: str) -> list[str]:
    """The config keys of ``command`` (``ppo``, ``compare``): what its ``--config`` accepts."""
    return [f.name for f in fields(COMMANDS[command].config)]


def _one_line(err: object, accepted: Sequence[str]) -> str:
    """The error on one line; jsonargparse's messages about an unknown key (``accepted``: the
    keys there are) or a value of the wrong type read like the configuration's own (the value,
    then what is accepted)."""
    message = " ".join(str(err).split())  # jsonargparse's messages span lines
    unknown = re.fullmatch(r"Option '([^']+)' is not accepted", message)
    if unknown:
        return f"unknown config key {unknown.group(1)!r}; accepted: {', '.join(accepted)}"
    bad = re.fullmatch(r'Parser key "(\w+)": (.*?)(?:Got|Given) value: (.*)', message)
    if not bad:
        return message
    key, expected, value = bad.groups()
    value = re.split(r" - | Given value", value)[0]  # a union's: the item that failed first
    choices = re.search(r"Literal\[([^\]]*)\]", expected)
    if choices:
        return f"unknown {key} {value!r}; accepted: {choices.group(1).replace(chr(39), '')}"
    subtypes = re.search(r"Subtypes: \[(.*?)\] Errors", expected)  # a union names its types
    expected = subtypes.group(1) if subtypes else expected.partition("Given value type")[0]
    kinds = dict.fromkeys(f"a list of {item}s" if item else _TYPE_NAMES.get(name, name)
                          for name, item in re.findall(r"<class '(\w+)'>|tuple\[(\w+), \.\.\.]",
                                                       expected))
    return f"{key} must be {' or '.join(kinds)}, got {value!r}"


#: How `_one_line` names the types jsonargparse expected.
_TYPE_NAMES = {"int": "an int", "float": "a float", "str": "a string", "bool": "true or false",
               "NoneType": "null", "tuple": "a list"}


if __name__ == "__main__":
    sys.exit(main())
