"""`SeedSlot`: the place in a host network where a seed can grow.

Forward semantics at a slot with host activation ``h`` and seed output ``s = seed(x)``:

* empty slot, GERMINATED, PRUNED, EMBARGOED, RESETTING: identity, the seed is not run;
* TRAINING: the incubator on a detached input ``x = h.detach()``: its value is ``h``'s own (no
  arithmetic on ``s``, so an inf or NaN seed output never reaches the host), its backward hands
  the gradient that reaches ``h`` to the host unchanged and to the seed, so the seed learns from
  it and the host's gradients are bitwise those of a host without the seed;
* BLENDING onwards: ``blend(h, s, alpha)`` (ADD, MULTIPLY or GATE). The seed's input is the host
  activation itself (``blend_gradient="through"``, the default), so host layers before the slot
  learn through the seed as it blends in. ``"detached"`` keeps it detached while BLENDING: those
  layers then receive only ``(1 − alpha)`` of their gradient, and none at alpha 1 until the seed
  advances to HOLDING, which costs accuracy (docs/evidence.md). From HOLDING on the input is
  never detached.

Counterfactuals pass a per-sample ``alpha_override`` (argument, or the `alpha_override` context
manager for slots called from inside a host's forward) instead of mutating alpha. An override
with K times as many rows as the batch fans the batch out K times at this slot (with or without
a seed).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from esper_lightning import blueprints
from esper_lightning.blueprints.growth import (
    BlockCall,
    GatedBlock,
    GrownBlocks,
    GrowthSite,
    operator_of,
)
from esper_lightning.core.alpha import AlphaAlgorithm, AlphaController, AlphaCurve, AlphaMode
from esper_lightning.core.gradient_stats import record_gradient_stats
from esper_lightning.core.lifecycle import (
    ACTIVE_STAGES,
    ALPHA_TOLERANCE,
    DEFAULT_BLEND_TEMPO,
    EMBARGO_TICKS,
    LIVE_STAGES,
    AlphaView,
    GateConfig,
    GateMode,
    GateResult,
    IllegalTransitionError,
    QualityGates,
    SeedMetrics,
    SeedStage,
    SeedState,
    StageEvent,
    default_successor,
)
from esper_lightning.core.manifest import (
    MANIFEST_VERSION,
    blend_gradient_of,
    check_manifest,
    identity_of,
)

#: Whether a BLENDING seed's input is detached from the host (`SeedSlot` ``blend_gradient``).
BLEND_GRADIENTS = ("detached", "through")
#: ``blend_gradient`` of a slot that names none: measured better than "detached" on both tasks.
DEFAULT_BLEND_GRADIENT = "through"
#: Slot -> what its engine calls before a live seed in the host's forward runs in a training
#: forward (`MorphogenesisEngine` keeps the host's buffers then, to put them back when the
#: seed's output spoiled them). Weak both ways, and off the module, so copying or saving a
#: model never drags its engine along.
BLEND_GUARDS: weakref.WeakKeyDictionary[nn.Module, Callable[[], Callable[[], None] | None]] = (
    weakref.WeakKeyDictionary())


@dataclass(frozen=True)
class BlendConfig:
    """How a seed is blended in, chosen at germination (algorithm may change on retarget)."""

    algorithm: AlphaAlgorithm = AlphaAlgorithm.ADD
    curve: AlphaCurve = AlphaCurve.LINEAR
    steepness: float = 12.0
    tempo: int = DEFAULT_BLEND_TEMPO
    alpha_target: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": int(self.algorithm),
            "curve": int(self.curve),
            "steepness": self.steepness,
            "tempo": self.tempo,
            "alpha_target": self.alpha_target,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BlendConfig:
        return cls(
            AlphaAlgorithm(data["algorithm"]),
            AlphaCurve(data["curve"]),
            float(data["steepness"]),
            int(data["tempo"]),
            float(data["alpha_target"]),
        )


class GatedBlend(nn.Module):
    """Gate in [0, 1] for the GATE blend: per sample (CNN: of the pooled feature map; linear: of
    each row, or each token of ``[B, T, D]``) or per token and causal (transformer)."""

    def __init__(self, channels: int, topology: str) -> None:
        super().__init__()
        hidden = max(8, channels // 4)
        self.topology = topology
        self.net = nn.Sequential(nn.Linear(channels, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: Tensor) -> Tensor:
        if self.topology == "cnn":
            pooled = x.mean(dim=(2, 3))  # [B, C]
            return torch.sigmoid(self.net(pooled)).view(-1, 1, 1, 1)
        if self.topology == "linear":
            return torch.sigmoid(self.net(x))  # [..., 1]: each row on its own
        # Cumulative mean over tokens so position t never sees t+1 (causal); float32 counts
        # stay exact beyond bf16's 256.
        steps = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=torch.float32)
        pooled = (x.float().cumsum(dim=1) / steps.view(1, -1, 1)).to(x.dtype)  # [B, T, D]
        return torch.sigmoid(self.net(pooled))  # [B, T, 1]


@dataclass(frozen=True)
class SlotReport:
    """Plain-data snapshot of one slot, what controllers and observations read."""

    slot_id: str
    stage: SeedStage
    seed_id: str | None
    blueprint: str | None
    alpha: float
    alpha_target: float
    alpha_mode: AlphaMode
    alpha_steps_total: int
    alpha_steps_done: int
    alpha_curve: AlphaCurve
    alpha_velocity: float
    algorithm: AlphaAlgorithm | None
    tempo: int | None
    previous_stage: SeedStage
    previous_epochs_in_stage: int
    metrics: SeedMetrics
    last_gate: GateResult | None
    prune_reason: str | None
    history: tuple[StageEvent, ...]
    #: Blocks a seed here adds to a stack (a growth slot); 0 for any other slot.
    growth_blocks: int = 0
    #: Decisions a seed germinated here incubates before G2 (its gates' ``min_training_epochs``;
    #: a blueprint without incubation skips it).
    incubation: int = 0
    #: The blend ramp, in decisions, of a seed germinated here (None: the action's tempo).
    blend_ticks: int | None = None

    @property
    def epochs_total(self) -> int:
        return self.metrics.epochs_total

    @property
    def epochs_in_stage(self) -> int:
        return self.metrics.epochs_in_stage

    @property
    def alpha_view(self) -> AlphaView:
        return AlphaView(self.alpha, self.alpha_target, self.alpha_mode == AlphaMode.HOLD)

    @property
    def seed_params(self) -> int:
        return self.metrics.seed_params


class SeedSlot(nn.Module):
    """A slot that holds at most one seed module and applies the lifecycle to it.

    Args:
        slot_id: name of the slot (``r{row}c{col}`` for built-in hosts, a module path otherwise).
        channels: width of the activation at the slot; inferred from the first forward if None.
        topology: ``"cnn"`` (activations ``[B, C, H, W]``), ``"transformer"`` (``[B, T, D]``),
            ``"linear"`` (``[B, D]``, or ``[B, T, D]`` token by token) or None: inferred from
            the rank of the first activation (4: cnn, 3: transformer, 2: linear).
        gate_mode: ``"permissive"`` (default) or ``"strict"`` quality gates.
        gate_config: gate thresholds (`GateConfig` defaults by default).
        blend_gradient: ``"through"`` (host layers before the slot learn through a BLENDING
            seed; the default) or ``"detached"`` (its input is detached from the host).
        layer_scale_init: initial gain of every LayerScale in a seed built here (None: the
            blueprint's own, 1e-3 for the built-ins; ``blueprints.build``).
        growth: None, or the `blueprints.growth.GrowthSite` of a *growth slot*: one after a
            block of a stack of same-shape blocks, where a depth-growth seed (``block_copy``,
            ``block_identity``, ...) adds ``growth.blocks`` new blocks (`growth`). A growth
            blueprint is refused in one line anywhere else.
        growth_place: Where a growth slot's blocks go when the model is handed back
            (`core.depth.materialize`): ``{"stack": path, "after": block index, "order": k}``.

    Example:
        >>> slot = SeedSlot("r0c1", channels=16)
        >>> _ = slot.germinate("conv_light")
        >>> slot.advance().passed, slot.stage.name
        (True, 'TRAINING')
    """

    def __init__(
        self,
        slot_id: str,
        channels: int | None = None,
        topology: str | None = "cnn",
        gate_mode: GateMode | str = GateMode.PERMISSIVE,
        gate_config: GateConfig | None = None,
        blend_gradient: str = DEFAULT_BLEND_GRADIENT,
        layer_scale_init: float | None = None,
        growth: GrowthSite | None = None,
        growth_place: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        check_topology(topology)
        if channels is not None and channels < 1:
            raise ValueError(f"slot {slot_id!r}: channels must be >= 1, got {channels}")
        if channels is not None and topology is None:
            raise ValueError(f"slot {slot_id!r}: a slot with a width needs a topology")
        self.slot_id = slot_id
        self.channels = channels
        self.topology = topology
        self.blend_gradient = blend_gradient
        self.layer_scale_init = check_layer_scale_init(layer_scale_init)
        if (growth is None) != (growth_place is None):
            raise ValueError(f"slot {slot_id!r}: a growth slot needs both its growth site and "
                             "its place in the stack")
        self._growth = growth
        self._growth_place = growth_place
        self._identity_mode: str | None = None
        self.gates = QualityGates(gate_mode, gate_config)
        self._embargo_ticks = EMBARGO_TICKS
        self._blend_ticks: int | None = None
        self.seed: nn.Module | None = None
        self.gate: GatedBlend | None = None
        self.state: SeedState | None = None
        self.blend: BlendConfig | None = None
        self.alpha_controller = AlphaController()
        self.seeds_germinated = 0
        self._override: Tensor | None = None
        self._frozen: list[nn.Parameter] = []
        self._alpha_cache: tuple[float, torch.device, torch.dtype, Tensor] | None = None
        #: Whether a training forward of a live seed gave a non-finite output from a finite
        #: input, and whether its input was not finite, since the engine last looked
        #: (`take_nonfinite`); flags on the device, so nothing syncs here.
        self._nonfinite: Tensor | None = None
        # Follows .to()/.half() so seeds are built on the host's device and dtype.
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)

    # --- forward ------------------------------------------------------------------------------
    @property
    def stage(self) -> SeedStage:
        return SeedStage.DORMANT if self.state is None else self.state.stage

    @property
    def alpha(self) -> float:
        return self.alpha_controller.alpha

    @property
    def growth(self) -> GrowthSite | None:
        """The growth site of a growth slot (constructor), None for any other slot."""
        return self._growth

    @property
    def growth_place(self) -> dict[str, Any] | None:
        """Where a growth slot's blocks go when the model is handed back (constructor)."""
        return self._growth_place

    @property
    def identity_mode(self) -> str | None:
        """How ``identity`` makes a copy return its input here, once checked on the slot's
        first activation (`record_identity`) or read from its manifest; None before."""
        return self._identity_mode

    @property
    def embargo_ticks(self) -> int:
        """Decisions a pruned seed's slot stays EMBARGOED (`core.timing.SeedTiming.embargo`;
        `set_timing`)."""
        return self._embargo_ticks

    @property
    def blend_ticks(self) -> int | None:
        """The blend ramp, in decisions, of seeds germinated here from now on, replacing the
        action's tempo (`core.timing.SeedTiming.blend`; `set_timing`); None: the action's."""
        return self._blend_ticks

    def configure(self, gates: QualityGates | None = None, blend_gradient: str | None = None,
                  layer_scale_init: float | None = None) -> None:
        """Replace the slot's quality gates, blend gradient or seeds' LayerScale gain (what is
        None stays): the engine gives every slot the run's settings."""
        if gates is not None:
            self.gates = gates
        if blend_gradient is not None:
            self.blend_gradient = blend_gradient
        if layer_scale_init is not None:
            self.layer_scale_init = check_layer_scale_init(layer_scale_init)

    def set_timing(self, embargo_ticks: int | None = None, blend_ticks: int | None = None) -> None:
        """The lifecycle's durations in decisions for seeds from now on (what is None stays)."""
        if embargo_ticks is not None:
            self._embargo_ticks = int(embargo_ticks)
        if blend_ticks is not None:
            self._blend_ticks = int(blend_ticks)

    def resize(self, channels: int) -> None:
        """Take a new activation width: the host around an empty slot was widened
        (`core.width`). A slot holding a seed keeps its width (its seed was built for it).

        Raises:
            ValueError: The slot holds a seed, or ``channels`` is not an int >= 1.
        """
        if self.seed is not None or self.gate is not None:
            raise ValueError(f"slot {self.slot_id!r} holds a seed of width {self.channels}; "
                             "accepted: resizing an empty slot")
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise ValueError(f"slot {self.slot_id!r}: channels must be an int >= 1, got "
                             f"{channels!r}")
        self.channels = channels

    def record_identity(self, mode: str) -> None:
        """What the first activation's check found (`core.depth`): ``"projections"`` or
        ``"gate"``; saved in the manifest."""
        if self._growth is None:
            raise ValueError(f"slot {self.slot_id!r} is not a growth slot")
        self._identity_mode = mode

    def refine_growth(self, site: GrowthSite) -> None:
        """Replace the growth site by one that knows more of the same stack (the residual
        projections found on the first activation, `core.depth`)."""
        if self._growth is None:
            raise ValueError(f"slot {self.slot_id!r} is not a growth slot")
        self._growth = site

    def adopt_growth(self, other: SeedSlot) -> None:
        """Take ``other``'s growth site and place: a slot kept across a second injection into
        the same model is the same slot of a newly built site."""
        self._growth, self._growth_place = other.growth, other.growth_place

    @property
    def blend_gradient(self) -> str:
        """Whether a BLENDING seed's input lets gradient ``"through"`` to the host layers
        before the slot or is ``"detached"`` from them."""
        return self._blend_gradient

    @blend_gradient.setter
    def blend_gradient(self, value: str) -> None:
        self._blend_gradient = check_blend_gradient(value, optional=False)

    def forward(self, h: Tensor, alpha_override: Tensor | None = None,
                call: BlockCall | None = None) -> Tensor:
        """The slot's output for host activation ``h``; ``call`` is how the block a growth slot
        follows was called (its other arguments, replayed on the seed's blocks)."""
        if self.channels is None:
            self._adopt_shape(h)
        stage = self.stage
        override = self._override if alpha_override is None else alpha_override
        if override is not None and override.dim() == 1 and override.shape[0] != h.shape[0]:
            if call is not None and (call.args or call.kwargs):
                raise ValueError(f"slot {self.slot_id!r}: a fused counterfactual cannot fan out "
                                 "the other arguments of a growth slot's block; use "
                                 "counterfactual='separate'")
            h = _fan_out(h, override.shape[0])  # before the seed check: probes fan out too
        if self.seed is None or stage not in ACTIVE_STAGES:
            return h
        x = h.detach() if self._isolated(stage) else h
        # Only grown blocks replay the block's call; any other seed in a growth slot (a LoRA
        # after a block, say) sees the activation alone, as in any slot.
        if stage != SeedStage.TRAINING and stage in LIVE_STAGES and torch.is_grad_enabled():
            guard = BLEND_GUARDS.get(self)
            keep = None if guard is None or h.is_meta else guard()
            if keep is not None:
                keep()
        s = (self.seed(x, call) if isinstance(self.seed, GrownBlocks) else self.seed(x))
        s = s.to(h.dtype)
        if stage in LIVE_STAGES and torch.is_grad_enabled() and not s.is_meta:
            self._note_forward(x, s)
        if stage == SeedStage.TRAINING and override is None:
            if s.shape != h.shape:  # the incubator hands h's gradient to s as it is
                raise RuntimeError(f"slot {self.slot_id!r}: seed output shape {tuple(s.shape)} "
                                   f"!= activation shape {tuple(h.shape)}")
            return _Incubator.apply(h, s)
        if override is None and self._replaces(h):
            return s  # h + 1·(s − h), exactly: the grown host computes the deeper host
        a = self._alpha_tensor(h) if override is None else _per_sample(override, h)
        return self._blend(h, s, x, a)

    def _note_forward(self, x: Tensor, s: Tensor) -> None:
        """Fold whether the seed's output ``s`` is not finite while its input ``x`` is (its own
        doing: a seed whose output overflows may still have finite gradients, as a linear
        layer's weight gradient never sees its output), and whether ``x`` is not (the host's
        doing), into the device flags the engine reads once per optimizer step."""
        bad_input = ~torch.isfinite(x.detach()).all()
        bad_output = ~torch.isfinite(s.detach()).all() & ~bad_input
        flags = torch.stack([bad_output, bad_input])
        self._nonfinite = flags if self._nonfinite is None else self._nonfinite | flags

    def take_nonfinite(self) -> Tensor | None:
        """Since the last call, whether a training forward of this slot's live seed gave an inf
        or NaN output from a finite input, and whether its input was inf or NaN (a bool tensor
        ``[output, input]`` on the seed's device; None: no such forward ran); forgets them."""
        flags, self._nonfinite = self._nonfinite, None
        return flags

    def _replaces(self, h: Tensor) -> bool:
        """Whether the output is the seed's own: an ADD blend at alpha exactly 1."""
        blend = self.blend
        return (blend is not None and blend.algorithm == AlphaAlgorithm.ADD
                and self.alpha_controller.alpha == 1.0)

    def _adopt_shape(self, h: Tensor) -> None:
        """Width (and, for a slot without one, topology) from the first activation."""
        topology = self.topology or blueprints.TOPOLOGY_OF_RANK.get(h.dim())
        if topology is None:
            ranks = ", ".join(f"{rank} ({name})"
                              for rank, name in blueprints.TOPOLOGY_OF_RANK.items())
            raise ValueError(f"slot {self.slot_id!r} infers its topology from the rank of its "
                             f"activations; accepted ranks: {ranks}, got shape {tuple(h.shape)}")
        if h.dim() not in blueprints.ACTIVATION_RANKS[topology]:
            raise ValueError(f"slot {self.slot_id!r} ({topology}) needs activations "
                             f"{blueprints.ACTIVATION_SHAPES[topology]}, got shape "
                             f"{tuple(h.shape)}")
        self.topology = topology
        self.channels = int(h.shape[1] if topology == "cnn" else h.shape[-1])

    def _isolated(self, stage: SeedStage) -> bool:
        if stage == SeedStage.TRAINING:
            return True
        return stage == SeedStage.BLENDING and self.blend_gradient == "detached"

    def _blend(self, h: Tensor, s: Tensor, x: Tensor, a: Tensor) -> Tensor:
        assert self.blend is not None
        if self.blend.algorithm == AlphaAlgorithm.ADD:
            return h + a * (s - h)
        if self.blend.algorithm == AlphaAlgorithm.MULTIPLY:
            return h * (1 + a * torch.tanh(s - x))
        assert self.gate is not None, "GATE blend without a gate module"
        a_eff = (a * self.gate(x).to(h.dtype)).clamp(0.0, 1.0)
        return h + a_eff * (s - h)

    def _alpha_tensor(self, h: Tensor) -> Tensor:
        alpha = self.alpha_controller.alpha
        cache = self._alpha_cache
        if cache is None or cache[:3] != (alpha, h.device, h.dtype):
            value = torch.full((), alpha, device=h.device, dtype=h.dtype)  # no host copy
            cache = (alpha, h.device, h.dtype, value)
            self._alpha_cache = cache
        return cache[3]

    @contextmanager
    def alpha_override(self, alpha: Tensor) -> Iterator[None]:
        """Use ``alpha`` (shape ``[B]`` or broadcastable) in forwards inside this block."""
        previous, self._override = self._override, alpha
        try:
            yield
        finally:
            self._override = previous

    # --- lifecycle operations -----------------------------------------------------------------
    def germinate(
        self,
        blueprint: str,
        seed_id: str | None = None,
        *,
        algorithm: AlphaAlgorithm = AlphaAlgorithm.ADD,
        curve: AlphaCurve = AlphaCurve.LINEAR,
        steepness: float = 12.0,
        tempo: int = DEFAULT_BLEND_TEMPO,
        alpha_target: float = 1.0,
    ) -> GateResult:
        """Build a seed from ``blueprint`` in this empty slot (stage GERMINATED).

        A blueprint that needs no incubation (`blueprints.BlueprintSpec.incubation` 0, the
        block seeds) passes G0, G1 and G2 here and is BLENDING on return, every transition and
        gate result in its history; its blend tempo, when it sets one, replaces ``tempo``.

        Returns:
            The last gate asked: G0, or G2 for a blueprint that needs no incubation.
        """
        if self.state is not None:
            raise IllegalTransitionError(f"slot {self.slot_id!r}: germinate into {self.stage.name}")
        if self.channels is None:
            raise RuntimeError(f"slot {self.slot_id!r}: width unknown; run a forward pass first")
        if tempo < 1:
            raise ValueError(f"blend tempo must be >= 1 epoch, got {tempo}")
        if not 0.0 < alpha_target <= 1.0:
            raise ValueError(f"alpha target must be in (0, 1], got {alpha_target}")
        spec = self._spec(blueprint)
        if self.blend_ticks is not None:
            tempo = self.blend_ticks
        # A blueprint with a pace of its own blends at it (block seeds: at once or in one epoch).
        if spec.blend_tempo is not None:
            tempo = spec.blend_tempo
        blend = BlendConfig(AlphaAlgorithm(algorithm), AlphaCurve(curve), steepness, tempo,
                            alpha_target)
        seed = self._build_seed(blueprint)
        state = SeedState(seed_id or f"{self.slot_id}:seed{self.seeds_germinated}", blueprint)
        result = self.gates.check(SeedStage.GERMINATED, state, self._alpha_view())
        state.last_gate = result
        if not result.passed:
            raise ValueError(f"slot {self.slot_id!r}: {result.message}")
        state.transition(SeedStage.GERMINATED, result.message)
        state.metrics.seed_params = sum(p.numel() for p in seed.parameters())
        self.seed, self.state, self.blend = seed, state, blend
        self.gate = self._build_gate() if blend.algorithm == AlphaAlgorithm.GATE else None
        self.alpha_controller = AlphaController()
        self.seeds_germinated += 1
        if spec.incubation == 0:
            # Nothing to incubate: G1 and G2 are asked now, in order and recorded like any
            # others, and the seed enters BLENDING in the decision that germinated it.
            for _ in (SeedStage.TRAINING, SeedStage.BLENDING):
                result = self.advance()
                if not result.passed:  # G1 and G2 of a seed that never ran cannot fail
                    raise RuntimeError(f"slot {self.slot_id!r}: {blueprint} needs no "
                                       f"incubation but {result.message} at germination")
        return result

    def implant(self, blueprint: str, seed_id: str | None = None) -> None:
        """Put a seed in this empty slot that is FOSSILIZED from birth at alpha 1.

        Not a lifecycle move (no gate is asked, nothing is learned behind the host): it builds
        the "born grown" baseline, a host that has a grown model's capacity from epoch 0 without
        its growth, so comparisons can ask whether growing beats starting bigger. The history
        records one ``DORMANT -> FOSSILIZED`` event with the reason ``"implanted"``.
        """
        if self.state is not None:
            raise IllegalTransitionError(f"slot {self.slot_id!r}: implant into {self.stage.name}")
        if self.channels is None:
            raise RuntimeError(f"slot {self.slot_id!r}: width unknown; run a forward pass first")
        seed = self._build_seed(blueprint)
        state = SeedState(seed_id or f"{self.slot_id}:seed{self.seeds_germinated}", blueprint,
                          stage=SeedStage.FOSSILIZED, previous_stage=SeedStage.DORMANT)
        state.history.append(StageEvent(int(SeedStage.DORMANT), int(SeedStage.FOSSILIZED), 0,
                                        "implanted"))
        state.metrics.seed_params = sum(p.numel() for p in seed.parameters())
        self.seed, self.state, self.blend, self.gate = seed, state, BlendConfig(), None
        self.alpha_controller = AlphaController()
        self.alpha_controller.snap(1.0)
        self.seeds_germinated += 1

    def advance(self) -> GateResult:
        """Try the gate into the next stage (G1, G2 or G3); the stage moves only if it passes."""
        state = self._require(SeedStage.GERMINATED, SeedStage.TRAINING, SeedStage.BLENDING)
        target = default_successor(state.stage)
        assert target is not None
        result = self.gates.check(target, state, self._alpha_view(),
                                  incubation=self._spec(state.blueprint).incubation)
        state.last_gate = result
        if result.passed:
            self._enter(target, result.message)
        return result

    def fossilize(self) -> GateResult:
        """Try G5 from HOLDING; a fossilized seed stays at alpha 1 for good."""
        state = self._require(SeedStage.HOLDING)
        result = self.gates.check(SeedStage.FOSSILIZED, state, self._alpha_view(),
                                  incubation=self._spec(state.blueprint).incubation)
        state.last_gate = result
        if result.passed:
            state.transition(SeedStage.FOSSILIZED, result.message)
            self.alpha_controller.snap(1.0)
        return result

    def set_alpha_target(
        self,
        target: float,
        steps: int,
        curve: AlphaCurve = AlphaCurve.LINEAR,
        steepness: float = 12.0,
        algorithm: AlphaAlgorithm | None = None,
    ) -> None:
        """Retarget a BLENDING or HOLDING seed (alpha must be holding)."""
        state = self._require(SeedStage.BLENDING, SeedStage.HOLDING)
        if self.alpha_controller.mode != AlphaMode.HOLD:
            raise IllegalTransitionError(f"slot {self.slot_id!r}: retarget while alpha ramps")
        if not 0.0 < target <= 1.0:
            raise ValueError(f"alpha target must be in (0, 1], got {target}")
        if state.stage == SeedStage.HOLDING and target < 1.0 - ALPHA_TOLERANCE:
            state.transition(SeedStage.BLENDING, "retarget")
        if algorithm is not None and self.blend is not None:
            self._switch_algorithm(AlphaAlgorithm(algorithm))
        self.alpha_controller.retarget(target, steps, curve, steepness)
        self._sync_freeze()

    def schedule_prune(
        self,
        steps: int,
        curve: AlphaCurve = AlphaCurve.LINEAR,
        steepness: float = 12.0,
        reason: str = "scheduled_prune",
    ) -> None:
        """Ramp alpha to 0 over ``steps`` ticks with the seed frozen, then prune. Instant when
        ``steps <= 0`` or alpha is already 0."""
        state = self._require(*LIVE_STAGES)
        if steps <= 0 or self.alpha <= ALPHA_TOLERANCE:
            self.prune(reason)
            return
        if self.alpha_controller.mode != AlphaMode.HOLD:
            raise IllegalTransitionError(f"slot {self.slot_id!r}: prune while alpha ramps")
        if state.stage == SeedStage.HOLDING:
            state.transition(SeedStage.BLENDING, reason)
        state.prune_reason = reason
        self.alpha_controller.retarget(0.0, steps, curve, steepness)
        self._sync_freeze()

    def prune(self, reason: str) -> None:
        """Remove the seed now. The state stays for the embargo; fossilized seeds are permanent."""
        state = self._require(*LIVE_STAGES)
        self._unfreeze()
        state.prune_reason = reason
        state.transition(SeedStage.PRUNED, reason)
        self.seed = None
        self.gate = None
        self._nonfinite = None  # the removed seed's
        self.alpha_controller = AlphaController()

    def tick(self) -> None:
        """Advance this slot by one epoch: counters, alpha ramp, embargo. Call once per epoch."""
        state = self.state
        if state is None:
            return
        if state.tick(self.embargo_ticks):
            self.state, self.blend = None, None
            return
        ramp_done = state.stage == SeedStage.BLENDING and self.alpha_controller.step()
        if ramp_done and self.alpha_controller.target <= ALPHA_TOLERANCE:
            self.prune(state.prune_reason or "scheduled_prune")
        self._sync_freeze()

    # --- measurements -------------------------------------------------------------------------
    def record_accuracy(self, accuracy: float) -> None:
        """Record the host's validation accuracy (percent) for a seed that is present."""
        if self.state is not None and self.seed is not None:
            self.state.metrics.record_accuracy(float(accuracy))

    def record_contribution(self, contribution: float,
                            standard_error: float | None = None) -> None:
        """Record acc(current alphas) − acc(this slot's alpha = 0), in percentage points, and
        its standard error over the validation examples where it is known."""
        if self.state is None or self.seed is None:
            raise IllegalTransitionError(f"slot {self.slot_id!r}: contribution without a seed")
        error = None if standard_error is None else float(standard_error)
        self.state.metrics.record_contribution(float(contribution), error)

    def capture_gradient_stats(
        self, host_grad_norm: float | None = None, host_params: int | None = None
    ) -> None:
        """Measure the seed's gradients (call after backward, before clipping).

        Health = clamp01(1 − 0.5·frac_vanishing − 0.8·frac_exploding), 0 if any norm is
        non-finite. With the host's gradient norm the param-normalised ratio
        ``(‖g_seed‖/‖g_host‖)·sqrt(P_host/P_seed)`` is tracked as an EMA.
        """
        if self.state is None:
            return
        grads = [p.grad for p in self.seed_parameters() if p.grad is not None]
        record_gradient_stats(self.state.metrics, grads, host_grad_norm, host_params)

    def seed_parameters(self) -> list[nn.Parameter]:
        """Parameters owned by the seed (and its gate), in a stable order."""
        params: list[nn.Parameter] = []
        for module in (self.seed, self.gate):
            if module is not None:
                params.extend(module.parameters())
        return params

    def report(self) -> SlotReport:
        state, ctrl, blend = self.state, self.alpha_controller, self.blend
        return SlotReport(
            slot_id=self.slot_id,
            stage=self.stage,
            seed_id=None if state is None else state.seed_id,
            blueprint=None if state is None else state.blueprint,
            alpha=ctrl.alpha,
            alpha_target=ctrl.target,
            alpha_mode=ctrl.mode,
            alpha_steps_total=ctrl.steps_total,
            alpha_steps_done=ctrl.steps_done,
            alpha_curve=ctrl.curve,
            alpha_velocity=ctrl.velocity,
            algorithm=None if blend is None else blend.algorithm,
            tempo=None if blend is None else blend.tempo,
            previous_stage=SeedStage.UNKNOWN if state is None else state.previous_stage,
            previous_epochs_in_stage=0 if state is None else state.previous_epochs_in_stage,
            # A copy of scalars (every field is a number, a bool or None), not asdict's deep copy.
            metrics=SeedMetrics() if state is None else dataclasses.replace(state.metrics),
            last_gate=None if state is None else state.last_gate,
            prune_reason=None if state is None else state.prune_reason,
            history=() if state is None else tuple(state.history),
            growth_blocks=0 if self.growth is None else self.growth.blocks,
            incubation=self.gates.config.min_training_epochs,
            blend_ticks=self.blend_ticks,
        )

    # --- state --------------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """Everything needed to rebuild this slot's seed (plain data, no tensors)."""
        return {
            "version": MANIFEST_VERSION,
            "slot_id": self.slot_id,
            "channels": self.channels,
            "topology": self.topology,
            "blend_gradient": self.blend_gradient,
            "growth": None if self.growth is None else {
                "blocks": self.growth.blocks, "identity": self.identity_mode,
                "place": self.growth_place},
            "gate_mode": self.gates.mode.value,
            "gate_config": self.gates.config.to_dict(),
            "seeds_germinated": self.seeds_germinated,
            "state": None if self.state is None else self.state.to_dict(),
            "blend": None if self.blend is None else self.blend.to_dict(),
            "alpha": self.alpha_controller.state_dict(),
            "has_seed": self.seed is not None,
        }

    def load_manifest(self, manifest: dict[str, Any]) -> None:
        """Rebuild the seed modules the manifest describes (weights are loaded separately).

        An existing seed of the same blueprint and width is kept, so parameter identity (and any
        optimizer referencing it) survives an in-place restore.
        """
        check_manifest(manifest, self.slot_id, self.topology,
                       None if self.growth is None else self.growth.blocks)
        if self.growth is not None and manifest.get("growth") is not None:
            self._identity_mode = identity_of(manifest)
        old_blueprint = None if self.state is None else self.state.blueprint
        self._unfreeze()
        # An inferring slot adopts the saved topology.
        self.topology = manifest["topology"] or self.topology
        self.channels = manifest["channels"]
        self.blend_gradient = blend_gradient_of(manifest, self.topology, DEFAULT_BLEND_GRADIENT)
        self.seeds_germinated = manifest["seeds_germinated"]
        self.gates = QualityGates(manifest["gate_mode"], GateConfig(**manifest["gate_config"]))
        self.state = None if manifest["state"] is None else SeedState.from_dict(manifest["state"])
        self.blend = None if manifest["blend"] is None else BlendConfig.from_dict(manifest["blend"])
        self.alpha_controller = AlphaController()
        self.alpha_controller.load_state_dict(manifest["alpha"])
        if not manifest["has_seed"] or self.state is None:
            self.seed, self.gate = None, None
            return
        if self.seed is None or old_blueprint != self.state.blueprint:
            self.seed = self._build_seed(self.state.blueprint)
        needs_gate = self.blend is not None and self.blend.algorithm == AlphaAlgorithm.GATE
        if not needs_gate:
            self.gate = None
        elif self.gate is None:
            self.gate = self._build_gate()
        self._sync_freeze()

    def get_extra_state(self) -> dict[str, Any]:
        return self.manifest()

    def set_extra_state(self, state: dict[str, Any]) -> None:
        # Called by load_state_dict before the children load, so rebuilt seeds receive weights.
        self.load_manifest(state)

    def extra_repr(self) -> str:
        seed = "empty" if self.state is None else f"{self.state.blueprint} {self.stage.name}"
        return f"{self.slot_id!r}, channels={self.channels}, {seed}, alpha={self.alpha:.3f}"

    # --- internals ----------------------------------------------------------------------------
    def _require(self, *stages: SeedStage) -> SeedState:
        if self.state is None or self.state.stage not in stages:
            allowed = ", ".join(s.name for s in stages)
            raise IllegalTransitionError(
                f"slot {self.slot_id!r}: operation needs stage in {{{allowed}}}, "
                f"stage is {self.stage.name}"
            )
        return self.state

    def _enter(self, target: SeedStage, reason: str) -> None:
        assert self.state is not None and self.blend is not None
        self.state.transition(target, reason)
        if target == SeedStage.BLENDING:
            b = self.blend
            self.alpha_controller.retarget(b.alpha_target, b.tempo, b.curve, b.steepness)
        elif target == SeedStage.HOLDING:
            self.alpha_controller.snap(1.0)

    def _build_seed(self, blueprint: str) -> nn.Module:
        if self.channels is None:
            raise RuntimeError(f"slot {self.slot_id!r}: width unknown")
        error = self.context_error(blueprint)
        if error is not None:
            raise ValueError(f"slot {self.slot_id!r}: {error}")
        return blueprints.build(
            blueprint,
            self.channels,
            self.topology,
            device=self._anchor.device,
            dtype=self._anchor.dtype,
            context=self._context(),
            layer_scale=self.layer_scale_init,
        )

    def context_error(self, blueprint: str) -> str | None:
        """Why ``blueprint`` cannot grow in this slot for want of what it builds on (a growth
        seed outside a growth slot), or None."""
        error = blueprints.context_error(blueprint, self.topology or "", self._context())
        if error is None:
            return None
        return (f"{error}, and slot {self.slot_id!r} is not one; accepted: a growth slot "
                "(MorphogenesisCallback(growth=DepthGrowth(...)), or GPTHost's r1c*)")

    def _context(self) -> dict[str, Any]:
        site = self.growth
        if site is not None:  # what the seed's blocks need to know of this slot now
            site = dataclasses.replace(site, width=self.channels, identity=self.identity_mode)
        return {"growth": site}

    def seed_sources(self) -> dict[int, nn.Parameter]:
        """For a growth seed: the id of each of its parameters -> the parameter in the same
        place of the block it was made from (the optimizer puts each in its source's
        weight-decay group, and may start a copied one from its source's moments). Empty for
        any other seed, and for a gate."""
        state = self.state
        operator = None if state is None else operator_of(state.blueprint)
        if self.seed is None or self.growth is None or operator is None:
            return {}
        sources: dict[int, nn.Parameter] = {}
        for block, source in zip(self.seed, self.growth.sources(), strict=True):
            inner = block.block if isinstance(block, GatedBlock) else block
            by_name = dict(source.named_parameters())
            for name, p in inner.named_parameters():
                if name in by_name and by_name[name].shape == p.shape:
                    sources[id(p)] = by_name[name]
        return sources

    def incubation_epochs(self, blueprint: str) -> int:
        """Epochs a seed of ``blueprint`` trains here before G2 lets it blend: the blueprint's
        own incubation (0 for block seeds), else the gates' ``min_training_epochs``."""
        own = self._spec(blueprint).incubation
        return self.gates.config.min_training_epochs if own is None else own

    def _spec(self, blueprint: str) -> blueprints.BlueprintSpec:
        return blueprints.get_spec(blueprint, self.topology or "")

    def _build_gate(self) -> GatedBlend:
        assert self.channels is not None
        return GatedBlend(self.channels, self.topology).to(
            device=self._anchor.device, dtype=self._anchor.dtype
        )

    def _switch_algorithm(self, algorithm: AlphaAlgorithm) -> None:
        assert self.blend is not None
        if algorithm == self.blend.algorithm:
            return
        self.blend = BlendConfig(algorithm, self.blend.curve, self.blend.steepness,
                                 self.blend.tempo, self.blend.alpha_target)
        self.gate = self._build_gate() if algorithm == AlphaAlgorithm.GATE else None

    def _alpha_view(self) -> AlphaView:
        ctrl = self.alpha_controller
        return AlphaView(ctrl.alpha, ctrl.target, ctrl.mode == AlphaMode.HOLD)

    def _sync_freeze(self) -> None:
        """Freeze the seed while alpha ramps down (the host still gets gradients through it)."""
        if self.alpha_controller.mode == AlphaMode.DOWN:
            if not self._frozen:
                self._frozen = [p for p in self.seed_parameters() if p.requires_grad]
                for p in self._frozen:
                    p.requires_grad_(False)
        else:
            self._unfreeze()

    def _unfreeze(self) -> None:
        for p in self._frozen:
            p.requires_grad_(True)
        self._frozen = []


class _Incubator(torch.autograd.Function):
    """The TRAINING forward: ``h``'s value exactly, with the seed's output ``s`` in the graph.

    The backward gives the gradient reaching the output to ``h`` unchanged (the host's gradients
    are those of a host without the seed) and to ``s`` (the seed learns what the host's loss
    asks of this activation). Nothing is computed from ``s`` in the forward, so an inf or NaN
    seed output cannot reach the host's output (``h + (s − s)`` would be NaN there).
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, s: Tensor) -> Tensor:
        # A tensor of its own: a view of h would forbid the host's in-place ops after the slot
        # (ReLU(inplace=True)) on the output of a custom Function.
        return h.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        return (grad if ctx.needs_input_grad[0] else None,
                grad if ctx.needs_input_grad[1] else None)


def check_topology(topology: str | None) -> str | None:
    """``topology`` if it is one of `blueprints.TOPOLOGIES` or None (inferred), else a one-line
    `ValueError`."""
    if topology is not None and topology not in blueprints.TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; accepted: "
                         f"{', '.join(blueprints.TOPOLOGIES)} or None (inferred)")
    return topology


def check_layer_scale_init(value: Any) -> float | None:
    """``value`` as a float if it is a number >= 0 or None (the blueprints' own), else a
    one-line `ValueError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"layer_scale_init must be a number >= 0 or None, got {value!r}")
    return float(value)


def check_blend_gradient(value: Any, optional: bool = True) -> Any:
    """``value`` if it is one of `BLEND_GRADIENTS` (or None, where ``optional``: "keep the
    slots' own"), else a one-line `ValueError`."""
    if (value is None and optional) or value in BLEND_GRADIENTS:
        return value
    raise ValueError(f"unknown blend_gradient {value!r}; accepted: {', '.join(BLEND_GRADIENTS)}")


def _fan_out(h: Tensor, rows: int) -> Tensor:
    """Repeat the batch K times (configuration-major) when a per-sample alpha has K times as many
    rows: the fused counterfactual starts at the first slot it measures, so the host layers
    before it run once instead of K times."""
    batch = h.shape[0]
    if rows % batch != 0:
        raise ValueError(f"per-sample alpha has {rows} rows for a batch of {batch}")
    return h.repeat(rows // batch, *([1] * (h.dim() - 1)))


def _per_sample(alpha: Tensor, h: Tensor) -> Tensor:
    """Reshape a per-sample alpha ``[B]`` to broadcast against ``h``; pass others through."""
    alpha = alpha.to(device=h.device, dtype=h.dtype)
    if alpha.dim() == 1 and h.dim() > 1:
        return alpha.view(-1, *([1] * (h.dim() - 1)))
    return alpha


def host_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters of ``module`` that belong to the host, not to any seed (or its gate)."""
    seed_ids = {id(p) for slot in find_slots(module).values() for p in slot.seed_parameters()}
    return [p for p in module.parameters() if id(p) not in seed_ids]


def prune_live(slots: Iterable[SeedSlot], reason: str) -> list[str]:
    """Prune every live seed of ``slots`` now (a governor rollback); fossils stay. Returns the
    ids of the pruned slots."""
    pruned = [slot for slot in slots if slot.stage in LIVE_STAGES]
    for slot in pruned:
        slot.prune(reason)
    return [slot.slot_id for slot in pruned]


#: The forward hook that runs each slot injected after a module of a model it does not own
#: (`core.injection`): removed when the slot is attached again or handed back.
_SLOT_HOOKS: weakref.WeakKeyDictionary[SeedSlot, Any] = weakref.WeakKeyDictionary()


def set_slot_hook(slot: SeedSlot, handle: Any) -> None:
    """Record the hook ``handle`` that runs ``slot``, removing the one it replaces (a second
    fit attaches the same slot again: it must never run twice)."""
    remove_slot_hook(slot)
    _SLOT_HOOKS[slot] = handle


def remove_slot_hook(slot: SeedSlot) -> None:
    """Remove the hook that runs ``slot``, if it has one."""
    handle = _SLOT_HOOKS.pop(slot, None)
    if handle is not None:
        handle.remove()


def find_slots(module: nn.Module) -> dict[str, SeedSlot]:
    """All `SeedSlot` modules inside ``module`` keyed by slot id (ids must be unique)."""
    slots: dict[str, SeedSlot] = {}
    for _, child in module.named_modules():
        if isinstance(child, SeedSlot):
            if child.slot_id in slots:
                raise ValueError(f"duplicate slot id {child.slot_id!r}")
            slots[child.slot_id] = child
    return slots
