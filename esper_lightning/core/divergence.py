"""The governor's divergence rules: when has training gone wrong enough to roll back?

`Governor` reads losses and answers with a rollback reason or None; it holds no tensors and no
model. What a rollback restores lives in `snapshot.py`; who carries it out is the adapter (the
`GovernorCallback` in a Trainer, the env in the PPO pool). The rules, in the order checked:

1. a non-finite loss (train batch or validation) -> ``"governor_nan"`` at once;
2. **lobotomy**: after at least 10 healthy readings whose mean is below 0.6·ln(C), a validation
   loss within 0.065·ln(C) of ln(C) (the loss of a uniform guess over C classes) ->
   ``"governor_lobotomy"`` at once;
3. **divergence**: a validation loss above *all three* of the absolute threshold (12), the
   history mean + 6σ and 3× the history mean (history = last 20 healthy readings, rule active
   from 10 readings) is an anomaly; 3 consecutive anomalies -> ``"governor_divergence"``.

What an adapter does with the answer (the rollback itself is `rollback.roll_back`: prune live
seeds, restore the snapshot in place, drop the gradients, count it here)::

    reason = governor.check_validation(val_loss, num_classes=10)
    if reason is not None:
        roll_back(snapshot, model, governor, reason, prune=engine.prune_live, optimizer=optimizer,
                  scaler=scaler)
    elif governor.should_snapshot(epoch):
        snapshot = take_snapshot(model, optimizer, scaler)

The thresholds are those of the research code this project descends from (docs/design.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# --- thresholds -------------------------------------------------------------------------------
#: A validation loss must exceed this absolute value to count as an anomaly (the research code
#: used 12 for every task).
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
#: Snapshot cadence in epochs (``epoch % 5 == 0``, plus after every fossilize).
DEFAULT_SNAPSHOT_EVERY = 5

REASON_NAN = "governor_nan"
REASON_LOBOTOMY = "governor_lobotomy"
REASON_DIVERGENCE = "governor_divergence"
ROLLBACK_REASONS = (REASON_NAN, REASON_LOBOTOMY, REASON_DIVERGENCE)

STATE_VERSION = 1


# ================================================================================================
# Configuration
# ================================================================================================
@dataclass(frozen=True)
class GovernorConfig:
    """Thresholds of the governor's rules (defaults: the research code's, see docs/design.md).

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
            turns the rule off (assuming 10 classes would misfire on other tasks).
        snapshot_every: epochs between snapshots (`Governor.should_snapshot`).

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

    def __post_init__(self) -> None:
        for name in ("absolute_threshold", "sigma", "multiplier"):
            _require_number(name, getattr(self, name), minimum=0.0, inclusive=False)
        _require_fraction("lobotomy_mean_fraction", self.lobotomy_mean_fraction)
        _require_fraction("lobotomy_tolerance", self.lobotomy_tolerance)
        # Two readings are the fewest that give a standard deviation at all.
        _require_int("min_history", self.min_history, minimum=2)
        _require_int("history_length", self.history_length, minimum=self.min_history)
        _require_int("consecutive", self.consecutive, minimum=1)
        _require_int("snapshot_every", self.snapshot_every, minimum=1)
        check_num_classes(self.num_classes, "GovernorConfig.num_classes")


def check_num_classes(value: Any, name: str = "num_classes") -> int | None:
    """``value`` if it can drive the lobotomy rule (an int >= 2, the classes or vocabulary
    size) or is None (the rule is off); else a one-line `ValueError`."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 2):
        raise ValueError(f"{name} must be an int >= 2 (classes or vocabulary size) or None "
                         f"(lobotomy rule off), got {value!r}")
    return value


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
    against. After a rollback (`record_rollback`) the history is **kept**: the
    restored weights come from a snapshot whose losses are in that window, and clearing it would
    blind the divergence rule for ``min_history`` epochs, just when a second divergence is most
    likely. Only the consecutive-anomaly counter is reset. `reset` (a new episode) clears it all
    except the lifetime `rollbacks` counter.

    Args:
        config: thresholds; the defaults when None.

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
        if check_num_classes(classes) is None:
            return False
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
        # Immediate panics jump the counter to the rollback level, so a
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


