"""`esper-lightning compare`: controllers played on the same episodes, judged with paired stats.

Every controller plays the same evaluation episodes in the Fabric env pool: episode ``i`` has the
same host initialisation, data order and augmentation for every controller (its rng seed is
`evaluation_rng_seed`), so two controllers can be compared episode by episode. The controller ×
episode pairs run in lockstep, in chunks of the pool's size; each finished episode is appended to
``<out>/episodes.csv`` at once, so a rerun with the same ``--out`` skips what is done. A folder
never mixes results: its settings (``compare_config.json``) and its controllers
(``controllers.json``: a policy by its file's SHA-256) must be those of the rerun, and every row
an episode of those settings; anything else is refused before a byte is written.

Random-number seeds of the three kinds of episodes never overlap: PPO training uses rounds
``0, 1, 2, ...`` of `episode_rng_seed`; evaluation episode ``i`` uses round
``EVALUATION_ROUNDS + i`` and tuning episode ``i`` (of the heuristic's knobs, of a learning
rate) round ``TUNING_ROUNDS + i``.

**The verdict reads the test split** (`envs.Task.load_test`: the second half of the held-out
text, of the official CIFAR-10 test batch), measured once at each episode's end and read by
nothing that decides: the test outcome (``test_outcome``: test accuracy minus the seeds' price)
or, under a budget, the test loss (``test_bits``). Tuning (the heuristic's knobs, the learning
rates) decides on the validation split (``outcome``, ``final_bits``).

**At equal compute** (a budget: ``budget_flops`` or ``budget_steps``) every episode spends the
same training FLOPs (with ``budget_scales``, episode ``i`` draws its budget from its rng seed, the
same for every controller; ``episodes.csv`` records it as ``budget_flops``), and the verdict
judges the loss at the budget (``test_bits``, bits per byte on the language model, lower is
better) instead of the accuracy outcome; the report adds the speed-up at equal loss
(`app.compare.speedup`: the FLOPs each controller needs to reach ``speedup_reference``'s final
loss) and ``loss_vs_flops.png``. With more than one budget the report also gives the judged
metric's tables per budget (`app.compare.report.per_budget`), and with ``stack:`` arms that
differ only in TAU each controller's regret to the oracle TAU chosen per budget
(`app.compare.regret`). Every arm can train at its own learning rate (``arm_lr``), or at the
best of ``tune_lr`` on tuning episodes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import esper_lightning.app.compare.growth as growth
import esper_lightning.app.compare.plots as plots
import esper_lightning.app.compare.regret as regret
import esper_lightning.app.compare.speedup as speedup
from esper_lightning import blueprints as blueprint_registry
from esper_lightning.app.compare.arms import (
    ARM_KINDS,
    ControllerSpec,
    EpisodePlan,
    Implants,
    fingerprint,
    parse_controller,
)
from esper_lightning.app.compare.records import (
    METRICS,
    OUTCOME,
    TEST_BITS,
    TEST_OUTCOME,
    Episode,
    EpisodeRecord,
    append_record_csv,
    read_records_csv,
)
from esper_lightning.app.compare.report import (
    ControllerSummary,
    Scope,
    budget_json,
    budget_markdown,
    coinciding,
    cost_markdown,
    group_differences,
    group_json,
    group_markdown,
    markdown_table,
    paired_differences,
    per_budget,
    summarize,
    summary_json,
)
from esper_lightning.app.config import (
    ADDED_KEY_DEFAULTS,
    CompareConfig,
    TaskConfig,
    check_hardware,
)
from esper_lightning.app.logs import label_engine
from esper_lightning.app.provenance import code_version, machine_description
from esper_lightning.app.task import env_spec, load_splits, make_task
from esper_lightning.controllers import (
    Controller,
    HeuristicConfig,
    HeuristicController,
)
from esper_lightning.core.lifecycle import PRESENT_STAGES
from esper_lightning.core.report import EpochReport
from esper_lightning.envs import EnvPool, draw_budget_scale, episode_rng_seed
from esper_lightning.errors import ConfigError

log = logging.getLogger("esper_lightning")

EVALUATION_ROUNDS = 1_000_000
TUNING_ROUNDS = 2_000_000
#: The heuristic's main knobs and the values `--tune_heuristic` tries (every combination).
TUNING_GRID: dict[str, tuple[Any, ...]] = {
    "plateau_epochs_to_germinate": (1, 3),
    "fossilize_contribution": (0.0, 0.5),
    "blueprint_rotation": (
        ("conv_light", "conv_heavy", "attention", "norm", "depthwise"),
        ("conv_small", "norm", "depthwise", "attention", "conv_light"),
    ),
}
#: Settings that must not change between a comparison and its rerun in the same folder.
_RESUME_KEYS = (*(f.name for f in dataclasses.fields(TaskConfig)), "tune_heuristic", "tuning_seeds",
                "tune_lr")
#: The metric a comparison under a compute budget judges: the validation loss at the budget.
BUDGET_OUTCOME = "final_bits"


def evaluation_rng_seed(root: int, index: int) -> int:
    """Random-number seed of evaluation episode ``index`` (the same for every controller)."""
    return episode_rng_seed(root, EVALUATION_ROUNDS + index, 0)


def balanced_root(scales: Sequence[float], episodes: int, start: int, tries: int = 100_000) -> int:
    """The first root rng seed from ``start`` whose first ``episodes`` evaluation episodes draw
    every budget of ``scales`` equally often (``episodes`` a multiple of their number).

    A final table fixes its root before any episode is played; choosing it this way reads the
    budget draws only (`draw_budget_scale`), never an outcome, and gives every budget the same
    number of paired episodes.

    Example:
        >>> root = balanced_root((0.5, 2.0), 4, start=100)
        >>> sorted(draw_budget_scale((0.5, 2.0), evaluation_rng_seed(root, i)) for i in range(4))
        [0.5, 0.5, 2.0, 2.0]
    """
    if not scales or episodes < 1 or episodes % len(scales):
        raise ValueError(f"episodes={episodes} is not a positive multiple of the "
                         f"{len(scales)} budget scales {list(scales)}")
    scales = sorted(scales)  # as a comparison keeps them: the draw indexes into this order
    share = episodes // len(scales)
    for root in range(start, start + tries):
        drawn = [draw_budget_scale(scales, evaluation_rng_seed(root, i)) for i in range(episodes)]
        if all(drawn.count(scale) == share for scale in scales):
            return root
    raise ValueError(f"no root in [{start}, {start + tries}) draws {share} episodes of each "
                     f"budget scale {list(scales)}")


def tuning_rng_seed(root: int, index: int) -> int:
    """Random-number seed of heuristic-tuning episode ``index``."""
    return episode_rng_seed(root, TUNING_ROUNDS + index, 0)


# --- playing episodes in lockstep -------------------------------------------------------------
def play_episodes(
    pool: EnvPool,
    plans: Sequence[EpisodePlan],
    controllers: Sequence[Controller],
    task: TaskConfig,
) -> list[EpisodeRecord]:
    """Play one episode per plan on envs ``0..len(plans)-1`` of ``pool`` in lockstep."""
    which = list(range(len(plans)))
    start = time.perf_counter()
    # The first epoch trains before the first decision, as in a Trainer and in PPO rollouts.
    observations = pool.reset([p.rng_seed for p in plans], which, [p.implants for p in plans],
                              [p.host_lr for p in plans])
    for k, plan in enumerate(plans):  # event lines name their controller, episode and env
        label_engine(pool.envs[k].engine, plan.label, episode=plan.index, env=k)
    for controller in controllers:
        controller.reset()
    returns = [0.0] * len(plans)
    histories = [[o.report] for o in observations]  # every epoch's report, per episode
    over = False
    while not over:  # every env's episode has the same number of decisions
        actions = [c.decide(o.report) for c, o in zip(controllers, observations, strict=True)]
        steps = pool.step(actions, which)
        for k, step in enumerate(steps):
            returns[k] += step.reward.total  # the env's reward, as PPO's rollouts read it
            histories[k].append(step.observation.report)
        observations = [step.observation for step in steps]
        ends = {step.terminated for step in steps}
        assert len(ends) == 1, "the envs of one chunk play episodes of one length"
        over = ends.pop()
    seconds = (time.perf_counter() - start) / len(plans)
    tests = pool.test(which)  # once, at the end: for the final tables only
    return [_record(pool, k, plan, task, returns[k], histories[k], seconds,
                    observations[k].data_passes, tests[k]) for k, plan in enumerate(plans)]


def _record(
    pool: EnvPool, k: int, plan: EpisodePlan, task: TaskConfig, episode_return: float,
    reports: list[EpochReport], seconds: float, data_passes: float, test: tuple[float, float],
) -> EpisodeRecord:
    engine = pool.envs[k].engine
    assert engine is not None
    seeds = tuple((sid, slot.state.blueprint) for sid, slot in engine.slots.items()
                  if slot.state is not None and slot.stage in PRESENT_STAGES)
    episode = Episode(tuple(reports), episode_return, engine.seed_params, engine.host_params,
                      engine.event_counts(), task.param_cost, seconds, seeds, data_passes,
                      *test)
    return EpisodeRecord.of_episode(plan.label, plan.index, plan.rng_seed,
                                    str(task.host_preset), episode)


# --- the comparison ---------------------------------------------------------------------------
class Comparison:
    """Plan, run, resume and report one paired comparison.

    Everything the user gave is checked in the constructor (controller names, policy
    checkpoints, the ``out`` folder of an earlier run), before anything is written.

    Args:
        config: what to compare and on which task.
        custom: your own controllers, by name: a factory called once per episode with its
            `EpisodePlan` (use ``plan.rng_seed`` to seed anything random). Name them in
            ``config.controllers`` like the built-in ones.
        pool: the env pool to play on (at least ``config.envs`` envs); by default one is built
            from the config on first use.
        command: the command line that started it, quoted in the report's header (the CLI
            passes it).

    Example:
        >>> config = CompareConfig(controllers=("static", "heuristic", "mine"), seeds=10)
        >>> Comparison(config, custom={"mine": lambda plan: MyController()}).run()
        ... # doctest: +SKIP
    """

    def __init__(
        self,
        config: CompareConfig,
        custom: Mapping[str, Callable[[EpisodePlan], Controller]] | None = None,
        pool: EnvPool | None = None,
        *,
        command: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.command = tuple(command)
        self.out = Path(config.out)
        self.custom = dict(custom or {})
        unused = sorted(set(self.custom) - set(config.controllers))
        if unused:  # a controller the user made and would never see played
            raise ConfigError(f"custom controller {unused[0]!r} is not among the controllers "
                              f"to play; add it to controllers (played: "
                              f"{', '.join(config.controllers)})")
        self.specs = {text: parse_controller(text, tuple(self.custom))
                      for text in config.controllers}
        self.task = make_task(config)
        self.topology = self.task.topology
        #: What each arm's kind checked and keeps for its episodes (`ArmKind.prepare`).
        self.prepared: dict[str, Any] = {}
        for spec in self.specs.values():
            kind = ARM_KINDS.get(spec.kind)
            if kind is not None and kind.prepare is not None:
                self.prepared[spec.label] = kind.prepare(self, spec)  # early: one line
        check_hardware(config, config.devices_for(config.envs))
        #: Each controller's host learning rate (absent: host_lr); `tune_lrs` adds its choices.
        self.arm_lrs = config.arm_lrs()
        self.fingerprints = {label: fingerprint(spec, self.arm_lrs.get(label))
                             for label, spec in self.specs.items()}
        #: What tuning decides on (validation): the loss at the budget under one, else the
        #: outcome; and what the verdict judges, the same on the test split.
        self.decides = BUDGET_OUTCOME if config.budgeted else OUTCOME
        self.judged = TEST_BITS if config.budgeted else TEST_OUTCOME
        self._check_out_folder()
        self.heuristic = default_heuristic(config)
        self._pool = pool

    # --- files ------------------------------------------------------------------------------
    @property
    def episodes_csv(self) -> Path:
        return self.out / "episodes.csv"

    @property
    def tuning_csv(self) -> Path:
        return self.out / "tuning.csv"

    @property
    def config_json(self) -> Path:
        """The settings the folder's episodes were played with."""
        return self.out / "compare_config.json"

    @property
    def controllers_json(self) -> Path:
        """Every controller that played in the folder, by label: its kind and, for a policy,
        its file's path and content hash."""
        return self.out / "controllers.json"

    def _check_out_folder(self) -> None:
        """Refuse, before anything is written, a folder whose episodes were played with other
        settings or other controllers under the same names: a comparison never mixes them."""
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"out '{self.out}' exists and is not a folder")
        tables = {path: read_records_csv(path)  # a foreign or cut table: one line
                  for path in (self.episodes_csv, self.tuning_csv) if path.is_file()}
        if not self.config_json.is_file():
            if tables:
                raise ConfigError(f"out '{self.out}' holds {next(iter(tables)).name} but no "
                                  f"{self.config_json.name}, so the settings its episodes were "
                                  "played with are unknown; use another --out")
            return
        self._check_settings(_read_json(self.config_json))
        self._check_controllers(tables.get(self.episodes_csv, []))
        untested = [r for r in tables.get(self.episodes_csv, []) if r[self.judged] is None]
        if untested:
            raise ConfigError(f"out '{self.out}' holds {len(untested)} episode(s) recorded "
                              f"before the test split (no {self.judged}), which the verdict "
                              "judges; use another --out")
        for path, records in tables.items():
            _check_rows(path, records, self.config, tuning=path == self.tuning_csv)

    def _check_settings(self, saved: dict[str, Any]) -> None:
        saved = {**ADDED_KEY_DEFAULTS, **saved}
        current = self.config.to_dict()
        changed = [k for k in _RESUME_KEYS
                   if _normalised(k, saved.get(k)) != _normalised(k, current[k])]
        if changed:
            diffs = ", ".join(f"{k}={saved.get(k)!r} (now {current[k]!r})" for k in changed)
            raise ConfigError(f"out '{self.out}' holds a comparison with other settings: {diffs}; "
                              "use another --out")

    def _check_controllers(self, done: Sequence[EpisodeRecord]) -> None:
        """A controller that played here must be the same one now: a policy file with other
        content (a policy retrained into the same path) is another controller."""
        saved = _read_json(self.controllers_json) if self.controllers_json.is_file() else {}
        played = {r.controller for r in done}
        for spec in self.specs.values():
            unknown = [r for r in done if r.controller == spec.argument
                       and r["final_seeds"] is None] if _reads_others(spec) else []
            if unknown:
                raise ConfigError(f"{spec.label}: the episodes of {spec.argument} in out "
                                  f"'{self.out}' were recorded without the seeds they grew "
                                  "(an older table); use another --out")
        for label, now in self.fingerprints.items():
            if label not in played or (now == {"kind": now["kind"]} and label not in saved):
                continue  # a plain controller of a table from before fingerprints
            then = saved.get(label)
            if then is None:
                what = "which policy file" if "path" in now else "at which learning rate"
                raise ConfigError(f"out '{self.out}' holds episodes of {label} but not {what} "
                                  "played them; use another --out")
            if then != now:
                n = sum(r.controller == label for r in done)
                raise ConfigError(f"{label} is not the controller that played its {n} episodes "
                                  f"in out '{self.out}' ({_fingerprint_change(then, now)}); use "
                                  "another --out")

    def _write_config(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        config = self.config.to_dict()
        config["data_dir"] = _normalised("data_dir", config["data_dir"])
        self.config_json.write_text(json.dumps(config, indent=2) + "\n")
        saved = _read_json(self.controllers_json) if self.controllers_json.is_file() else {}
        self.controllers_json.write_text(json.dumps({**saved, **self.fingerprints},
                                                    indent=2) + "\n")

    # --- running ----------------------------------------------------------------------------
    def run(self) -> list[EpisodeRecord]:
        """Tune (if asked), play every missing episode, write the report; returns the table."""
        self._get_pool()  # the data first: a data error leaves ``out`` as it was
        self._write_config()
        done = read_records_csv(self.episodes_csv) if self.episodes_csv.exists() else []
        if self.config.tune_heuristic:
            self.heuristic = self.tune()
        if self.config.tune_lr:
            self.arm_lrs = {**self.tune_lrs(), **self.arm_lrs}
        # Arms that read the others' episodes (matched:) play once those are on disk.
        first = [s for s in self.specs.values() if not _reads_others(s)]
        done += self._play_missing(self._plans(first, done), self.episodes_csv)
        after = [s for s in self.specs.values() if _reads_others(s)]
        done += self._play_missing(self._plans(after, done), self.episodes_csv)
        # Report the table as kept, not as played: a folder of an earlier layout keeps its own
        # columns (a new metric of the rows just played is left out), and a rerun must report
        # exactly what this run does.
        records = [r for r in read_records_csv(self.episodes_csv) if r.controller in self.specs]
        self.report(records)
        return records

    def _plans(self, specs: Sequence[ControllerSpec], done: Sequence[EpisodeRecord]
               ) -> list[EpisodePlan]:
        by_episode = {(r.controller, r.episode_index): r for r in done}
        plans = []
        for spec in specs:
            for i in range(self.config.seeds):
                if (spec.label, i) not in by_episode:
                    rng_seed = evaluation_rng_seed(self.config.rng_seed, i)
                    implants = self._implants(spec, i, by_episode)
                    plans.append(EpisodePlan(spec.label, i, rng_seed, implants,
                                             self.arm_lrs.get(spec.label)))
        return plans

    def _play_missing(self, plans: list[EpisodePlan], csv_path: Path,
                      make: Callable[[EpisodePlan], Controller] | None = None,
                      ) -> list[EpisodeRecord]:
        make = make or self._make_controller
        played: list[EpisodeRecord] = []
        size = self.config.envs
        with tqdm(total=len(plans), desc=csv_path.stem, unit="episode",
                  disable=not self.config.progress or not plans, dynamic_ncols=True) as bar:
            for start in range(0, len(plans), size):
                chunk = plans[start:start + size]
                controllers = [make(plan) for plan in chunk]
                for record in play_episodes(self._get_pool(), chunk, controllers, self.config):
                    append_record_csv(csv_path, record)
                    played.append(record)
                bar.update(len(chunk))
        return played

    def _make_controller(self, plan: EpisodePlan) -> Controller:
        spec = self.specs[plan.label]
        if spec.kind == "custom":
            made = self.custom[spec.label](plan)  # before the episode trains: one line
            # An episode calls decide and reset only (compare saves no controller's state).
            if isinstance(made, type) or not all(
                    callable(getattr(made, m, None)) for m in ("decide", "reset")):
                what = f"the class {made.__name__}" if isinstance(made, type) else repr(made)
                raise ConfigError(f"custom controller {spec.label!r}: its factory returned "
                                  f"{what}, not a controller (it needs decide and reset)")
            return made
        return ARM_KINDS[spec.kind].controller(self, spec, plan, self.prepared.get(spec.label))

    def _implants(self, spec: ControllerSpec, index: int,
                  by_episode: Mapping[tuple[str, int], EpisodeRecord]) -> Implants:
        """What the host of ``spec``'s episode ``index`` is born with (`ArmKind.implants`)."""
        kind = ARM_KINDS.get(spec.kind)
        if kind is None or kind.implants is None:
            return ()
        return kind.implants(self, spec, index, by_episode, self.prepared.get(spec.label))

    def _get_pool(self) -> EnvPool:
        if self._pool is None:
            c = self.config
            train, val = load_splits(c, c.progress)
            test = make_task(c).load_test(c.data_dir, rng_seed=c.rng_seed)
            self._pool = EnvPool(env_spec(c), train, val, c.devices_for(c.envs), test)
        return self._pool

    # --- tuning the heuristic ---------------------------------------------------------------
    def tune(self) -> HeuristicConfig:
        """Play every `tuning_grid` configuration on the tuning episodes; keep the best mean
        of the judged metric (the outcome, or the loss at the budget; ties: the earlier
        configuration). Saved to ``heuristic_tuned.json``."""
        saved = self.out / "heuristic_tuned.json"
        if saved.is_file():
            return _heuristic_from_json(json.loads(saved.read_text())["config"])
        grid = tuning_grid(self.topology, default_heuristic(self.config))
        csv_path = self.tuning_csv
        done = read_records_csv(csv_path) if csv_path.exists() else []
        finished = {(r.controller, r.episode_index) for r in done}
        lr = self.arm_lrs.get("heuristic")  # the heuristic's own rate when it has one
        plans = [EpisodePlan(f"tune-{k}", i, tuning_rng_seed(self.config.rng_seed, i),
                             host_lr=lr)
                 for k in range(len(grid)) for i in range(self.config.tuning_seeds)
                 if (f"tune-{k}", i) not in finished]
        configs = {f"tune-{k}": config for k, config in enumerate(grid)}
        done += self._play_missing(plans, csv_path, lambda p: HeuristicController(configs[p.label]))
        best, means = self._best(done, list(configs))
        chosen = configs[best]
        saved.write_text(json.dumps({"chosen": best, "judged": self.decides, "means": means,
                                     "config": _heuristic_to_json(chosen)}, indent=2) + "\n")
        log.info("tuned heuristic: %s (mean %s %.4g on %d tuning episodes)", best, self.decides,
                 means[best], self.config.tuning_seeds)
        return chosen

    def _best(self, done: Sequence[EpisodeRecord], labels: list[str]
              ) -> tuple[str, dict[str, float]]:
        """The label with the best mean judged metric over its tuning episodes (ties: the
        earlier label), and every label's mean."""
        means = {label: math.fsum(r[self.decides] for r in done if r.controller == label)
                 / self.config.tuning_seeds for label in labels}
        sign = 1.0 if METRICS[self.decides].better == "higher" else -1.0
        best = max(labels, key=lambda label: (sign * means[label], -labels.index(label)))
        return best, means

    # --- tuning each arm's learning rate ----------------------------------------------------
    def tune_lrs(self) -> dict[str, float]:
        """Each controller without an ``arm_lr`` (and not ``matched:NAME``, whose seeds come
        from NAME's evaluation episodes) plays every rate of ``tune_lr`` on the tuning
        episodes (``<label>@lr=<rate>`` in ``tuning.csv``) and keeps the one with the best
        mean judged metric (ties: the earlier rate). Saved to ``lr_tuned.json``; a rerun reads
        it back and tunes only the controllers it lacks (added to the folder since)."""
        saved = self.out / "lr_tuned.json"
        chosen: dict[str, Any] = json.loads(saved.read_text()) if saved.is_file() else {}
        tuned = [s for s in self.specs.values() if not _reads_others(s)
                 and s.label not in self.arm_lrs and s.label not in chosen]
        rates = {f"{s.label}@lr={lr:g}": (s.label, lr) for s in tuned
                 for lr in self.config.tune_lr}
        done = read_records_csv(self.tuning_csv) if self.tuning_csv.exists() else []
        finished = {(r.controller, r.episode_index) for r in done}
        # Each arm tunes on its own host: a born:K arm is born grown in its tuning episodes too.
        plans = [EpisodePlan(label, i, tuning_rng_seed(self.config.rng_seed, i),
                             self._implants(self.specs[name], i, {}), host_lr=lr)
                 for label, (name, lr) in rates.items() for i in range(self.config.tuning_seeds)
                 if (label, i) not in finished]
        done += self._play_missing(plans, self.tuning_csv,
                                   lambda p: self._make_controller(
                                       dataclasses.replace(p, label=rates[p.label][0])))
        for spec in tuned:
            labels = [label for label, (name, _) in rates.items() if name == spec.label]
            best, means = self._best(done, labels)
            chosen[spec.label] = {"chosen": rates[best][1], f"mean_{self.decides}": means}
            log.info("tuned lr of %s: %g (mean %s %.4g)", spec.label, rates[best][1],
                     self.decides, means[best])
        if tuned:
            saved.write_text(json.dumps(chosen, indent=2) + "\n")
        return {label: float(v["chosen"]) for label, v in chosen.items() if label in self.specs}

    # --- report -----------------------------------------------------------------------------
    def header(self, n_controllers: int) -> str:
        """The report's title and a table of the settings a reader needs to judge or rerun it:
        task, preset, budget, learning rates, episodes and root rng seed, controllers, what
        the verdict judges, the code, the machine and the command. Code and machine are this
        run's: a resumed table's earlier rows may have been played by others."""
        c = self.config
        preset = next((b for a, b in itertools.pairwise(self.command) if a == "--preset"),
                      next((a.partition("=")[2] for a in self.command
                            if a.startswith("--preset=")), None))
        if c.budget_flops is not None:
            budget = f"{c.budget_flops:.3g} training FLOPs"
        elif c.budget_steps is not None:
            budget = f"the FLOPs of {c.budget_steps} steps of the host as born"
        else:
            budget = f"none: {c.episode_length} epochs"
        if c.budget_scales:
            budget += " × a scale drawn per episode from " + ", ".join(
                f"{x:g}" for x in c.budget_scales)
        rates = f"{c.host_lr:g} ({c.lr_schedule})"
        rates += "".join(f"; {name}: {lr:g}" for name, lr in self.arm_lrs.items())
        if c.tune_lr:
            rates += " (tuned on tuning episodes from " + ", ".join(
                f"{x:g}" for x in c.tune_lr) + ")"
        controllers = ", ".join(f"{name} (the reference)" if name == c.reference else name
                                for name in self.specs)
        judged = METRICS[self.judged]
        rows = [
            ("task", f"{c.task}: host {c.host_preset}, slots {' '.join(c.slots)}"),
            ("preset", preset or "none"),
            ("budget", budget),
            ("host learning rate", rates),
            ("episodes", f"{c.seeds} evaluation episodes per controller, root rng seed "
                         f"{c.rng_seed}"),
            ("controllers", controllers),
            ("judged", f"{judged.label} on the test split; tuning decides on validation "
                       f"({METRICS[self.decides].label})"),
            ("code", code_version()),
            ("machine", machine_description()),
        ]
        if self.command:
            rows.append(("command", "`" + " ".join(shlex.quote(a) for a in self.command) + "`"))
        title = (f"# Comparison of {n_controllers} controllers on {c.task}"
                 f"{f' ({preset})' if preset else ''}")
        table = ["| setting | value |", "|---|---|",
                 *(f"| {k} | {v.replace('|', chr(92) + '|')} |" for k, v in rows)]
        return "\n".join([title, "", *table, "", ""])

    def arm_costs(self) -> dict[str, dict[str, Any]]:
        """What making each arm cost, where its kind knows (`ArmKind.cost`), by label."""
        costs = {}
        for label, spec in self.specs.items():
            kind = ARM_KINDS.get(spec.kind)
            if kind is not None and kind.cost is not None:
                cost = kind.cost(spec, self.prepared.get(label))
                if cost is not None:
                    costs[label] = cost
        return costs

    def report(self, records: Sequence[EpisodeRecord]) -> str:
        """Write ``summary.md``, ``summary.json``, the plots and TensorBoard; return the table."""
        pairs = "all" if self.config.all_pairs else None
        summaries = summarize(records)
        comparisons = paired_differences(records, self.config.reference, pairs,
                                         outcome=self.judged)
        reference = self.config.speedup_reference or self.config.reference
        speedups = speedup.speedups(records, reference)
        budgets = per_budget(records, self.config.reference, pairs, outcome=self.judged)
        oracles, regrets = regret.regrets(records, self.judged, groups=self.config.groups())
        scope = Scope.of(records, bits=self.task.loss_in_bits, example=self.task.example)
        if not scope.budgeted:
            speedups = []  # equal loss at less compute: a question of runs under a budget
        table = markdown_table(summaries, comparisons, scope=scope, same=coinciding(records))
        costs = self.arm_costs()
        grown = growth.growth_rows(records)
        groups = group_differences(records, self.config.groups(), self.config.reference,
                                   self.judged, self.config.paired_groups())
        table += "\n".join([*group_markdown(groups, self.judged),
                            *budget_markdown(budgets, scope),
                            *regret.markdown(oracles, regrets, self.judged),
                            *speedup.markdown(speedups, reference), *growth.markdown(grown),
                            *cost_markdown(costs), ""])
        (self.out / "summary.md").write_text(self.header(len(summaries)) + table + "\n")
        summary = summary_json(summaries, comparisons)
        summary["per_budget"] = budget_json(budgets)
        summary["regret"] = regret.as_json(oracles, regrets)
        summary["heuristic"] = _heuristic_to_json(self.heuristic)
        summary["judged"] = self.judged
        summary["arm_lr"] = self.arm_lrs
        summary["speedup"] = speedup.as_json(speedups, reference)
        summary["cost"] = costs
        summary["growth"] = growth.as_json(grown)
        summary["groups"] = group_json(groups)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        plots.save_figures(records, summaries, comparisons, self.out,
                           param_cost=self.config.param_cost, scope=scope)
        if regrets:
            plots.save_figure(plots.regret_figure(regrets, self.judged), self.out / "regret.png")
        if grown and any(r.first is not None and r.budget is not None for r in grown):
            plots.save_figure(plots.growth_figure(grown), self.out / "growth_times.png")
        _log_tensorboard(self.out, self.config, table, summaries, self.judged)
        return table


def _fingerprint_change(then: dict[str, Any], now: dict[str, Any]) -> str:
    """What tells a controller's fingerprint when it played from the one it has now: its policy
    file's content first, then its learning rate, its policy file's path, its kind."""
    if then.get("sha256") != now.get("sha256"):
        return (f"file sha256 {str(then.get('sha256'))[:12]}... then, "
                f"{str(now.get('sha256'))[:12]}... now")
    for key, name in (("lr", "arm_lr"), ("path", "file")):
        if then.get(key) != now.get(key):
            return f"{name} {then.get(key)} then, {now.get(key)} now"
    return f"kind {then.get('kind')!r} then, {now['kind']!r} now"


def _reads_others(spec: ControllerSpec) -> bool:
    """Whether the arm plays after the others, reading their episodes (`ArmKind.reads_others`)."""
    kind = ARM_KINDS.get(spec.kind)
    return kind is not None and kind.reads_others


def _normalised(key: str, value: Any) -> Any:
    """A saved setting in the form two runs compare: a data path made absolute (the same
    folder given relative and absolute is the same data)."""
    if key == "data_dir" and value is not None:
        return str(Path(value).expanduser().resolve())
    return value


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"cannot read {path}: not a JSON object")
    return data


def _check_rows(path: Path, records: Sequence[EpisodeRecord], config: CompareConfig,
                tuning: bool) -> None:
    """Every row must be an episode of these settings: its rng seed, host and length."""
    seed_of = tuning_rng_seed if tuning else evaluation_rng_seed
    for r in records:
        problem = (
            f"rng seed {r.episode_rng_seed}, not {seed_of(config.rng_seed, r.episode_index)}"
            if r.episode_rng_seed != seed_of(config.rng_seed, r.episode_index) else
            f"host {r.host!r}, not {config.host_preset!r}" if r.host != config.host_preset else
            f"{len(r['accuracy_curve'])} epochs, not {config.episode_length}"
            if len(r["accuracy_curve"]) != config.episode_length else None
        )
        if problem is not None:
            raise ConfigError(f"{path}: episode {r.episode_index} of {r.controller} was played "
                              f"with other settings ({problem}); use another --out")


#: The untuned heuristic on a host whose enabled slots include growth slots: it deepens the host
#: with the function-preserving block seed (the sizing pilot in docs/evidence.md: identity beat
#: copy at every growth time) and not after 0.8 of the budget (a block born later had too little
#: compute left to pay for itself there); when it grows is its own plateau rule.
GROWTH_HEURISTIC: dict[str, Any] = {"blueprint_rotation": ("block_identity",),
                                    "germinate_until_fraction": 0.8}


def default_heuristic(config: CompareConfig) -> HeuristicConfig:
    """The heuristic's configuration before any tuning: `GROWTH_HEURISTIC` on a host that grows
    deeper (`TaskSpec.growth_slot_ids`) with an enabled growth slot, else the defaults."""
    growth_slots = config.task_spec.growth_slot_ids(str(config.host_preset))
    if set(growth_slots) & set(config.slots or ()):
        return HeuristicConfig(**GROWTH_HEURISTIC)
    return HeuristicConfig()


def tuning_grid(topology: str = "cnn", base: HeuristicConfig | None = None
                ) -> list[HeuristicConfig]:
    """Every combination of `TUNING_GRID` on top of ``base`` (None: the defaults); each blueprint
    rotation keeps the blueprints of ``topology`` (all of them gone: the topology's default
    rotation). A ``base`` with a rotation of its own (`GROWTH_HEURISTIC`) keeps it: the grid's
    rotations would swap its block seeds for seeds that do not deepen the host."""
    base = HeuristicConfig() if base is None else base
    keys = [k for k in TUNING_GRID
            if not (k == "blueprint_rotation" and base.blueprint_rotation is not None)]
    grid = [dict(zip(keys, values, strict=True))
            for values in itertools.product(*(TUNING_GRID[k] for k in keys))]
    for knobs in grid:
        if knobs.get("blueprint_rotation") is not None:
            kept = [n for n in knobs["blueprint_rotation"]
                    if n in blueprint_registry.available(topology)]
            knobs["blueprint_rotation"] = tuple(kept) or None
    return [dataclasses.replace(base, **knobs) for knobs in grid]


def _heuristic_to_json(config: HeuristicConfig) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(config).items()}


def _heuristic_from_json(values: dict[str, Any]) -> HeuristicConfig:
    return HeuristicConfig(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in values.items()})


def _log_tensorboard(out: Path, config: CompareConfig, table: str,
                     summaries: Sequence[ControllerSummary], judged: str = OUTCOME) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(str(out), name="tensorboard", default_hp_metric=False)
    logger.experiment.add_text("compare/summary", table)
    outcomes = {s.controller: s.metrics[judged] for s in summaries}
    metrics = {f"{judged}/{name}": value.mean for name, value in outcomes.items()
               if value is not None and math.isfinite(value.mean)}
    logger.log_hyperparams(config.to_dict(), metrics)
    logger.finalize("success")
