"""Log lines that say where they come from: which env, episode and controller.

An env pool runs many hosts side by side and each host's engine logs its lifecycle events, so a
bare ``epoch 3: r0c1 germinated conv_light (policy)`` could come from any of them, decided by
anyone. After every reset the apps label each env's engine with `label_engine`; its lines then
read ``[round 2 env 3] epoch 3: r0c1 germinated conv_light (ppo)`` in a PPO run and
``[episode 4 env 1] epoch 3: r0c1 germinated conv_light (random)`` in a comparison.

Example:
    >>> class Engine:  # what `label_engine` needs: `MorphogenesisEngine.label`
    ...     def label(self, controller_name, log=None):
    ...         self.controller_name, self.log = controller_name, log
    >>> engine = Engine()
    >>> label_engine(engine, "random", episode=4, env=1)
    >>> engine.controller_name, engine.log.process("epoch 3: ...", {})[0]
    ('random', '[episode 4 env 1] epoch 3: ...')
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any, Protocol

#: The logger the engine's event lines come from.
ENGINE_LOGGER = "esper_lightning.core.engine"


class _Labelled(Protocol):
    def label(self, controller_name: str,
              log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None
              ) -> None: ...


class WhereAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every message with ``[<where>]`` (``extra["where"]``)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]
                ) -> tuple[Any, MutableMapping[str, Any]]:
        return f"[{self.extra['where']}] {msg}", kwargs  # type: ignore[index]


def where(**parts: object) -> str:
    """``round 2 env 3``: the parts given, in order, None ones left out."""
    return " ".join(f"{name} {value}" for name, value in parts.items() if value is not None)


def label_engine(engine: _Labelled, controller: str, **parts: object) -> None:
    """Label ``engine``'s event lines: its events are caused by ``controller`` (``(random)``)
    and each line says ``where(**parts)`` it happened (``[episode 4 env 1]``). Call it after
    each reset: a reset builds a new engine."""
    engine.label(controller, labelled(logging.getLogger(ENGINE_LOGGER), **parts))


def labelled(logger: logging.Logger, **parts: object) -> WhereAdapter:
    """``logger`` with ``where(**parts)`` in front of every line (an app's own lines about one
    env, episode or controller)."""
    return WhereAdapter(logger, {"where": where(**parts)})
