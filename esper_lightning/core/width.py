"""Width growth in any transformer: its hidden size ``d -> k·d`` and its MLP's, function-preserving
at birth, with the copies' symmetry broken so that the new width learns.

Method card
-----------
**What.** `widen` grows a model in place, at once, no lifecycle (the width sibling of
`core.depth.grow`): its residual stream from ``d`` to ``k·d`` (``WidthGrowth(factor=k)``, ``k``
an int >= 2; the widths it accepts are the multiples ``k·d``) through token and position tables,
LayerNorm and RMSNorm, attention, the MLP and the output head (tied or untied); or its MLP alone
from ``m`` to ``j·m`` units (``WidthGrowth(factor=1, mlp=j)``). Every parameter keeps its
identity (its tensor is replaced, ``param.data``), so the optimizer's param groups, weight
tying, the user's references and LR schedulers need no change; `Widening` says what grew.

**How, hidden width.**

- The residual stream is duplicated, copy-major: ``x' = [x, x, ..., x]`` (``k`` copies). Every
  writer of the stream (the token and position tables, attention's and the MLP's output
  projections, a Linear outside the stack that outputs ``d``) repeats its output rows (and
  biases) once per copy, so each copy carries exactly the old stream.
- A LayerNorm or RMSNorm of a duplicated vector sees the old statistics (its mean, variance and
  mean square are the original's), so with gamma and beta repeated per copy each copy of the
  normalised stream is the old one.
- Every reader of the stream (attention's q, k, v; the MLP's input projections; an untied head)
  splits each input column between the copies: ``W -> [W∘A_1, ..., W∘A_k]``, ``Σ_j A_j = 1``, one
  draw per entry from Dirichlet(1, ..., 1) (for ``k = 2``: ``A ~ U(0, 1)`` and ``1 - A``). On
  ``k`` equal copies it computes ``W x`` again. The copies' gradients differ from the first
  step (``A_1 ≠ A_2``), so they drift apart and the new width learns. ``split="even"`` (``W/k``
  each, Net2Net's split) is the ablation: it gives the copies equal gradients until the new
  heads' and units' random rows reach them.
- Attention grows **more heads of the same head width**: ``n`` heads become ``k·n``, and under
  grouped-query attention ``n_kv`` key-value heads become ``k·n_kv``, so each key-value head is
  still shared by ``n / n_kv`` query heads (old query heads read old key-value heads, new read
  new; with ``k`` an int the grouping always divides). The old heads keep their q, k, v rows
  (columns split as above); the new heads get random incoming rows (std: the matrix's own,
  or ``init_std``) and zero columns in the output projection, so they add nothing at birth:
  their output columns get gradient at the first step, their incoming rows from the second.
- The MLP grows new units the same way (``m -> mlp·m``, ``mlp`` defaults to ``factor``):
  random incoming rows (both of a gated MLP's input projections), zero outgoing columns, zero
  biases. MLP-only widening is this step alone; the residual stream is untouched.
- ``new_units="clone"`` makes each new head and MLP unit a copy of an old one instead
  (Net2Net's replication; HyperCloning's cloned weights): its incoming rows repeat its
  source's, and the outgoing column of the source is split between the source and its copies
  like a reader's (``split``): function-preserving too, with what the small model learned in
  every head and unit at birth, not only in the old ones. A copy and its source compute
  the same activation at birth; their outgoing columns differ (``A`` and ``1 - A`` per entry),
  so each weighs the tokens' errors differently and their incoming rows get different gradients
  from the first step (tested: a copy's incoming row leaves its source's within a few AdamW
  steps; split evenly, the two stay equal). ``init_std`` draws nothing here and is refused with
  it.
- A tied head (its weight the token table) reads ``k`` copies of the duplicated table: its
  logits would be ``k`` times the old ones, so the final norm's gamma and beta are scaled by
  ``1/k`` (the one norm registered after the stack; a tied head with none there, or several,
  is refused).

**Why more heads, not wider heads.** A head's width is ``head_dim``. Wider heads would change
each head's score scale ``1/sqrt(head_dim)`` and, under rotary position embeddings (Llama), its
rotation frequencies ``base^(-2i/head_dim)``: the old heads would compute something else, and no
split of the weights makes a wider head's rotation the old one's. More heads of the same width
leave every old head's scores, rotation and softmax as they were and ``head_dim`` unchanged in
the config, as a natively wider model of the same family has it (GPT-2 and Llama keep
``head_dim`` as they grow wider and add heads).

**Function at birth.** The logits equal the old ones within 1e-5 in float32 (tested per host),
not bitwise: a norm sums ``k·d`` entries instead of ``d`` and a reader's ``W∘A_1 x + W∘A_2 x``
rounds differently from ``W x``. The stream's copies themselves are bitwise equal to each other
and to the old stream up to the first norm, and a new unit's or head's contribution is exactly
zero (drawn; a clone and its source split their old one). MLP-only widening with drawn units
only appends zero columns to the output projection: its logits equal the old ones within 1e-5,
the bound the tests hold it to (on this project's CPU they come out bitwise equal, which a
longer inner sum is not bound to give on every kernel).

**Optimizer** (``optimizer=``). ``moments="copy"``: every state tensor shaped like a parameter
(AdamW's ``exp_avg``, ``exp_avg_sq``) follows its parameter into the new shape, each entry the
state of the entry it was made from (a split column's gradient at birth is its source's: the
copies it reads are equal); a new entry (a new head's or unit's) starts with a zero first
moment and, for a second moment (a state named ``*_sq``), the mean of the old entries. Not zero:
AdamW's ``step`` counts per tensor, so under a long run's bias correction (near 1) a zero second
moment makes a steady gradient's step ``(1 - β1^t) / sqrt(1 - β2^t)`` times the learning rate
``t`` steps after growth: 3.2 at once, 6.5 at ``t = 12``, still 3.2 at ``t = 100`` (β 0.9,
0.999; at β2 = 0.95 at most 1.1). ``moments="reset"``: the widened parameters' state is
dropped (fresh moments, ``step`` 0); parameters that did not grow keep theirs either way.
Cloned heads and units have no new entries: every entry carries its source's state, so a
split column and its copies each start with the source's whole first moment, and their sum
moves up to ``k`` times the old column's step until the moments adapt (a reader's split
columns of the stream do the same with either ``new_units``).
Measured (6 paired episodes, one width-32 block widened to 64 at a tenth of its budget;
docs/evidence.md): reset minus copy −0.0014 nats [−0.0041, +0.0013], no detectable
difference, so ``copy`` stays the default.

**Configs follow.** A Hugging Face config (``n_embd`` / ``hidden_size``, ``n_head`` /
``num_attention_heads``, ``num_key_value_heads``, ``n_inner`` / ``intermediate_size``;
``head_dim`` unchanged) and a dataclass config (`GPTHost`'s `GPTConfig`, also where a
LightningModule's ``hparams`` hold it) say the new sizes, so ``save_pretrained`` ->
``from_pretrained`` (or a checkpoint's hyper-parameters) build the wider model with the same
logits; each module's own sizes (``in_features``, ``normalized_shape``, ``n_head``,
``split_size``, ...) follow too. Empty seed slots take the new width.

**Compute.** `core.flops.FlopMeter` keys its cache on every parameter's shape, so the widened
model is measured anew at its next step: its cost is a natively wider model's.

**Refused, in one line each, before anything changes:** a factor that is not an int >= 1 (or
nothing to grow), a block of no known layout (`LAYOUTS`; give ``WidthGrowth(layout=...)``) or
with parameters its layout does not name, a module outside the stack of a kind width growth does
not know, a tied head without exactly one final norm, or whose final norm does not scale its
output with its gain (Gemma's ``x̂·(1 + w)``), or which another layer reads beside (it would
read ``x/k``), a token table with no layer reading the stream (a head computed as ``F.linear(x,
wte.weight)`` cannot be told tied), attention that keeps no head count, a slot holding a seed,
a config that cannot say the new MLP width.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["LAYOUTS", "MOMENTS", "NEW_UNITS", "SPLITS", "BlockLayout", "Widening", "WidthGrowth",
           "check_widen", "widen"]

#: How a reader's input columns are split between the copies of the stream.
SPLITS = ("random", "even")
#: What the optimizer's state of a widened parameter becomes.
MOMENTS = ("copy", "reset")
#: What a new head's or MLP unit's weights are: drawn (zero outgoing) or an old one's copy.
NEW_UNITS = ("random", "clone")
#: Attribute names that hold the residual width, the head counts, the MLP width.
HIDDEN_NAMES = ("n_embd", "hidden_size", "embed_dim", "d_model", "dim", "split_size")
HEAD_NAMES = ("n_head", "num_heads", "num_attention_heads", "n_heads", "num_key_value_heads",
              "n_kv_heads", "num_kv_heads")
MLP_NAMES = ("intermediate_size", "n_inner", "ffn_dim")


@dataclass(frozen=True)
class BlockLayout:
    """Where a transformer block keeps its parts, by module name inside the block.

    Attributes:
        norms: The norms of the residual stream (before attention and before the MLP).
        qkv: Attention's input projections: one fused ``q|k|v`` layer, or three (q, k, v).
        attn_out: Attention's output projection (back to the stream).
        mlp_in: The MLP's input projections (one, or a gated MLP's two).
        mlp_out: The MLP's output projection (back to the stream).

    Example:
        >>> LAYOUTS["Hugging Face Llama"].mlp_out
        'mlp.down_proj'
    """

    norms: tuple[str, ...]
    qkv: tuple[str, ...]
    attn_out: str
    mlp_in: tuple[str, ...]
    mlp_out: str

    def __post_init__(self) -> None:
        if len(self.qkv) not in (1, 3):
            raise ValueError(f"BlockLayout qkv names one fused layer or three (q, k, v), got "
                             f"{self.qkv!r}")

    def names(self) -> tuple[str, ...]:
        """Every module the layout names."""
        return (*self.norms, *self.qkv, self.attn_out, *self.mlp_in, self.mlp_out)


#: The block layouts width growth knows, tried in order.
LAYOUTS: dict[str, BlockLayout] = {
    "nanoGPT and Hugging Face GPT-2": BlockLayout(
        ("ln_1", "ln_2"), ("attn.c_attn",), "attn.c_proj", ("mlp.c_fc",), "mlp.c_proj"),
    "Hugging Face Llama": BlockLayout(
        ("input_layernorm", "post_attention_layernorm"),
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn.o_proj",
        ("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj"),
    "timm ViT": BlockLayout(("norm1", "norm2"), ("attn.qkv",), "attn.proj", ("mlp.fc1",),
                            "mlp.fc2"),
}


@dataclass(frozen=True)
class WidthGrowth:
    """How a model grows wider (module docstring).

    Args:
        factor: ``k``: the residual width ``d`` becomes ``k·d`` and the heads ``k·n``; 1 keeps
            them (MLP-only widening).
        mlp: The MLP's units ``m`` become ``mlp·m``; None: ``factor``.
        stack: Module path of the stack of blocks (as `core.depth.DepthGrowth`'s); None: the
            model's one stack of same-shape blocks.
        split: ``"random"`` (each reader's columns split between the copies by a random
            fraction per entry) or ``"even"`` (``W/k`` each: the symmetric ablation).
        rng_seed: Seeds the split fractions and the new rows.
        init_std: Std of a new head's or unit's incoming weights; None: that matrix's own.
        moments: ``"copy"`` (optimizer state carried into the new shapes) or ``"reset"``.
        new_units: ``"random"`` (a new head's or unit's incoming rows drawn, its outgoing
            columns zero) or ``"clone"`` (each a copy of an old one, the outgoing columns split
            between them).
        layout: The blocks' layout (a `BlockLayout`, or its name in `LAYOUTS`); None: the first
            of `LAYOUTS` the blocks have.

    Example:
        >>> WidthGrowth(factor=1, mlp=2).mlp_factor
        2
    """

    factor: int = 2
    mlp: int | None = None
    stack: str | None = None
    split: str = "random"
    rng_seed: int = 0
    init_std: float | None = None
    moments: str = "copy"
    new_units: str = "random"
    layout: BlockLayout | str | None = None

    def __post_init__(self) -> None:
        for name in ("factor", "mlp"):
            value = getattr(self, name)
            if value is None and name == "mlp":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"WidthGrowth {name} must be an int >= 1 (the new width is "
                                 f"{name} times the old), got {value!r}")
        if self.factor == 1 and self.mlp_factor == 1:
            raise ValueError("WidthGrowth factor=1 and mlp=1 grow nothing; accepted: factor >= 2 "
                             "(hidden width) or mlp >= 2 (MLP width)")
        for name, value, accepted in (("split", self.split, SPLITS),
                                      ("moments", self.moments, MOMENTS),
                                      ("new_units", self.new_units, NEW_UNITS)):
            if value not in accepted:
                raise ValueError(f"WidthGrowth {name} must be one of {', '.join(accepted)}, got "
                                 f"{value!r}")
        if self.init_std is not None and (isinstance(self.init_std, bool) or not isinstance(
                self.init_std, int | float) or not (math.isfinite(self.init_std)
                                                    and self.init_std > 0)):
            raise ValueError(f"WidthGrowth init_std must be a finite number > 0 or None, got "
                             f"{self.init_std!r}")
        if isinstance(self.rng_seed, bool) or not isinstance(self.rng_seed, int):
            raise ValueError(f"WidthGrowth rng_seed must be an int, got {self.rng_seed!r}")
        if isinstance(self.layout, str) and self.layout in LAYOUTS:  # a layout's name
            object.__setattr__(self, "layout", LAYOUTS[self.layout])
        if self.layout is not None and not isinstance(self.layout, BlockLayout):
            raise ValueError(f"WidthGrowth layout must be a BlockLayout, one of "
                             f"{', '.join(map(repr, LAYOUTS))}, or None, got {self.layout!r}")
        if self.init_std is not None and self.new_units == "clone":
            raise ValueError(f"WidthGrowth init_std={self.init_std!r} with new_units='clone': "
                             "cloned heads and units draw no weights; accepted: init_std=None "
                             "with 'clone', or new_units='random'")

    @property
    def mlp_factor(self) -> int:
        """What the MLP's width is multiplied by."""
        return self.factor if self.mlp is None else self.mlp


@dataclass(frozen=True)
class Widening:
    """What `widen` grew.

    Attributes:
        hidden: The residual width, before and after.
        mlp: The MLP's width, before and after.
        fresh: Parameter name -> a bool mask of its entries made from no old entry (a new
            head's or unit's rows and columns; none when they are clones); every widened
            parameter has one.
    """

    hidden: tuple[int, int]
    mlp: tuple[int, int]
    fresh: dict[str, Tensor] = field(default_factory=dict)


# --- axes: how one dimension of a parameter grows ---------------------------------------------
SAME, COPY_OUT, COPY_IN, GROW_OUT, GROW_IN = "same", "copy_out", "copy_in", "grow_out", "grow_in"


@dataclass(frozen=True)
class _Axis:
    """One dimension of a parameter: kept (``same``), the stream written (``copy_out``: repeated
    per copy) or read (``copy_in``: split between copies), new heads or units made
    (``grow_out``: new rows appended to each of ``sections`` equal parts) or read
    (``grow_in``: new zero columns). Cloned (``new_units="clone"``), a new head's or unit's rows
    repeat its source's and the columns reading them are split like ``copy_in``'s."""

    kind: str
    size: int
    times: int = 1
    sections: int = 1

    def index(self, clone: bool = False) -> tuple[Tensor, Tensor]:
        """Per new position: the old position it comes from (-1: new), and its copy number
        (``clone``: new heads and units are copies of the old ones in their part).

        Example:
            >>> _Axis(GROW_OUT, 4, times=2, sections=2).index()[0].tolist()
            [0, 1, -1, -1, 2, 3, -1, -1]
            >>> [t.tolist() for t in _Axis(GROW_OUT, 4, times=2, sections=2).index(clone=True)]
            [[0, 1, 0, 1, 2, 3, 2, 3], [0, 0, 1, 1, 0, 0, 1, 1]]
        """
        old = torch.arange(self.size)
        if self.kind in (COPY_OUT, COPY_IN):
            return old.repeat(self.times), torch.arange(self.times).repeat_interleave(self.size)
        if self.kind in (GROW_OUT, GROW_IN):
            part = self.size // self.sections
            parts = [old[s * part:(s + 1) * part] for s in range(self.sections)]
            if clone:
                number = torch.arange(self.times).repeat_interleave(part).repeat(self.sections)
                return torch.cat([p.repeat(self.times) for p in parts]), number
            new = torch.full((part * (self.times - 1),), -1)
            source = torch.cat([t for p in parts for t in (p, new)])
            return source, torch.zeros_like(source)
        return old, torch.zeros_like(old)


@dataclass(frozen=True)
class _Piece:
    """One parameter to widen: its name, the parameter, one axis per dimension, and a factor
    on its old entries (``1/k`` for the final norm before a tied head)."""

    name: str
    param: nn.Parameter
    axes: tuple[_Axis, ...]
    scale: float = 1.0


def _fractions(times: int, count: int, split: str, generator: torch.Generator) -> Tensor:
    """``[times, count]`` split fractions summing to 1 over the copies: even, or Dirichlet(1,
    ..., 1) per entry (normalised exponential draws)."""
    if split == "even":
        return torch.full((times, count), 1.0 / times, dtype=torch.float64)
    draws = -torch.log1p(-torch.rand((times, count), generator=generator, dtype=torch.float64))
    return draws / draws.sum(0, keepdim=True)


def _expand(piece: _Piece, growth: WidthGrowth,
            generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """``piece``'s new tensor, the flat old index of each new entry (-1: new) and the mask of
    new entries (module docstring: repeated, split, new random rows, new zero columns; cloned,
    none is new and a column reading a copy is split)."""
    old = piece.param.detach()
    clone = growth.new_units == "clone"
    splits = (COPY_IN, GROW_IN) if clone else (COPY_IN,)
    maps = [axis.index(clone) for axis in piece.axes]
    shape = tuple(len(source) for source, _ in maps)
    flat = torch.zeros(shape, dtype=torch.long)
    fresh = torch.zeros(shape, dtype=torch.bool)
    reads_new = torch.zeros(shape, dtype=torch.bool)
    copy = torch.zeros(shape, dtype=torch.long)
    stride = 1
    for dim in reversed(range(len(shape))):
        view = [-1 if i == dim else 1 for i in range(len(shape))]
        source, number = maps[dim][0].view(view), maps[dim][1].view(view)
        flat = flat + source.clamp(min=0) * stride
        fresh = fresh | (source < 0)
        if piece.axes[dim].kind == GROW_IN:
            reads_new = reads_new | (source < 0)
        if piece.axes[dim].kind in splits:
            copy = copy + number
        stride *= old.shape[dim]
    value = old.flatten().double().cpu()[flat]
    split = [a.times for a in piece.axes if a.kind in splits and a.times > 1]
    assert len(split) <= 1, f"{piece.name}: more than one axis split between copies"
    if split:
        value = value * _fractions(split[0], old.numel(), growth.split, generator)[copy, flat]
    value = value * piece.scale
    if bool(fresh.any()):
        noise = torch.zeros(shape, dtype=torch.float64)
        # A new head's or unit's incoming rows are drawn; a bias, and a column reading a new
        # unit, start at zero.
        if old.dim() >= 2 and bool((fresh & ~reads_new).any()):
            noise = torch.randn(shape, generator=generator, dtype=torch.float64)
            noise = noise * _incoming_std(piece, growth)
        value = torch.where(fresh, torch.where(reads_new, 0.0, noise), value)
    device = old.device
    return value.to(device=device, dtype=old.dtype), torch.where(fresh, -1, flat).to(device), \
        fresh.to(device)


def _incoming_std(piece: _Piece, growth: WidthGrowth) -> float:
    """The std of a new head's or unit's incoming weights: ``init_std``, else the matrix's own.

    Raises:
        ValueError: The matrix is constant (std 0): its new rows could never learn.
    """
    if growth.init_std is not None:
        return growth.init_std
    std = float(piece.param.detach().double().std())
    if not std > 0:
        raise ValueError(f"WidthGrowth: {piece.name} is constant (std 0), so its new rows would "
                         "be too and never learn; accepted: WidthGrowth(init_std=...) > 0")
    return std


# --- the plan: which parameters grow, and how --------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """The parameters to widen, the stack's path, and the old widths (``d``, ``m``)."""

    pieces: list[_Piece]
    stack: str
    width: int
    units: int


def _is_conv1d(module: nn.Module) -> bool:
    """Hugging Face's ``Conv1D`` (GPT-2): a Linear whose weight is stored ``[in, out]``."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def _is_norm(module: nn.Module) -> bool:
    """A LayerNorm or RMSNorm of any class (``nn.LayerNorm``, nanoGPT's ``LayerNorm``,
    ``LlamaRMSNorm``): normalises each token's vector, so duplicating it keeps its statistics."""
    return type(module).__name__.endswith("Norm") and not isinstance(module, nn.GroupNorm)


def _io(name: str, module: nn.Module) -> tuple[int, int]:
    """``(in, out)`` of a Linear or Conv1D.

    Raises:
        ValueError: ``module`` is neither (one line naming it).
    """
    if isinstance(module, nn.Linear):
        return int(module.weight.shape[1]), int(module.weight.shape[0])
    if _is_conv1d(module):
        return int(module.weight.shape[0]), int(module.weight.shape[1])
    raise ValueError(f"WidthGrowth: {name} is a {type(module).__name__}, not a Linear or Conv1D; "
                     "accepted: a layout naming the block's Linear (or Conv1D) layers")


def _linear(name: str, module: nn.Module, out_axis: _Axis, in_axis: _Axis) -> list[_Piece]:
    """The weight (``[out, in]``, a Conv1D's ``[in, out]``) and bias of a layer."""
    axes = (in_axis, out_axis) if _is_conv1d(module) else (out_axis, in_axis)
    pieces = [_Piece(f"{name}.weight", module.weight, axes)]
    bias = getattr(module, "bias", None)
    if isinstance(bias, nn.Parameter):
        pieces.append(_Piece(f"{name}.bias", bias, (out_axis,)))
    return pieces


def _norm(name: str, module: nn.Module, axis: _Axis, scale: float = 1.0) -> list[_Piece]:
    """A norm's gain and bias, repeated per copy (and scaled)."""
    return [_Piece(f"{name}.{key}", p, (axis,), scale)
            for key, p in module.named_parameters(recurse=False)]


def _layout(block: nn.Module, growth: WidthGrowth) -> BlockLayout:
    """``growth.layout``, else the first of `LAYOUTS` whose modules ``block`` has.

    Raises:
        ValueError: None fits (one line naming the block's layers and what is accepted).
    """
    if growth.layout is not None:
        return growth.layout
    modules = dict(block.named_modules())
    for layout in LAYOUTS.values():
        if all(name in modules for name in layout.names()):
            return layout
    layers = [n for n, m in block.named_modules() if n and next(m.parameters(False), None)
              is not None]
    raise ValueError(f"WidthGrowth: {type(block).__name__} has no known width layout (its "
                     f"layers: {', '.join(layers)}); accepted: blocks laid out as "
                     f"{'; '.join(LAYOUTS)}, or WidthGrowth(layout=BlockLayout(...)) naming its "
                     "parts")


def _sizes(path: str, block: nn.Module, layout: BlockLayout) -> tuple[int, int]:
    """The residual width ``d`` and the MLP's width ``m`` of ``block``."""
    modules = dict(block.named_modules())
    missing = [n for n in layout.names() if n not in modules]
    if missing:
        raise ValueError(f"WidthGrowth: {path} has no module {missing[0]!r}, which its layout "
                         f"names; accepted: a layout naming the block's own modules")
    # attention reads the stream; the MLP's output projection reads its units
    width, _ = _io(f"{path}.{layout.qkv[0]}", modules[layout.qkv[0]])
    units, _ = _io(f"{path}.{layout.mlp_out}", modules[layout.mlp_out])
    return width, units


def _check_block(path: str, block: nn.Module, layout: BlockLayout, width: int, units: int,
                 growth: WidthGrowth) -> None:
    """Refuse, in one line, a block whose layout's layers do not fit together at width ``d``
    and MLP width ``m``, that has parameters its layout does not name, or whose attention
    keeps no head count (its heads could not grow)."""
    modules = dict(block.named_modules())
    _sizes(path, block, layout)
    sizes = {n: _io(f"{path}.{n}", modules[n]) for n in (*layout.qkv, layout.attn_out,
                                                          *layout.mlp_in, layout.mlp_out)}
    if len(layout.qkv) == 1 and sizes[layout.qkv[0]][1] % 3:
        raise ValueError(f"WidthGrowth: {path}.{layout.qkv[0]} has {sizes[layout.qkv[0]][1]} "
                         "outputs, not three equal parts q|k|v; accepted: a layout naming a fused "
                         "q|k|v layer, or the three")
    inner = sizes[layout.qkv[0]][1] // (3 if len(layout.qkv) == 1 else 1)
    wanted = {**{n: (width, None) for n in layout.qkv}, layout.attn_out: (inner, width),
              **{n: (width, units) for n in layout.mlp_in}, layout.mlp_out: (units, width)}
    for name, (want_in, want_out) in wanted.items():
        got_in, got_out = sizes[name]
        if got_in != want_in or want_out not in (None, got_out):
            raise ValueError(f"WidthGrowth: {path}.{name} maps {got_in} -> {got_out}, not "
                             f"{want_in} -> {want_out or 'any'} as its layout's place needs "
                             f"(width {width}, MLP {units}); accepted: a layout naming the "
                             "right layers")
    for name in layout.norms:
        params = list(modules[name].parameters(recurse=False))
        if not _is_norm(modules[name]) or any(p.shape != (width,) for p in params):
            raise ValueError(f"WidthGrowth: {path}.{name} is a {type(modules[name]).__name__}, "
                             f"not a LayerNorm or RMSNorm of width {width}")
    named = {f"{n}.{k}" for n in layout.names() for k, _ in
             modules[n].named_parameters(recurse=False)}
    other = [n for n, _ in block.named_parameters() if n not in named]
    if other:
        raise ValueError(f"WidthGrowth: {path} has a parameter {other[0]!r} its layout does not "
                         "name, so it cannot follow the new width; accepted: blocks whose "
                         "parameters are all in their layout's norms and layers")
    if growth.factor > 1 and not any(
            isinstance(m.__dict__.get(a), int) for m in block.modules()
            for a in (*HEAD_NAMES, "head_dim")):
        raise ValueError(f"WidthGrowth: {path} ({type(block).__name__}) keeps no head count (an "
                         f"attribute {', '.join(HEAD_NAMES)} or head_dim), so its heads cannot "
                         "grow; accepted: attention that reshapes by one of them")


def _block_pieces(path: str, block: nn.Module, layout: BlockLayout, growth: WidthGrowth,
                  width: int, units: int) -> list[_Piece]:
    """A block's parameters and how each grows (module docstring)."""
    modules = dict(block.named_modules())
    k, j = growth.factor, growth.mlp_factor
    written, read = _Axis(COPY_OUT, width, k), _Axis(COPY_IN, width, k)
    pieces: list[_Piece] = []
    if k > 1:
        for name in layout.norms:
            pieces += _norm(f"{path}.{name}", modules[name], written)
        sections = 3 if len(layout.qkv) == 1 else 1  # a fused q|k|v grows in each part
        for name in layout.qkv:
            _, out = _io(name, modules[name])
            pieces += _linear(f"{path}.{name}", modules[name], _Axis(GROW_OUT, out, k, sections),
                              read)
        inner, _ = _io(layout.attn_out, modules[layout.attn_out])
        pieces += _linear(f"{path}.{layout.attn_out}", modules[layout.attn_out], written,
                          _Axis(GROW_IN, inner, k))
    for name in layout.mlp_in:
        pieces += _linear(f"{path}.{name}", modules[name], _Axis(GROW_OUT, units, j), read)
    pieces += _linear(f"{path}.{layout.mlp_out}", modules[layout.mlp_out], written,
                      _Axis(GROW_IN, units, j))
    return pieces


def _outer_pieces(model: nn.Module, stack: str, width: int, k: int) -> list[_Piece]:
    """The parameters outside the stack: tables and writers repeated per copy, readers split,
    norms repeated (the final one scaled by ``1/k`` before a tied head).

    Raises:
        ValueError: A module width growth does not know, a layer that both reads and writes
            width ``d``, or a tied head without one final norm after the stack (one line).
    """
    written, read = _Axis(COPY_OUT, width, k), _Axis(COPY_IN, width, k)
    named = list(model.named_modules())
    tables = {id(m.weight) for _, m in named if isinstance(m, nn.Embedding)}
    pieces: list[_Piece] = []
    norms: list[tuple[int, str, nn.Module]] = []
    tied, after, readers = False, None, []
    for order, (name, module) in enumerate(named):
        if name == stack or name.startswith(stack + "."):
            after = order if after is None else after
            continue
        if next(module.parameters(recurse=False), None) is None:
            continue
        if isinstance(module, nn.Embedding):
            if module.embedding_dim == width:
                pieces.append(_Piece(f"{name}.weight", module.weight,
                                     (_Axis(SAME, module.num_embeddings), written)))
        elif isinstance(module, nn.Linear) or _is_conv1d(module):
            tied = tied or id(module.weight) in tables
            linear = _outer_linear(name, module, width, written, read, tables)
            if any(read in piece.axes for piece in linear):  # its columns split: it reads
                readers.append(name)
            pieces += linear
        elif _is_norm(module) and all(p.shape == (width,) for p in module.parameters(False)):
            norms.append((order, name, module))
        else:
            raise ValueError(f"WidthGrowth: {name or type(model).__name__} is a "
                             f"{type(module).__name__}, which width growth does not know; "
                             "accepted outside the stack: Embedding, Linear, Conv1D, LayerNorm, "
                             "RMSNorm")
    _check_readers(tied, readers, width, streams=any(
        isinstance(m, nn.Embedding) and m.embedding_dim == width for _, m in named))
    final = [name for order, name, _ in norms if after is not None and order > after]
    if tied and len(final) != 1:
        raise ValueError(f"WidthGrowth: the output head is tied to the token table and needs one "
                         f"final norm after the stack to scale by 1/k, found "
                         f"{', '.join(final) or 'none'}; accepted: an untied head, or one final "
                         "LayerNorm/RMSNorm with a gain")
    for _, name, module in norms:
        scaled = tied and name in final
        if scaled:
            _check_scales_with_gain(name, module, width, k)
        pieces += _norm(name, module, written, 1.0 / k if scaled else 1.0)
    return pieces


def _check_scales_with_gain(name: str, module: nn.Module, width: int, k: int) -> None:
    """Refuse a final norm whose output does not shrink by ``1/k`` with its gain and bias
    (Gemma's RMSNorm computes ``x̂·(1 + w)``): scaling it would not keep a tied head's logits.
    Tried on a random input, the parameters put back bitwise."""
    params = list(module.parameters(recurse=False))
    x = torch.randn(1, 2, width, generator=torch.Generator().manual_seed(0)).to(params[0])
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        before = module(x)
        for p in params:
            p.mul_(1.0 / k)
        after = module(x)
        for p, value in zip(params, saved, strict=True):
            p.copy_(value)
    if not torch.allclose(after, before / k, rtol=1e-4, atol=1e-6):
        raise ValueError(f"WidthGrowth: the final norm {name} ({type(module).__name__}) before "
                         f"the tied head does not scale its output with its gain (x̂·(1 + w)?), "
                         f"so the logits cannot be kept; accepted: a final LayerNorm/RMSNorm "
                         f"computing x̂·w (+ b), or an untied head")


def _check_readers(tied: bool, readers: list[str], width: int, streams: bool) -> None:
    """Refuse the outputs width growth cannot keep (one line): a tied head's final norm is
    scaled by ``1/k``, so another layer reading it would read ``x/k`` (Hugging Face's
    ``GPT2DoubleHeadsModel``'s multiple-choice head); and with a token table of width ``d``
    (``streams``) but neither a tied head nor a layer reading the stream, the output is
    computed where growth cannot see it (``F.linear(x, wte.weight)``, a tied head it would not
    scale: logits ``k`` times the old). A bare stack of blocks, with no table, hands back the
    widened stream itself."""
    if tied and readers:
        raise ValueError(f"WidthGrowth: the output head is tied to the token table, so the "
                         f"final norm is scaled by 1/k, and {', '.join(readers)} also read(s) "
                         f"width {width}; accepted: a tied head as the only layer reading the "
                         "stream, or an untied head")
    if streams and not tied and not readers:
        raise ValueError(f"WidthGrowth: no layer outside the stack reads the stream (width "
                         f"{width}), so the output head cannot be told tied or not (a head "
                         "computed as F.linear(x, wte.weight)?); accepted: an nn.Linear head, "
                         "tied by sharing the token table's weight or untied")


def _outer_linear(name: str, module: nn.Module, width: int, written: _Axis, read: _Axis,
                  tables: set[int]) -> list[_Piece]:
    """A layer outside the stack: a tied head (its weight is a table: grown there), a reader of
    the stream (an untied head: its columns split), a writer (rows repeated), or untouched."""
    if id(module.weight) in tables:
        return []
    fan_in, fan_out = _io(name, module)
    if fan_in == width and fan_out == width:
        raise ValueError(f"WidthGrowth: {name} maps {width} -> {width}, so it may read or write "
                         "the residual stream; accepted outside the stack: layers that do one")
    if fan_in == width:
        return _linear(name, module, _Axis(SAME, fan_out), read)
    if fan_out == width:
        return _linear(name, module, written, _Axis(SAME, fan_in))
    return []


def _check_slots(model: nn.Module) -> None:
    """Refuse a model whose seed slots hold a seed or a gate of the old width (one line)."""
    from esper_lightning.core.slots import SeedSlot

    for module in model.modules():
        if isinstance(module, SeedSlot) and (module.seed is not None or module.gate is not None):
            raise ValueError(f"WidthGrowth: slot {module.slot_id!r} holds a seed, which width "
                             "growth does not widen; accepted: a model whose slots are empty "
                             "(materialize the fossilized growth, prune the rest, first)")


def _plan(model: nn.Module, growth: WidthGrowth) -> _Plan:
    """Every parameter that grows, and how; every refusal happens here, before any change."""
    from esper_lightning.core.depth import find_stack

    try:
        path, container, _ = find_stack(model, growth.stack)
    except ValueError as err:  # the stack is found as depth growth finds it
        raise ValueError(str(err).replace("DepthGrowth", "WidthGrowth")) from None
    _check_slots(model)
    blocks = list(container)
    layout = _layout(blocks[0], growth)
    width, units = _sizes(f"{path}.0", blocks[0], layout)
    pieces: list[_Piece] = []
    for index, block in enumerate(blocks):
        _check_block(f"{path}.{index}", block, layout, width, units, growth)
        pieces += _block_pieces(f"{path}.{index}", block, layout, growth, width, units)
    if growth.factor > 1:
        pieces += _outer_pieces(model, path, width, growth.factor)
    grows = [p for p in pieces if p.scale != 1.0 or any(a.times > 1 for a in p.axes)]
    return _Plan(grows, path, width, units)


# --- configs and module sizes follow -----------------------------------------------------------
def _in_place(config: Any) -> bool:
    """A Hugging Face config (changed in place: it holds private settings such as the attention
    implementation that a copy would lose), not a plain dataclass (replaced)."""
    return callable(getattr(config, "to_dict", None))


def _configs(model: nn.Module) -> list[Any]:
    """The distinct config objects of ``model``'s modules: Hugging Face configs and
    dataclasses (a module's ``config`` attribute)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        config = module.__dict__.get("config")
        if config is not None and (dataclasses.is_dataclass(config)
                                   or callable(getattr(config, "to_dict", None))):
            found[id(config)] = config
    return list(found.values())


def _config_changes(config: Any, plan: _Plan, growth: WidthGrowth) -> dict[str, Any]:
    """The new values of ``config``'s sizes by name; {} for a config that is not of this
    model's width.

    Raises:
        ValueError: The config holds the width but cannot say the new MLP width (one line).
    """
    fields = (None if _in_place(config) else {f.name for f in dataclasses.fields(config)})
    names = (*HIDDEN_NAMES, *HEAD_NAMES, *MLP_NAMES)
    values = {n: getattr(config, n) for n in names
              if (n in fields if fields is not None else hasattr(config, n))}
    if plan.width not in [values.get(n) for n in HIDDEN_NAMES]:
        return {}
    k, j = growth.factor, growth.mlp_factor
    changes: dict[str, Any] = {}
    if k > 1:
        changes |= {n: v * k for n, v in values.items() if n in HIDDEN_NAMES and v == plan.width}
        changes |= {n: v * k for n, v in values.items() if n in HEAD_NAMES
                    and isinstance(v, int) and not isinstance(v, bool)}
    mlp = {n: v for n, v in values.items() if n in MLP_NAMES}
    wrong = [n for n, v in mlp.items() if v not in (None, plan.units)]
    if wrong or (not mlp and j != k):
        what = (f"its {wrong[0]} is {mlp[wrong[0]]}, not the MLP's {plan.units}" if wrong
                else f"it has no field for the MLP's width ({', '.join(MLP_NAMES)})")
        raise ValueError(f"WidthGrowth: {type(config).__name__} cannot say the new MLP width "
                         f"{plan.units * j}: {what}; accepted: mlp equal to factor for this "
                         "model")
    for name, value in mlp.items():  # None: the model's default multiple of the width
        if value == plan.units or j != k:
            changes[name] = plan.units * j
    return changes


def _apply_configs(model: nn.Module, changes: list[tuple[Any, dict[str, Any]]]) -> None:
    """Each config takes its new sizes: a Hugging Face config in place, a frozen dataclass
    replaced wherever a module or a LightningModule's ``hparams`` holds it."""
    for config, values in changes:
        if not values:
            continue
        if _in_place(config):
            for name, value in values.items():
                setattr(config, name, value)
            continue
        new = dataclasses.replace(config, **values)
        for module in model.modules():
            if module.__dict__.get("config") is config:
                module.config = new
            hparams = module.__dict__.get("_hparams")
            if isinstance(hparams, Mapping):
                for key, value in list(hparams.items()):
                    if value is config or (type(value) is type(config) and value == config):
                        hparams[key] = new


def _follow_modules(model: nn.Module, plan: _Plan, growth: WidthGrowth) -> None:
    """Every module's own sizes follow its parameters: a Linear's ``in_features``, a Conv1D's
    ``nx``/``nf``, an Embedding's ``embedding_dim``, a norm's ``normalized_shape``, the width
    and MLP width a module keeps (`HIDDEN_NAMES`, `MLP_NAMES`), the head counts of the stack's
    modules (`HEAD_NAMES`), an empty slot's ``channels``."""
    from esper_lightning.core.slots import SeedSlot

    k, j, width, units = growth.factor, growth.mlp_factor, plan.width, plan.units
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            module.out_features, module.in_features = module.weight.shape
        elif _is_conv1d(module):
            module.nx, module.nf = module.weight.shape
        elif isinstance(module, nn.Embedding):
            module.embedding_dim = int(module.weight.shape[1])
        if isinstance(module, SeedSlot) and module.channels == width:
            module.resize(width * k)
        attrs = module.__dict__
        if k > 1 and tuple(attrs.get("normalized_shape") or ()) == (width,):
            module.normalized_shape = (width * k,)
        inside = name == plan.stack or name.startswith(plan.stack + ".")
        for attr in (*HIDDEN_NAMES, *MLP_NAMES, *HEAD_NAMES):
            value = attrs.get(attr)
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            if attr in HIDDEN_NAMES and value == width:
                setattr(module, attr, value * k)
            elif attr in MLP_NAMES and value == units:
                setattr(module, attr, value * j)
            elif attr in HEAD_NAMES and inside:
                setattr(module, attr, value * k)


# --- the optimizer and the functional form -----------------------------------------------------
def _carried(optimizer: torch.optim.Optimizer, param: nn.Parameter, index: Tensor,
             fresh: Tensor, moments: str) -> dict[str, Any] | None:
    """``param``'s optimizer state in its new shape (module docstring): ``"copy"`` carries
    each entry's state from its source entry (a new entry: zero, a second moment the old
    entries' mean); None: no state (``"reset"`` drops it). Read before ``param`` changes
    shape; nothing is written here."""
    state = optimizer.state.get(param)
    if not state or moments == "reset":
        return None
    carried = dict(state)
    for key, value in state.items():
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape == param.shape:
            fill = value.mean() if str(key).endswith("_sq") else value.new_zeros(())
            carried[key] = torch.where(fresh, fill, value.flatten()[index.clamp(min=0)])
    return carried


def _swap_all(pieces: list[tuple[_Piece, Tensor]]) -> None:
    """Every piece's parameter takes its new value: the same ``Parameter`` object (param
    groups, ties and references hold) with its contents and autograd record swapped whole (a
    ``.data`` assignment would keep the leaf's gradient accumulator, which a graph still
    referenced, last step's loss, holds alive with the old shape: the next backward fails on
    it). All or none: a parameter a graph not yet backpropagated holds cannot be swapped, and
    the ones swapped before it are swapped back.

    Raises:
        RuntimeError: Such a graph (one line naming the parameter).
    """
    done: list[tuple[nn.Parameter, nn.Parameter]] = []
    for piece, value in pieces:
        new = nn.Parameter(value.to(piece.param.dtype), requires_grad=piece.param.requires_grad)
        try:
            torch.utils.swap_tensors(piece.param, new)
        except RuntimeError as err:
            for param, old in reversed(done):
                torch.utils.swap_tensors(param, old)
            raise RuntimeError(f"widen: {piece.name} is held by a graph not yet backpropagated "
                               "(an output computed with gradients); backpropagate or drop it, "
                               "or compute it under torch.no_grad(), before widening") from err
        done.append((piece.param, new))


def widen(model: nn.Module, growth: WidthGrowth | None = None,
          optimizer: torch.optim.Optimizer | None = None) -> Widening:
    """Grow ``model`` wider at once by ``growth`` (module docstring), no lifecycle: every
    parameter of the stream, the attention and the MLP takes its new shape in place (the same
    ``nn.Parameter`` objects, so ``optimizer``'s param groups and weight tying stand), its
    ``optimizer`` state follows (``growth.moments``), module sizes and configs say the new
    widths. The logits at birth equal the old ones within 1e-5.

    Args:
        model: A transformer with one stack of same-shape blocks of a known layout (or
            ``growth.stack`` / ``growth.layout`` naming them), and empty seed slots if any.
        growth: How much and how; None: ``WidthGrowth()`` (twice the width).
        optimizer: The optimizer training ``model``, whose state follows; None: none.

    Returns:
        The widths before and after and each widened parameter's mask of new entries.

    Raises:
        ValueError: What cannot be widened, in one line, before anything changed.

    Example:
        >>> from esper_lightning.blueprints.block import Block
        >>> net = nn.Module()
        >>> net.blocks = nn.ModuleList([Block(8, 2)])
        >>> widen(net, WidthGrowth(factor=2)).hidden
        (8, 16)
        >>> net.blocks[0].n_head, net.blocks[0].attn.c_attn.weight.shape
        (4, torch.Size([48, 16]))
    """
    growth = growth or WidthGrowth()
    plan = _plan(model, growth)
    configs = [(config, _config_changes(config, plan, growth)) for config in _configs(model)]
    generator = torch.Generator().manual_seed(growth.rng_seed)
    built = [(piece, *_expand(piece, growth, generator)) for piece in plan.pieces]
    states = [None if optimizer is None else _carried(optimizer, piece.param, index, new,
                                                      growth.moments)
              for piece, _, index, new in built]
    _swap_all([(piece, value) for piece, value, _, _ in built])
    fresh: dict[str, Tensor] = {}
    for (piece, _, _, new), state in zip(built, states, strict=True):
        if optimizer is not None:
            optimizer.state.pop(piece.param, None)
            if state is not None:
                optimizer.state[piece.param] = state
        fresh[piece.name] = new
    _follow_modules(model, plan, growth)
    _apply_configs(model, configs)
    return Widening((plan.width, plan.width * growth.factor),
                    (plan.units, plan.units * growth.mlp_factor), fresh)


def check_widen(model: nn.Module, growth: WidthGrowth | None = None) -> None:
    """Refuse now what `widen` would refuse on ``model`` (its stack, layout, modules, slots and
    configs), changing nothing: a caller that widens later (a Trainer callback at a point of the
    run) says so at its start. A matrix of constant entries, whose new rows could never learn, is
    found only when it is widened.

    Raises:
        ValueError: What cannot be widened, in one line.

    Example:
        >>> from esper_lightning.blueprints.block import Block
        >>> net = nn.Module()
        >>> net.blocks = nn.ModuleList([Block(8, 2)])
        >>> check_widen(net, WidthGrowth(factor=2)), net.blocks[0].n_head  # nothing changed
        (None, 2)
    """
    growth = growth or WidthGrowth()
    plan = _plan(model, growth)
    for config in _configs(model):
        _config_changes(config, plan, growth)
