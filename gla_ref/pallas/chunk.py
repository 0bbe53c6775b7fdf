"""``chunk_gla``: the non-fused (state-materialising) Pallas path, and the plumbing every path shares.

Forward (paper §3.3 "with materialisation", Alg. 3):

1. ``b``: the chunk-local cumulative log-gate (float32; in XLA a matmul by a triangle of ones or a scan,
   :func:`_triangular_sum`, or a launcher's kernel of its own, :data:`GATE_SUM_KERNELS`);
2. a *state kernel* runs over the chunks in order and writes the state entering each chunk,
   ``h`` (held transposed, ``[B, H, N, V, K]``; float32, or in the input dtype where the output kernel
   alone reads it, :func:`output_states`) and the final state;
3. an *output kernel*, parallel over chunks, computes each chunk's output from its ``h`` and
   the two-level intra-chunk scores (:mod:`gla_ref.pallas.chunk_math`).

Backward (Alg. 4 and the reading notes' seven steps): the states are recomputed by the state
kernel, a reverse state kernel writes the gradient of the state leaving each chunk, and a
parallel kernel gives ``dq, dk, dv`` and the gate gradient. That is the paper's closed form (§4.3),
``d log b_t = q_t ⊙ dq_t − k_t ⊙ dk_t``, summed from t to the end of t's chunk only, plus the
gradient of the chunk's total decay ``Σ_v S_out ⊙ dS_out`` (:func:`chunk_math.chunk_gate_grad`;
the fused path, which never holds a state and its gradient together, sums per-chunk terms for it,
:func:`_fused_gate_grad`): summed to the end of the sequence instead, every later token's bf16
rounding adds up.

Only the kernels sit inside the ``jax.custom_vjp``; transposes, padding and casts around them
are plain JAX, so autodiff carries the gradients through them (and sums a per-head ``g_gamma``'s
gradient over every position).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.lax import Precision

from gla_ref import device
from gla_ref._validate import MAX_K, MAX_V  # noqa: F401 (the limits every kernel shares, named here too)
from gla_ref._validate import check_chunk_sizes, check_flag, check_gate_values, check_inputs, check_scale, dtype_name
from gla_ref._validate import check_head_dims as _check_head_dims
from gla_ref._validate import invalid_gates_to_nan
from gla_ref.pallas import chunk_math
from gla_ref.pallas import compat
from gla_ref.pallas.launchers import gpu, mosaic_gpu, tpu
from gla_ref.pallas.launchers.mosaic_gpu import gates as mosaic_gpu_gates

__all__ = ["chunk_gla", "chunk_gla_bwd", "state_grad_pass", "state_pass"]

KERNEL_DTYPES = ("float32", "bfloat16")
LAUNCHERS = {"tpu": tpu, "gpu": gpu, "mosaic_gpu": mosaic_gpu}
HIGHEST = Precision.HIGHEST


class Plan(NamedTuple):
    """Static choices of one call: which launcher, interpreted or not, and the algorithm."""
    launcher: Any  # the module gla_ref.pallas.launchers.tpu, .gpu or .mosaic_gpu
    interpret: Any  # False, True, a pltpu.InterpretParams or a Mosaic GPU interpreter's params
    chunk_size: int
    scale: float
    fused: bool
    want_final: bool


# ---------------------------------------------------------------- checks and choices

def check_head_dims(K: int, V: int) -> None:
    """The head-size limits every kernel shares (:func:`gla_ref._validate.check_head_dims`): the Pallas
    launchers hold a chunk's whole K in ``[C, K]`` blocks and tile V (TPU 128, GPU 64 values a block)."""
    _check_head_dims(K, V, "the Pallas kernels")


def check_options(q, k, v, scale, chunk_size, output_final_state):
    """Kernel-specific checks: dtypes, chunk size, scale, flags (shapes are checked by check_inputs).

    Returns ``(scale, chunk_size, output_final_state)`` as a Python float, int and bool."""
    if dtype_name(q) not in KERNEL_DTYPES:
        raise TypeError(f"q, k, v must be float32 or bfloat16 for the Pallas kernels, got {dtype_name(q)}: a TPU's "
                        "matrix unit has no float16, and the launchers keep one set of dtypes so that a program "
                        "runs alike on TPU and GPU; cast to bfloat16 (or use gla_ref.triton, which takes float16)")
    check_chunk_sizes(chunk_size)
    if chunk_size < chunk_math.SUB or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= {chunk_math.SUB} for the Pallas kernels, "
                         f"got {chunk_size}")
    return check_scale(scale, q.shape[-1]), int(chunk_size), check_flag("output_final_state", output_final_state)


def _concrete(x):
    if isinstance(x, jax.core.Tracer):
        x = getattr(x, "to_concrete_value", lambda: None)()
    return None if x is None else np.asarray(x, dtype=np.float64)


def check_values(**arrays):
    """Under ``gla_ref.device.debug(True)``: NaN/inf inputs raise ValueError, and so do invalid
    log-gates ``g``/``g_gamma`` (NaN, > 0, -inf), naming the first bad position as the references
    do (:func:`gla_ref._validate.check_gate_values`).

    Needs concrete values (a device sync), so it is skipped while ``jit`` traces; the kernels then
    return NaN for an invalid gate (:func:`_local_cumsum`).
    """
    if not device.is_debug():
        return
    for name, x in arrays.items():
        x = None if x is None else _concrete(x)
        if x is None:
            continue
        if name in ("g", "g_gamma"):
            check_gate_values(name, x)
        elif not np.isfinite(x).all():
            raise ValueError(f"{name} contains NaN or inf values")


def make_plan(launcher, interpret, *, chunk_size, scale, K, fused, want_final, dtype=None,
              scalar_gate=False) -> Plan:
    """Pick the launcher and whether to interpret. ``launcher=None``: Mosaic on a TPU; on a Hopper GPU with a
    JAX that has Mosaic GPU, ``"mosaic_gpu"`` where it takes the call (bf16 ``dtype``, chunk 64, ``K ≤ 128``,
    fused ``K ≤ 64``: on the H200 it was faster than the Triton-backend launcher for GLA's gates,
    benchmarks/results/pallas_mosaic_gpu_nvidia_h200.json), except for a ``scalar_gate`` (chunk_simple_gla: g_gamma
    or a scalar g), where it took 1.2–1.7 times the Triton-backend launcher's time at T = 4K–16K (g_gamma there,
    g in benchmarks/results/mosaic_scalar_gate_nvidia_h200.json); the Triton backend elsewhere.
    ``interpret=None``: interpret unless the launcher's own hardware is present (for ``"mosaic_gpu"`` a
    Hopper GPU and a JAX with Mosaic GPU)."""
    platform = device.jax_platform()
    if launcher is None:
        launcher = "tpu" if platform == "tpu" else "gpu"
        if (launcher == "gpu" and dtype is not None and not scalar_gate
                and mosaic_gpu.supported(dtype, K, chunk_size, fused) and compat.mosaic_gpu_runs_here()):
            launcher = "mosaic_gpu"
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be None, 'tpu', 'gpu' or 'mosaic_gpu', got {launcher!r}")
    if interpret is None:
        interpret = not compat.mosaic_gpu_runs_here() if launcher == "mosaic_gpu" else platform != launcher
    scale = float(K ** -0.5 if scale is None else scale)
    return Plan(LAUNCHERS[launcher], interpret, chunk_size, scale, fused, want_final)


# ---------------------------------------------------------------- layout

def _to_kernel_layout(x, T_pad, D_pad, dtype=None):
    """``[B, T, H, D]`` → ``[B, H, T_pad, D_pad]``, zero-padded (zero log-gates: no decay)."""
    x = jnp.swapaxes(x if dtype is None else x.astype(dtype), 1, 2)
    return jnp.pad(x, ((0, 0), (0, 0), (0, T_pad - x.shape[2]), (0, D_pad - x.shape[3])))


def _padded_tokens(x, T_pad, D_pad):
    """``[B, T, H, D]`` zero-padded to ``[B, T_pad, H, D_pad]``, for a launcher that reads q, k, v in the API's
    layout (``TOKEN_MAJOR``); no copy at all when nothing is padded."""
    if x.shape[1] == T_pad and x.shape[3] == D_pad:
        return x
    return jnp.pad(x, ((0, 0), (0, T_pad - x.shape[1]), (0, 0), (0, D_pad - x.shape[3])))


def _token_major(plan) -> bool:
    """Whether the plan's launcher reads q, k, v, dO and writes o, dv as ``[B, T, H, D]`` (Mosaic GPU) rather
    than in the kernel layout ``[B, H, T, D]``; its gates, states and partials are ``[B, H, …]`` either way."""
    return getattr(plan.launcher, "TOKEN_MAJOR", False)


def _swapped_if_token_major(x, plan):
    """For a token-major launcher, ``x`` with its token and head axes swapped (``[B, T, H, D]`` ↔ ``[B, H, T, D]``,
    the swap its own inverse); for the others, ``x`` as it is."""
    return jnp.swapaxes(x, 1, 2) if _token_major(plan) else x


def _triangular_sum(x, chunk_size, upper, scan):
    """Inclusive sums inside each chunk of ``chunk_size`` rows of ``x [B, H, T, D]`` (T a multiple of it): lower gives
    ``Σ_{s ≤ t}``, upper gives ``Σ_{s ≥ t}``. A NaN anywhere in a chunk makes every row of it NaN.

    ``scan`` (the Mosaic GPU launcher, :func:`_sums_by_scan`): an associative scan over the chunk's rows, then the
    chunk's total times 0 added to every row (0 for a finite total, NaN for a NaN one). Otherwise one
    float32 matmul by a triangle of ones, its products by 0/1 exact and its zeros carrying a NaN to every row.
    On the H200 (jax 0.11.2, B=8, H=16, K=128) the gates' whole XLA step, layout change included, took 0.86 and
    2.49 ms at T=4096 and 16384 with the matmul and 0.60 and 1.81 ms with the scan
    (benchmarks/results/mosaic_glue_nvidia_h200.json: ``before`` and ``rows``).
    """
    B, H, T, D = x.shape
    x = x.reshape(B, H, T // chunk_size, chunk_size, D)
    if scan:
        out = lax.associative_scan(jnp.add, x, axis=3, reverse=upper)
        total = out[:, :, :, :1] if upper else out[:, :, :, -1:]
        out = out + 0.0 * total
    else:
        ones = jnp.ones((chunk_size, chunk_size), jnp.float32)
        tri = jnp.triu(ones) if upper else jnp.tril(ones)
        out = jnp.einsum("ts,bhnsd->bhntd", tri, x, precision=HIGHEST)
    return out.reshape(B, H, T, D)


def _sums_by_scan(launcher) -> bool:
    """Whether ``launcher`` (a module of :data:`LAUNCHERS`) takes the chunk sums of :func:`_triangular_sum` by a
    scan: the Mosaic GPU launcher, whose forward it was measured in. The Triton-backend launcher keeps the
    matmul its stored timings (and chapter 5's count of the bytes around its kernels) were taken with, and the
    TPU launcher the matmul its MXU runs (no TPU was available to time either)."""
    return launcher is mosaic_gpu


MOSAIC_GPU_GATE_SUMS = {mosaic_gpu: mosaic_gpu_gates.gate_sums}
"""The Mosaic GPU launcher's gate-sum kernel, :func:`gla_ref.pallas.launchers.mosaic_gpu.gates.gate_sums`, as an entry of
:data:`GATE_SUM_KERNELS`."""
GATE_SUM_KERNELS: dict = dict(MOSAIC_GPU_GATE_SUMS)
"""Launchers that sum a per-key gate in a kernel of their own, reading ``g`` in the API's ``[B, T, H, K]``
(:func:`_gate_layout`); the others sum it in XLA (:func:`_triangular_sum`). The Mosaic GPU launcher's kernel
(:data:`MOSAIC_GPU_GATE_SUMS`), checked and timed on an H200 against XLA's scan
(benchmarks/results/mosaic_forward_nvidia_h200.json, gate_kernel_only: the gates' step 0.62 -> 0.48 ms at T=4096 and
1.81 -> 1.21 ms at T=16384, B=8, H=16, K=128), is in it; the benchmark empties the table to time the scan."""


def _gate_kernel(plan, width):
    """The plan's gate-sum kernel for a gate laid out ``width`` columns wide by :func:`_gate_layout`, or None:
    per-key gates only (a scalar gate's ``[C, 1]`` tile is below a TMA copy's 16-byte rows)."""
    return GATE_SUM_KERNELS.get(plan.launcher) if width > 1 else None


def _gate_layout(g, plan, T_pad, K_pad, per_key):
    """``g [B, T, H, Kg]`` as the plan's :func:`_local_cumsum` reads it: for a launcher with a gate-sum kernel and a
    ``per_key`` gate the API's layout zero-padded to ``K_pad`` columns (no copy when nothing is padded; float32,
    bfloat16 or float16 as given), else ``[B, H, T_pad, K_pad or 1]`` in float32."""
    width = K_pad if per_key else 1
    if _gate_kernel(plan, width) is None:
        return _to_kernel_layout(g, T_pad, width, jnp.float32)
    if g.dtype not in mosaic_gpu_gates.GATE_DTYPES:
        g = g.astype(jnp.float32)
    return _padded_tokens(g, T_pad, K_pad)


def _local_cumsum(g, plan):
    """``b [B, H, T, Kg]``: cumulative log-gates restarting at every chunk, float32, from ``g`` as
    :func:`_gate_layout` lays it out: by the plan's gate-sum kernel, or in XLA.

    This is where the kernels read the gate, so an invalid one (NaN, > 0, -inf; the contract of
    :mod:`gla_ref._validate`) becomes NaN here: inside the gate-sum kernel, or an elementwise select on g, which
    XLA can fuse with the copy that lays g out for the kernels (no extra pass over g under jit). The sums then
    carry that NaN to every row of its chunk (:func:`_triangular_sum`,
    :mod:`gla_ref.pallas.launchers.mosaic_gpu.gates`), and the state carries it to every later chunk: o from the bad
    token's chunk on, the final state and the gradients are NaN, never a finite wrong answer (jit cannot
    check values).
    """
    kernel = _gate_kernel(plan, g.shape[-1])
    if kernel is not None:
        return kernel(g, chunk_size=plan.chunk_size, interpret=plan.interpret)
    return _triangular_sum(valid_gate(g), plan.chunk_size, upper=False, scan=_sums_by_scan(plan.launcher))


def valid_gate(g):
    """``g`` where it is a valid log-gate (finite, ≤ 0), NaN elsewhere: one elementwise select."""
    return invalid_gates_to_nan(g, jnp.where)


def run(q, k, v, g, initial_state, plan: Plan):
    """Pad to kernel layout, call the kernels through the custom VJP, unpad.

    ``g`` is the ``[B, T, H, Kg]`` log-gate, ``Kg`` = K (GLA) or 1 (scalar gate).
    """
    T, K, V = q.shape[1], q.shape[3], v.shape[3]
    check = getattr(plan.launcher, "check_call", None)  # what a launcher cannot do yet, before any kernel
    if check is not None:
        check(q, g, plan.chunk_size, fused=plan.fused)
    o, ht = _kernels(plan)(*_layouts(q, k, v, g, initial_state, plan))
    o = o[:, :T, :, :V] if _token_major(plan) else jnp.swapaxes(o[:, :, :T, :V], 1, 2)
    return o, (_api_state(ht, K, V) if plan.want_final else None)


def _layouts(q, k, v, g, initial_state, plan):
    """q, k, v, g and the initial state as the plan's kernels read them (padded; states ``[B, H, V, K]``, float32).
    q, k or the initial state may be None (a piece that does not read it); v may be dO (same layout)."""
    x = q if k is None else k
    T, K, V = x.shape[1], x.shape[3], v.shape[3]
    K_pad, V_pad = plan.launcher.padded_dims(K, V)
    T_pad = -(-T // plan.chunk_size) * plan.chunk_size
    layout = _padded_tokens if _token_major(plan) else _to_kernel_layout
    qp, kp = (None if x is None else layout(x, T_pad, K_pad) for x in (q, k))
    vp = layout(v, T_pad, V_pad)
    gp = _gate_layout(g, plan, T_pad, K_pad, per_key=g.shape[-1] == K)
    h0 = None
    if initial_state is not None:  # kernels hold states transposed: [B, H, V, K]
        h0 = jnp.swapaxes(initial_state.astype(jnp.float32), 2, 3)
        h0 = jnp.pad(h0, ((0, 0), (0, 0), (0, V_pad - V), (0, K_pad - K)))
    return qp, kp, vp, gp, h0


def _api_state(state, K, V):
    """A state ``[B, H, V_pad, K_pad]`` from the kernels as the API's ``[B, H, K, V]``."""
    return jnp.swapaxes(state[:, :, :V, :K], 2, 3)


# ---------------------------------------------------------------- the custom VJP around the kernels

def _forward(plan: Plan, q, k, v, b, h0):
    L, kw = plan.launcher, {"chunk_size": plan.chunk_size, "interpret": plan.interpret}
    if plan.fused:
        return L.fused_fwd(q, k, v, b, h0, scale=plan.scale, want_final=plan.want_final, **kw)
    h, ht = L.state_fwd(k, v, b, h0, want_final=plan.want_final, **kw, **output_states(L, q.dtype))
    return L.chunk_fwd_o(q, k, v, b, h, scale=plan.scale, **kw), ht


def output_states(launcher, dtype) -> dict:
    """The forward's state kernel's keywords for the states only its output kernel reads: the Mosaic GPU launcher
    writes them in the input ``dtype`` (:func:`gla_ref.pallas.launchers.mosaic_gpu.state_fwd`: its output kernel rounds them
    to that dtype anyway, so o is unchanged and the states' bytes halve in bf16); the others keep float32. The
    backward recomputes the states in float32 on every launcher."""
    return {"states_dtype": dtype} if launcher is mosaic_gpu else {}


def _backward(plan: Plan, q, k, v, b, h0, do, dht):
    L, kw = plan.launcher, {"chunk_size": plan.chunk_size, "scale": plan.scale, "interpret": plan.interpret}
    want_dh0 = h0 is not None
    if plan.fused:
        dq, dk, dv, dh0, *rows = L.fused_bwd(q, k, v, b, do, h0, dht, want_dh0=want_dh0, **kw)
        return dq, dk, dv, dh0, tuple(r.sum(2)[:, :, :, 0] for r in rows)  # a, c, e: [B, H, N, Kg]
    h, _ = L.state_fwd(k, v, b, h0, chunk_size=plan.chunk_size, want_final=False, interpret=plan.interpret)
    dso, dh0 = L.state_bwd(q, b, do, dht, want_dh0=want_dh0, **kw)
    dq, dk, dv, dg = L.chunk_bwd(q, k, v, b, do, h, dso, **kw)
    return dq, dk, dv, dh0, dg.sum(2)


def _fused_gate_grad(q, k, dq, dk, g, ht, dht, chunk_size, a, c, e, scan):
    """The fused path's gate gradient, chunk-local like :func:`chunk_math.chunk_gate_grad`:
    ``dg_t = Σ_{s ≥ t in t's chunk} (q_s ⊙ dq_s − k_s ⊙ dk_s) + dγ`` with ``dγ = F_out + e``, where
    ``F_out = Σ_v S ⊙ dS`` at the chunk's end is ``Σ_v S_T ⊙ dS_T`` plus the later chunks' ``a − c``
    (:func:`chunk_math.state_in_term`, ``state_out_term``; ``a, c, e`` are ``[B, H, N, Kg]``)."""
    dlogb = q.astype(jnp.float32) * dq - k.astype(jnp.float32) * dk
    if g.shape[-1] == 1:  # a scalar gate scales every key column alike
        dlogb = dlogb.sum(-1, keepdims=True)
    B, H, T, Kg = dlogb.shape
    N = T // chunk_size
    later = jnp.triu(jnp.ones((N, N), jnp.float32), 1)  # chunk m gets the terms of chunks n > m
    F = jnp.einsum("mn,bhnd->bhmd", later, a - c, precision=HIGHEST) + e
    if dht is not None:
        final = (ht * dht).sum(-2)  # states are [B, H, V, K]: sum over V
        F = F + (final.sum(-1, keepdims=True) if Kg == 1 else final)[:, :, None, :]
    within = _triangular_sum(dlogb, chunk_size, upper=True, scan=scan).reshape(B, H, N, chunk_size, Kg)
    return (within + F[:, :, :, None, :]).reshape(B, H, T, Kg)


def checked_run(q, k, v, g, scale, initial_state, output_final_state, chunk_size, launcher,
                interpret, *, fused):
    """Validate a public call's arguments, plan it and run it (shared by both public paths)."""
    dims = check_inputs(q, k, v, g, initial_state, gate_ranks=(4,))
    check_head_dims(dims.K, dims.V)
    scale, chunk_size, output_final_state = check_options(q, k, v, scale, chunk_size, output_final_state)
    check_values(q=q, k=k, v=v, g=g, initial_state=initial_state)
    plan = make_plan(launcher, interpret, chunk_size=chunk_size, scale=scale, K=dims.K, fused=fused,
                     want_final=output_final_state, dtype=q.dtype)
    return run(q, k, v, g, initial_state, plan)


def _kernels(plan: Plan):
    @jax.custom_vjp
    def f(q, k, v, g, h0):
        return _forward(plan, q, k, v, _local_cumsum(g, plan), h0)

    def f_fwd(q, k, v, g, h0):
        o, ht = f(q, k, v, g, h0)
        return (o, ht), (q, k, v, g, h0, ht)

    def f_bwd(res, cotangents):
        return _kernel_grads(plan, *res, *cotangents)

    f.defvjp(f_fwd, f_bwd)
    return f


def _kernel_grads(plan: Plan, q, k, v, g, h0, ht, do, dht):
    """The custom VJP's backward, in the kernels' layout: ``(dq, dk, dv, dg, dh0)``."""
    do = do.astype(q.dtype)
    dq, dk, dv, dh0, dg = _backward(plan, q, k, v, _local_cumsum(g, plan), h0, do, dht)
    dq, dk = dq.sum(2), dk.sum(2)  # partials of the value blocks, [B, H, T, K]
    if plan.fused:  # no state beside its gradient in one kernel: the chunk-local form from a, c
        qh, kh = (_swapped_if_token_major(x, plan) for x in (q, k))  # [B, H, T, K], as dq and dk
        dg = _fused_gate_grad(qh, kh, dq, dk, g, ht, dht, plan.chunk_size, *dg, scan=_sums_by_scan(plan.launcher))
    dq, dk = (_swapped_if_token_major(x, plan) for x in (dq, dk))  # in q's and k's layout
    if _gate_kernel(plan, g.shape[-1]) is not None:  # g came in the API's layout and dtype
        dg = jnp.swapaxes(dg, 1, 2).astype(g.dtype)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dg, dh0


# ---------------------------------------------------------------- public

def chunk_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
              chunk_size=64, launcher=None, interpret=None):
    """GLA with the non-fused Pallas kernels: states entering each chunk are written to HBM.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]`` (float32 or bfloat16; K ≤ 256, V ≤ 4096).
        g: log forget gates ``[B, T, H, K]`` (finite, ≤ 0). An invalid gate (NaN, > 0, or -inf, a
            hard reset: split the sequences instead) makes o and the final state NaN; under
            ``gla_ref.device.debug(True)``, outside jit, a ValueError naming its position.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]`` float32 state.
        output_final_state: also return the final ``[B, H, K, V]`` float32 state.
        chunk_size: a power of two ≥ 16 (sub-chunks are 16 tokens).
        launcher: ``"tpu"`` (Mosaic), ``"gpu"`` (Triton backend) or ``"mosaic_gpu"`` (Hopper, bfloat16,
            chunk 64, K ≤ 128: Mosaic GPU kernels, :mod:`gla_ref.pallas.launchers.mosaic_gpu`); default: ``"tpu"`` on a
            TPU, ``"mosaic_gpu"`` on a Hopper GPU where it takes the call, else ``"gpu"`` (:func:`make_plan`).
        interpret: run in Pallas' interpreter (True, or a ``pltpu.InterpretParams`` for the TPU
            launcher, a Mosaic GPU ``InterpretGPUParams`` for ``"mosaic_gpu"``); default: only when
            the launcher's hardware is absent.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state or None.
    """
    return checked_run(q, k, v, g, scale, initial_state, output_final_state, chunk_size, launcher,
                       interpret, fused=False)


# ---------------------------------------------------------------- pieces, for a caller that writes its own backward

def _piece_plan(like, v, g, initial_state, scale, chunk_size, launcher, interpret):
    """Check a piece's arguments (``like`` stands for q and k: ``[B, T, H, K]``) and plan it (non-fused)."""
    dims = check_inputs(like, like, v, g, initial_state, gate_ranks=(4,))
    check_head_dims(dims.K, dims.V)
    scale, chunk_size, _ = check_options(like, like, v, scale, chunk_size, False)
    plan = make_plan(launcher, interpret, chunk_size=chunk_size, scale=scale, K=dims.K, fused=False,
                     want_final=True, dtype=like.dtype)
    check = getattr(plan.launcher, "check_call", None)
    if check is not None:
        check(like, g, plan.chunk_size, fused=False)
    return plan


def state_pass(k, v, g, *, initial_state=None, chunk_size=64, launcher=None, interpret=None):
    """The final state ``[B, H, K, V]`` (float32) of :func:`chunk_gla` without its output: the gate sums and the
    state kernel only (forward step 2 of the module docstring). Arguments as :func:`chunk_gla`'s. Not
    differentiable: a piece for a caller that writes its backward itself (:mod:`gla_ref.sequence_parallel.jax`,
    the state a device's slice builds from zero)."""
    plan = _piece_plan(k, v, g, initial_state, None, chunk_size, launcher, interpret)
    _, kp, vp, gp, h0 = _layouts(None, k, v, g, initial_state, plan)
    L = plan.launcher
    _, ht = L.state_fwd(kp, vp, _local_cumsum(gp, plan), h0, chunk_size=plan.chunk_size, want_final=True,
                        interpret=plan.interpret, **output_states(L, k.dtype))
    return _api_state(ht, k.shape[3], v.shape[3])


def state_grad_pass(q, g, do, *, final_state_grad=None, scale=None, chunk_size=64, launcher=None, interpret=None):
    """The gradient ``[B, H, K, V]`` (float32) of the initial state for the cotangents ``do`` of o and
    ``final_state_grad`` of the final state (None: zero), without any other gradient: the reverse state kernel
    only (backward step 3). Not differentiable, like :func:`state_pass`."""
    plan = _piece_plan(q, do, g, final_state_grad, scale, chunk_size, launcher, interpret)
    qp, _, dop, gp, dht = _layouts(q, None, do.astype(q.dtype), g, final_state_grad, plan)
    _, dh0 = plan.launcher.state_bwd(qp, _local_cumsum(gp, plan), dop, dht, chunk_size=plan.chunk_size,
                                     scale=plan.scale, want_dh0=True, interpret=plan.interpret)
    return _api_state(dh0, q.shape[3], do.shape[3])


def chunk_gla_bwd(q, k, v, g, do, *, scale=None, initial_state=None, final_state_grad=None, chunk_size=64,
                  launcher=None, interpret=None):
    """``(dq, dk, dv, dg, dh0)`` of :func:`chunk_gla` for the cotangents ``do`` of o and ``final_state_grad``
    of the final state (None: zero), without running its forward: the custom VJP's backward kernels alone, laid
    out as :func:`chunk_gla` lays them out. dh0 is None without an initial state. Arguments as :func:`chunk_gla`'s."""
    plan = _piece_plan(q, v, g, initial_state, scale, chunk_size, launcher, interpret)
    args, back = jax.vjp(lambda *a: _layouts(*a, plan), q, k, v, g, initial_state)
    dop = _layouts(None, k, do, g, None, plan)[2]
    dht = None if final_state_grad is None else _layouts(None, k, do, g, final_state_grad, plan)[4]
    grads = _kernel_grads(plan, *args, None, dop, dht)
    return back(grads)
