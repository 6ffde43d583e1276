"""Running statistics for observations, rewards and value targets.

Three normalisers, all updated **once per round** (never inside a rollout):

* `RunningMeanStd` (observations): ``clip((x - mean) / sqrt(var + eps), ±clip)``. It is frozen
  while a rollout collects data, so every observation of a round is normalised with the same
  statistics (the ones the policy acted on); the raw observations of the round are fed to `update`
  once, after the rollout. Calling `update` while frozen raises.
* `RewardNormalizer`: divides rewards by the running std of the *discounted return*
  ``G_t = r_t + gamma * G_{t-1}`` (reset at episode starts), as CleanRL / SB3 ``VecNormalize``
  do. We scale by the return's std rather than the reward's std because the critic and the
  advantages live on the return scale: after scaling, returns have roughly unit std whatever the
  reward magnitude. No mean is subtracted (that would change the optimal policy when episodes
  have different lengths). The clip grows with the mean episode length (`RewardNormalizer`
  says why), so a terminal-only reward never saturates in long episodes.
* `ValueNormalizer`: value targets are trained as ``(R - mean) / std`` (mean AND std, unlike
  the research code, which never centred). The critic outputs normalised values; `denormalize`
  maps them back to the return scale for GAE.

Statistics start empty (count 0): the first update takes the batch moments exactly, so early
rounds do not see a near-identity normaliser (the research code's EMA started from a (0, 1) prior).
Later updates either merge exactly (Chan's parallel Welford, ``momentum=None``) or follow an EMA
of the batch moments (``momentum`` = weight of the old statistics).

Data-parallel learning (DD-PPO): every ``update`` takes an ``all_reduce`` (sums a tensor over the
ranks), and the batch moments are those of every rank's rows together (`batch_moments`: count
and sum, then the sum of squared deviations from the global mean), so every rank holds the same
statistics as one process that saw the whole batch. One process is one rank whose sum over the
ranks is its own tensor (`single_process`, the default), so the same formula runs either way.

All ``state_dict`` values are plain tensors, floats and bools (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

#: Sums a tensor over every rank of a data-parallel run and returns the sum (every rank calls it).
AllReduce = Callable[[Tensor], Tensor]


def single_process(tensor: Tensor) -> Tensor:
    """The `AllReduce` of a one-process run: the sum over the only rank is the tensor itself.
    Callers never modify what an all-reduce returns, so the tensor is not copied.

    Example:
        >>> single_process(torch.tensor([1.0, 2.0]))
        tensor([1., 2.])
    """
    return tensor


def batch_moments(
    x: Tensor, all_reduce: AllReduce = single_process
) -> tuple[Tensor, Tensor, float]:
    """Mean, (biased) variance and count of the rows of ``x`` ``[N, *shape]`` over every rank's
    rows (two collectives: count and sum, then the squared deviations from the global mean, so
    nothing cancels).

    Example:
        >>> mean, var, n = batch_moments(torch.tensor([[0.0], [2.0]]))
        >>> mean.tolist(), var.tolist(), n
        ([1.0], [1.0], 2.0)
    """
    head = all_reduce(torch.cat([x.new_tensor([x.shape[0]]), x.sum(0).reshape(-1)]))
    count = float(head[0])
    mean = (head[1:] / count).view(x.shape[1:])
    m2 = all_reduce((x - mean).square().sum(0))
    return mean, m2 / count, count


class RunningMeanStd:
    """Running mean and variance of a feature vector, with freeze semantics.

    Args:
        shape: feature shape (``()`` for scalars).
        epsilon: added to the variance before the square root.
        clip: normalised values are clipped to ``[-clip, clip]`` (None: no clipping).
        momentum: None for exact running statistics over everything seen; a float in (0, 1) for
            an EMA of batch moments where ``momentum`` is the weight of the old statistics.

    Example:
        >>> rms = RunningMeanStd(shape=(2,))
        >>> rms.update(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
        >>> rms.mean.tolist(), rms.var.tolist()
        ([1.0, 2.0], [1.0, 1.0])
    """

    def __init__(
        self,
        shape: Sequence[int] = (),
        epsilon: float = 1e-4,
        clip: float | None = 10.0,
        momentum: float | None = None,
    ) -> None:
        if momentum is not None and not 0.0 < momentum < 1.0:
            raise ValueError(f"momentum must be in (0, 1) or None, got {momentum}")
        self.shape = tuple(shape)
        self.epsilon = epsilon
        self.clip = clip
        self.momentum = momentum
        self.mean = torch.zeros(self.shape, dtype=torch.float64)
        self.var = torch.ones(self.shape, dtype=torch.float64)
        self.count = 0.0
        self.frozen = False

    # --- freeze semantics -------------------------------------------------------------------
    def freeze(self) -> None:
        """Stop updates (start of a rollout)."""
        self.frozen = True

    def unfreeze(self) -> None:
        """Allow the once-per-round update (end of a rollout)."""
        self.frozen = False

    # --- statistics -------------------------------------------------------------------------
    def update(self, x: Tensor, all_reduce: AllReduce = single_process) -> None:
        """Fold a batch ``[N, *shape]`` (with ``all_reduce``: every rank's batches together)
        into the statistics.

        Raises:
            RuntimeError: while frozen (an update inside a rollout is a programming error).
            ValueError: on a shape mismatch, an empty batch or non-finite values.
        """
        if self.frozen:
            raise RuntimeError("RunningMeanStd.update while frozen (inside a rollout)")
        x = x.detach().to(torch.float64).reshape(-1, *self.shape)
        if x.shape[0] == 0:
            raise ValueError("RunningMeanStd.update with an empty batch")
        if not bool(torch.isfinite(x).all()):
            raise ValueError("RunningMeanStd.update with non-finite values")
        self._merge(*batch_moments(x, all_reduce))

    def _merge(self, batch_mean: Tensor, batch_var: Tensor, n: float) -> None:
        if self.count == 0:
            self.mean, self.var = batch_mean, batch_var
        elif self.momentum is None:
            # Chan et al.'s parallel combination of two (mean, M2, count) summaries.
            total = self.count + n
            delta = batch_mean - self.mean
            m2 = self.var * self.count + batch_var * n + delta.square() * self.count * n / total
            self.mean = self.mean + delta * n / total
            self.var = m2 / total
        else:
            # EMA of batch moments; the cross term keeps it the variance of the mixture.
            w = self.momentum
            delta = batch_mean - self.mean
            self.mean = w * self.mean + (1 - w) * batch_mean
            self.var = w * self.var + (1 - w) * batch_var + w * (1 - w) * delta.square()
        self.count += n

    @property
    def std(self) -> Tensor:
        return (self.var + self.epsilon).sqrt()

    def normalize(self, x: Tensor) -> Tensor:
        """``clip((x - mean) / std)`` in the dtype of ``x``."""
        out = (x - self.mean.to(x)) / self.std.to(x)
        return out if self.clip is None else out.clamp(-self.clip, self.clip)

    # --- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean.clone(),
            "var": self.var.clone(),
            "count": float(self.count),
            "frozen": bool(self.frozen),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("mean", "var"):
            if tuple(state[key].shape) != self.shape:
                raise ValueError(
                    f"normaliser {key} has shape {tuple(state[key].shape)}, expected {self.shape}"
                )
        self.mean = state["mean"].to(torch.float64).clone()
        self.var = state["var"].to(torch.float64).clone()
        self.count = float(state["count"])
        self.frozen = bool(state["frozen"])


#: Episode length (decisions) up to which scaled rewards clip at ``clip``; beyond it the clip
#: grows as sqrt(length) (`RewardNormalizer.effective_clip`).
CLIP_HORIZON = 30


class RewardNormalizer:
    """Scales rewards by the running std of discounted returns (see the module docstring).

    The clip grows with the episodes: a reward that arrives alone (a terminal outcome, nothing
    else in the episode) is one nonzero G among L steps of zeros, so std(G) is about
    ``R_rms / sqrt(L)`` and the scaled reward about ``sqrt(L) * R / R_rms``: at a fixed ±10 every
    outcome of episodes past ~100 decisions clipped to the same reward and PPO learned nothing
    from it. Scaled rewards are clipped to ``±effective_clip`` = ``clip * max(1, sqrt(L /
    CLIP_HORIZON))`` with ``L`` the mean episode length seen, so a lone reward keeps the
    headroom it has at 30 decisions (outcomes up to ``clip / sqrt(30)``, 1.8x for the default,
    times their RMS stay distinct) whatever the length, and up to 30 decisions (every shipped
    preset) the clip is ``clip`` exactly as before. The mean length is what std(G) pools over.

    Args:
        gamma: discount of the return whose std is tracked (use the PPO gamma).
        epsilon: variance floor inside the square root.
        clip: bound of the scaled rewards, ``[-clip, clip]``, for episodes of up to
            `CLIP_HORIZON` decisions.
    """

    def __init__(self, gamma: float, epsilon: float = 1e-8, clip: float = 10.0) -> None:
        self.gamma = gamma
        self.clip = clip
        self.returns = RunningMeanStd(shape=(), epsilon=epsilon, clip=None)
        self.steps = 0.0  # steps and episodes seen (every rank's): the mean episode length
        self.episodes = 0.0

    @property
    def effective_clip(self) -> float:
        """The bound of the scaled rewards (see the class docstring)."""
        if not self.episodes:
            return self.clip
        return self.clip * max(1.0, (self.steps / self.episodes / CLIP_HORIZON) ** 0.5)

    def update(
        self, rewards: Tensor, episode_starts: Tensor, all_reduce: AllReduce = single_process
    ) -> None:
        """Fold one round of raw rewards ``[N, T]`` (every rank's, with ``all_reduce``) into the
        return statistics.

        ``episode_starts[n, t]`` marks the first step of an episode; each row must start one.
        """
        if not bool(episode_starts[:, 0].all()):
            raise ValueError("RewardNormalizer.update: every row must begin with an episode start")
        discounted = torch.zeros_like(rewards, dtype=torch.float64)
        running = torch.zeros(rewards.shape[0], dtype=torch.float64)
        for t in range(rewards.shape[1]):
            running = running * self.gamma * (~episode_starts[:, t]) + rewards[:, t]
            discounted[:, t] = running
        self.returns.update(discounted.reshape(-1), all_reduce)
        counts = all_reduce(torch.tensor([rewards.numel(), int(episode_starts.sum())],
                                         dtype=torch.float64))
        self.steps += float(counts[0])
        self.episodes += float(counts[1])

    def normalize(self, rewards: Tensor) -> Tensor:
        scaled = rewards / self.returns.std.to(rewards)
        clip = self.effective_clip
        return scaled.clamp(-clip, clip)

    @property
    def frozen(self) -> bool:
        return self.returns.frozen

    def freeze(self) -> None:
        self.returns.freeze()

    def unfreeze(self) -> None:
        self.returns.unfreeze()

    def state_dict(self) -> dict[str, Any]:
        return {"gamma": float(self.gamma), "returns": self.returns.state_dict(),
                "steps": self.steps, "episodes": self.episodes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if float(state["gamma"]) != self.gamma:
            raise ValueError(f"reward normaliser gamma {state['gamma']} != {self.gamma}")
        self.returns.load_state_dict(state["returns"])
        # Absent before the clip followed the episode length: counted from the next update.
        self.steps = float(state.get("steps", 0.0))
        self.episodes = float(state.get("episodes", 0.0))


class ValueNormalizer:
    """Mean/std normaliser of value targets; the critic predicts normalised returns.

    Args:
        momentum: weight of the old statistics per update (one update per round). The default
            0.9 forgets old rounds within ~10 updates, so the statistics follow the returns as
            the policy improves; the first update is exact.
        epsilon: variance floor inside the square root.
    """

    def __init__(self, momentum: float | None = 0.9, epsilon: float = 1e-4) -> None:
        self.stats = RunningMeanStd(shape=(), epsilon=epsilon, clip=None, momentum=momentum)

    @property
    def mean(self) -> float:
        return float(self.stats.mean)

    @property
    def std(self) -> float:
        return float(self.stats.std)

    def update(self, returns: Tensor, all_reduce: AllReduce = single_process) -> None:
        self.stats.update(returns, all_reduce)

    def normalize(self, returns: Tensor) -> Tensor:
        return (returns - self.mean) / self.std

    def denormalize(self, values: Tensor) -> Tensor:
        return values * self.std + self.mean

    @property
    def frozen(self) -> bool:
        return self.stats.frozen

    def freeze(self) -> None:
        self.stats.freeze()

    def unfreeze(self) -> None:
        self.stats.unfreeze()

    def state_dict(self) -> dict[str, Any]:
        return self.stats.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state)
