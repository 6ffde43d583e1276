"""The heuristic controller: hand-written growth rules, fed the counterfactual contribution.

Rules (carried over from the research code, docs/design.md), one action per epoch, for the first
live seed in slot order:

* no live seed: germinate the next blueprint of a rotation in the first empty slot once the host
  is stable and its accuracy has plateaued, unless a prune happened recently (embargo);
* GERMINATED -> ADVANCE; TRAINING -> PRUNE when the seed's own gradients are unhealthy or it has
  incubated too long, else ADVANCE (the gate decides whether it moves). An incubating seed is
  bitwise isolated from the host, so the host's accuracy says nothing about it. A seed whose
  blueprint needs no incubation (block seeds) is BLENDING from its germination on;
* BLENDING -> PRUNE when the host has been losing accuracy since blending began (the seed now
  shapes the host's output), ADVANCE once alpha sits at 1.0;
* HOLDING -> decided on the measured counterfactual contribution: WAIT until measured, PRUNE a
  seed the host depends on while it made things worse ("ransomware"), FOSSILIZE a seed that
  contributes enough, PRUNE the rest.

The research code never measured the contribution, so its seeds waited in HOLDING forever; here
the engine records it during validation and the heuristic reads it from the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from esper_lightning.blueprints import blueprint_index
from esper_lightning.controllers.base import (
    WAIT,
    BlueprintCheck,
    check_named_blueprint,
    check_state,
    state_header,
)
from esper_lightning.core.actions import (
    Action,
    AlphaTargetChoice,
    LifecycleOp,
    Tempo,
    action_error,
    canonicalize,
    slot_op_error,
)
from esper_lightning.core.counterfactual import ACCURACY
from esper_lightning.core.lifecycle import (
    FAILURE_STAGES,
    MIN_GRADIENT_HEALTH,
    MIN_TRAINING_EPOCHS,
    SeedStage,
    blend_complete,
)
from esper_lightning.core.report import EpochReport
from esper_lightning.core.slots import SlotReport
from esper_lightning.errors import ConfigError

_KIND = "heuristic"
_STATE_KEYS = (
    "prev_accuracy",
    "prev_loss",
    "plateau_epochs",
    "stable_epochs",
    "stabilized",
    "last_epoch",
    "last_prune_epoch",
    "blueprint_index",
    "penalties",
    "counted_prunes",
)
#: The germination order of a config that names none, per slot topology (the transformer's is
#: what the CNN rotation left on a transformer before rotations were per topology).
DEFAULT_ROTATIONS: dict[str, tuple[str, ...]] = {
    "cnn": ("conv_light", "conv_heavy", "attention", "norm", "depthwise"),
    "transformer": ("attention", "norm"),
    "linear": ("mlp_bottleneck", "mlp_small", "norm"),
}
#: The knobs counted in epochs, scaled with the run length (`HeuristicConfig.reference_epochs`).
TIMING_KNOBS = (
    "plateau_epochs_to_germinate",
    "min_epochs_before_germinate",
    "stabilization_epochs",
    "embargo_epochs_after_prune",
    "min_epochs_before_prune",
)


#: Fields checked against their own range below (a NaN fails it too): only their type here.
_RANGED = ("min_training_gradient_health", "judge_z", "blueprint_penalty_decay")


@dataclass(frozen=True)
class HeuristicConfig:
    """Knobs of `HeuristicController`; the defaults are the research code's constants.

    Accuracies are in percentage points, loss changes are relative.

    Timing: the knobs counted in epochs (`TIMING_KNOBS`) are given for a run of
    ``reference_epochs`` epochs and scaled linearly to the run's ``max_epochs`` (rounded half
    up, never below 1; a knob set to 0 stays 0; no scaling when the run length is unknown), so a
    30-epoch run does not wait as long as a 150-epoch one. ``reference_epochs=None`` (or
    `fixed_timing`) keeps them as given, the research code's behaviour. `scaled_to` and
    `HeuristicController.timing` show the values a run will use; the lifecycle durations it
    asks of the slots (``incubation_epochs``, ``blend_epochs``) scale the same way
    (`HeuristicController.lifecycle`), the blend only downwards.

    Args:
        plateau_threshold: an epoch that gains less accuracy than this counts as a plateau epoch.
        plateau_epochs_to_germinate: consecutive plateau epochs needed before germinating.
        min_epochs_before_germinate: no germination before this (0-based) epoch.
        stabilization_epochs: consecutive stable epochs after which the host counts as stable
            for the rest of the run (a latch).
        stabilization_threshold: a stable epoch improves the val loss by less than this fraction,
        regression_threshold: and worsens it by less than this fraction.
        embargo_epochs_after_prune: epochs without germination after a prune.
        min_epochs_before_prune: epochs in TRAINING or BLENDING before the prune tests apply.
        prune_improvement_threshold: prune a BLENDING seed when the host's accuracy since
            blending began is below this (points).
        min_training_gradient_health: prune a TRAINING seed whose measured gradient health is
            below this (or whose gradients exploded); G2's own threshold by default.
        max_training_epochs: prune a seed still TRAINING after this many epochs (G2 never let
            it blend); 0: no limit. Not scaled with the run length, since G2's incubation is
            not.
        fossilize_contribution: fossilize a HOLDING seed whose contribution is above this,
            prune it otherwise.
        judge_z: judge a HOLDING seed only once its contribution is this many standard errors
            (over the validation examples, `core.counterfactual`) from
            ``fossilize_contribution``, either side: on a small validation set a contribution
            of a few examples is noise, and the seed holds and is measured again. 0: judge on
            the contribution alone, the research code's rule. Contributions measured without a
            standard error are judged at once.
        max_holding_epochs: decisions a seed may spend in HOLDING (its ``epochs_in_stage``,
            counted from its entry: the first judgement sees 1) while ``judge_z`` cannot tell;
            then, and at the run's last decision, it is judged on its contribution alone (the
            reason says so). Not scaled with the run length.
        ransomware_contribution: prune a seed contributing more than this while the host has
            lost accuracy since it germinated (the host learned to depend on a harmful seed).
        blueprint_penalty_on_prune: added to a blueprint's penalty each time one is pruned.
        blueprint_penalty_decay: all penalties are multiplied by this once per epoch,
        blueprint_penalty_floor: and dropped once below this.
        blueprint_penalty_threshold: blueprints with at least this penalty are skipped.
        blueprint_rotation: germination order (round robin), filtered to the blueprints the
            run allows; None: the slot topology's `DEFAULT_ROTATIONS`. Every name must exist
            for the run's topology (a one-line error at fit start otherwise).
        reference_epochs: run length the timing knobs are given for (None: not scaled).
        germinate_from_fraction: no germination before this fraction of the run is spent
            (`EpochReport.spent_fraction`: of the compute budget under one, else of the
            planned epochs); None: no limit. With block seeds (``blueprint_rotation=
            ("block_copy",)``, no incubation) it makes "grow once a share of the compute is
            spent" a knob of the rules.
        germinate_until_fraction: no germination once this fraction of the run is spent (a
            seed born later cannot pay for itself); None: no limit.
        incubation_epochs: the G2 incubation this controller asks of the run's slots, scaled
            with the run length like the timing knobs (a Trainer callback applies it unless
            its ``timing`` or ``gate_config`` sets one; `lifecycle`); None: the slots' own.
        blend_epochs: the alpha ramp, in decisions, this controller asks of the run's slots,
            scaled down with the run length like the timing knobs but never above this value,
            so a run of at least ``reference_epochs`` keeps the standard tempo's 5 (a Trainer
            callback applies it unless its ``timing`` sets a blend; `lifecycle`); >= 1, or
            None: the germination's own tempo (`Tempo.STANDARD`).
        finish_by_end: germinate only while the planned run leaves a seed the decisions to
            incubate, blend and be judged (`decisions_to_judge`), and, once stable, germinate at
            that last chance even without a plateau: a seed born too late to be judged costs
            compute and teaches nothing. Needs the run's length (no effect without one).

    Example:
        >>> HeuristicConfig(embargo_epochs_after_prune=8).embargo_epochs_after_prune
        8
        >>> HeuristicConfig().scaled_to(20).min_epochs_before_germinate  # 5 * 20 / 50
        2
        >>> HeuristicConfig.fixed_timing().scaled_to(20).min_epochs_before_germinate
        5
    """

    plateau_threshold: float = 0.5
    plateau_epochs_to_germinate: int = 3
    min_epochs_before_germinate: int = 5
    stabilization_epochs: int = 3
    stabilization_threshold: float = 0.03
    regression_threshold: float = 0.05
    embargo_epochs_after_prune: int = 5
    min_epochs_before_prune: int = 5
    prune_improvement_threshold: float = -2.0
    min_training_gradient_health: float = MIN_GRADIENT_HEALTH
    max_training_epochs: int = 3 * MIN_TRAINING_EPOCHS
    fossilize_contribution: float = 0.5
    judge_z: float = 2.0
    max_holding_epochs: int = 3
    ransomware_contribution: float = 0.1
    blueprint_penalty_on_prune: float = 2.0
    blueprint_penalty_decay: float = 0.5
    blueprint_penalty_floor: float = 0.1
    blueprint_penalty_threshold: float = 3.0
    blueprint_rotation: tuple[str, ...] | None = None
    reference_epochs: int | None = 50
    germinate_from_fraction: float | None = None
    germinate_until_fraction: float | None = None
    incubation_epochs: int | None = MIN_TRAINING_EPOCHS
    blend_epochs: int | None = Tempo.STANDARD.epochs
    finish_by_end: bool = True

    def __post_init__(self) -> None:
        if self.blueprint_rotation is not None:
            object.__setattr__(self, "blueprint_rotation", tuple(self.blueprint_rotation))
        for f in fields(self):
            value = getattr(self, f.name)
            optional = f.type == "int | None" and value is None
            if f.type in ("int", "int | None") and not optional and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"HeuristicConfig.{f.name} must be an int >= 0, got {value!r}")
            number = f.type == "float" or (f.type == "float | None" and value is not None)
            if number and (isinstance(value, bool) or not isinstance(value, int | float) or (
                    f.name not in _RANGED and not math.isfinite(value))):
                # A NaN threshold compares False with everything: the rule never fires.
                raise ValueError(f"HeuristicConfig.{f.name} must be a finite number, got "
                                 f"{value!r}")
        for name in ("plateau_threshold", "stabilization_threshold"):
            value = getattr(self, name)
            if value < 0.0:
                raise ValueError(f"HeuristicConfig.{name} must be >= 0, got {value!r}")
        if not 0.0 <= self.min_training_gradient_health <= 1.0:
            raise ValueError(
                "HeuristicConfig.min_training_gradient_health must be in [0, 1], "
                f"got {self.min_training_gradient_health!r}"
            )
        if not (math.isfinite(self.judge_z) and self.judge_z >= 0.0):
            raise ValueError(f"HeuristicConfig.judge_z must be a finite number >= 0, got "
                             f"{self.judge_z!r}")
        if not 0.0 <= self.blueprint_penalty_decay <= 1.0:
            raise ValueError(
                "HeuristicConfig.blueprint_penalty_decay must be in [0, 1], "
                f"got {self.blueprint_penalty_decay!r}"
            )
        if self.blueprint_rotation is not None and not self.blueprint_rotation:
            raise ValueError("HeuristicConfig.blueprint_rotation must name at least one blueprint")
        for name in self.blueprint_rotation or ():
            blueprint_index(name)  # BlueprintError (a ValueError) listing the known names
        if self.blend_epochs == 0:
            raise ValueError("HeuristicConfig.blend_epochs must be an int >= 1 or None, got 0")
        ref = self.reference_epochs
        if ref is not None and (isinstance(ref, bool) or not isinstance(ref, int) or ref < 1):
            raise ValueError(f"HeuristicConfig.reference_epochs must be an int >= 1 or None, "
                             f"got {ref!r}")
        self._check_window()

    def _check_window(self) -> None:
        low, high = self.germinate_from_fraction, self.germinate_until_fraction
        for name, value in (("from", low), ("until", high)):
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"HeuristicConfig.germinate_{name}_fraction must be in [0, 1] "
                                 f"or None, got {value!r}")
        if low is not None and high is not None and low > high:
            raise ValueError(f"HeuristicConfig.germinate_from_fraction {low} is after "
                             f"germinate_until_fraction {high}")

    def rotation(self, topology: str) -> tuple[str, ...]:
        """The germination order on slots of ``topology``.

        Example:
            >>> HeuristicConfig().rotation("transformer")
            ('attention', 'norm')
        """
        if self.blueprint_rotation is not None:
            return self.blueprint_rotation
        return DEFAULT_ROTATIONS.get(topology, ())

    @classmethod
    def fixed_timing(cls, **knobs: Any) -> HeuristicConfig:
        """A config whose timing knobs are used as given, whatever the run length."""
        return cls(**{**knobs, "reference_epochs": None})

    def scaled_to(self, max_epochs: int | None) -> HeuristicConfig:
        """The config a run of ``max_epochs`` epochs uses: timing knobs scaled, the result
        fixed (``reference_epochs=None``). Unchanged for None or a non-positive length (an
        open-ended run)."""
        ref = self.reference_epochs
        if ref is None or max_epochs is None or max_epochs < 1:
            return dataclasses.replace(self, reference_epochs=None)
        scaled = {name: _scale(getattr(self, name), max_epochs, ref) for name in TIMING_KNOBS}
        if self.incubation_epochs is not None:
            scaled["incubation_epochs"] = _scale(self.incubation_epochs, max_epochs, ref)
        if self.blend_epochs is not None:
            # Shorter only: a run too short for the standard ramp still has a seed blend and be
            # judged, while runs of the reference length or longer blend as they always have.
            scaled["blend_epochs"] = min(self.blend_epochs,
                                         _scale(self.blend_epochs, max_epochs, ref))
        return dataclasses.replace(self, reference_epochs=None, **scaled)


class HeuristicController:
    """Rule-based controller, deciding HOLDING seeds on the
    measured counterfactual contribution.

    Every action it returns is allowed by ``report.masks``: when a rule's action is masked
    (ADVANCE while gates auto-advance, PRUNE while alpha ramps, GERMINATE while another slot
    cools down) it returns WAIT, and `last_reason` says why. Prunes are noticed from the
    reports (a slot entering PRUNED, EMBARGOED or RESETTING with a new seed id), so prunes by
    the governor or a finished prune ramp count too; each is dated to the decision after which
    it happened and starts the embargo and the blueprint penalty.

    It tracks validation accuracy and loss across calls, so call `decide` exactly once per epoch
    and `reset` at the start of each run or episode. Without validation metrics the host never
    counts as stable, so it never germinates.

    Args:
        config: rule constants; the research code's by default.

    Example:
        Grow a host with the default rules::

            controller = HeuristicController(HeuristicConfig(embargo_epochs_after_prune=8))
            trainer = Trainer(callbacks=[MorphogenesisCallback(controller)])

        A fresh controller waits for the host to settle first:

        >>> controller = HeuristicController()
        >>> controller.is_stabilized, controller.plateau_epochs, controller.last_reason
        (False, 0, 'reset')
    """

    #: What it reads of a validation run (`core.counterfactual.validation_reads`).
    validation_reads = frozenset({ACCURACY})

    def __init__(self, config: HeuristicConfig | None = None) -> None:
        self.config = config or HeuristicConfig()
        self._scaled = (self.config, None, self.config.scaled_to(None))
        self.reset()

    # --- public API ---------------------------------------------------------------------------
    def reset(self) -> None:
        self._prev_accuracy: float | None = None
        self._prev_loss: float | None = None
        self._plateau_epochs = 0
        self._stable_epochs = 0
        # With stabilization_epochs == 0 the host counts as stable from the start (scaling
        # keeps a zero knob at zero).
        self._stabilized = self.config.stabilization_epochs == 0
        self._last_epoch: int | None = None
        self._last_prune_epoch: int | None = None
        self._blueprint_index = 0
        self._penalties: dict[str, float] = {}
        self._counted_prunes: dict[str, str] = {}  # slot id -> seed id whose prune was counted
        #: Why the last decision was taken (for logs and tests); not part of the state.
        self.last_reason = "reset"
        self._blueprint_check = BlueprintCheck()

    def check_blueprints(self, topology: str, allowed: Sequence[str]) -> None:
        """Refuse (one line) a rotation naming a blueprint that does not exist for
        ``topology``, or one of which the run allows nothing."""
        rotation = self.config.rotation(topology)
        for name in rotation:
            check_named_blueprint("heuristic blueprint_rotation", name, topology)
        if not any(name in allowed for name in rotation):
            raise ConfigError(
                f"heuristic blueprint_rotation ({', '.join(rotation) or 'none for ' + topology}) "
                f"names no blueprint this run allows; accepted: {', '.join(allowed)}"
            )

    def decide(self, report: EpochReport) -> Action:
        self._blueprint_check(self, report)
        self._active(report.max_epochs)
        epoch = int(report.epoch)
        self._note_prunes(report)  # dated to the previous decision, so before the decay
        self._decay_penalties(epoch)
        self._track(report)
        self._last_epoch = epoch
        action, reason = self._rule(report)
        return self._legal(action, reason, report)

    def timing(self, max_epochs: int | None) -> dict[str, int]:
        """The timing knobs a run of ``max_epochs`` epochs uses (see `HeuristicConfig`).

        Example:
            >>> HeuristicController().timing(25)["min_epochs_before_germinate"]
            3
        """
        cfg = self.config.scaled_to(max_epochs)
        return {name: getattr(cfg, name) for name in TIMING_KNOBS}

    def lifecycle(self, max_epochs: int | None) -> dict[str, int]:
        """The lifecycle durations (in decisions) this controller asks of a run of
        ``max_epochs`` decisions: its scaled G2 ``incubation`` and ``blend`` (`HeuristicConfig`
        ``incubation_epochs``, ``blend_epochs``). It asks no hold: it judges a HOLDING seed at
        the first decision that has its contribution (strict gates' G3 hold is the gates').

        Example:
            >>> HeuristicController().lifecycle(30)  # 10 and 5 decisions of 50, scaled to 30
            {'incubation': 6, 'blend': 3}
            >>> HeuristicController().lifecycle(150)  # the blend never exceeds its 5
            {'incubation': 30, 'blend': 5}
        """
        cfg = self.config.scaled_to(max_epochs)
        asked = {"incubation": cfg.incubation_epochs, "blend": cfg.blend_epochs}
        return {name: value for name, value in asked.items() if value is not None}

    def earliest_germination(self, max_epochs: int | None) -> int:
        """The first epoch (0-based) at which the rules can germinate in a run of
        ``max_epochs`` epochs: the stability latch and the plateau each need that many epochs
        after the first, and germination waits for ``min_epochs_before_germinate``."""
        t = self.timing(max_epochs)
        earliest = max(t["min_epochs_before_germinate"], t["stabilization_epochs"],
                       t["plateau_epochs_to_germinate"])
        low = self.config.germinate_from_fraction
        if low is not None and max_epochs:  # (epoch + 1) / max_epochs >= low, without a budget
            earliest = max(earliest, math.ceil(low * max_epochs) - 1)
        return earliest

    @property
    def is_stabilized(self) -> bool:
        """Whether the host has latched as stable for this run."""
        return self._stabilized

    @property
    def plateau_epochs(self) -> int:
        """Consecutive epochs that gained less than ``config.plateau_threshold``."""
        return self._plateau_epochs

    @property
    def blueprint_penalties(self) -> dict[str, float]:
        """Current penalty per blueprint (blueprints without one are absent)."""
        return dict(self._penalties)

    def state_dict(self) -> dict[str, Any]:
        return {
            **state_header(_KIND),
            "prev_accuracy": self._prev_accuracy,
            "prev_loss": self._prev_loss,
            "plateau_epochs": self._plateau_epochs,
            "stable_epochs": self._stable_epochs,
            "stabilized": self._stabilized,
            "last_epoch": self._last_epoch,
            "last_prune_epoch": self._last_prune_epoch,
            "blueprint_index": self._blueprint_index,
            "penalties": dict(self._penalties),
            "counted_prunes": dict(self._counted_prunes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, _KIND, _STATE_KEYS)
        self._prev_accuracy = _optional_float(state["prev_accuracy"])
        self._prev_loss = _optional_float(state["prev_loss"])
        self._plateau_epochs = int(state["plateau_epochs"])
        self._stable_epochs = int(state["stable_epochs"])
        self._stabilized = bool(state["stabilized"])
        self._last_epoch = _optional_int(state["last_epoch"])
        self._last_prune_epoch = _optional_int(state["last_prune_epoch"])
        self._blueprint_index = int(state["blueprint_index"])
        self._penalties = {str(k): float(v) for k, v in state["penalties"].items()}
        self._counted_prunes = {str(k): str(v) for k, v in state["counted_prunes"].items()}
        self.last_reason = "loaded"

    # --- signals ------------------------------------------------------------------------------
    def _active(self, max_epochs: int | None) -> HeuristicConfig:
        """The config scaled to this run's length (cached: the length rarely changes)."""
        if self._scaled[:2] != (self.config, max_epochs):
            self._scaled = (self.config, max_epochs, self.config.scaled_to(max_epochs))
        return self._scaled[2]

    def _track(self, report: EpochReport) -> None:
        """Update the plateau counter and the stabilisation latch from this epoch's metrics."""
        cfg = self._scaled[2]
        if report.val_accuracy is not None:
            accuracy = float(report.val_accuracy)
            if self._prev_accuracy is not None:
                # NaN compares False, so a non-finite reading ends the plateau.
                flat = accuracy - self._prev_accuracy < cfg.plateau_threshold
                self._plateau_epochs = self._plateau_epochs + 1 if flat else 0
            self._prev_accuracy = accuracy
        if report.val_loss is None:
            return
        loss = float(report.val_loss)
        if not self._stabilized and self._prev_loss is not None:
            self._stable_epochs = self._stable_epochs + 1 if self._stable(loss) else 0
            self._stabilized = self._stable_epochs >= cfg.stabilization_epochs
        self._prev_loss = loss

    def _stable(self, loss: float) -> bool:
        prev = self._prev_loss
        if prev is None or not (math.isfinite(prev) and prev > 0.0 and math.isfinite(loss)):
            return False
        improvement = (prev - loss) / prev
        cfg = self._scaled[2]
        return -cfg.regression_threshold < improvement < cfg.stabilization_threshold

    def _note_prunes(self, report: EpochReport) -> None:
        """Count every seed removed since the last decision: penalty for its blueprint, and the
        embargo clock restarts."""
        for slot_id, slot in zip(report.slot_ids, report.slots, strict=True):
            if slot.stage not in FAILURE_STAGES:
                self._counted_prunes.pop(slot_id, None)
                continue
            seed_id = slot.seed_id or ""
            if self._counted_prunes.get(slot_id) == seed_id:
                continue
            self._counted_prunes[slot_id] = seed_id
            last = self._last_epoch
            self._last_prune_epoch = int(report.epoch) if last is None else last
            if slot.blueprint is not None:
                penalty = self._penalties.get(slot.blueprint, 0.0)
                self._penalties[slot.blueprint] = penalty + self.config.blueprint_penalty_on_prune

    def _decay_penalties(self, epoch: int) -> None:
        elapsed = 0 if self._last_epoch is None else epoch - self._last_epoch
        if elapsed <= 0:
            return
        factor = self.config.blueprint_penalty_decay**elapsed
        floor = self.config.blueprint_penalty_floor
        decayed = {name: p * factor for name, p in self._penalties.items()}
        self._penalties = {name: p for name, p in decayed.items() if p >= floor}

    # --- rules --------------------------------------------------------------------------------
    def _rule(self, report: EpochReport) -> tuple[Action, str]:
        live = report.live_slots
        if live:
            index = live[0]
            return self._manage(index, report.slots[index], report)
        return self._germination(report)

    def _germination(self, report: EpochReport) -> tuple[Action, str]:
        cfg = self._scaled[2]
        epoch = int(report.epoch)
        if self._last_prune_epoch is not None:
            since = epoch - self._last_prune_epoch
            if since < cfg.embargo_epochs_after_prune:
                return WAIT, f"embargo: {since} epoch(s) since the last prune"
        outside = self._outside_window(report)
        if outside is not None:
            return WAIT, outside
        if not self._stabilized:
            return WAIT, "host not stabilised"
        if epoch < cfg.min_epochs_before_germinate:
            return WAIT, f"epoch {epoch} < {cfg.min_epochs_before_germinate} before germinating"
        if not report.empty_slots:
            return WAIT, "no empty slot"
        slot = report.empty_slots[0]
        last_chance = False
        if cfg.finish_by_end and report.max_epochs:
            left = report.max_epochs - epoch - 1  # decisions after this one
            needed = decisions_to_judge(report.slots[slot])
            if left < needed:
                return WAIT, (f"too late to germinate: {left} decision(s) left, a seed needs "
                              f"{needed} to incubate, blend and be judged")
            last_chance = left == needed
        if self._plateau_epochs < cfg.plateau_epochs_to_germinate and not last_chance:
            return WAIT, f"no plateau ({self._plateau_epochs} epoch(s))"
        # Check before picking, so a masked germination does not advance the rotation.
        if not report.masks.head("slot", LifecycleOp.GERMINATE)[slot]:
            error = slot_op_error(LifecycleOp.GERMINATE, slot, report.slots, report.mask_context)
            return WAIT, f"germinate masked ({error or 'not in the masks'}): wait"
        blueprint = self._next_blueprint(self.config.rotation(report.topology),
                                         report.mask_context.blueprints)
        if blueprint is None:
            return WAIT, "no blueprint of the rotation is allowed in this run"
        action = Action(
            LifecycleOp.GERMINATE,
            slot=slot,
            blueprint=blueprint,
            alpha_target=AlphaTargetChoice.FULL,
        )
        plateau = f"{self._plateau_epochs} epoch{'s' if self._plateau_epochs != 1 else ''}"
        if last_chance and self._plateau_epochs < cfg.plateau_epochs_to_germinate:
            return action, f"last decision a seed can still be judged by: germinate {blueprint}"
        return action, f"plateau of {plateau}: germinate {blueprint}"

    def _outside_window(self, report: EpochReport) -> str | None:
        """Why the run is outside the germination window (`HeuristicConfig`
        ``germinate_from_fraction``, ``germinate_until_fraction``), or None."""
        low, high = self.config.germinate_from_fraction, self.config.germinate_until_fraction
        if low is None and high is None:
            return None
        spent = report.spent_fraction
        if spent is None:
            raise ConfigError("heuristic germinate_from_fraction / germinate_until_fraction "
                              "need a compute budget or a planned number of epochs, and this "
                              "run has neither")
        if low is not None and spent < low:
            return f"{spent:.3f} of the run spent < {low} before germinating"
        if high is not None and spent >= high:
            return f"{spent:.3f} of the run spent >= {high}: too late to germinate"
        return None

    def _next_blueprint(self, rotation: tuple[str, ...], allowed: tuple[str, ...]) -> str | None:
        """Round robin over the rotation, skipping blueprints not allowed or penalised; when all
        allowed ones are penalised, the least penalised (the rotation does not move)."""
        cfg = self.config
        n = len(rotation)
        candidates = [
            (k, rotation[(self._blueprint_index + k) % n])
            for k in range(n)
            if rotation[(self._blueprint_index + k) % n] in allowed
        ]
        if not candidates:
            return None
        for k, name in candidates:
            if self._penalties.get(name, 0.0) < cfg.blueprint_penalty_threshold:
                self._blueprint_index = (self._blueprint_index + k + 1) % n
                return name
        return min(candidates, key=lambda c: (self._penalties.get(c[1], 0.0), c[0]))[1]

    def _manage(self, index: int, slot: SlotReport, report: EpochReport) -> tuple[Action, str]:
        stage = slot.stage
        if stage == SeedStage.GERMINATED:
            return Action(LifecycleOp.ADVANCE, slot=index), "germinated: advance to training"
        if stage == SeedStage.TRAINING:
            failing = self._incubation_failure(slot)
            if failing is not None:
                return _prune(index), f"training seed {failing}: prune"
            return Action(LifecycleOp.ADVANCE, slot=index), "training: try to advance"
        if stage == SeedStage.BLENDING and self._failing(slot):
            drop = slot.metrics.improvement_since_stage_start
            return _prune(index), f"blending seed: host lost {-drop:.2f} pp: prune"
        if stage == SeedStage.BLENDING:
            if blend_complete(slot.alpha_view):
                return Action(LifecycleOp.ADVANCE, slot=index), "blended in: advance to holding"
            return WAIT, "blending: alpha not yet at 1.0"
        return self._judge(index, slot, report)

    def _incubation_failure(self, slot: SlotReport) -> str | None:
        """Why an incubating seed should go, judged on what it can affect: its own gradients
        and its age. (Its output is not in the host's forward, so the host's accuracy moves for
        reasons of its own.) None: keep incubating."""
        cfg, m = self._scaled[2], slot.metrics
        if cfg.max_training_epochs and slot.epochs_in_stage >= cfg.max_training_epochs:
            age = slot.epochs_in_stage
            return f"incubated {age} epoch{'s' if age != 1 else ''} without passing G2"
        if slot.epochs_in_stage < cfg.min_epochs_before_prune or m.gradient_health is None:
            return None
        if m.is_healthy is False:
            return "gradients exploded or went non-finite"
        if m.gradient_health < cfg.min_training_gradient_health:
            return (f"gradient health {m.gradient_health:.2f} < "
                    f"{cfg.min_training_gradient_health}")
        return None

    def _failing(self, slot: SlotReport) -> bool:
        cfg = self._scaled[2]
        return (
            slot.epochs_in_stage >= cfg.min_epochs_before_prune
            and slot.metrics.improvement_since_stage_start < cfg.prune_improvement_threshold
        )

    def _judge(self, index: int, slot: SlotReport, report: EpochReport) -> tuple[Action, str]:
        """HOLDING: keep or remove the seed on its measured contribution, once the validation
        examples tell it from the threshold (`HeuristicConfig` ``judge_z``)."""
        cfg = self._scaled[2]
        contribution = slot.metrics.counterfactual_contribution
        if contribution is None:
            return WAIT, "holding: contribution not measured yet"
        total = slot.metrics.total_improvement
        if contribution > cfg.ransomware_contribution and total < 0.0:
            return _prune(index), (
                f"ransomware: contribution {contribution:.2f} while the host lost "
                f"{-total:.2f} pp: prune"
            )
        measured, (told, anyway) = _contribution_text(slot), self._told_apart(slot, report)
        if not told and anyway is None:
            return WAIT, (f"holding: contribution {measured} is within {cfg.judge_z:g} standard "
                          f"errors of {cfg.fossilize_contribution}: measure again "
                          f"(held {slot.epochs_in_stage} of at most {cfg.max_holding_epochs} "
                          "decisions)")
        alone = "" if told else f", judged on its value alone ({anyway})"
        if contribution > cfg.fossilize_contribution:
            return Action(LifecycleOp.FOSSILIZE, slot=index), (
                f"contribution {measured} > {cfg.fossilize_contribution}{alone}: fossilize"
            )
        return _prune(index), (
            f"contribution {measured} <= {cfg.fossilize_contribution}{alone}: prune"
        )

    def _told_apart(self, slot: SlotReport, report: EpochReport) -> tuple[bool, str | None]:
        """Whether the seed's contribution is told from ``fossilize_contribution`` at
        ``judge_z`` standard errors, and if not, why it is judged anyway (None: it holds and is
        measured again)."""
        cfg, m = self._scaled[2], slot.metrics
        if cfg.judge_z == 0.0 or m.contribution_se is None or m.counterfactual_contribution is None:
            return True, None
        margin = abs(m.counterfactual_contribution - cfg.fossilize_contribution)
        if margin > cfg.judge_z * m.contribution_se:
            return True, None
        if report.max_epochs is not None and report.epoch + 1 >= report.max_epochs:
            return False, "the run's last decision"
        if slot.epochs_in_stage >= cfg.max_holding_epochs:
            return False, f"held {slot.epochs_in_stage} decisions"
        return False, None

    def _legal(self, action: Action, reason: str, report: EpochReport) -> Action:
        """Return ``action`` (canonicalised) if the masks allow it, else WAIT; note the reason."""
        action = canonicalize(action)
        if report.masks.allows(action):
            self.last_reason = reason
            return action
        error = action_error(action, report.slots, report.mask_context) or "not in the masks"
        self.last_reason = f"{reason}; {action.op.name} masked ({error}): wait"
        return WAIT


def decisions_to_judge(slot: SlotReport) -> int:
    """Decisions a seed germinated in ``slot`` needs before the heuristic can judge it: one to
    start training, its incubation, its blend (the heuristic germinates at the standard tempo
    unless the slot sets its own: a Trainer callback sets the scaled `HeuristicConfig`
    ``blend_epochs``), one to move to HOLDING and one to be judged.

    Example:
        >>> from esper_lightning.core.slots import SeedSlot
        >>> decisions_to_judge(SeedSlot("s", channels=4).report())  # 1 + 10 + 5 + 1 + 1
        18
    """
    blend = slot.blend_ticks if slot.blend_ticks is not None else Tempo.STANDARD.epochs
    return 1 + slot.incubation + blend + 2


def _contribution_text(slot: SlotReport) -> str:
    """``1.25`` or, with its standard error, ``1.25 ± 0.80 pp``."""
    m = slot.metrics
    value = f"{m.counterfactual_contribution:.2f}"
    return value if m.contribution_se is None else f"{value} ± {m.contribution_se:.2f} pp"


def _prune(index: int) -> Action:
    # Instant removal (canonical alpha speed): the heuristic has no use for a blend-out.
    return Action(LifecycleOp.PRUNE, slot=index)




def _scale(epochs: int, max_epochs: int, reference: int) -> int:
    if epochs == 0:
        return 0  # a knob switched off stays off
    return max(1, math.floor(epochs * max_epochs / reference + 0.5))


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
