"""The Pallas benchmark's harness: one candidate, one mode, one length, timed (``bench_pallas.py``).

Lives beside the script that uses it. Candidates are the Pallas kernels, the JAX reference under
``jax.jit`` and the Triton kernels of chapter 4 on the same inputs.
"""

from __future__ import annotations

from gla_ref.bench import jax_inputs, time_jax, time_wall


PALLAS_BENCH = ("pallas chunk_gla", "pallas fused_chunk_gla", "pallas chunk_simple_gla g_gamma",
                "jax_ref.chunk_gla", "triton chunk_gla", "triton fused_chunk_gla")
"""The candidates of :func:`time_pallas_gla`: the Pallas kernels, the JAX reference under ``jax.jit``
and the Triton kernels of chapter 4 (PyTorch). Rows are named ``"<candidate> <mode>"``."""


BENCH_MODES = ("fwd", "fwd+bwd")


def _pallas_bench_inputs(B, T, H, K, V, dtype, gate):
    """Seeded q, k, v ~ N(0, 1) in ``dtype``, the output cotangent do, and the gates: log σ(N(0, 1))/16
    ``[B, T, H, K]`` for GLA (``gate="gla"``), ``[B, T, H]`` for a scalar gate per token (``"scalar"``), or the
    ALiBi slopes of :mod:`gla_ref.reference.gates` as ``g_gamma [H]`` (``"const"``): :func:`gla_ref.bench.jax_inputs`."""
    return jax_inputs(B, T, H, K, V, gate, dtype)


def time_pallas_gla(name, mode, T, *, B=2, H=16, K=128, V=128, chunk_size=64, dtype="bfloat16",
                    warmup=5, rep=50, stage=None) -> dict:
    """Time one candidate of :data:`PALLAS_BENCH` in one mode (``"fwd"`` or ``"fwd+bwd"``) at one T.

    ``"fwd+bwd"`` is the gradient of ``⟨o, do⟩`` with respect to q, k, v and the gates, ``do`` being
    an argument of the jitted function (a captured array would be baked into the program as a
    constant of B·T·H·V numbers). JAX candidates are timed by :func:`time_jax` (``compile_ms`` is
    XLA's compile), Triton ones by :func:`_time_triton_on`. Returns ``{"T", "name", "compile_ms",
    "first_ms", "median_ms", "p20_ms", "p80_ms"}``; errors (out of memory, ...) propagate.
    ``stage(text)`` is called as each phase starts (the benchmark's worker reports progress so).
    """
    import jax
    import jax.numpy as jnp

    from gla_ref import jax_ref
    from gla_ref.pallas import chunk_gla, chunk_simple_gla, fused_chunk_gla

    if name not in PALLAS_BENCH or mode not in BENCH_MODES:
        raise ValueError(f"name must be one of {PALLAS_BENCH} and mode one of {BENCH_MODES}, "
                         f"got {name!r}, {mode!r}")
    C = chunk_size
    gate = "const" if name.endswith("g_gamma") else "gla"
    q, k, v, g, do = _pallas_bench_inputs(B, T, H, K, V, dtype, gate)
    row = {"T": T, "name": f"{name} {mode}"}
    if name.startswith("triton"):
        return {**row, **_time_triton_on(name, mode, q, k, v, g, do, C, warmup, rep, stage)}
    fn = {
        "pallas chunk_gla": lambda q, k, v, g: chunk_gla(q, k, v, g, chunk_size=C)[0],
        "pallas fused_chunk_gla": lambda q, k, v, g: fused_chunk_gla(q, k, v, g, chunk_size=C)[0],
        "pallas chunk_simple_gla g_gamma": lambda q, k, v, g: chunk_simple_gla(q, k, v, g_gamma=g,
                                                                                chunk_size=C)[0],
        "jax_ref.chunk_gla": lambda q, k, v, g: jax_ref.chunk_gla(q, k, v, g, chunk_size=C)[0],
    }[name]
    if mode == "fwd":
        return {**row, **time_jax(jax.jit(fn), q, k, v, g, warmup=warmup, rep=rep, stage=stage)}

    def loss(q, k, v, g, do):
        return (fn(q, k, v, g).astype(jnp.float32) * do.astype(jnp.float32)).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    return {**row, **time_jax(grads, q, k, v, g, do, warmup=warmup, rep=rep, stage=stage)}


def _time_triton_on(name, mode, q, k, v, g, do, C, warmup, rep, stage) -> dict:
    """A Triton kernel on JAX's arrays (copied through DLPack to PyTorch's device), timed like
    :func:`time_jax` by :func:`time_wall`: ``compile_ms`` is the first call (JIT compilation and
    autotuning of every kernel it launches). ``"fwd"`` runs under ``no_grad``; ``"fwd+bwd"`` is
    ``o.backward(do)`` into q, k, v, g."""
    import torch

    from gla_ref import device
    from gla_ref import triton as gla_triton

    dev = device.torch_device()
    tq, tk, tv, tg = (torch.from_dlpack(x).to(dev).requires_grad_() for x in (q, k, v, g))
    tdo = torch.from_dlpack(do).to(dev)
    fn = {"triton chunk_gla": gla_triton.chunk_gla, "triton fused_chunk_gla": gla_triton.fused_chunk_gla,
          "triton chunk_simple_gla g": gla_triton.chunk_simple_gla}[name]

    def fwd():
        with torch.no_grad():
            return fn(tq, tk, tv, tg, chunk_size=C)[0]

    def fwd_bwd():
        for x in (tq, tk, tv, tg):
            x.grad = None  # time the gradients, not their accumulation into old ones
        fn(tq, tk, tv, tg, chunk_size=C)[0].backward(tdo)

    sync = (lambda _: torch.cuda.synchronize()) if dev == "cuda" else None
    if stage:
        stage("compile and run")
    t = time_wall(fwd if mode == "fwd" else fwd_bwd, warmup=warmup, rep=rep, sync=sync)
    return {"compile_ms": t["first_ms"], **{k: t[k] for k in ("first_ms", "median_ms", "p20_ms", "p80_ms")}}
