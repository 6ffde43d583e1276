"""The package ships its trained policies and py.typed: `esper_lightning.shipped` finds the
policies, the package data of pyproject.toml names them, and a built wheel holds them."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from esper_lightning.controllers import PolicyController
from esper_lightning.shipped import MANIFEST, policies_dir, shipped_policies, shipped_policy

ROOT = Path(__file__).resolve().parent.parent
#: Every file the wheel must hold, as a path inside it.
SHIPPED = sorted(["esper_lightning/py.typed", f"esper_lightning/policies/{MANIFEST}",
                  *(f"esper_lightning/policies/{p.name}"
                    for p in (ROOT / "policies").glob("*.pt"))])


def test_the_shipped_policies_are_the_repositorys_and_each_matches_its_manifest():
    # policy:policies/NAME.pt (the docs, scripts and results) and shipped_policy(NAME) are one
    # file: the package's folder is the repository's.
    assert policies_dir().resolve() == (ROOT / "policies").resolve()
    names = shipped_policies()
    assert "grow124-timing-s1" in names
    assert names == tuple(sorted(p.stem for p in (ROOT / "policies").glob("*.pt")))
    manifest = json.loads((policies_dir() / MANIFEST).read_text())
    for name in names:
        path = shipped_policy(name)
        assert path == shipped_policy(f"{name}.pt") and path.is_file()
        assert hashlib.sha256(path.read_bytes()).hexdigest() == manifest[path.name]["sha256"]


def test_a_shipped_policy_drives_a_policy_controller():
    controller = PolicyController(shipped_policy("grow124-timing-s1"))
    assert controller.slot_ids


def test_an_unknown_policy_name_is_one_line_listing_the_shipped_ones():
    with pytest.raises(ValueError) as err:
        shipped_policy("grow124-timing-s9")
    assert str(err.value) == (f"no shipped policy 'grow124-timing-s9'; accepted: "
                              f"{', '.join(shipped_policies())}")


def test_the_package_data_names_every_shipped_file():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["esper_lightning"]
    inside = [path.removeprefix("esper_lightning/") for path in SHIPPED]
    assert [p for p in inside if not any(fnmatch.fnmatch(p, g) for g in globs)] == []
    assert (ROOT / "esper_lightning" / "py.typed").is_file()


@pytest.mark.slow  # pip builds the wheel: about 25 s on 2 shared cores
def test_the_built_wheel_holds_the_policies_and_py_typed(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("esper_lightning-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        held = {info.filename: info.file_size for info in archive.infolist()}
    assert [p for p in SHIPPED if p not in held] == []
    for path in SHIPPED:  # the files themselves, not links to them
        source = ROOT / "policies" / Path(path).name if "/policies/" in path else ROOT / path
        assert held[path] == source.stat().st_size, path
