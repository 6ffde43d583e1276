"""The governor: a watchdog that detects divergence and rolls training back in place.

Framework-agnostic core shared by the Lightning ``GovernorCallback`` and the Fabric RL
environments, so nothing here imports Lightning. Two independent pieces:

* `Governor` reads losses and says *whether* to roll back (a reason string) — the rules of the
  upstream ``TolariaGovernor`` (reference/vectorized.md §4):

  1. a non-finite loss (train batch or validation) → ``"governor_nan"`` at once;
  2. **lobotomy**: after at least 10 healthy readings whose mean is below 0.6·ln(C), a validation
     loss within 0.065·ln(C) of ln(C) (the loss of a uniform guess over C classes) →
     ``"governor_lobotomy"`` at once;
  3. **divergence**: a validation loss above *all three* of the absolute threshold (12), the
     history mean + 6σ and 3× the history mean (history = last 20 healthy readings, rule active
     from 10 readings) is an anomaly; 3 consecutive anomalies → ``"governor_divergence"``.

* `take_snapshot` / `restore_snapshot` say *what* a rollback restores: CPU copies of the host and
  fossilized-seed weights, the slot manifests, the optimizer state keyed by parameter name and the
  grad scaler, written back in place so every Parameter object (and anything holding it: the
  optimizer, Lightning, a compiled graph) stays valid.

Rollback, in the order the engine carries it out::

    reason = governor.check_validation(val_loss, val_acc, num_classes=10)
    if reason is not None:
        engine.prune_live(reason)   # slot.prune(reason) + drops their optimizer groups/state
        restore_snapshot(snapshot, model, optimizer, scaler)
        governor.record_rollback()
    elif governor.should_snapshot(epoch):
        snapshot = take_snapshot(model, optimizer, scaler)

Memory: a snapshot costs one CPU copy of the host and fossilized-seed weights and buffers, plus one
CPU copy of their optimizer state (SGD with momentum: 1× the weights again; Adam: 2×). Live seeds
are never copied. Taking a snapshot replaces the previous one, so the caller holds at most two
during the swap. `Snapshot.nbytes` reports the exact figure.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from esper_lightning.lifecycle import LIVE_STAGES, SeedStage
from esper_lightning.slots import SeedSlot, find_slots

# --- thresholds (upstream TolariaGovernor, reference/vectorized.md §4) -------------------------
#: A validation loss must exceed this absolute value to count as an anomaly (upstream passes 12
#: for every task, although its constants file suggests 15 for TinyStories).
DEFAULT_ABSOLUTE_THRESHOLD = 12.0
#: "sensitivity": an anomaly must also exceed history mean + SIGMA · population std.
DEFAULT_SIGMA = 6.0
#: An anomaly must also exceed MULTIPLIER · history mean.
DEFAULT_MULTIPLIER = 3.0
#: "history_window": healthy validation losses kept for the statistics (oldest dropped first).
DEFAULT_HISTORY_LENGTH = 20
#: "MIN_GOVERNOR_HISTORY_SAMPLES": below this many readings nothing but NaN/Inf can panic.
DEFAULT_MIN_HISTORY = 10
#: "min_panics_before_rollback": consecutive anomalies needed for a divergence panic.
DEFAULT_CONSECUTIVE = 3
#: Lobotomy needs the history mean below this fraction of the random-guess loss ln(C) ...
DEFAULT_LOBOTOMY_MEAN_FRACTION = 0.6
#: ... and the new loss within this fraction of ln(C) of ln(C) (0.15 for CIFAR-10).
DEFAULT_LOBOTOMY_TOLERANCE = 0.065
#: Snapshot cadence in epochs (upstream: ``epoch % 5 == 0``, plus after every fossilize).
DEFAULT_SNAPSHOT_EVERY = 5
#: "death_penalty": the RL reward of a step that ends in a rollback is −penalty.
DEFAULT_ROLLBACK_PENALTY = 10.0

REASON_NAN = "governor_nan"
REASON_LOBOTOMY = "governor_lobotomy"
REASON_DIVERGENCE = "governor_divergence"
ROLLBACK_REASONS = (REASON_NAN, REASON_LOBOTOMY, REASON_DIVERGENCE)

STATE_VERSION = 1
# torch stores a module's get_extra_state() under "<module path>._extra_state".
_EXTRA_STATE_SUFFIX = "_extra_state"


# ================================================================================================
# Configuration
# ================================================================================================
@dataclass(frozen=True)
class GovernorConfig:
    """Thresholds of the governor; the defaults are upstream's (reference/vectorized.md §4).

    Args:
        absolute_threshold: an anomalous validation loss must exceed this value.
        sigma: ... and the history mean + ``sigma`` population standard deviations.
        multiplier: ... and ``multiplier`` × the history mean.
        history_length: healthy validation losses kept (a sliding window).
        min_history: readings needed before lobotomy and divergence are checked.
        consecutive: consecutive anomalies that make a divergence panic.
        lobotomy_mean_fraction: lobotomy needs history mean < fraction · ln(num_classes).
        lobotomy_tolerance: ... and ``|loss − ln(C)| < tolerance · ln(C)``.
        num_classes: C for the lobotomy rule when `Governor.check_validation` gets none; None
            turns the rule off (upstream assumes 10, which misfires on other tasks).
        snapshot_every: epochs between snapshots (`Governor.should_snapshot`).
        rollback_penalty: RL penalty of a rollback; the reward is ``-rollback_penalty``.

    Example:
        >>> GovernorConfig(num_classes=10).absolute_threshold
        12.0
        >>> GovernorConfig(sigma=-1.0)
        Traceback (most recent call last):
        ...
        ValueError: GovernorConfig.sigma must be a finite number > 0, got -1.0
    """

    absolute_threshold: float = DEFAULT_ABSOLUTE_THRESHOLD
    sigma: float = DEFAULT_SIGMA
    multiplier: float = DEFAULT_MULTIPLIER
    history_length: int = DEFAULT_HISTORY_LENGTH
    min_history: int = DEFAULT_MIN_HISTORY
    consecutive: int = DEFAULT_CONSECUTIVE
    lobotomy_mean_fraction: float = DEFAULT_LOBOTOMY_MEAN_FRACTION
    lobotomy_tolerance: float = DEFAULT_LOBOTOMY_TOLERANCE
    num_classes: int | None = None
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY
    rollback_penalty: float = DEFAULT_ROLLBACK_PENALTY

    def __post_init__(self) -> None:
        for name in ("absolute_threshold", "sigma", "multiplier"):
            _require_number(name, getattr(self, name), minimum=0.0, inclusive=False)
        _require_number("rollback_penalty", self.rollback_penalty, minimum=0.0, inclusive=True)
        _require_fraction("lobotomy_mean_fraction", self.lobotomy_mean_fraction)
        _require_fraction("lobotomy_tolerance", self.lobotomy_tolerance)
        # Two readings are the fewest that give a standard deviation at all.
        _require_int("min_history", self.min_history, minimum=2)
        _require_int("history_length", self.history_length, minimum=self.min_history)
        _require_int("consecutive", self.consecutive, minimum=1)
        _require_int("snapshot_every", self.snapshot_every, minimum=1)
        if self.num_classes is not None:
            _require_int("num_classes", self.num_classes, minimum=2)


def _require_number(name: str, value: Any, minimum: float, inclusive: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > minimum or (inclusive and value == minimum)):
        return
    bound = ">=" if inclusive else ">"
    raise ValueError(f"GovernorConfig.{name} must be a finite number {bound} {minimum:g}, "
                     f"got {value!r}")


def _require_fraction(name: str, value: Any) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and 0.0 < value <= 1.0):
        raise ValueError(f"GovernorConfig.{name} must be a number in (0, 1], got {value!r}")


def _require_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"GovernorConfig.{name} must be an int >= {minimum}, got {value!r}")


# ================================================================================================
# The watchdog
# ================================================================================================
class Governor:
    """Decides when training has gone wrong enough to roll back (no tensors, no model).

    History: only healthy validation losses enter the history. A panicking reading (NaN/Inf,
    lobotomy, or an anomaly, even one that has not yet made ``consecutive`` in a row) is never
    appended, so one bad epoch cannot inflate the mean and σ that later readings are judged
    against. After a rollback (`record_rollback`) the history is **kept**, as upstream does: the
    restored weights come from a snapshot whose losses are in that window, and clearing it would
    blind the divergence rule for ``min_history`` epochs, just when a second divergence is most
    likely. Only the consecutive-anomaly counter is reset. `reset` (a new episode) clears it all
    except the lifetime `rollbacks` counter.

    Args:
        config: thresholds; upstream defaults when None.

    Example:
        >>> governor = Governor(GovernorConfig(num_classes=10))
        >>> governor.check_train_loss(float("nan"))
        'governor_nan'
        >>> [governor.check_validation(1.0 + 0.01 * i) for i in range(12)][-1] is None
        True
        >>> [governor.check_validation(50.0) for _ in range(3)]
        [None, None, 'governor_divergence']
        >>> governor.record_rollback()
        >>> governor.rollbacks, governor.history[-1]
        (1, 1.11)
    """

    def __init__(self, config: GovernorConfig | None = None) -> None:
        self.config = config if config is not None else GovernorConfig()
        self._history: deque[float] = deque(maxlen=self.config.history_length)
        self._consecutive = 0
        self._rollbacks = 0
        self._last_reason: str | None = None
        self._last_panic_loss: float | None = None

    # --- read-only views ----------------------------------------------------------------------
    @property
    def history(self) -> tuple[float, ...]:
        """Healthy validation losses, oldest first."""
        return tuple(self._history)

    @property
    def consecutive_anomalies(self) -> int:
        return self._consecutive

    @property
    def rollbacks(self) -> int:
        """Rollbacks carried out over the governor's lifetime (logged as ``governor/rollbacks``)."""
        return self._rollbacks

    @property
    def last_reason(self) -> str | None:
        """Reason of the latest panic or pending anomaly; None after a healthy reading."""
        return self._last_reason

    @property
    def last_panic_loss(self) -> float | None:
        return self._last_panic_loss

    @property
    def rollback_reward(self) -> float:
        """The RL reward of a step that ends in a rollback (before any reward clipping)."""
        return -self.config.rollback_penalty

    # --- checks -------------------------------------------------------------------------------
    def check_train_loss(self, loss: float) -> str | None:
        """Check one training batch loss: only non-finite values panic.

        The statistical rules need a per-epoch signal, so they run on the validation loss only;
        batch losses are far too noisy for a 6σ test and never enter the history.
        """
        loss = float(loss)
        if math.isfinite(loss):
            return None
        return self._panic(REASON_NAN, loss)

    def check_validation(
        self,
        val_loss: float,
        val_accuracy: float | None = None,
        num_classes: int | None = None,
    ) -> str | None:
        """Check the epoch's validation loss; returns a rollback reason or None.

        Args:
            val_loss: mean validation loss of the epoch.
            val_accuracy: only checked for being finite (a NaN accuracy means NaN logits).
            num_classes: classes (or vocabulary size) for the lobotomy rule; overrides
                ``config.num_classes``; the rule is off when both are None.
        """
        loss = float(val_loss)
        if not math.isfinite(loss):
            return self._panic(REASON_NAN, loss)
        if val_accuracy is not None and not math.isfinite(float(val_accuracy)):
            return self._panic(REASON_NAN, loss)
        if len(self._history) < self.config.min_history:
            self._healthy(loss)
            return None
        if self._is_lobotomy(loss, num_classes):
            return self._panic(REASON_LOBOTOMY, loss)
        if not self._is_anomaly(loss):
            self._healthy(loss)
            return None
        self._consecutive += 1
        self._last_reason, self._last_panic_loss = REASON_DIVERGENCE, loss
        if self._consecutive >= self.config.consecutive:
            return REASON_DIVERGENCE
        return None

    def _is_lobotomy(self, loss: float, num_classes: int | None) -> bool:
        classes = num_classes if num_classes is not None else self.config.num_classes
        if classes is None:
            return False
        if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {classes!r}")
        # ln(C): the cross-entropy of a uniform guess, what a network outputs once "lobotomized".
        guess = math.log(classes)
        mean = sum(self._history) / len(self._history)
        was_learning = mean < self.config.lobotomy_mean_fraction * guess
        return was_learning and abs(loss - guess) < self.config.lobotomy_tolerance * guess

    def _is_anomaly(self, loss: float) -> bool:
        cfg, history = self.config, self._history
        mean = sum(history) / len(history)
        std = math.sqrt(sum((x - mean) ** 2 for x in history) / len(history))  # population σ
        # All three must hold: the absolute bar ignores noisy runs at a low loss, the σ bar
        # ignores noisy histories, the multiplier ignores flat histories where σ ≈ 0.
        return (
            loss > cfg.absolute_threshold
            and loss > mean + cfg.sigma * std
            and loss > cfg.multiplier * mean
        )

    def _healthy(self, loss: float) -> None:
        self._history.append(loss)
        self._consecutive = 0
        self._last_reason = None

    def _panic(self, reason: str, loss: float) -> str:
        # Immediate panics jump the counter to the rollback level, as upstream does, so a
        # caller that does not roll back still gets a divergence on the next anomaly.
        self._consecutive = self.config.consecutive
        self._last_reason, self._last_panic_loss = reason, loss
        return reason

    # --- bookkeeping --------------------------------------------------------------------------
    def record_rollback(self) -> None:
        """Count a rollback the caller carried out; the history is kept (see class docstring)."""
        self._rollbacks += 1
        self._consecutive = 0
        self._last_reason = None

    def should_snapshot(self, epoch: int, fossilized: bool = False) -> bool:
        """Whether to take a snapshot after a healthy check at ``epoch`` (every
        ``snapshot_every`` epochs, and after a successful fossilize so the new fossil is kept)."""
        return fossilized or epoch % self.config.snapshot_every == 0

    def reset(self) -> None:
        """Forget all readings and panic state (new episode); `rollbacks` is a lifetime total."""
        self._history.clear()
        self._consecutive = 0
        self._last_reason = None
        self._last_panic_loss = None

    # --- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain data (floats, ints, strings, None), loadable with ``weights_only=True``.

        The config is not included: build the governor with the same config before loading.
        """
        return {
            "version": STATE_VERSION,
            "history": [float(x) for x in self._history],
            "consecutive": self._consecutive,
            "rollbacks": self._rollbacks,
            "last_reason": self._last_reason,
            "last_panic_loss": self._last_panic_loss,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        expected = {"version", "history", "consecutive", "rollbacks", "last_reason",
                    "last_panic_loss"}
        if set(state) != expected:
            raise ValueError(f"governor state keys {sorted(state)}; expected {sorted(expected)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"governor state version {state['version']!r}; "
                             f"accepted: {STATE_VERSION}")
        history = [float(x) for x in state["history"]]
        if len(history) > self.config.history_length or not all(map(math.isfinite, history)):
            raise ValueError(f"governor history must hold <= {self.config.history_length} finite "
                             f"losses, got {len(history)} values")
        if state["last_reason"] not in (None, *ROLLBACK_REASONS):
            raise ValueError(f"governor last_reason {state['last_reason']!r}; "
                             f"accepted: None or one of {ROLLBACK_REASONS}")
        self._history = deque(history, maxlen=self.config.history_length)
        self._consecutive = int(state["consecutive"])
        self._rollbacks = int(state["rollbacks"])
        self._last_reason = state["last_reason"]
        panic = state["last_panic_loss"]
        self._last_panic_loss = None if panic is None else float(panic)


# ================================================================================================
# Snapshots
# ================================================================================================
class SnapshotMismatchError(RuntimeError):
    """The model no longer has the structure a snapshot was taken from."""


@dataclass(frozen=True)
class Snapshot:
    """An in-memory, CPU-resident last-known-good state (see `take_snapshot`).

    Attributes:
        tensors: state_dict key → CPU copy, host and fossilized seeds only.
        extra_states: state_dict key → copy of the extra state of non-slot modules.
        manifests: slot id → `SeedSlot.manifest()` at snapshot time (for the engine and logs;
            `restore_snapshot` only uses them to check fossils are still there).
        excluded_prefixes: state_dict key prefixes left out (live seeds, plus ``exclude``).
        optimizer_state: parameter name → optimizer state with tensors on the CPU; None when
            no optimizer was given.
        cpu_state_keys: (parameter name, state key) of state tensors that lived on the CPU while
            their parameter did not (Adam's ``step``), restored to the CPU rather than moved.
        param_groups: group ``"name"`` → hyperparameters (every key but ``"params"``).
        scaler_state: ``scaler.state_dict()``, or None when no scaler was given.
    """

    tensors: dict[str, Tensor]
    extra_states: dict[str, Any]
    manifests: dict[str, dict[str, Any]]
    excluded_prefixes: frozenset[str]
    optimizer_state: dict[str, dict[str, Any]] | None = None
    cpu_state_keys: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    param_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    scaler_state: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the snapshot's tensors (weights, buffers and optimizer state)."""
        total = sum(t.numel() * t.element_size() for t in self.tensors.values())
        for entry in (self.optimizer_state or {}).values():
            total += sum(v.numel() * v.element_size() for v in entry.values()
                         if isinstance(v, Tensor))
        return total


def live_seed_prefixes(model: nn.Module) -> set[str]:
    """State_dict key prefixes of seeds a rollback prunes (stage in `LIVE_STAGES`).

    Example:
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 1), SeedSlot("a", channels=8))
        >>> _ = model[1].germinate("conv_light")
        >>> sorted(live_seed_prefixes(model))
        ['1.gate.', '1.seed.']
    """
    prefixes: set[str] = set()
    # remove_duplicate=False: a module reachable under two paths appears in state_dict twice.
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, SeedSlot) and module.stage in LIVE_STAGES:
            prefixes.update(_seed_prefixes(name))
    return prefixes


def take_snapshot(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any | None = None,
    exclude: Iterable[str] | None = None,
) -> Snapshot:
    """Capture CPU copies of everything a rollback restores; live seeds are left out.

    Args:
        model: the host, containing `SeedSlot` modules (or none).
        optimizer: its state is captured per parameter *name*, because the engine adds and
            removes seed param groups, which shifts the index-based keys of
            ``optimizer.state_dict()``. Every optimized parameter must belong to ``model``.
        scaler: anything with ``state_dict()`` / ``load_state_dict()`` (``torch.amp.GradScaler``).
        exclude: extra state_dict key prefixes to leave out (e.g. ``["head."]``).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        >>> snap = take_snapshot(model, opt)
        >>> sorted(snap.tensors), snap.tensors["0.weight"].device.type
        (['0.bias', '0.weight'], 'cpu')
    """
    if isinstance(exclude, str):
        raise TypeError(f"exclude must be a collection of key prefixes, got the string {exclude!r}")
    excluded = frozenset(live_seed_prefixes(model) | set(exclude or ()))
    owners = _extra_state_owners(model)
    tensors: dict[str, Tensor] = {}
    extra_states: dict[str, Any] = {}
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if _under(key, excluded):
                continue
            owner = owners.get(key)
            if owner is None:
                tensors[key] = _cpu_copy(value)
            elif not isinstance(owner, SeedSlot):  # slot extra state = manifest, kept below
                extra_states[key] = _cpu_copy(value)
    manifests = {sid: copy.deepcopy(slot.manifest()) for sid, slot in find_slots(model).items()}
    snapshot = Snapshot(tensors, extra_states, manifests, excluded)
    if optimizer is not None:
        state, cpu_keys, groups = _capture_optimizer(model, optimizer, excluded)
        snapshot = replace(snapshot, optimizer_state=state, cpu_state_keys=cpu_keys,
                            param_groups=groups)
    if scaler is not None:
        snapshot = replace(snapshot, scaler_state=copy.deepcopy(scaler.state_dict()))
    return snapshot


def restore_snapshot(
    snapshot: Snapshot,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any | None = None,
    *,
    restore_hyperparameters: bool = False,
) -> None:
    """Write ``snapshot`` back into ``model`` (and optimizer, scaler) in place.

    Expected order: the engine first prunes every live seed (``slot.prune(reason)``) and removes
    their optimizer param groups and state, then calls this. Seeds are never pruned here (that is
    lifecycle bookkeeping the engine owns, with its events and embargo), and slot manifests are not
    loaded back (that would resurrect the pruned seeds).

    Every captured key is copied into the existing Parameter or buffer (``copy_`` under no_grad),
    so parameter identity is kept. The optimizer state is replaced by exactly the snapshot's: the
    captured entries are re-attached to the current Parameter objects (moved to each parameter's
    device); every other parameter's state is cleared — which also drops momentum that would push
    the restored weights straight back towards the divergence. The snapshot itself is not consumed
    and can be restored again.

    Args:
        snapshot: from `take_snapshot`.
        model: the same model, live seeds pruned.
        optimizer: restores the captured optimizer state (the snapshot must hold one).
        scaler: restores the captured grad-scaler state (the snapshot must hold one).
        restore_hyperparameters: also write back the hyperparameters (lr, momentum, ...) of
            named param groups. Off by default: LR schedulers are not part of the snapshot and
            keep their own step count, so rewinding their learning rates would shift the schedule.

    Raises:
        SnapshotMismatchError: a captured key is missing from the model (for example a
            fossilized seed disappeared), a shape changed, the model has state the snapshot
            neither captured nor excluded, or a captured parameter is no longer optimized.
            Nothing is modified when this is raised.
        ValueError: an optimizer or scaler is given but the snapshot did not capture one.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> snap = take_snapshot(model)
        >>> weight = model[0].weight
        >>> with torch.no_grad():
        ...     _ = weight.add_(1.0)
        >>> restore_snapshot(snap, model)
        >>> model[0].weight is weight and torch.equal(weight, snap.tensors["0.weight"])
        True
    """
    if optimizer is not None and snapshot.optimizer_state is None:
        raise ValueError("restore_snapshot got an optimizer but the snapshot holds no optimizer "
                         "state; pass the optimizer to take_snapshot")
    if scaler is not None and snapshot.scaler_state is None:
        raise ValueError("restore_snapshot got a scaler but the snapshot holds no scaler state; "
                         "pass the scaler to take_snapshot")
    current = model.state_dict(keep_vars=True)
    # Validate everything before touching anything, so a mismatch leaves the run intact.
    _check_model(snapshot, model, current)
    targets = None if optimizer is None else _check_optimizer(snapshot, model, optimizer)
    _restore_model(snapshot, model, current)
    if optimizer is not None and targets is not None:
        _restore_optimizer(snapshot, optimizer, targets)
        if restore_hyperparameters:
            _restore_hyperparameters(snapshot, optimizer)
    if scaler is not None:
        scaler.load_state_dict(copy.deepcopy(snapshot.scaler_state))


# --- snapshot internals ------------------------------------------------------------------------
def _seed_prefixes(slot_path: str) -> tuple[str, str]:
    base = f"{slot_path}." if slot_path else ""
    return f"{base}seed.", f"{base}gate."


def _under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key.startswith(prefix) for prefix in prefixes)


def _extra_state_owners(model: nn.Module) -> dict[str, nn.Module]:
    """state_dict key → module, for every module that defines its own extra state."""
    owners: dict[str, nn.Module] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if type(module).get_extra_state is not nn.Module.get_extra_state:
            owners[f"{name}.{_EXTRA_STATE_SUFFIX}" if name else _EXTRA_STATE_SUFFIX] = module
    return owners


def _cpu_copy(value: Any) -> Any:
    """A CPU copy that shares no storage with ``value`` (tensors nested in containers too)."""
    if isinstance(value, Tensor):
        # to(copy=True) copies straight to the CPU; clone().cpu() would first clone on the GPU.
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


def _capture_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, excluded: frozenset[str]
) -> tuple[dict[str, dict[str, Any]], frozenset[tuple[str, str]], dict[str, dict[str, Any]]]:
    names = {param: name for name, param in model.named_parameters()}
    state: dict[str, dict[str, Any]] = {}
    cpu_keys: set[tuple[str, str]] = set()
    groups: dict[str, dict[str, Any]] = {}
    for group in optimizer.param_groups:
        kept = 0
        for param in group["params"]:
            name = names.get(param)
            if name is None:
                raise ValueError(f"optimizer parameter of shape {tuple(param.shape)} is not a "
                                 "parameter of the model; the governor snapshots model parameters "
                                 "only")
            if _under(name, excluded):
                continue
            kept += 1
            entry = optimizer.state.get(param)
            if entry:
                state[name] = _cpu_copy(dict(entry))
                cpu_keys.update((name, k) for k, v in entry.items() if _stays_on_cpu(v, param))
        if "name" in group and (kept or not group["params"]):
            if group["name"] in groups:
                raise ValueError(f"two optimizer param groups are named {group['name']!r}; "
                                 "group names must be unique")
            groups[group["name"]] = {k: _cpu_copy(v) for k, v in group.items() if k != "params"}
    return state, frozenset(cpu_keys), groups


def _stays_on_cpu(value: Any, param: Tensor) -> bool:
    # Optimizers keep some scalars (Adam's non-capturable ``step``) on the CPU on purpose.
    return isinstance(value, Tensor) and value.device.type == "cpu" and param.device.type != "cpu"


def _check_model(snapshot: Snapshot, model: nn.Module, current: dict[str, Any]) -> None:
    captured = snapshot.tensors.keys() | snapshot.extra_states.keys()
    missing = sorted(k for k in captured if k not in current)
    if missing:
        raise SnapshotMismatchError(
            f"{len(missing)} captured key(s) missing from the model, e.g. {missing[:3]}: a host "
            "module or fossilized seed present at snapshot time is gone"
        )
    for key, saved in snapshot.tensors.items():
        if current[key].shape != saved.shape:
            raise SnapshotMismatchError(f"{key!r} has shape {tuple(current[key].shape)}, "
                                        f"snapshot has {tuple(saved.shape)}")
    _check_unexpected(snapshot, model, current, captured)
    _check_fossils(snapshot, model)


def _check_unexpected(
    snapshot: Snapshot, model: nn.Module, current: dict[str, Any], captured: Iterable[str]
) -> None:
    # Allowed outside the snapshot: excluded prefixes and any seed (a fossil newer than the
    # snapshot keeps its current weights); slot extra state is the manifest, not restored.
    allowed = set(snapshot.excluded_prefixes)
    slot_extra: set[str] = set()
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, SeedSlot):
            allowed.update(_seed_prefixes(name))
            slot_extra.add(f"{name}.{_EXTRA_STATE_SUFFIX}" if name else _EXTRA_STATE_SUFFIX)
    captured = set(captured)
    unexpected = sorted(k for k in current
                        if k not in captured and k not in slot_extra and not _under(k, allowed))
    if unexpected:
        raise SnapshotMismatchError(
            f"{len(unexpected)} model key(s) not in the snapshot, e.g. {unexpected[:3]}: the "
            "model gained state outside its seeds since the snapshot"
        )


def _check_fossils(snapshot: Snapshot, model: nn.Module) -> None:
    slots = find_slots(model)
    for slot_id, manifest in snapshot.manifests.items():
        state = manifest["state"]
        if state is None or state["stage"] != int(SeedStage.FOSSILIZED):
            continue
        slot = slots.get(slot_id)
        now = None if slot is None else slot.state
        if now is None or now.stage != SeedStage.FOSSILIZED or now.seed_id != state["seed_id"]:
            found = "no slot" if slot is None else f"stage {slot.stage.name}"
            raise SnapshotMismatchError(
                f"slot {slot_id!r}: fossilized seed {state['seed_id']!r} of the snapshot is gone "
                f"({found}); fossils are permanent and must survive until restore"
            )


def _check_optimizer(
    snapshot: Snapshot, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, nn.Parameter]:
    params = dict(model.named_parameters())
    optimized = {p for group in optimizer.param_groups for p in group["params"]}
    targets: dict[str, nn.Parameter] = {}
    for name in snapshot.optimizer_state or {}:
        param = params.get(name)
        if param is None or param not in optimized:
            where = "is not in the model" if param is None else "is in no optimizer param group"
            raise SnapshotMismatchError(f"optimizer state of parameter {name!r} was captured but "
                                        f"the parameter {where}")
        targets[name] = param
    return targets


def _restore_model(snapshot: Snapshot, model: nn.Module, current: dict[str, Any]) -> None:
    with torch.no_grad():
        for key, saved in snapshot.tensors.items():
            current[key].copy_(saved)  # in place: the Parameter object stays the same
    owners = _extra_state_owners(model)
    for key, saved in snapshot.extra_states.items():
        owners[key].set_extra_state(copy.deepcopy(saved))


def _restore_optimizer(
    snapshot: Snapshot, optimizer: torch.optim.Optimizer, targets: dict[str, nn.Parameter]
) -> None:
    # Mutate optimizer.state in place: wrappers (LightningOptimizer) share this very object.
    optimizer.state.clear()
    for name, entry in (snapshot.optimizer_state or {}).items():
        param = targets[name]
        optimizer.state[param] = {
            key: _to_param_device(value, param, (name, key) in snapshot.cpu_state_keys)
            for key, value in entry.items()
        }


def _to_param_device(value: Any, param: Tensor, stay_on_cpu: bool) -> Any:
    if not isinstance(value, Tensor):
        return copy.deepcopy(value)
    device = torch.device("cpu") if stay_on_cpu else param.device
    return value.to(device, copy=True)  # a copy, so the snapshot can be restored again


def _restore_hyperparameters(snapshot: Snapshot, optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        saved = snapshot.param_groups.get(group.get("name"))
        if saved is None:
            continue
        for key, value in saved.items():
            if isinstance(group.get(key), Tensor) and isinstance(value, Tensor):
                group[key].copy_(value)  # tensor lr (capturable/fused): keep the object
            else:
                group[key] = copy.deepcopy(value)


__all__ = [
    "DEFAULT_ABSOLUTE_THRESHOLD",
    "DEFAULT_CONSECUTIVE",
    "DEFAULT_HISTORY_LENGTH",
    "DEFAULT_LOBOTOMY_MEAN_FRACTION",
    "DEFAULT_LOBOTOMY_TOLERANCE",
    "DEFAULT_MIN_HISTORY",
    "DEFAULT_MULTIPLIER",
    "DEFAULT_ROLLBACK_PENALTY",
    "DEFAULT_SIGMA",
    "DEFAULT_SNAPSHOT_EVERY",
    "REASON_DIVERGENCE",
    "REASON_LOBOTOMY",
    "REASON_NAN",
    "ROLLBACK_REASONS",
    "Governor",
    "GovernorConfig",
    "Snapshot",
    "SnapshotMismatchError",
    "live_seed_prefixes",
    "restore_snapshot",
    "take_snapshot",
]
