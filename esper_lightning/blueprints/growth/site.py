"""What a growth slot offers a depth-growth seed: the blocks it grows from and how they are called.

A *growth slot* sits right after a block of a stack of same-shape blocks (the user's own
``blocks``, Hugging Face's ``transformer.h`` or ``model.layers``, `GPTHost`'s blocks). Its
`GrowthSite` says how many blocks one seed there adds, which blocks they are made from (the
nearest ones before the slot, a block grown earlier in the same place included, so growth
chains), how the model initialises a block, and how the identity init makes a copy return its
input. `BlockCall` replays the call of the block the slot follows on each new block: the
hidden state changes, every other argument (attention mask, rotary position embeddings,
position ids) is the same, and a tuple output gives its first element.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

__all__ = ["MOMENTS", "BlockCall", "GrowthSite", "hidden_of"]

#: What the optimizer starts a copied block from: fresh moments, or the source block's.
MOMENTS = ("fresh", "copy")


def hidden_of(output: Any) -> Tensor:
    """The hidden state a block returned: the output itself, or the first element of a tuple
    (the Hugging Face convention: ``(hidden_states, attentions, ...)``).

    Raises:
        TypeError: One line naming what the block returned instead.
    """
    if isinstance(output, Tensor):
        return output
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0]
    raise TypeError(f"a block of a growing stack must return its hidden state (a tensor, or a "
                    f"tuple whose first element is one), got {type(output).__name__}")


def _is_cache(value: Any) -> bool:
    """A key-value cache (Hugging Face's `Cache` classes, by their interface)."""
    return callable(getattr(value, "get_seq_length", None))


@dataclass(frozen=True)
class BlockCall:
    """How a block was called, minus its hidden state: replayed on new blocks (`run`).

    A key-value cache is not passed on, and ``use_cache`` is False: a new block attends over
    the tokens of this call alone, which is exactly what a forward over whole sequences (every
    training and evaluation step) computes. A call that decodes with past tokens in its cache
    is refused in one line (hand the grown model back first: `core.depth.materialize`).

    Attributes:
        args: Positional arguments after the hidden state.
        kwargs: Keyword arguments (the hidden state's own keyword, if it came as one, removed).
        keyword: The keyword the hidden state came as, or None (the first positional argument).
    """

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    keyword: str | None = None

    @classmethod
    def of(cls, args: tuple[Any, ...], kwargs: Mapping[str, Any],
           keyword: str | None) -> BlockCall:
        """The call of a block that got ``args`` and ``kwargs``; ``keyword`` names the hidden
        state's parameter when it may come by keyword."""
        kwargs = dict(kwargs)
        if args:
            return cls(tuple(None if _is_cache(a) else a for a in args[1:]), _strip(kwargs))
        if keyword is None or keyword not in kwargs:
            raise TypeError("a block of a growing stack must get its hidden state as its first "
                            "argument")
        kwargs.pop(keyword)
        return cls((), _strip(kwargs), keyword)

    def check(self, hidden: Tensor) -> None:
        """Refuse a call that decodes past tokens from a cache (one line)."""
        for value in (*self.args, *self.kwargs.values()):
            if _is_cache(value) and value.get_seq_length() > hidden.shape[-2]:
                raise RuntimeError("a growth slot cannot decode with a key-value cache of past "
                                   "tokens; hand the grown model back first "
                                   "(esper_lightning.core.depth.materialize)")

    def run(self, block: nn.Module, hidden: Tensor) -> Tensor:
        """``block``'s hidden state for ``hidden`` under this call."""
        if self.keyword is not None:
            return hidden_of(block(*self.args, **{self.keyword: hidden}, **self.kwargs))
        return hidden_of(block(hidden, *self.args, **self.kwargs))


def _strip(kwargs: dict[str, Any]) -> dict[str, Any]:
    stripped = {k: (None if _is_cache(v) else v) for k, v in kwargs.items()}
    if "use_cache" in stripped:
        stripped["use_cache"] = False
    return stripped


@dataclass(frozen=True)
class GrowthSite:
    """Where a depth-growth seed grows.

    Attributes:
        blocks: New blocks one seed adds (>= 1).
        stack: The blocks before the slot in forward order, nearest last (the stack's blocks up
            to the one the slot follows, and the blocks grown in earlier slots at the same
            place; interleaved growth: the block the slot follows and its own earlier growth
            alone): what new blocks are made from.
        width: The slot's width ``D`` (a gate's size); set by the slot at germination.
        init: How the model initialises a block (the ``random`` operator), None: each
            submodule's own ``reset_parameters``.
        projections: Names (inside a block) of the residual branches' output projections the
            ``identity`` operator zeroes; None: found for the common layouts
            (`blueprints.growth.layouts`).
        gate: Whether ``identity`` may fall back to a zero-initialised gate on the block's
            residual update where zeroed projections do not make the identity.
        identity: How ``identity`` makes a copy the identity here, once checked on a real
            activation (``"projections"`` or ``"gate"``); None: decided from the layout.
        moments: ``"fresh"`` (a new block's optimizer moments start at zero) or ``"copy"``
            (a block made from a source's weights starts from the source's moments).
    """

    blocks: int
    stack: Callable[[], list[nn.Module]]
    width: int | None = None
    init: Callable[[nn.Module], None] | None = None
    projections: tuple[str, ...] | None = None
    gate: bool = True
    identity: str | None = None
    moments: str = "fresh"

    def __post_init__(self) -> None:
        if isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 1:
            raise ValueError(f"a growth site adds an int >= 1 of blocks, got {self.blocks!r}")
        if self.moments not in MOMENTS:
            raise ValueError(f"unknown moments {self.moments!r}; accepted: {', '.join(MOMENTS)}")

    def sources(self) -> list[nn.Module]:
        """The block each new block is made from, in order: the last ``blocks`` blocks of the
        stack, the stack repeated when it is shorter (one block grown to four: three copies of
        it; two grown to four: both, twice, in order).

        Raises:
            ValueError: The slot follows no block.
        """
        stack = self.stack()
        if not stack:
            raise ValueError("a growth slot follows no block")
        last = stack[-self.blocks:] if len(stack) >= self.blocks else stack
        return [last[i % len(last)] for i in range(self.blocks)]
