"""`PolicyController`: a PPO-trained policy driving `MorphogenesisCallback`."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from esper_lightning.controllers.base import check_state, state_header
from esper_lightning.core.actions import Action, compute_masks
from esper_lightning.core.counterfactual import VALIDATION_READS
from esper_lightning.core.report import EpochReport
from esper_lightning.rl.checkpoint import PolicyBundle, check_blueprints, load_policy_file
from esper_lightning.rl.distributions import MaskBatch, fit_blueprint_head
from esper_lightning.rl.observations import encode_reports


class PolicyController:
    """Acts with the policy of a ``esper-lightning ppo`` checkpoint.

    The observation is built exactly as in training (same features, the training episode length
    as horizon, the saved observation normaliser) and the LSTM state carries over from epoch to
    epoch. Actions are the argmax of each head by default (``deterministic=False`` samples, as
    in training: from ``rng_seed``'s own generator when given, which runs on across `reset` so
    successive episodes differ and is kept in `state_dict`; else from torch's global one).

    The policy acts in any run whose blueprints all have an entry in its blueprint head, also
    after more blueprints were registered; at the first decision a run that allows a blueprint
    the policy has never seen is refused with a `ConfigError` naming both. A policy trained
    with a subset of the blueprints (``blueprints`` of its run) germinates only those: the masks
    it acts on allow the blueprints of the run that it was trained with
    (`PolicyBundle.playable`), and no germination where the run allows none of them.

    Args:
        checkpoint: path of a PPO checkpoint (loaded with ``weights_only=True``), or a
            `PolicyBundle` already loaded (many controllers can share one policy read-only).
        deterministic: argmax actions instead of sampling.
        rng_seed: with ``deterministic=False``, seed of the generator the actions are drawn
            from (None: torch's global generator).

    Example:
        >>> controller = PolicyController("runs/ckpt.pt")  # doctest: +SKIP
        >>> trainer = L.Trainer(callbacks=[MorphogenesisCallback(controller)])  # doctest: +SKIP
    """

    #: What it reads of a validation run (`core.counterfactual.validation_reads`).
    validation_reads = VALIDATION_READS

    def __init__(
        self, checkpoint: str | os.PathLike[str] | PolicyBundle, deterministic: bool = True,
        rng_seed: int | None = None,
    ) -> None:
        if deterministic and rng_seed is not None:
            raise ValueError(f"rng_seed={rng_seed} seeds sampled actions; a deterministic "
                             "policy draws none (accepted: deterministic=False, or no rng_seed)")
        bundle = (checkpoint if isinstance(checkpoint, PolicyBundle)
                  else load_policy_file(checkpoint))
        self.bundle = bundle
        self.policy, self.obs_rms = bundle.policy, bundle.obs_rms
        self.slot_ids, self.horizon, self.compact = bundle.slot_ids, bundle.horizon, bundle.compact
        self.deterministic = deterministic
        self.generator = None if rng_seed is None else torch.Generator().manual_seed(rng_seed)
        self._checked: tuple[str, ...] | None = None  # the run blueprints found fitting
        self.reset()

    def decide(self, report: EpochReport) -> Action:
        if report.slot_ids != self.slot_ids:
            raise ValueError(
                f"the policy was trained for slots {list(self.slot_ids)}; the callback has "
                f"{list(report.slot_ids)}"
            )
        allowed = report.mask_context.blueprints
        if allowed != self._checked:
            check_blueprints(self.bundle, allowed)
            self._checked = allowed
        obs, blueprints, masks = self.inputs(report)
        starts = torch.tensor([self._episode_start])
        generators = None if self.generator is None else [self.generator]
        out = self.policy.act(obs, blueprints, masks, self.hidden, self.deterministic,
                              episode_starts=starts, generators=generators)
        self.hidden, self._episode_start = out.hidden, False
        return Action.from_indices(out.actions[0].tolist())

    def inputs(self, report: EpochReport) -> tuple[torch.Tensor, torch.Tensor, MaskBatch]:
        """What the policy acts on for ``report``: normalised observation ``[1, D]``, blueprint
        indices ``[1, S]`` and masks, exactly as in training."""
        _, obs, blueprints, masks = encode_reports([self._playable(report)], self.obs_rms,
                                                   self.horizon, self.compact)
        return obs, blueprints, fit_blueprint_head(masks, len(self.bundle.blueprints))

    def _playable(self, report: EpochReport) -> EpochReport:
        """The report with its masks recomputed for the blueprints the policy plays (the
        core's own mask rules, so a GERMINATE with none left is masked as everywhere)."""
        context = report.mask_context
        playable = self.bundle.playable(context.blueprints)
        if playable == context.blueprints:
            return report
        context = replace(context, blueprints=playable)
        return replace(report, masks=compute_masks(report.slots, context), mask_context=context)

    def reset(self) -> None:
        self.hidden = self.policy.initial_state(1)
        self._episode_start = True

    def state_dict(self) -> dict[str, Any]:
        h, c = self.hidden
        state = {**state_header("policy"), "hidden_h": h.flatten().tolist(),
                 "hidden_c": c.flatten().tolist(), "episode_start": self._episode_start}
        if self.generator is not None:  # a sampling policy resumes its draws exactly
            state["generator"] = self.generator.get_state().tolist()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        own_draws = () if self.generator is None else ("generator",)
        check_state(state, "policy", ("hidden_h", "hidden_c", "episode_start", *own_draws))
        shape = self.hidden[0].shape
        self.hidden = (torch.tensor(state["hidden_h"]).view(shape),
                       torch.tensor(state["hidden_c"]).view(shape))
        self._episode_start = bool(state["episode_start"])
        if self.generator is not None:
            self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
