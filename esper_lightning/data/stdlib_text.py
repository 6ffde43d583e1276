"""A text no controller was tuned on, present on every machine: the Python standard library.

`write_stdlib_text` writes the source of the standard library's modules (``*.py`` under
``sysconfig``'s ``stdlib`` path, test suites, third-party packages and IDLE left out), file by
file in sorted path order, each preceded by a ``# file: <path>`` line, up to ``max_bytes``, so a
language-model task can be evaluated on a text unlike the one its controllers saw (plays),
without a download::

    python -m esper_lightning.data.stdlib_text stdlib.txt   # about 5 MB
    esper-lightning compare --preset lm-grow-cpu --data_dir stdlib.txt ...

The text depends on the Python version that wrote it (its modules change between releases):
the command prints its SHA-256 and the version, which a results table records beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DEFAULT_MAX_BYTES", "stdlib_source_files", "write_stdlib_text"]

#: About the size of the Shakespeare text the controllers learn on (5.06 MB).
DEFAULT_MAX_BYTES = 5_000_000
#: Folders under the standard library that are not its modules' source as shipped.
_LEFT_OUT = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib",
                       "__pycache__", "lib2to3"})


def stdlib_source_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's ``*.py`` files under ``root`` (None: this Python's), in sorted
    order of their path relative to it, without the folders of `_LEFT_OUT`."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    return sorted((p for p in base.rglob("*.py")
                   if p.is_file() and not _LEFT_OUT & set(p.relative_to(base).parts[:-1])),
                  key=lambda p: p.relative_to(base).as_posix())


def write_stdlib_text(out: str | Path, max_bytes: int = DEFAULT_MAX_BYTES,
                      root: str | Path | None = None) -> Path:
    """Write up to ``max_bytes`` of standard-library source to ``out`` (module docstring):
    whole files only, so the text ends at the end of a file.

    Raises:
        ValueError: ``max_bytes`` < 1, or no file of the library fits in it.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for path in stdlib_source_files(base):
        chunk = (f"# file: {path.relative_to(base).as_posix()}\n".encode()
                 + path.read_bytes().rstrip(b"\n") + b"\n\n")
        if size + len(chunk) > max_bytes:
            break
        parts.append(chunk)
        size += len(chunk)
    if not parts:
        raise ValueError(f"no standard-library file under '{base}' fits in {max_bytes} bytes")
    file = Path(out)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(b"".join(parts))
    return file


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m esper_lightning.data.stdlib_text",
                                     description="write the Python standard library's source "
                                     "as one text file")
    parser.add_argument("out", help="the text file to write")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES,
                        help=f"at most this many bytes (default {DEFAULT_MAX_BYTES:,})")
    args = parser.parse_args(argv)
    try:
        file = write_stdlib_text(args.out, args.max_bytes)
    except ValueError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    print(f"{file}: {file.stat().st_size:,} bytes of the Python {sys.version.split()[0]} "
          f"standard library, sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
