"""gla_ref.viz.kernels draws what the launchers launch.

Every family is launched with its kernels replaced by recorders (nothing runs): the recorded grids,
block sizes and output tensors (Triton) or grids and block shapes (Pallas) must match the specs the
drawings are made from. The constants the drawings read are the kernels' own (gla_ref.specs), and
drawing loads no framework. Then the drawings themselves: one panel per kernel, one outline per tensor,
one highlighted tile per block a program touches.
"""

from __future__ import annotations

import math
import subprocess
import sys

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gla_ref import specs
from gla_ref.viz import kernels as pk

# awkward shapes: T not a multiple of C, K and V not powers of two, several value blocks
SHAPES = [dict(B=1, T=50, H=2, K=20, V=24, C=16), dict(B=2, T=77, H=1, K=100, V=72, C=32),
          dict(B=1, T=130, H=1, K=130, V=200, C=64)]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ----------------------------------------------------------------------------- constants

def test_drawing_loads_no_framework():
    """The spec module and the drawings import neither torch, JAX nor Triton, even once every spec is evaluated."""
    code = ("import sys, gla_ref.specs, gla_ref.viz.kernels as pk; "
            "s = pk.Sizes(B=1, T=50, H=2, K=20, V=24, C=16, initial_state=True, final_state=True); "
            "[pk.traffic(key, s) for key in pk.KERNELS]; "
            "assert not {'torch', 'jax', 'triton'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_kernel_constants_are_the_specs():
    """Every launch constant a drawing reads is the kernel's own: the kernel modules bind their names to
    gla_ref.specs, and the first autotune config of each tuned kernel (the interpreter's only one, the one
    the drawings show) holds the spec's blocks."""
    from gla_ref.pallas import chunk_math
    from gla_ref.pallas.launchers import gpu, tpu
    from gla_ref.teaching import historical
    from gla_ref.triton import chunk_simple, fused_recurrent
    from gla_ref.triton.chunk import backward_intra, intra as chunk_intra, output as chunk_output, state as chunk_state
    from gla_ref.triton.fused_chunk import forward as fused_chunk_fwd

    assert fused_recurrent.STATE_BUDGET is specs.RECURRENT_STATE_BUDGET
    assert fused_chunk_fwd.STATE_ELEMENTS is specs.FUSED_STATE_ELEMENTS
    for module, name, spec in [(chunk_intra, "SUB_CHUNK", "SUB_CHUNK"), (backward_intra, "SUB_CHUNK", "SUB_CHUNK"),
                               (chunk_intra, "WHOLE_CHUNK_KEYS", "WHOLE_CHUNK_KEYS"),
                               (historical, "CHUNK", "HISTORICAL_CHUNK"), (historical, "MAX_BLOCK", "HISTORICAL_MAX_BLOCK"),
                               (chunk_math, "SUB", "PALLAS_SUB_CHUNK"), (tpu, "LANES", "TPU_LANES"),
                               (tpu, "BLOCK_V", "TPU_BLOCK_V"), (gpu, "BLOCK_V", "GPU_BLOCK_V")]:
        assert getattr(module, name) == getattr(specs, spec), (module.__name__, name)
    first = lambda kernel: kernel.configs[0].kwargs  # noqa: E731  what the interpreter (and the drawing) uses
    state, output = first(chunk_state.chunk_state_fwd_kernel), first(chunk_output.chunk_output_kernel)
    assert (state["BK"], state["BV"]) == specs.STATE_FWD_BLOCKS
    assert (output["BK"], output["BV"]) == specs.OUTPUT_BLOCKS
    assert first(chunk_simple.simple_output_kernel) == {"BV": specs.BLOCK_CONFIGS_FIRST}
    for K, V in [(20, 24), (100, 72), (128, 256), (130, 200)]:  # the Pallas drawings' padding is the launchers'
        s = pk.Sizes(B=1, T=10, H=1, K=K, V=V)
        for backend, mod in (("tpu", tpu), ("gpu", gpu)):
            b = pk.block_sizes(f"{backend}.gla_fused_fwd", s)
            assert (b["Kp"], b["Vp"]) == mod.padded_dims(K, V) and b["BV"] == mod.block_v(b["Vp"])


# ----------------------------------------------------------------------------- Triton

class Recorder:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **kwargs)`` records the grid (a callable
    grid is evaluated with the kernel's first autotune config) and the arguments by name."""

    def __init__(self, name, kernel, log):
        self.name, self.log = name, log
        self.arg_names = list(kernel.arg_names)
        self.meta = dict(kernel.configs[0].kwargs) if hasattr(kernel, "configs") else {}

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = {**dict(zip(self.arg_names, args)), **kwargs}
            g = grid({**named, **self.meta}) if callable(grid) else grid
            self.log.append((self.name, tuple(int(n) for n in g), {**named, **self.meta}))
        return launch


TRITON_KERNELS = {  # family -> the kernels it launches (module, attribute)
    "fused_recurrent_gla": [("gla_ref.triton.fused_recurrent", "_fwd_kernel")],
    "fused_chunk_gla": [("gla_ref.triton.fused_chunk.forward", "_fwd_kernel")],
    "chunk_gla": [("gla_ref.triton.chunk.cumsum", "chunk_cumsum_kernel"),
                  ("gla_ref.triton.chunk.state", "chunk_state_fwd_kernel"),
                  ("gla_ref.triton.chunk.intra", "chunk_intra_kernel"),
                  ("gla_ref.triton.chunk.output", "chunk_output_kernel")],
    "chunk_simple_gla": [("gla_ref.triton.chunk.cumsum", "chunk_cumsum_kernel"),
                         ("gla_ref.triton.chunk.state", "chunk_state_fwd_kernel"),
                         ("gla_ref.triton.chunk_simple", "simple_output_kernel")],
    "historical": [("gla_ref.teaching.historical.decay_cumsum", "decay_cumsum_kernel"),
                   ("gla_ref.teaching.historical.prepare_qg_kg", "prepare_qg_kg_kernel"),
                   ("gla_ref.teaching.historical.fused_chunk", "fused_chunk_fwd_kernel"),
                   ("gla_ref.teaching.historical.inner_chunk", "inner_chunk_kernel")],
}


def _launch_triton(family, s, monkeypatch):
    import importlib

    import torch

    import gla_ref.triton as tr
    from gla_ref.testing import as_torch, random_inputs
    from gla_ref.teaching import historical

    log = []
    for module, attr in TRITON_KERNELS[family]:
        mod = importlib.import_module(module)
        monkeypatch.setattr(mod, attr, Recorder(getattr(mod, attr).fn.__name__ if hasattr(getattr(mod, attr), "fn")
                                                else attr, getattr(mod, attr), log))
    gate = "scalar" if family == "chunk_simple_gla" else "gla"
    x = as_torch(random_inputs(B=s.B, T=s.T, H=s.H, K=s.K, V=s.V, gate=gate, seed=0, initial_state=s.initial_state))
    kw = dict(initial_state=x.get("initial_state"), output_final_state=s.final_state)
    with torch.no_grad():
        if family == "historical":
            historical.fused_chunk_gla_historical(x["q"], x["k"], x["v"], x["g"], **kw)
        elif family == "fused_recurrent_gla":
            tr.fused_recurrent_gla(x["q"], x["k"], x["v"], x["g"], **kw)
        else:
            getattr(tr, family)(x["q"], x["k"], x["v"], x["g"], chunk_size=s.C, **kw)
    return log


@pytest.mark.parametrize("flags", [dict(), dict(initial_state=True, final_state=True)])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda d: "T{T}K{K}V{V}C{C}".format(**d))
@pytest.mark.parametrize("family", list(TRITON_KERNELS))
def test_triton_specs_are_what_the_launchers_launch(family, shape, flags, monkeypatch):
    s = pk.Sizes(**shape, itemsize=4, gate_itemsize=4, **flags)
    log = _launch_triton(family, s, monkeypatch)
    specs = [pk.KERNELS[key] for key in pk.FAMILIES[family]]
    assert [name for name, _, _ in log] == [spec.name for spec in specs]
    for spec, (name, launched, args) in zip(specs, log):
        assert pk.grid(spec, s) == launched, (spec.title, launched)
        blocks = pk.block_sizes(spec, s)
        for key in set(blocks) & set(args):  # block sizes the launcher passes (or the autotune config holds)
            assert blocks[key] == args[key], (spec.title, key)
        for access in spec.accesses:
            tensor = args[access.arg]
            if access.when is not None and not getattr(s, access.when):
                assert tensor is None, (spec.title, access.tensor)
                continue
            if access.mode == "write":  # the tiles of all programs cover the output exactly once
                total = next(r["total"] for r in pk.traffic(spec, s) if r["tensor"] == access.tensor
                             and r["mode"] == "write")
                assert total == tensor.numel() * tensor.element_size(), (spec.title, access.tensor)


def test_triton_traffic_follows_the_docstrings():
    s = pk.Sizes(B=2, T=200, H=4, K=100, V=72, C=64, itemsize=2, gate_itemsize=4)
    # chunk_output: Q ⊙ Λ (step 1's), A, the K × BV slice of S_n and the C × BV tile of V read; O written once
    b = pk.block_sizes("chunk_output", s)
    rows = {r["tensor"]: r["program"] for r in pk.traffic("chunk_output", s, program=(0, 0, 0))}
    assert rows == {"Q ⊙ Λ": 64 * 100 * 2, "A": 64 * 64 * 2, "h": 100 * b["BV"] * 2,
                    "v": 64 * b["BV"] * 2, "o": 64 * b["BV"] * 2}
    # step 1 of chunk_gla: a C × BD tile of g, q and k read; gc (float32), Q ⊙ Λ and K ⊙ Γ written
    rows = {r["tensor"]: r["program"] for r in pk.traffic("chunk_cumsum", s, program=(0, 0, 0))}
    assert rows == {"g": 64 * 64 * 4, "q": 64 * 64 * 2, "k": 64 * 64 * 2, "gc": 64 * 64 * 4,
                    "Q ⊙ Λ": 64 * 64 * 2, "K ⊙ Γ": 64 * 64 * 2}
    # the state kernel reads K ⊙ Γ whole and only the last gc row of each of the 4 chunks (T = 200)
    rows = {r["tensor"]: r["program"] for r in pk.traffic("chunk_state_fwd", s, program=(0, 0, 0))}
    assert rows["K ⊙ Γ"] == 200 * 32 * 2 and rows["gc (last rows)"] == 4 * 32 * 4
    # fused_chunk: q, k, g read ⌈V/BV⌉ times, v once, o written once
    nv = pk.grid("fused_chunk_gla", s)[0]
    assert nv == 2
    totals = {r["tensor"]: r["total"] for r in pk.traffic("fused_chunk_gla", s)}
    assert totals == {"q": nv * 8 * 200 * 100 * 2, "k": nv * 8 * 200 * 100 * 2, "g": nv * 8 * 200 * 100 * 4,
                      "v": 8 * 200 * 72 * 2, "o": 8 * 200 * 72 * 2}
    # the state kernel writes one block of every chunk's state: N tiles of BK × BV, in the input dtype
    write = next(r for r in pk.traffic("chunk_state_fwd", s, program=(0, 0, 0)) if r["mode"] == "write")
    assert write["program"] == math.ceil(200 / 64) * 32 * 72 * 2  # BK = 32, BV = 128 covers all V = 72


# ----------------------------------------------------------------------------- Pallas

def _launch_pallas(call, monkeypatch):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    log = []

    def pallas_call(kernel, out_shape=None, *, grid=(), in_specs=(), out_specs=(), name=None, **_):
        def run(*args):
            def block_bytes(specs, arrays):
                specs = specs if isinstance(specs, (list, tuple)) else [specs]
                return sum(math.prod(d for d in spec.block_shape if isinstance(d, int)) * a.dtype.itemsize
                           for spec, a in zip(specs, arrays))
            outs = out_shape if isinstance(out_shape, (list, tuple)) else [out_shape]
            log.append((name, tuple(grid), block_bytes(in_specs, args), block_bytes(out_specs, outs)))
            zeros = [jnp.zeros(o.shape, o.dtype) for o in outs]
            return zeros if isinstance(out_shape, (list, tuple)) else zeros[0]
        return run

    monkeypatch.setattr(pl, "pallas_call", pallas_call)
    call()
    jax.effects_barrier()
    return log


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda d: "T{T}K{K}V{V}C{C}".format(**d))
def test_pallas_specs_are_what_the_launchers_launch(backend, shape, monkeypatch):
    from gla_ref.pallas import chunk_gla, chunk_simple_gla, fused_chunk_gla
    from gla_ref.testing import as_jax, random_inputs

    s = pk.Sizes(**shape, itemsize=4, gate_itemsize=4)
    x = as_jax(random_inputs(B=s.B, T=s.T, H=s.H, K=s.K, V=s.V, gate="gla", seed=0))
    xs = as_jax(random_inputs(B=s.B, T=s.T, H=s.H, K=s.K, V=s.V, gate="scalar", seed=0))
    kw = dict(chunk_size=s.C, launcher=backend, interpret=True)
    calls = {
        "pallas.chunk_gla": lambda: chunk_gla(x["q"], x["k"], x["v"], x["g"], **kw),
        "pallas.fused_chunk_gla": lambda: fused_chunk_gla(x["q"], x["k"], x["v"], x["g"], **kw),
        "auto": lambda: chunk_simple_gla(xs["q"], xs["k"], xs["v"], xs["g"], **kw),
        "chunk": lambda: chunk_simple_gla(xs["q"], xs["k"], xs["v"], xs["g"], mode="chunk", **kw),
    }
    expected = {  # what each call launches, as keys of KERNELS
        "pallas.chunk_gla": [f"{backend}.gla_state_fwd", f"{backend}.gla_chunk_fwd_o"],
        "pallas.fused_chunk_gla": [f"{backend}.gla_fused_fwd"],
        "auto": [f"{backend}.gla_fused_fwd.scalar"],
        "chunk": [f"{backend}.gla_state_fwd.scalar", f"{backend}.gla_chunk_fwd_o.scalar"],
    }
    for what, call in calls.items():
        log = _launch_pallas(call, monkeypatch)
        keys = expected[what]
        assert [name for name, *_ in log] == [pk.KERNELS[k].name for k in keys], what
        for key, (_, launched, read, written) in zip(keys, log):
            assert pk.grid(key, s) == launched, (key, launched)
            rows = pk.traffic(key, s)
            assert sum(r["program"] for r in rows if r["mode"] == "read") == read, key
            assert sum(r["program"] for r in rows if r["mode"] == "write") == written, key
    # every Pallas kernel chapter 5 draws for this backend is one checked here
    drawn = {k for fam in ("pallas.chunk_gla", "pallas.fused_chunk_gla", "pallas.chunk_simple_gla")
             for k in pk.FAMILIES[fam] if k.startswith(backend + ".")}
    assert drawn and drawn <= {k for keys in expected.values() for k in keys}


# ----------------------------------------------------------------------------- drawings

def _tensor_outlines(ax):
    return [p for p in ax.patches if p.get_label() == "tensor"]


def test_a_family_draws_one_panel_per_kernel_with_its_tensors_and_tiles():
    s = pk.Sizes(B=2, T=200, H=4, K=100, V=72, C=64)
    fig = pk.draw_kernels("chunk_gla", s)
    assert isinstance(fig, plt.Figure)
    specs = [pk.KERNELS[k] for k in pk.FAMILIES["chunk_gla"]]
    assert len(fig.axes) == len(specs) == 4
    N = math.ceil(200 / 64)
    for ax, spec in zip(fig.axes, specs):
        g = pk.grid(spec, s)
        assert spec.name in ax.get_title() and f"= {math.prod(g)} programs" in ax.get_title()
        for axis, n in zip(spec.grid, g):
            assert f"{axis.label}={n}" in ax.get_title()
        tensors = list(dict.fromkeys(a.tensor for a in spec.accesses if a.when is None))
        states = N if "h" in tensors else 0  # h is drawn as N blocks, one per chunk state
        assert len(_tensor_outlines(ax)) == len(tensors) - (1 if states else 0) + states
        texts = [t.get_text() for t in ax.texts]
        for name in tensors:
            assert any(t.startswith(name + "\n") for t in texts), (spec.name, name)
        loop = [t for t in texts if t.startswith("loop:")]
        assert (loop == [f"loop: {spec.loop}"]) if spec.loop else not loop
    state_ax = fig.axes[1]  # chunk_state_fwd: one written tile in every chunk's state
    assert len([p for p in state_ax.patches if p.get_label() == "write"]) == N
    assert [t.get_text() for t in state_ax.texts if t.get_text().startswith("$S_")] == [
        f"$S_{{[{i}]}}$" for i in range(N)]


def test_optional_states_and_padding_are_drawn_only_when_there():
    s = pk.Sizes(B=1, T=50, H=2, K=20, V=24, C=16)
    plain = pk.draw_kernels("fused_recurrent_gla", s).axes[0]
    both = pk.draw_kernels("fused_recurrent_gla", pk.Sizes(B=1, T=50, H=2, K=20, V=24, C=16, initial_state=True,
                                                             final_state=True)).axes[0]
    assert len(_tensor_outlines(both)) == len(_tensor_outlines(plain)) + 2
    tpu = pk.draw_kernels("tpu.gla_fused_fwd", s).axes[0]  # K = 20, V = 24 padded to 128 lanes
    assert any(p.get_label() == "padding" for p in tpu.patches)
    gpu = pk.draw_kernels("gpu.gla_fused_fwd", pk.Sizes(B=1, T=64, H=2, K=32, V=64, C=16)).axes[0]
    assert not any(p.get_label() == "padding" for p in gpu.patches)


def test_bad_arguments_name_themselves():
    s = pk.Sizes(B=1, T=50, H=2, K=20, V=24)
    with pytest.raises(ValueError, match="K must be a positive int"):
        pk.Sizes(B=1, T=50, H=2, K=0, V=24)
    with pytest.raises(ValueError, match="spec must be"):
        pk.draw_kernels("no_such_kernel", s)
    with pytest.raises(TypeError, match="sizes must be"):
        pk.draw_kernels("chunk_gla", dict(B=1))
    with pytest.raises(ValueError, match="program must index the grid"):
        pk.traffic("chunk_output", s, program=(5, 0, 0))
    with pytest.raises(ValueError, match="no block size 'BQ'"):
        pk.grid("chunk_output", s, BQ=3)
    assert pk.grid("chunk_output", s, BV=8) == (3, 1, 2)  # an autotuner's other pick
