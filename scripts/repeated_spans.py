"""Repeated random spans: a synthetic byte text that one attention layer cannot predict and two can.

Writes the text to a file for ``growth_pilot.py --data``: the pilot of a cheaper growth task
than Shakespeare (docs/evidence.md, "Learning when to grow": at width 32 and 64 no induction
formed within 6,000 steps, so the task was not used)::

    python scripts/repeated_spans.py spans.txt --tokens 2000000

The text is a chain of chunks; a chunk is a span of ``L`` symbols drawn uniformly from an
alphabet, then the same span again (``L`` uniform in ``[min_span, max_span]`` per chunk, no
separator). The first copy of a span is noise (``log2(symbols)`` bits per byte to any model);
the second copy is predictable by *induction*: find the earlier position holding the current
byte and copy the byte after it. Induction needs two attention layers (one writes each position's
previous byte into it, the next matches on it), and since ``L`` varies no fixed-offset head can
stand in for it, so a one-block GPT saturates well above the loss a two-block GPT reaches: a
task whose best depth — and whether and when growing pays — shows within seconds of training.

The text is fixed by ``rng_seed`` (every episode trains on the same text; episodes differ in
the order of the blocks they draw from it).

Example:
    >>> from repeated_spans import repeated_spans
    >>> tokens = repeated_spans(40, symbols=4, min_span=3, max_span=3, rng_seed=0)
    >>> text = bytes(tokens.tolist()).decode()
    >>> len(text), set(text) <= set("abcd")
    (40, True)
    >>> first, second = text[:3], text[3:6]  # the first chunk: a span of 3, then its copy
    >>> first == second
    True
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from esper_lightning.data.files import check_int

#: The symbols, as bytes: lower-case letters then digits, so a sample reads as text.
SPAN_ALPHABET = b"abcdefghijklmnopqrstuvwxyz0123456789"


def repeated_spans(n_tokens: int, *, symbols: int = 32, min_span: int = 4, max_span: int = 12,
                   rng_seed: int = 0) -> torch.Tensor:
    """``n_tokens`` bytes of repeated random spans (see the module docstring).

    Args:
        n_tokens: length of the text.
        symbols: alphabet size, the first ``symbols`` bytes of `SPAN_ALPHABET`.
        min_span, max_span: the span lengths drawn (inclusive).
        rng_seed: fixes the text.

    Returns:
        uint8 ``[n_tokens]`` CPU tensor.
    """
    check_int("n_tokens", n_tokens, 1)
    check_int("symbols", symbols, 2)
    if symbols > len(SPAN_ALPHABET):
        raise ValueError(f"symbols must be at most {len(SPAN_ALPHABET)}, got {symbols}")
    check_int("min_span", min_span, 1)
    check_int("max_span", max_span, min_span)
    gen = torch.Generator().manual_seed(rng_seed)
    chunks = n_tokens // (2 * min_span) + 1  # enough chunks to cover the text
    lengths = torch.randint(min_span, max_span + 1, (chunks,), generator=gen)
    span_start = torch.cumsum(lengths, 0) - lengths  # where each span sits in `draws`
    draws = torch.randint(0, symbols, (int(lengths.sum()),), generator=gen)
    chunk = torch.repeat_interleave(torch.arange(chunks), 2 * lengths)  # chunk of each byte
    offset = torch.arange(len(chunk)) - torch.repeat_interleave(2 * span_start, 2 * lengths)
    index = span_start[chunk] + offset % lengths[chunk]  # both copies read the same draws
    alphabet = torch.tensor(list(SPAN_ALPHABET[:symbols]), dtype=torch.uint8)
    return alphabet[draws[index[:n_tokens]]].clone()


def span_entropy_bits(symbols: int = 32) -> float:
    """Bits per byte of an ideal induction model, about: half the bytes are fresh draws
    (``log2(symbols)`` each), half are copies (nearly free). It ignores the first byte of each
    copy, which no model can tell from a fresh draw, and chance repeats inside a span."""
    return 0.5 * torch.log2(torch.tensor(float(symbols))).item()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="text file to write")
    parser.add_argument("--tokens", type=int, default=2_000_000, help="bytes of text")
    parser.add_argument("--symbols", type=int, default=32, help="alphabet size")
    parser.add_argument("--min-span", type=int, default=4)
    parser.add_argument("--max-span", type=int, default=12)
    parser.add_argument("--rng-seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokens = repeated_spans(args.tokens, symbols=args.symbols, min_span=args.min_span,
                            max_span=args.max_span, rng_seed=args.rng_seed)
    args.out.write_bytes(bytes(tokens.tolist()))
    print(f"{args.out}: {args.tokens:,} bytes; an induction model reaches about "
          f"{span_entropy_bits(args.symbols):.2f} bits per byte")


if __name__ == "__main__":
    main()
