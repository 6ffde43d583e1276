"""The standard library's source as an unseen text: which files, in which order, cut where."""

from __future__ import annotations

from pathlib import Path

import pytest

from esper_lightning.data.stdlib_text import main, stdlib_source_files, write_stdlib_text


def _library(root: Path) -> Path:
    files = {"zlib_like.py": "z = 1\n", "abc.py": "a = 1\n\n\n", "email/parser.py": "p = 2\n",
             "test/test_abc.py": "t = 0\n", "email/tests/x.py": "t = 0\n",
             "site-packages/pkg.py": "t = 0\n", "__pycache__/abc.py": "t = 0\n",
             "idlelib/run.py": "t = 0\n", "notes.txt": "not source\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_modules_source_in_path_order_without_tests_packages_or_caches(tmp_path):
    root = _library(tmp_path / "lib")
    assert [p.relative_to(root).as_posix() for p in stdlib_source_files(root)] == [
        "abc.py", "email/parser.py", "zlib_like.py"]
    text = write_stdlib_text(tmp_path / "out" / "stdlib.txt", root=root).read_text()
    assert text == ("# file: abc.py\na = 1\n\n# file: email/parser.py\np = 2\n\n"
                    "# file: zlib_like.py\nz = 1\n\n")
    assert write_stdlib_text(tmp_path / "again.txt", root=root).read_text() == text


def test_it_stops_before_the_first_file_that_would_pass_the_limit(tmp_path):
    root = _library(tmp_path / "lib")
    first = len("# file: abc.py\na = 1\n\n")
    cut = write_stdlib_text(tmp_path / "cut.txt", max_bytes=first + 5, root=root)
    assert cut.read_text() == "# file: abc.py\na = 1\n\n"
    with pytest.raises(ValueError, match="fits in 3 bytes"):
        write_stdlib_text(tmp_path / "none.txt", max_bytes=3, root=root)
    with pytest.raises(ValueError, match="max_bytes must be >= 1, got 0"):
        write_stdlib_text(tmp_path / "none.txt", max_bytes=0, root=root)


def test_this_pythons_library_gives_megabytes_and_the_command_prints_its_hash(tmp_path, capsys):
    assert main([str(tmp_path / "stdlib.txt"), "--max-bytes", "2000000"]) == 0
    out = capsys.readouterr().out
    size = (tmp_path / "stdlib.txt").stat().st_size
    assert 1_900_000 < size <= 2_000_000 and "standard library, sha256 " in out
    assert main([str(tmp_path / "x.txt"), "--max-bytes", "0"]) == 2
    assert capsys.readouterr().err.endswith("error: max_bytes must be >= 1, got 0\n")
