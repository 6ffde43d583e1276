"""`EpochReport`: what a controller sees at each decision (once per epoch in the RL envs).

The engine builds one report after validation; the heuristic, the random and scripted controllers,
the PPO observation builder and the rewards all read this one type.
"""

from __future__ import annotations

from dataclasses import dataclass

from esper_lightning.core.actions import Action, ActionMasks, MaskContext
from esper_lightning.core.lifecycle import LIVE_STAGES, SeedStage
from esper_lightning.core.slots import SlotReport

#: Validation history kept in reports (the observation reads the last 5).
HISTORY_WINDOW = 10


@dataclass(frozen=True)
class EpochReport:
    """State of the host and its slots at one decision point.

    Accuracies are in percent (0-100); contributions in percentage points.

    Attributes:
        epoch: index of the epoch that just finished (0-based) in this run or episode.
        max_epochs: planned episode length (None when unbounded).
        slot_ids: enabled slot ids in action order; ``slots[i]`` reports ``slot_ids[i]``.
        slots: one report per enabled slot.
        val_accuracy, val_loss: this epoch's validation metrics (None without validation).
        train_loss: mean training loss of the epoch (None if unknown).
        accuracy_history, loss_history: last `HISTORY_WINDOW` validation values, oldest first,
            including this epoch's.
        host_params: parameters of the host without seeds.
        seed_params: parameters of all seeds present (live and fossilized).
        seed_params_history: seed parameters present when each accuracy of
            ``accuracy_history`` was measured, aligned with it (what the outcome's parameter
            cost averages).
        masks: legal actions now; ``mask_context`` is what they were computed with.
        last_action: the action executed at the previous decision (None at the start).
        last_action_success: whether it was legal and its gate (if any) passed.
        topology: ``"cnn"``, ``"transformer"`` or ``"linear"``.
        train_flops: training FLOPs spent so far in this run or episode (host and every seed,
            forward and backward; 0 when nobody measures them).
        growth_flops: the part of ``train_flops`` the live seeds (germinated, not yet
            fossilized) added to the training steps (`core.compute`'s ``growth`` kind; 0 when
            nobody measures them, and in a report built before the field existed).
        budget_flops: the run's compute budget in training FLOPs (None: no budget; the run is
            as long as its epochs).
        budget_scale: the episode's budget over the run's base budget when budgets vary by
            episode (`esper_lightning.envs.EnvSpec.budget_scales`), else 1.
        run_fraction: how far a run without a budget is, measured by its adapter in what
            bounds it (the Trainer callback: optimizer steps done over the planned steps, or
            time over ``max_time``); None: counted in decisions (``(epoch + 1) / max_epochs``).

    A decision is what ``epoch`` counts: once per epoch in the RL envs; after every validation
    run (or every N optimizer steps) in the Trainer callback, where ``max_epochs`` is then the
    decisions the run plans.
    """

    epoch: int
    max_epochs: int | None
    slot_ids: tuple[str, ...]
    slots: tuple[SlotReport, ...]
    val_accuracy: float | None
    val_loss: float | None
    train_loss: float | None
    accuracy_history: tuple[float, ...]
    loss_history: tuple[float, ...]
    host_params: int
    seed_params: int
    masks: ActionMasks
    mask_context: MaskContext
    last_action: Action | None = None
    last_action_success: bool = True
    topology: str = "cnn"
    seed_params_history: tuple[int, ...] = ()
    train_flops: float = 0.0
    budget_flops: float | None = None
    budget_scale: float = 1.0
    run_fraction: float | None = None
    growth_flops: float = 0.0

    @property
    def budget_fraction(self) -> float | None:
        """Fraction of the compute budget spent (None without a budget)."""
        return None if self.budget_flops is None else self.train_flops / self.budget_flops

    @property
    def spent_fraction(self) -> float | None:
        """How far the run is: the budget fraction under a compute budget, else the adapter's
        ``run_fraction``, else the decisions done over the planned ones (None when none is
        known)."""
        if self.budget_flops is not None:
            return self.budget_fraction
        if self.run_fraction is not None:
            return self.run_fraction
        return None if not self.max_epochs else (self.epoch + 1) / self.max_epochs

    def count(self, *stages: SeedStage) -> int:
        return sum(s.stage in stages for s in self.slots)

    @property
    def live_slots(self) -> tuple[int, ...]:
        """Indices of slots whose seed is live (germinated, not yet fossilized or removed)."""
        return tuple(i for i, s in enumerate(self.slots) if s.stage in LIVE_STAGES)

    @property
    def empty_slots(self) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self.slots) if s.stage == SeedStage.DORMANT)

