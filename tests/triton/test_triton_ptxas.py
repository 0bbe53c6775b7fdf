"""gla_ref.triton.common.ptxas: on Hopper a ptxas older than 12.9 is replaced by a good one found on the
machine (with a warning) or refused with a clear error; other GPUs and good assemblers are left alone.
The GPU side (the switch happening before the first launch on an H200) is recorded in the README."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import gla_ref.triton  # noqa: E402, F401  (selects the interpreter on a machine without CUDA)
from gla_ref.triton.common import ptxas  # noqa: E402

HOPPER = (9, 0)
VERSIONS = {"/triton/ptxas": (12, 8, 93), "/cuda/bin/ptxas": (13, 0, 88), "/new/bin/ptxas": (13, 2, 86),
            "/pip/bin/ptxas": (12, 9, 86)}


@pytest.fixture
def machine(monkeypatch):
    """A fake machine: Triton uses /triton/ptxas (12.8) through TRITON_PTXAS_PATH; the driver is CUDA 13."""
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if k not in ("TRITON_PTXAS_PATH", ptxas.SWITCH)})
    monkeypatch.setattr(ptxas, "release", VERSIONS.get)
    monkeypatch.setattr(ptxas, "triton_ptxas", lambda arch: ("/triton/ptxas", "TRITON_PTXAS_PATH"))
    monkeypatch.setattr(ptxas, "candidates", lambda: ["/cuda/bin/ptxas"])
    monkeypatch.setattr(ptxas, "driver_cuda_major", lambda: 13)
    ptxas.check.cache_clear()
    yield
    ptxas.check.cache_clear()


def test_release_of_the_installed_tritons_ptxas():
    path, var = ptxas.triton_ptxas(90)
    assert var in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH")
    version = ptxas.release(path)
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    assert version is not None and len(version) == 3 and f"V{'.'.join(map(str, version))}" in out
    assert ptxas.release("/no/such/ptxas") is None


def test_bad_ptxas_on_hopper_is_replaced_with_a_warning(machine):
    with pytest.warns(RuntimeWarning, match=r"ptxas 12\.8\.93 .*TRITON_PTXAS_PATH=/cuda/bin/ptxas"):
        ptxas.check(HOPPER)
    assert os.environ["TRITON_PTXAS_PATH"] == "/cuda/bin/ptxas"


def test_other_gpus_and_good_ptxas_are_left_alone(machine, monkeypatch, recwarn):
    ptxas.check((8, 0))  # Ampere: no wgmma, nothing to check
    ptxas.check((10, 0))
    monkeypatch.setattr(ptxas, "triton_ptxas", lambda arch: ("/pip/bin/ptxas", "TRITON_PTXAS_PATH"))
    ptxas.check(HOPPER)
    assert "TRITON_PTXAS_PATH" not in os.environ and not recwarn.list


def test_no_good_ptxas_is_an_error_that_says_what_to_install(machine, monkeypatch):
    monkeypatch.setattr(ptxas, "candidates", lambda: ["/new/bin/ptxas"])
    monkeypatch.setattr(ptxas, "driver_cuda_major", lambda: 12)  # 13.2's code would not load
    with pytest.raises(RuntimeError, match=r"no ptxas ≥ 12\.9 was found.*nvidia-cuda-nvcc-cu12==12\.9\.86"):
        ptxas.check(HOPPER)
    assert "TRITON_PTXAS_PATH" not in os.environ


def test_a_bad_ptxas_the_user_chose_is_refused(machine):
    os.environ["TRITON_PTXAS_PATH"] = "/triton/ptxas"
    with pytest.raises(RuntimeError, match="TRITON_PTXAS_PATH chose it"):
        ptxas.check(HOPPER)


def test_the_check_can_be_turned_off(machine, recwarn):
    os.environ[ptxas.SWITCH] = "0"
    ptxas.check(HOPPER)
    assert "TRITON_PTXAS_PATH" not in os.environ and not recwarn.list


def test_candidates_include_pips_nvidia_packages(tmp_path, monkeypatch):
    pip_ptxas = tmp_path / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
    pip_ptxas.parent.mkdir(parents=True)
    pip_ptxas.write_text("")
    monkeypatch.setitem(sys.modules, "nvidia", types.SimpleNamespace(__path__=[str(tmp_path / "nvidia")]))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no_toolkit"))
    assert str(pip_ptxas) in ptxas.candidates()


def test_a_triton_without_knobs_has_one_ptxas(monkeypatch):
    import triton

    monkeypatch.delattr(triton, "knobs")
    monkeypatch.setitem(sys.modules, "triton.knobs", None)  # as in Triton 3.3, which had no knobs module
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/chosen/ptxas")
    assert ptxas.triton_ptxas(90) == ("/chosen/ptxas", "TRITON_PTXAS_PATH")
    monkeypatch.delenv("TRITON_PTXAS_PATH")
    path, var = ptxas.triton_ptxas(90)
    assert path.endswith(os.path.join("backends", "nvidia", "bin", "ptxas")) and var == "TRITON_PTXAS_PATH"
