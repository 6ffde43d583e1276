"""`FactoredRecurrentActorCritic`: the PPO controller's network.

    obs [B, D] ⊕ blueprint embeddings [B, S·E]
      -> Linear -> LayerNorm -> ReLU                      (feature net, width H)
      -> x + LayerNorm(LSTM(x))                           (residual recurrent core, width H)
      -> one MLP per action head (8 heads, `HEADS` order) and one op-independent value MLP

Acting samples the op first, then every other head under its mask conditioned on the sampled op
(`MaskBatch.head`; the blueprint head also on the sampled slot): heads the op does not use
collapse to their canonical value with log-prob 0.
`evaluate` replays stored sequences from their stored pre-step hidden state, zeroing the state at
episode starts exactly as acting did, so unchanged parameters reproduce the rollout log-probs and
values.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor, nn

from esper_lightning.blueprints import blueprint_table
from esper_lightning.core.actions import HEAD_ENUMS, HEADS
from esper_lightning.rl.distributions import MaskBatch, MaskedCategorical
from esper_lightning.rl.observations import EMPTY_BLUEPRINT, obs_dim

Hidden = tuple[Tensor, Tensor]  # (h, c), each [B, H]


@dataclass(frozen=True)
class PolicyConfig:
    """Network sizes and init gains (defaults sized for CPU runs).

    Attributes:
        n_slots: enabled slots S (sets the observation size and the slot head).
        hidden_dim: width of the feature net and of the LSTM (the residual needs them equal).
        head_hidden_dim: hidden width of each action-head and value MLP.
        blueprint_embed_dim: embedding size per slot's blueprint.
        blueprints: the blueprint name of each index of the blueprint head (None: "no
            blueprint"); the blueprint table when the config is created, so a policy has a head
            entry and an embedding row for every blueprint registered by then.
        policy_head_gain: orthogonal gain of each head's last layer; small so the initial
            policy is near-uniform over the legal actions.
        value_head_gain: orthogonal gain of the value output layer.
    """

    n_slots: int
    hidden_dim: int = 128
    head_hidden_dim: int = 64
    blueprint_embed_dim: int = 4
    policy_head_gain: float = 0.01
    value_head_gain: float = 1.0
    blueprints: tuple[str | None, ...] = field(default_factory=blueprint_table)

    @property
    def obs_dim(self) -> int:
        return obs_dim(self.n_slots)

    @property
    def head_sizes(self) -> dict[str, int]:
        """Values per head: the slot head first, then `HEADS` order (the modules' order, so
        parameters and their optimizer state keep their places)."""
        sizes = {name: len(HEAD_ENUMS[name]) for name in HEADS if name in HEAD_ENUMS}
        sizes["blueprint"] = len(self.blueprints)
        return {"slot": self.n_slots, **{name: sizes[name] for name in HEADS if name != "slot"}}


class ActOutput(NamedTuple):
    """Result of one acting step.

    Attributes:
        actions: long ``[B, 8]`` head indices in `HEADS` order (irrelevant heads canonical).
        log_probs: ``[B, 8]`` per-head log-probs (exactly 0 for irrelevant heads).
        value: ``[B]`` critic output (normalised scale).
        hidden: the post-step recurrent state.
    """

    actions: Tensor
    log_probs: Tensor
    value: Tensor
    hidden: Hidden


class Evaluation(NamedTuple):
    """Re-evaluation of stored sequences.

    Attributes:
        log_probs: ``[B, T, 8]`` log-probs of the stored actions.
        entropy: ``[B, T, 8]`` *normalised* entropy H / ln(#legal) in [0, 1] of each head's
            op-conditioned distribution (0 for irrelevant or single-choice heads).
        values: ``[B, T]`` critic outputs (normalised scale).
        has_choice: bool ``[B, T, 8]``: the head had more than one legal value at that step.
    """

    log_probs: Tensor
    entropy: Tensor
    values: Tensor
    has_choice: Tensor


class FactoredRecurrentActorCritic(nn.Module):
    """Recurrent actor-critic with one categorical head per action head.

    Example:
        >>> policy = FactoredRecurrentActorCritic(PolicyConfig(n_slots=2, hidden_dim=16))
        >>> policy.initial_state(3)[0].shape
        torch.Size([3, 16])
    """

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.null_blueprint = len(c.blueprints)  # embedding row of an empty slot
        self.blueprint_embedding = nn.Embedding(len(c.blueprints) + 1, c.blueprint_embed_dim)
        in_dim = c.obs_dim + c.n_slots * c.blueprint_embed_dim
        self.feature_net = nn.Sequential(
            nn.Linear(in_dim, c.hidden_dim), nn.LayerNorm(c.hidden_dim), nn.ReLU()
        )
        self.lstm = nn.LSTM(c.hidden_dim, c.hidden_dim, batch_first=True)
        self.lstm_norm = nn.LayerNorm(c.hidden_dim)
        self.heads = nn.ModuleDict(
            {name: _mlp(c.hidden_dim, c.head_hidden_dim, n) for name, n in c.head_sizes.items()}
        )
        self.value_head = _mlp(c.hidden_dim, c.head_hidden_dim, 1)
        self._init_weights()

    # --- init -------------------------------------------------------------------------------
    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, gain=math.sqrt(2))
                nn.init.zeros_(module.bias)
        for head in self.heads.values():
            nn.init.orthogonal_(head[-1].weight, gain=self.config.policy_head_gain)
        nn.init.orthogonal_(self.value_head[-1].weight, gain=self.config.value_head_gain)
        nn.init.normal_(self.blueprint_embedding.weight, std=0.02)
        h = self.config.hidden_dim
        for name, param in self.lstm.named_parameters():
            if name.startswith("weight"):
                for gate in range(4):  # each gate's block separately, as in one LSTM per gate
                    nn.init.orthogonal_(param.data[gate * h : (gate + 1) * h])
            else:
                nn.init.zeros_(param)
                param.data[h : 2 * h] = 0.5  # forget gate: both bias vectors sum to 1.0

    @torch.no_grad()
    def set_blueprint_prior(self, old: Sequence[str], new: Sequence[str], share: float) -> None:
        """An action prior for a curriculum: the blueprints ``new`` get the probability
        ``share`` together, evenly, and ``old`` the rest in the proportions their biases give,
        set on the blueprint head's output bias (exact where the head's weights give zero
        logits, as a head that never learned nearly does: its last layer's gain is
        ``policy_head_gain``). The other blueprints keep their bias (a run's mask removes them).

        Example:
            >>> policy = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=8))
            >>> policy.set_blueprint_prior(["norm"], ["lora", "mlp"], 0.2)
            >>> bias = policy.heads["blueprint"][-1].bias
            >>> index = policy.config.blueprints.index
            >>> [round(float(bias[index(b)].exp()), 3) for b in ("norm", "lora", "mlp")]
            [0.8, 0.1, 0.1]
        """
        if not 0.0 < share < 1.0 or not old or not new or set(old) & set(new):
            raise ValueError(f"a blueprint prior needs 0 < share < 1 and two disjoint, non-empty "
                             f"sets; got share {share}, old {list(old)}, new {list(new)}")
        bias = self.heads["blueprint"][-1].bias
        was = [self.config.blueprints.index(name) for name in old]
        bias[was] += math.log(1.0 - share) - torch.logsumexp(bias[was], dim=0)
        for name in new:
            bias[self.config.blueprints.index(name)] = math.log(share / len(new))

    # --- recurrent state --------------------------------------------------------------------
    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> Hidden:
        """Zero (h, c) of shape ``[batch, hidden_dim]`` each (start of an episode)."""
        zeros = torch.zeros(batch, self.config.hidden_dim, device=device)
        return zeros, zeros.clone()

    # --- forward pieces ---------------------------------------------------------------------
    def _embed(self, obs: Tensor, blueprint_idx: Tensor) -> Tensor:
        """``[*B, D]`` and ``[*B, S]`` -> feature-net output ``[*B, H]``."""
        if bool(((blueprint_idx < EMPTY_BLUEPRINT) | (blueprint_idx >= self.null_blueprint)).any()):
            raise ValueError(f"blueprint index outside -1..{self.null_blueprint - 1}")
        rows = torch.where(blueprint_idx == EMPTY_BLUEPRINT, self.null_blueprint, blueprint_idx)
        embedded = self.blueprint_embedding(rows).flatten(-2)  # [*B, S·E]
        return self.feature_net(torch.cat([obs, embedded], dim=-1))

    def _core(self, x: Tensor, hidden: Hidden, episode_starts: Tensor) -> tuple[Tensor, Hidden]:
        """Run the LSTM over ``x`` ``[B, T, H]``; the state is zeroed before step t wherever
        ``episode_starts[:, t]`` (``[B, T]`` bool).

        One LSTM call per stretch of steps in which no env starts an episode, not one per step:
        a rollout of one episode per env, as the trainer collects them, is one call, and its
        backward one graph instead of T (a PPO update 1.8x faster with the default configs on
        one CPU thread: benchmarks/bench_ppo_update.py). Equal to the step-by-step unroll up to
        float rounding (the input projection is one matrix product over the stretch). A single
        step (acting) is one stretch without looking: no device sync."""
        h, c = hidden
        restarts = ([] if x.shape[1] == 1 else
                    episode_starts[:, 1:].any(dim=0).nonzero().flatten().add(1).tolist())
        bounds = [0, *restarts, x.shape[1]]
        outputs = []
        for begin, end in itertools.pairwise(bounds):
            keep = (~episode_starts[:, begin]).to(x.dtype)[:, None]  # [B, 1]
            y, (h_n, c_n) = self.lstm(x[:, begin:end], ((h * keep)[None], (c * keep)[None]))
            h, c = h_n[0], c_n[0]
            outputs.append(y)  # [B, end - begin, H]
        y = torch.cat(outputs, dim=1)  # [B, T, H]
        return x + self.lstm_norm(y), (h, c)

    def _logits(self, core: Tensor) -> dict[str, Tensor]:
        return {name: head(core) for name, head in self.heads.items()}

    # --- public API -------------------------------------------------------------------------
    @torch.no_grad()
    def act(
        self,
        obs: Tensor,
        blueprint_idx: Tensor,
        masks: MaskBatch,
        hidden: Hidden,
        deterministic: bool = False,
        episode_starts: Tensor | None = None,
        generators: Sequence[torch.Generator] | None = None,
    ) -> ActOutput:
        """Choose one action per env (no gradients: acting only collects data).

        Args:
            obs: ``[B, D]`` normalised observations.
            blueprint_idx: long ``[B, S]`` (−1 = empty slot).
            masks: batch shape ``[B]``.
            hidden: pre-step (h, c) ``[B, H]`` each.
            deterministic: argmax per head instead of sampling.
            episode_starts: bool ``[B]``; where True the hidden state is zeroed first.
            generators: one per env: env ``i`` samples from ``generators[i]`` (None: the global
                torch RNG), so a data-parallel run samples what one process would.
        """
        starts = (
            torch.zeros(obs.shape[0], dtype=torch.bool, device=obs.device)
            if episode_starts is None
            else episode_starts
        )
        x = self._embed(obs, blueprint_idx)[:, None]  # [B, 1, H]
        core, hidden = self._core(x, hidden, starts[:, None])
        core = core[:, 0]  # [B, H]
        logits = self._logits(core)
        op_dist = MaskedCategorical(logits["op"], masks.op)
        op = op_dist.mode() if deterministic else op_dist.sample(generators)  # [B]
        actions, log_probs = [op], [op_dist.log_prob(op)]
        for name in HEADS[1:]:
            slot = actions[1] if len(actions) > 1 else None  # the blueprint mask needs it
            dist = MaskedCategorical(logits[name], masks.head(name, op, slot))
            choice = dist.mode() if deterministic else dist.sample(generators)
            actions.append(choice)
            log_probs.append(dist.log_prob(choice))
        value = self.value_head(core).squeeze(-1)
        return ActOutput(torch.stack(actions, -1), torch.stack(log_probs, -1), value, hidden)

    def evaluate(
        self,
        obs_seq: Tensor,
        blueprint_idx_seq: Tensor,
        actions: Tensor,
        masks_seq: MaskBatch,
        hidden0: Hidden,
        episode_starts: Tensor,
    ) -> Evaluation:
        """Log-probs, normalised entropies and values of stored actions along sequences.

        Args:
            obs_seq: ``[B, T, D]``; blueprint_idx_seq: long ``[B, T, S]``.
            actions: long ``[B, T, 8]`` stored actions (`HEADS` order).
            masks_seq: batch shape ``[B, T]`` (unconditioned; conditioned here on the stored op).
            hidden0: pre-step hidden state at t = 0, ``[B, H]`` each.
            episode_starts: bool ``[B, T]``; the state is zeroed before those steps.
        """
        x = self._embed(obs_seq, blueprint_idx_seq)  # [B, T, H]
        core, _ = self._core(x, hidden0, episode_starts)
        logits = self._logits(core)
        op, slot = actions[..., 0], actions[..., 1]
        log_probs, entropies, choices = [], [], []
        for i, name in enumerate(HEADS):
            dist = MaskedCategorical(logits[name], masks_seq.head(name, op, slot))
            log_probs.append(dist.log_prob(actions[..., i]))
            entropies.append(dist.normalized_entropy())
            choices.append(dist.n_valid > 1)
        values = self.value_head(core).squeeze(-1)
        return Evaluation(torch.stack(log_probs, -1), torch.stack(entropies, -1), values,
                          torch.stack(choices, -1))

    @torch.no_grad()
    def preserve_value_outputs(
        self, old_mean: float, old_std: float, new_mean: float, new_std: float
    ) -> None:
        """Rescale the value output layer so de-normalised predictions are unchanged when the
        value normaliser moves from (old_mean, old_std) to (new_mean, new_std) (PopArt's
        "preserving outputs" step)."""
        layer = self.value_head[-1]
        layer.weight.mul_(old_std / new_std)
        layer.bias.mul_(old_std).add_(old_mean - new_mean).div_(new_std)


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))
