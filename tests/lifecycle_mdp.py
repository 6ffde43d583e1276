"""A small deterministic lifecycle MDP with a known optimal policy, for the PPO learning test.

It stands in for the host: the lifecycle is real (two real `SeedSlot`s of width 2, real
`execute_on_slot`, gates, ticks, `compute_masks`, `EpochReport`s, Obs V3 features), only the host's
accuracy is scripted:

* the host sits on a plateau at `PLATEAU` percent;
* a seed changes accuracy by ``gain · alpha``: `GAINS` gives the gain per (blueprint, slot): a
  ``norm`` seed in slot ``r0c1`` is good (+10 points), in ``r0c0`` useless (0), a ``depthwise``
  seed is harmful anywhere (−6). A good seed only delivers half its gain until it is
  fossilized (the host has not committed to it yet); pruning a harmful seed restores accuracy;
* the engine's measurements are fed every epoch: accuracy, counterfactual contribution (= the
  seed's effect) and healthy gradient statistics.

Episodes last `EPISODE_LENGTH` decisions; the reward is the accuracy change divided by
`REWARD_SCALE`, so an episode's return is ``(final accuracy − initial accuracy) / 10`` and the
optimum is reached by ending with the good seed fossilized and no harmful seed.

Reduced wait, so episodes stay short: when a seed enters TRAINING the MDP fast-forwards its
``epochs_in_stage`` to ``MIN_TRAINING_EPOCHS − 1`` (gate G2 needs 10 epochs in TRAINING), so G2
can pass one epoch later. Everything else runs under the default rules.

Two starts: ``clean`` (both slots empty) and ``harmful`` (a depthwise seed already HOLDING in
``r0c0``, old enough to prune). Optimal policies (`optimal_actions`):

* clean: GERMINATE norm in r0c1 (alpha target 1.0, fast tempo), ADVANCE ×2 (to TRAINING, then
  BLENDING), wait for the ramp, ADVANCE (HOLDING), FOSSILIZE: return +1.0.
* harmful: the same, but PRUNE the harmful seed right after germinating (not before: a prune puts
  the slot in embargo, which blocks any germination for 7 epochs and the good seed could not be
  fossilized in time): return +1.6.

Both are optimal because no reachable state has higher accuracy than "good seed fossilized, no
harmful seed" (+10 points, +6 more when a harmful seed was there).
"""

from __future__ import annotations

import torch

from esper_lightning.core.actions import (
    Action,
    AlphaTargetChoice,
    LifecycleOp,
    MaskContext,
    Tempo,
    action_error,
    compute_masks,
)
from esper_lightning.core.engine import execute_on_slot
from esper_lightning.core.lifecycle import ACTIVE_STAGES, MIN_TRAINING_EPOCHS, SeedStage
from esper_lightning.core.report import HISTORY_WINDOW, EpochReport
from esper_lightning.core.slots import SeedSlot
from esper_lightning.rl import (
    FactoredRecurrentActorCritic,
    RolloutBuffer,
    RunningMeanStd,
    batch_observations,
    step_ends,
)

PLATEAU = 50.0
EPISODE_LENGTH = 12
REWARD_SCALE = 10.0
HOST_PARAMS = 1000
SLOT_IDS = ("r0c0", "r0c1")
BLUEPRINTS = ("norm", "depthwise")
GAINS = {
    ("norm", "r0c0"): 0.0,
    ("norm", "r0c1"): 10.0,
    ("depthwise", "r0c0"): -6.0,
    ("depthwise", "r0c1"): -6.0,
}
CONTEXT = MaskContext(blueprints=BLUEPRINTS)
OPTIMAL_RETURN = {"clean": 1.0, "harmful": 1.6}


class LifecycleMDP:
    """One environment. ``start`` is ``"clean"`` or ``"harmful"``."""

    def __init__(self, start: str) -> None:
        if start not in OPTIMAL_RETURN:
            raise ValueError(f"unknown start {start!r}; accepted: {sorted(OPTIMAL_RETURN)}")
        self.start = start
        self.slots: list[SeedSlot] = []
        self.epoch = 0
        self.history: list[float] = []
        self.report: EpochReport | None = None

    def reset(self) -> EpochReport:
        self.slots = [SeedSlot(slot_id, channels=2) for slot_id in SLOT_IDS]
        if self.start == "harmful":
            _grow_to_holding(self.slots[0], "depthwise")
        self.epoch = 0
        self.history = []
        self._measure()
        self.report = self._report(last_action=None, success=True)
        return self.report

    def step(self, action: Action) -> tuple[EpochReport, float, bool]:
        """Apply ``action`` (it must be legal), run one epoch; ``(report, reward, done)``."""
        assert self.report is not None, "reset() first"
        if self.epoch >= EPISODE_LENGTH:
            raise RuntimeError("episode is over; reset()")
        error = action_error(action, self.report.slots, CONTEXT)
        if error is not None:
            raise ValueError(f"illegal action {action.describe(SLOT_IDS)}: {error}")
        slot = self.slots[action.slot]
        stage_before = slot.stage
        result = execute_on_slot(slot, action)
        if stage_before == SeedStage.GERMINATED and slot.stage == SeedStage.TRAINING:
            slot.state.metrics.epochs_in_stage = MIN_TRAINING_EPOCHS - 1  # reduced wait
        for s in self.slots:
            s.tick()
        self.epoch += 1
        previous = self.history[-1]
        self._measure()
        self.report = self._report(action, result is None or result.passed)
        reward = (self.history[-1] - previous) / REWARD_SCALE
        return self.report, reward, self.epoch == EPISODE_LENGTH

    # --- the scripted host --------------------------------------------------------------------
    def _effect(self, slot: SeedSlot) -> float:
        if slot.seed is None or slot.stage not in ACTIVE_STAGES:
            return 0.0
        gain = GAINS[(slot.state.blueprint, slot.slot_id)]
        committed = slot.stage == SeedStage.FOSSILIZED or gain < 0
        return gain * slot.alpha * (1.0 if committed else 0.5)

    def _measure(self) -> None:
        accuracy = PLATEAU + sum(self._effect(s) for s in self.slots)
        self.history.append(accuracy)
        for s in self.slots:
            if s.seed is None:
                continue
            metrics = s.state.metrics
            metrics.gradient_health, metrics.gradient_norm = 1.0, 0.05
            metrics.has_vanishing, metrics.has_exploding = False, False
            s.record_accuracy(accuracy)
            if s.stage in ACTIVE_STAGES:
                s.record_contribution(self._effect(s))

    def _report(self, last_action: Action | None, success: bool) -> EpochReport:
        return make_report(
            self.slots, epoch=self.epoch, accuracies=self.history, last_action=last_action,
            success=success,
        )


def make_report(
    slots: list[SeedSlot],
    *,
    epoch: int = 0,
    max_epochs: int | None = EPISODE_LENGTH,
    accuracies: list[float] | tuple[float, ...] = (PLATEAU,),
    context: MaskContext = CONTEXT,
    last_action: Action | None = None,
    success: bool = True,
    host_params: int = HOST_PARAMS,
    seed_history: tuple[int, ...] | None = None,
) -> EpochReport:
    """The `EpochReport` an engine would build for ``slots`` (``accuracies``: oldest first,
    the last one is this epoch's validation accuracy; the loss follows the accuracy;
    ``seed_history``: the seed parameters at each of those epochs, by default the present
    seeds' at every one)."""
    views = tuple(s.report() for s in slots)
    window = tuple(accuracies[-HISTORY_WINDOW:])
    seed_params = sum(v.seed_params for v in views if v.seed_id is not None)
    history = (seed_params,) * len(window) if seed_history is None else seed_history
    return EpochReport(
        epoch=epoch,
        max_epochs=max_epochs,
        slot_ids=tuple(s.slot_id for s in slots),
        slots=views,
        val_accuracy=window[-1],
        val_loss=_loss(window[-1]),
        train_loss=None,
        accuracy_history=window,
        loss_history=tuple(_loss(a) for a in window),
        host_params=host_params,
        seed_params=seed_params,
        masks=compute_masks(views, context),
        mask_context=context,
        last_action=last_action,
        last_action_success=success,
        seed_params_history=tuple(history[-HISTORY_WINDOW:]),
    )


def _loss(accuracy: float) -> float:
    return 2.3 * (1.0 - accuracy / 100.0)


def _grow_to_holding(slot: SeedSlot, blueprint: str) -> None:
    """Drive a fresh slot to HOLDING at alpha 1 through legal operations (before the episode)."""
    slot.germinate(blueprint, tempo=3)
    assert slot.advance().passed
    for _ in range(MIN_TRAINING_EPOCHS):
        slot.tick()
    slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
    assert slot.advance().passed
    for _ in range(3):
        slot.tick()
    assert slot.advance().passed


def optimal_actions(start: str) -> list[Action]:
    """An optimal action sequence (see the module docstring); WAIT pads the episode."""
    good, bad = SLOT_IDS.index("r0c1"), SLOT_IDS.index("r0c0")
    germinate = Action(
        LifecycleOp.GERMINATE,
        slot=good,
        blueprint="norm",
        tempo=Tempo.FAST,
        alpha_target=AlphaTargetChoice.FULL,
    )
    advance = Action(LifecycleOp.ADVANCE, slot=good)
    plan = [germinate]
    if start == "harmful":
        plan.append(Action(LifecycleOp.PRUNE, slot=bad))
    plan += [advance, advance, Action(), Action(), advance, Action(LifecycleOp.FOSSILIZE, good)]
    return plan + [Action()] * (EPISODE_LENGTH - len(plan))


def collect_rollout(
    policy: FactoredRecurrentActorCritic,
    obs_rms: RunningMeanStd,
    envs: list[LifecycleMDP],
    buffer: RolloutBuffer,
) -> None:
    """Fill ``buffer`` with whole episodes of every env, the way a trainer would.

    ``buffer.n_steps`` must be a multiple of `EPISODE_LENGTH`; the recurrent state is carried
    from one episode to the next and zeroed by the policy at episode starts. The observation
    normaliser is frozen during the rollout and updated once at the end with the raw features.
    """
    if buffer.n_steps % EPISODE_LENGTH:
        raise ValueError(f"buffer length {buffer.n_steps} is not whole episodes")
    buffer.reset()
    reports = [env.reset() for env in envs]
    hidden = policy.initial_state(len(envs))
    starts = torch.ones(len(envs), dtype=torch.bool)
    raw_history = []
    obs_rms.freeze()
    for t in range(buffer.n_steps):
        raw, indices, masks = batch_observations(reports)
        raw_history.append(raw)
        obs = obs_rms.normalize(raw)
        out = policy.act(obs, indices, masks, hidden, episode_starts=starts)
        actions = [Action.from_indices(a) for a in out.actions.tolist()]
        steps = [env.step(a) for env, a in zip(envs, actions, strict=True)]
        # The trainer's own rule for episode ends: the env's end is a true terminal.
        ends = step_ends([done for _, _, done in steps], rollout_over=t == buffer.n_steps - 1)
        buffer.add(
            obs=obs, blueprint_idx=indices, hidden=hidden, masks=masks, actions=out.actions,
            log_probs=out.log_probs, values=out.value,
            rewards=torch.tensor([reward for _, reward, _ in steps]),
            episode_starts=starts, terminated=ends.terminated, truncated=ends.truncated,
        )  # whole episodes per rollout: nothing is ever truncated, so nothing is bootstrapped
        done = ends.terminated
        reports = [env.reset() if d else r for env, (r, _, _), d in zip(envs, steps, done.tolist(),
                                                                          strict=True)]
        hidden, starts = out.hidden, done
    obs_rms.unfreeze()
    obs_rms.update(torch.cat(raw_history))

