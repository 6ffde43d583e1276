"""CNN seed blueprints for slots on ``[B, C, H, W]`` feature maps.

Every blueprint preserves its input shape for any ``C >= 1`` and any ``H, W``, normalises with
GroupNorm (never BatchNorm: seeds are trained on detached host activations and blended in and out,
so running statistics would drift), and is *live at birth*:

* close to the identity at birth: the residual seeds are ``x + gamma * branch(x)`` with a
  per-channel :class:`LayerScale2d` ``gamma = 1e-3``; ``norm`` moves ``x`` towards ``GN(x)`` by
  ``tanh(s)`` with a small ``s``, and ``attention`` multiplies ``x`` by a gain
  ``1 + g * (2 sigmoid(z) - 1)`` with a small ``g`` — so a new seed is within 1e-2 of the
  identity;
* the branch ends in a convolution, not a ReLU, so the residual stays signed;
* nothing is zero-initialised, so every parameter gets gradient on the first backward pass.

The parameter formulas in each docstring use ``C`` for the slot width and ``g(C)`` for the group
count chosen by :func:`num_groups`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from esper_lightning.blueprints.registry import (
    DEFAULT_LAYER_SCALE,
    BlueprintSpec,
    LayerScale2d,
    register,
)

__all__ = [
    "Bottleneck",
    "DepthwiseSeparable",
    "NormSeed",
    "PreActConv",
    "PreActResidual",
    "SqueezeExcite",
    "group_norm",
    "num_groups",
]

NormFactory = Callable[[int], nn.Module]
ActFactory = Callable[[], nn.Module]

_GROUP_CANDIDATES = (32, 16, 8, 4, 2, 1)
_MIN_CHANNELS_PER_GROUP = 16


def num_groups(channels: int) -> int:
    """GroupNorm group count for ``channels``.

    The first of 32, 16, 8, 4, 2, 1 that divides ``channels`` and leaves at least 16 channels per
    group; if none does (``channels < 32`` or awkward factors), the first that divides it.

    Args:
        channels: Number of channels, at least 1.

    Returns:
        A divisor of ``channels``.
    """
    divisors = [g for g in _GROUP_CANDIDATES if channels % g == 0]
    for g in divisors:
        if channels // g >= _MIN_CHANNELS_PER_GROUP:
            return g
    return divisors[0]


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm over ``channels`` with the group count from :func:`num_groups`."""
    return nn.GroupNorm(num_groups(channels), channels)


class NormSeed(nn.Module):
    """``norm``: gated normalisation, ``x + tanh(s) * (Norm(x) - x)``.

    Topology-agnostic: the transformer ``norm`` blueprint is this module with LayerNorm.

    Params: ``2C + 1`` (norm affine + scalar gate ``s``).

    ``s`` starts small but non-zero so that both ``s`` and the norm's affine parameters receive
    gradient while the output stays within ``tanh(s)`` of the identity.

    Args:
        channels: Slot width ``C``.
        norm_layer: Builds the normalisation for ``C`` channels.
        init_gate: Initial value of ``s``.
    """

    def __init__(
        self,
        channels: int,
        norm_layer: NormFactory = group_norm,
        init_gate: float = DEFAULT_LAYER_SCALE,
    ) -> None:
        super().__init__()
        self.norm = norm_layer(channels)
        self.gate = nn.Parameter(torch.tensor(init_gate))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.gate) * (self.norm(x) - x)


class SqueezeExcite(nn.Module):
    """``attention``: squeeze-excitation as a near-identity channel gain.

    ``z = fc2(act(fc1(mean_hw(x))))`` and ``y = x * (1 + gamma * (2 * sigmoid(z) - 1))``, so each
    channel is rescaled by a factor in ``[1 - gamma, 1 + gamma]``: exactly bounded around the
    identity at birth (``gamma = 1e-3``) instead of the research code's fixed ``x * 0.95``.

    Params: ``2Cr + 2C`` with ``r = max(1, C // 4)`` (fc1 without bias, fc2 with bias, gamma).

    Args:
        channels: Slot width ``C``.
        reduction: Channel reduction of the hidden layer.
        act_layer: Hidden activation. SiLU rather than ReLU so a narrow hidden layer cannot start
            with every unit dead.
        init_scale: Initial ``gamma``.
    """

    def __init__(
        self,
        channels: int,
        reduction: int = 4,
        act_layer: ActFactory = nn.SiLU,
        init_scale: float = DEFAULT_LAYER_SCALE,
    ) -> None:
        super().__init__()
        hidden = max(1, channels // reduction)
        self.fc1 = nn.Linear(channels, hidden, bias=False)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden, channels)
        self.ls = LayerScale2d(channels, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.fc2(self.act(self.fc1(x.mean(dim=(2, 3)))))  # [B, C]
        gain = self.ls(2.0 * torch.sigmoid(z)[:, :, None, None] - 1.0)  # [B, C, 1, 1]
        return x * (1.0 + gain)


class DepthwiseSeparable(nn.Module):
    """``depthwise``: ``x + gamma * pw1x1(act(Norm(dw3x3(x))))``.

    Params: ``C^2 + 13C`` (dw 9C without bias, norm 2C, pw C^2 + C, gamma C).

    Args:
        channels: Slot width ``C``.
        norm_layer: Builds the normalisation for ``C`` channels.
        act_layer: Activation.
        init_scale: Initial LayerScale ``gamma``.
    """

    def __init__(
        self,
        channels: int,
        norm_layer: NormFactory = group_norm,
        act_layer: ActFactory = nn.ReLU,
        init_scale: float = DEFAULT_LAYER_SCALE,
    ) -> None:
        super().__init__()
        self.dw = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.norm = norm_layer(channels)
        self.act = act_layer()
        self.pw = nn.Conv2d(channels, channels, 1)
        self.ls = LayerScale2d(channels, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ls(self.pw(self.act(self.norm(self.dw(x)))))


class Bottleneck(nn.Module):
    """``bottleneck``: ``x + gamma * up1x1(act(Norm(conv3x3(act(Norm(down1x1(x)))))))``.

    Width ``b = max(8, C // 4)``; with ``C < 32`` the "bottleneck" is wider than the slot.

    Params: ``2Cb + 9b^2 + 4b + 2C`` (down Cb and conv 9b^2 without bias, two norms 4b,
    up bC + C, gamma C).

    Args:
        channels: Slot width ``C``.
        norm_layer: Builds the normalisation for a given channel count.
        act_layer: Activation.
        init_scale: Initial LayerScale ``gamma``.
    """

    def __init__(
        self,
        channels: int,
        norm_layer: NormFactory = group_norm,
        act_layer: ActFactory = nn.ReLU,
        init_scale: float = DEFAULT_LAYER_SCALE,
    ) -> None:
        super().__init__()
        width = max(8, channels // 4)
        self.down = nn.Conv2d(channels, width, 1, bias=False)
        self.norm1 = norm_layer(width)
        self.act1 = act_layer()
        self.conv = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.norm2 = norm_layer(width)
        self.act2 = act_layer()
        self.up = nn.Conv2d(width, channels, 1)
        self.ls = LayerScale2d(channels, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act1(self.norm1(self.down(x)))  # [B, b, H, W]
        h = self.act2(self.norm2(self.conv(h)))
        return x + self.ls(self.up(h))


class PreActConv(nn.Sequential):
    """Pre-activation unit ``conv(act(Norm(x)))``; the output is signed, ready for a residual.

    Params: ``2C_in + k^2 C_in C_out`` (+ ``C_out`` with bias).

    Args:
        in_channels: Input channels.
        out_channels: Output channels.
        kernel_size: Odd kernel size; "same" padding keeps ``H, W``.
        bias: Whether the convolution has a bias (redundant if a norm follows).
        norm_layer: Builds the normalisation for ``in_channels``.
        act_layer: Activation.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        bias: bool = True,
        norm_layer: NormFactory = group_norm,
        act_layer: ActFactory = nn.ReLU,
    ) -> None:
        super().__init__(
            norm_layer(in_channels),
            act_layer(),
            nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=bias),
        )


class PreActResidual(nn.Module):
    """``conv_small`` / ``conv_light`` / ``conv_heavy``: ``x + gamma * units(x)`` over ``depth``
    :class:`PreActConv` units ``conv_kxk(act(Norm(.)))`` of one kernel size ``k``.

    Params: ``depth * (k^2 C^2 + 2C) + 2C`` (per unit: norm 2C and conv k^2 C^2; the last conv's
    bias C, gamma C): ``C^2 + 4C`` for ``conv_small`` (k = 1, one unit), ``9C^2 + 4C`` for
    ``conv_light`` (k = 3, one unit), ``18C^2 + 6C`` for ``conv_heavy`` (k = 3, two units).

    Args:
        channels: Slot width ``C``.
        kernel_size: Odd kernel size ``k`` of every unit.
        depth: Number of units.
        norm_layer: Builds the normalisation for ``C`` channels.
        act_layer: Activation.
        init_scale: Initial LayerScale ``gamma``.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 3,
        depth: int = 1,
        norm_layer: NormFactory = group_norm,
        act_layer: ActFactory = nn.ReLU,
        init_scale: float = DEFAULT_LAYER_SCALE,
    ) -> None:
        super().__init__()
        self.units = nn.Sequential(
            *(
                # Only the last conv keeps its bias: every other one feeds a norm.
                PreActConv(
                    channels,
                    channels,
                    kernel_size,
                    bias=(i == depth - 1),
                    norm_layer=norm_layer,
                    act_layer=act_layer,
                )
                for i in range(depth)
            )
        )
        self.ls = LayerScale2d(channels, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ls(self.units(x))


_BUILTINS = (
    BlueprintSpec("norm", "cnn", NormSeed, "x + tanh(s)*(GN(x) - x); 2C+1"),
    BlueprintSpec(
        "attention", "cnn", SqueezeExcite, "squeeze-excitation gain 1 + g*(2sig(z)-1); 2Cr+2C"
    ),
    BlueprintSpec("depthwise", "cnn", DepthwiseSeparable, "x + g*pw(act(GN(dw3x3 x))); C^2+13C"),
    BlueprintSpec(
        "bottleneck", "cnn", Bottleneck, "x + g*up(act(GN(3x3(act(GN(down x)))))); 2Cb+9b^2+4b+2C"
    ),
    BlueprintSpec(
        "conv_small",
        "cnn",
        partial(PreActResidual, kernel_size=1, depth=1),
        "x + g*conv1x1(act(GN x)); C^2+4C",
    ),
    BlueprintSpec(
        "conv_light",
        "cnn",
        partial(PreActResidual, kernel_size=3, depth=1),
        "x + g*conv3x3(act(GN x)); 9C^2+4C",
    ),
    BlueprintSpec(
        "conv_heavy",
        "cnn",
        partial(PreActResidual, kernel_size=3, depth=2),
        "x + g*[conv3x3(act(GN .))]x2; 18C^2+6C",
    ),
)

for _spec in _BUILTINS:
    register(_spec)
