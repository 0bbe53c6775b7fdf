"""gla_ref.runtime and device.describe: what a reader is told and installed on each runtime."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

from gla_ref import device, runtime

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def machine(monkeypatch):
    """Pretend to be a machine: ``machine(cuda=..., jax=..., triton=...)`` (jax: a platform or None)."""
    def make(cuda=False, jax="cpu", triton=True, card=device.GPU("NVIDIA H200", (9, 0), 139.8)):
        monkeypatch.setattr(device, "has_cuda", lambda: cuda)
        monkeypatch.setattr(device, "gpu", lambda: card if cuda else None)
        monkeypatch.setattr(device, "has_triton", lambda: triton)
        monkeypatch.setattr(device, "_jax_platform_or_none", lambda: jax)
        monkeypatch.setattr(device, "_tpu_kind", lambda: "TPU v5 lite")
    return make


def test_describe_a_colab_tpu_runtime(machine):
    machine(cuda=False, jax="tpu", triton=True)
    assert device.describe() == ("TPU (TPU v5 lite): Triton kernels in Triton's CPU interpreter (fp32/fp16, small "
                                 "shapes); Pallas lowered through Mosaic TPU")


def test_describe_a_laptop_without_triton(machine):
    machine(cuda=False, jax="cpu", triton=False)
    assert device.describe() == "CPU: Triton not installed here: its cells skip; Pallas in interpret mode on the CPU"


def test_describe_a_gpu_whose_jax_has_no_gpu_backend(machine):
    machine(cuda=True, jax="cpu", triton=True)
    text = device.describe()
    assert text.startswith("GPU NVIDIA H200: Triton kernels compiled for this GPU;")
    assert text.endswith("Pallas in interpret mode on the CPU (this jax has no GPU backend) "
                         "(sm_90, 140 GiB, bf16 tensor cores; Hopper: the Mosaic GPU launcher runs)")
    machine(cuda=True, jax=None, triton=True)
    assert "JAX not installed: Pallas cells skip (sm_90" in device.describe()


@pytest.mark.parametrize("card, half, words", [
    (device.GPU("Tesla T4", (7, 5), 14.7), "float16", "sm_75, 15 GiB, no bf16 tensor cores: chapters use float16)"),
    (device.GPU("NVIDIA L4", (8, 9), 22.0), "bfloat16", "sm_89, 22 GiB, bf16 tensor cores)"),
    (device.GPU("NVIDIA A100-SXM4-40GB", (8, 0), 39.4), "bfloat16", "sm_80, 39 GiB, bf16 tensor cores)"),
    (device.GPU("NVIDIA H200", (9, 0), 139.8), "bfloat16", "bf16 tensor cores; Hopper: the Mosaic GPU launcher runs)")],
    ids=["T4", "L4", "A100", "H200"])
def test_colab_gpus_choose_what_they_can_run(machine, card, half, words):
    """Colab's GPUs, faked (no Colab here): the setup line names what each can run, and the chapters' 16-bit
    dtype follows it (a T4 has no bf16 tensor cores; only Hopper runs the Mosaic GPU launcher)."""
    import torch

    machine(cuda=True, jax="gpu", triton=True, card=card)
    assert device.describe().startswith(f"GPU {card.name}: ") and device.describe().endswith(words)
    assert device.half_dtype() == getattr(torch, half)
    assert card.hopper == (card.name == "NVIDIA H200")


def test_a_cpu_runs_float16():
    import torch

    if not torch.cuda.is_available():
        assert device.gpu() is None and device.half_dtype() == torch.float16


def test_describe_this_machine():
    import torch

    if torch.cuda.is_available():
        assert device.describe().startswith(f"GPU {torch.cuda.get_device_name()}: Triton kernels compiled for this GPU")
    else:
        assert device.describe().startswith("CPU: Triton kernels in Triton's CPU interpreter")


def test_setup_installs_only_missing_frameworks(monkeypatch, capsys):
    installed = []
    monkeypatch.setattr(runtime, "available", lambda name: name != "jax")
    monkeypatch.setattr(runtime, "_pip_install", installed.extend)
    monkeypatch.delenv(runtime.NO_INSTALL, raising=False)
    monkeypatch.setattr(runtime, "_status", lambda name: f"{name} ok")
    monkeypatch.setattr(runtime, "_missing_modules", lambda name: [] if name != "jax" else ["jax", "absl"])
    runtime.setup("torch", "jax")
    assert installed == ["jax>=0.10", "absl-py>=1.0"]
    assert capsys.readouterr().out.splitlines() == ["torch ok", "jax ok", device.describe()]


def test_jax_without_absl_gets_absl_and_nothing_else(monkeypatch):
    """A jax installed without absl-py (a plain ``pip install gla_ref`` of jax) cannot run the Mosaic GPU
    launcher's imports: the jax chapters' setup installs absl-py alone, and leaves jax as it is."""
    import importlib.util

    installed = []
    real = importlib.util.find_spec
    monkeypatch.setattr(runtime.importlib.util, "find_spec", lambda name: None if name == "absl" else real(name))
    monkeypatch.setattr(runtime, "_pip_install", installed.extend)
    monkeypatch.delenv(runtime.NO_INSTALL, raising=False)
    monkeypatch.setattr(runtime, "_status", lambda name: f"{name} ok")
    assert not runtime.available("jax")
    runtime.setup("jax")
    assert installed == ["absl-py>=1.0"]


def test_the_requirements_are_the_extras_of_the_package():
    """What setup installs is what ``pip install gla_ref[torch,jax]`` installs (pyproject.toml's extras)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ours = {req for parts in runtime.REQUIREMENTS.values() for req in parts.values()}
    theirs = {req.split(";")[0].strip() for req in extras["torch"] + extras["jax"]}
    assert ours == theirs


def test_setup_installs_nothing_when_told_not_to(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "available", lambda name: name != "triton")
    monkeypatch.setattr(runtime, "_pip_install", lambda reqs: pytest.fail(f"installed {reqs}"))
    monkeypatch.setenv(runtime.NO_INSTALL, "1")
    runtime.setup("torch", "triton")
    assert capsys.readouterr().out.splitlines()[1] == "triton: not installed; cells that need it are skipped"


def test_no_triton_install_where_pip_has_none(monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    assert not runtime.installable("triton") and runtime.installable("jax")
    monkeypatch.setattr(runtime, "available", lambda name: False)
    assert runtime._status("triton") == "triton: pip cannot install it on this platform; cells that need it are skipped"


def test_setup_asks_for_a_restart_when_an_install_replaced_a_loaded_package(monkeypatch):
    versions = iter([{"numpy": "1.26.4"}, {"numpy": "2.4.6"}])
    monkeypatch.setattr(runtime, "available", lambda name: name != "jax")
    monkeypatch.setattr(runtime, "_pip_install", lambda reqs: None)
    monkeypatch.setattr(runtime, "_imported_distributions", lambda: ["numpy"])
    monkeypatch.setattr(runtime, "_distribution_versions", lambda names: next(versions))
    monkeypatch.delenv(runtime.NO_INSTALL, raising=False)
    with pytest.raises(runtime.RestartRequired, match=r"numpy 1\.26\.4 -> 2\.4\.6.*Restart the runtime"):
        runtime.setup("jax")


def test_old_frameworks_are_kept_and_reported(monkeypatch):
    monkeypatch.setattr(runtime.importlib.metadata, "version", lambda name: "0.4.35")
    assert "older than the 0.10" in runtime._status("jax") and "kept as it is" in runtime._status("jax")
    assert runtime._version_tuple("2.13.0+cpu") == (2, 13) and runtime._version_tuple("0.10.2rc1") == (0, 10)


def test_setup_rejects_unknown_names():
    with pytest.raises(ValueError, match="needs must name frameworks"):
        runtime.setup("tensorflow")


def test_needs_magic_runs_or_skips_cells():
    """In a real IPython shell (a subprocess, so no shell leaks into other tests)."""
    pytest.importorskip("IPython")
    code = textwrap.dedent("""
        from IPython.core.interactiveshell import InteractiveShell
        from gla_ref import runtime
        shell = InteractiveShell.instance()
        runtime._register_magic()
        shell.run_cell("%%needs torch\\nx = 40 + 2", store_history=False)
        assert shell.user_ns["x"] == 42
        runtime.available = lambda name: name != "triton"
        shell.run_cell("%%needs torch triton\\ny = 1", store_history=False)
        assert "y" not in shell.user_ns
        result = shell.run_cell("%%needs torch\\nraise KeyError('inside')", store_history=False)
        assert not result.success and isinstance(result.error_in_exec, runtime.CellError)
        assert "KeyError: 'inside'" in str(result.error_in_exec)
        result = shell.run_cell("%%needs tensorflow\\nz = 1", store_history=False)
        assert isinstance(result.error_in_exec, ValueError)
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout + out.stderr
    assert "[skipped: this cell needs triton, which cannot be imported here]" in out.stdout


def test_the_framework_free_modules_load_no_framework():
    """What a reader imports before any framework is installed (setup cell, stored results, layers' shared
    configuration) must not import torch, jax or triton."""
    modules = ["gla_ref", "gla_ref.runtime", "gla_ref.device", "gla_ref.bench", "gla_ref.reference.gates", "gla_ref.layers",
               "gla_ref.sequence_parallel", "gla_ref._validate"]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "from gla_ref import bench, device; bench.latest_results('triton_bench'); device.has_triton()\n"
            "print(sorted({'torch', 'jax', 'triton', 'flax'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
