import subprocess

import pytest

from esper_lightning import __version__
from esper_lightning.app import provenance
from esper_lightning.app.provenance import code_version


def git(folder, *args):
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def test_a_checkout_names_its_commit_and_uncommitted_changes(tmp_path, monkeypatch):
    (tmp_path / "esper_lightning").mkdir()
    (tmp_path / "esper_lightning" / "__init__.py").write_text("")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    monkeypatch.setattr(provenance, "SOURCE", tmp_path.resolve())
    commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short=12", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert code_version() == f"esper-lightning {__version__}, commit {commit}"
    (tmp_path / "esper_lightning" / "__init__.py").write_text("x = 1\n")
    assert code_version().endswith(f"commit {commit} (with uncommitted changes)")


@pytest.mark.parametrize("layout", ["no repository", "someone else's repository"])
def test_an_installed_package_is_no_checkout(tmp_path, monkeypatch, layout):
    site = tmp_path / "venv" / "site-packages"
    (site / "esper_lightning").mkdir(parents=True)
    (site / "esper_lightning" / "__init__.py").write_text("")
    if layout == "someone else's repository":  # a venv inside the user's own project
        (tmp_path / "train.py").write_text("")
        git(tmp_path, "init", "-q")
        git(tmp_path, "add", ".")
        git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "theirs")
    monkeypatch.setattr(provenance, "SOURCE", site.resolve())
    assert code_version() == f"esper-lightning {__version__} (not a git checkout)"


def test_the_machine_names_the_cpu_kernels_and_threads():
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = provenance.machine_description()
        torch.set_num_threads(2)
        two = provenance.machine_description()
    finally:
        torch.set_num_threads(threads)
    kernels = f"kernels {torch.backends.cpu.get_cpu_capability()}"
    assert one.startswith(provenance.cpu_model() + "; torch " + torch.__version__)
    assert one.endswith(f"{kernels}, 1 thread") and f"{kernels}, 2 threads" in two


def test_the_cpu_model_comes_from_cpuinfo_or_platform(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\n")
    assert provenance.cpu_model(cpuinfo) == "AMD EPYC 9654"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: \n")  # named nowhere: platform's answer
    assert provenance.cpu_model(cpuinfo) == provenance.cpu_model(tmp_path / "missing")
    assert provenance.cpu_model(tmp_path / "missing")
