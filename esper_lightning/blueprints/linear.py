"""Linear (MLP) seed blueprints for slots on feature vectors ``[B, D]``.

A slot after a layer of a multi-layer perceptron sees one feature vector per sample. Its seeds
follow the rules of the CNN and transformer blueprints: residual ``x + gamma * branch(x)`` with a
per-feature :class:`LayerScale` ``gamma = 1e-3`` (near identity at birth, every parameter live),
branches that end in a linear layer (signed residual), no zero-initialised layers, and pre-norm
(LayerNorm) branches, because the activations a slot sees can have any scale.

Every seed acts on the last dimension only, so a ``[B, T, D]`` activation is transformed token by
token (a slot of topology ``"linear"`` accepts it; one whose topology is inferred from a rank-3
activation becomes a transformer slot, whose seeds may mix tokens causally).

Names shared with the transformer blueprints build the same modules (``norm``, ``mlp_small``,
``mlp``); ``mlp_bottleneck`` is the linear counterpart of a narrow residual branch. Parameter
formulas use ``D`` for the slot width.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from esper_lightning.blueprints.cnn import NormSeed
from esper_lightning.blueprints.registry import BlueprintSpec, register
from esper_lightning.blueprints.transformer import MLP

__all__ = ["bottleneck_width"]


def bottleneck_width(dim: int) -> int:
    """Hidden width of ``mlp_bottleneck``: a quarter of the slot, at least 8 (as the CNN
    ``bottleneck``), so the branch stays narrow on wide slots and trainable on narrow ones."""
    return max(8, dim // 4)


def _bottleneck(dim: int) -> MLP:
    return MLP(dim, hidden=bottleneck_width(dim))


_BUILTINS = (
    BlueprintSpec(
        "norm", "linear", partial(NormSeed, norm_layer=nn.LayerNorm),
        "x + tanh(s)*(LN(x) - x); 2D+1",
    ),
    BlueprintSpec(
        "mlp_bottleneck", "linear", _bottleneck,
        "x + g*fc2(GELU(fc1(LN x))), hidden b = max(8, D/4); 2Db+b+4D",
    ),
    BlueprintSpec(
        "mlp_small", "linear", partial(MLP, expansion=2),
        "x + g*fc2(GELU(fc1(LN x))), 2x expansion; 4D^2+6D",
    ),
    BlueprintSpec(
        "mlp", "linear", partial(MLP, expansion=4), "x + g*fc2(GELU(fc1(LN x))), 4x; 8D^2+8D"
    ),
)

for _spec in _BUILTINS:
    register(_spec)
