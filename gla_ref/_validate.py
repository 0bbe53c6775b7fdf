"""Shape, dtype and option checks shared by every form and kernel (any framework).

Only metadata is read (``.shape``, ``.dtype``), so the checks cost no device sync and run
before anything is traced or launched. Value checks (NaN, positive gates) live with each
framework, since they need its operations.
"""

from __future__ import annotations

from typing import NamedTuple

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class Dims(NamedTuple):
    B: int
    T: int
    H: int
    K: int
    V: int
    gate: str  # one of gla_ref.testing.GATES: "none", "const", "scalar", "gla"


def dtype_name(x) -> str:
    """``float32`` for torch.float32, jnp.float32, np.float32 alike."""
    return str(x.dtype).replace("torch.", "")


def _check_float(name, x, allowed=FLOAT_DTYPES):
    if dtype_name(x) not in allowed:
        raise TypeError(f"{name} must have a floating dtype in {allowed}, got {dtype_name(x)}")


def check_inputs(q, k, v, g=None, initial_state=None, *, gate_ranks=(None, 1, 3, 4),
                 max_dim=None) -> Dims:
    """Check the ``[B,T,H,D]`` layout of q, k, v, the log-gate g and the initial state.

    ``gate_ranks`` lists the gate ranks this form accepts (None = no gate); ``max_dim`` bounds
    K and V for kernels. Returns the sizes and the gate kind.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if len(x.shape) != 4:
            raise ValueError(f"{name} must have shape [B, T, H, D], got {tuple(x.shape)}")
        _check_float(name, x)
    B, T, H, K = q.shape
    V = v.shape[-1]
    if T < 1:
        raise ValueError(f"q must have T >= 1 tokens, got shape {tuple(q.shape)}")
    if tuple(k.shape) != (B, T, H, K):
        raise ValueError(f"k must have shape [B, T, H, K] = {(B, T, H, K)} like q, got {tuple(k.shape)}")
    if tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must have shape [B, T, H, V] with [B, T, H] = {(B, T, H)}, got {tuple(v.shape)}")
    if dtype_name(k) != dtype_name(q) or dtype_name(v) != dtype_name(q):
        raise TypeError(f"q, k, v must share one dtype, got {dtype_name(q)}, {dtype_name(k)}, {dtype_name(v)}")
    if max_dim is not None and (K > max_dim or V > max_dim):
        raise ValueError(f"q/v head dims K={K}, V={V} must be at most {max_dim} for this kernel")
    gate = _check_gate(g, B, T, H, K, gate_ranks)
    if initial_state is not None:
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(f"initial_state must have shape [B, H, K, V] = {(B, H, K, V)}, "
                             f"got {tuple(initial_state.shape)}")
        _check_float("initial_state", initial_state, ("float32", "float64"))
    return Dims(B, T, H, K, V, gate)


def _check_gate(g, B, T, H, K, gate_ranks) -> str:
    shapes = {1: ("const", (H,)), 3: ("scalar", (B, T, H)), 4: ("gla", (B, T, H, K))}
    expected = " or ".join("None" if r is None else f"{list(shapes[r][1])}" for r in gate_ranks)
    if g is None:
        if None not in gate_ranks:
            raise ValueError(f"g is required here: expected log-gates of shape {expected}")
        return "none"
    rank = len(g.shape)
    if rank not in gate_ranks or tuple(g.shape) != shapes[rank][1]:
        raise ValueError(f"g must have shape {expected}, got {tuple(g.shape)}")
    _check_float("g", g)
    return shapes[rank][0]


def check_chunk_sizes(chunk_size, sub_chunk_size=None) -> None:
    """Chunk sizes are positive integers and the sub-chunk divides the chunk."""
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if sub_chunk_size is None:
        return
    if not isinstance(sub_chunk_size, int) or isinstance(sub_chunk_size, bool) or sub_chunk_size < 1:
        raise ValueError(f"sub_chunk_size must be a positive int, got {sub_chunk_size!r}")
    if chunk_size % sub_chunk_size:
        raise ValueError(f"sub_chunk_size={sub_chunk_size} must divide chunk_size={chunk_size}")
