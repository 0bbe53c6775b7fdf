"""Shape, dtype and option checks shared by every form and kernel (any framework), and the
layout of packed batches (:func:`packed_layout`).

Tensor checks read only metadata (``.shape``, ``.dtype``), so they cost no device sync and run
before anything is traced or launched. The exceptions are :func:`read_offsets`, which must
read the offsets' values (see there; :func:`check_cu_seqlens` checks them), and
:func:`check_gate_values`, the one home of the log-gate value rule (below), which reads values and
so runs in the references always and in the kernels under ``gla_ref.device.debug(True)``. The
NaN/inf checks of q, k, v and the state live with each framework.

The log-gate rule, the same in every form and kernel: a valid log-gate is finite and ≤ 0 (a gate
in (0, 1]). NaN, positive values (a gate given as a probability rather than its log) and -inf
(a gate of exactly 0, a hard reset) are invalid: the references and debug mode raise a ValueError
naming the argument and its first bad position; kernels without debug turn an invalid gate into
NaN where they read it, so their output is never finite for it. Hard resets are refused on
purpose: the exact way to reset the state between documents is a packed batch (``cu_seqlens``).

Option rules, the same in every form and kernel:

* ``scale`` (:func:`check_scale`): None, or a finite real Python or NumPy scalar (not a bool);
* flags such as ``output_final_state`` (:func:`check_flag`): a Python ``bool`` or ``numpy.bool_``;
* chunk sizes (:func:`check_chunk_sizes`): positive Python or NumPy integers (not bools or floats);
* sizes: every dimension of q, k, v is at least 1 (an empty batch, head or feature axis is a
  ValueError rather than an empty result, so no kernel ever sees an empty grid).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

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


# ----------------------------------------------------------------------------- packed batches

OFFSET_DTYPES = ("int32", "int64")
"""The dtypes ``cu_seqlens`` may have, in every form and kernel (FLA's kernels take both)."""


def read_offsets(cu_seqlens, *, array_type=None, array_name="", device=None) -> np.ndarray:
    """The offsets of a packed batch (FLA's ``cu_seqlens``) read on the host, after the checks that
    need no values: a contiguous NumPy int64 array ``[N + 1]`` (a copy: later writes to
    ``cu_seqlens`` do not reach it). :func:`check_cu_seqlens` then checks the values.

    The rule, the same in every form and kernel: ``cu_seqlens`` is a 1-D int32 or int64 array of
    N + 1 ≥ 2 offsets, either the caller's framework's array (``array_type``: ``torch.Tensor`` or
    ``jax.Array``, named ``array_name`` in messages) or a NumPy array, converted here. Any stride
    is read as it is (a strided view is never read as if contiguous). A torch tensor must hold
    values (not a meta tensor) and sit on ``device`` (q's) when given. Another kind of object (a
    list, a tensor of the other framework), another dtype is a TypeError; another rank or size,
    or device, a ValueError; a JAX array traced by ``jit`` is a TypeError (its values set the
    sequence boundaries, so they must be known now). Every message names cu_seqlens.

    Reading the values is one device-to-host copy: a sync for a CUDA tensor.
    """
    kinds = "NumPy array" if array_type is None else f"{array_name} or NumPy array"
    expected = f"a 1-D {' or '.join(OFFSET_DTYPES)} {kinds} of N + 1 offsets"
    if not (isinstance(cu_seqlens, np.ndarray) or (array_type is not None and isinstance(cu_seqlens, array_type))):
        raise TypeError(f"cu_seqlens must be {expected}, got {type(cu_seqlens).__name__}")
    if dtype_name(cu_seqlens) not in OFFSET_DTYPES:
        raise TypeError(f"cu_seqlens must be {expected}, got dtype {dtype_name(cu_seqlens)}")
    if len(cu_seqlens.shape) != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"cu_seqlens must be {expected} (N >= 1), got shape {tuple(cu_seqlens.shape)}")
    if isinstance(cu_seqlens, np.ndarray):
        return np.array(cu_seqlens, dtype=np.int64)
    if getattr(cu_seqlens, "is_meta", False):
        raise ValueError("cu_seqlens is a meta tensor, which holds no values: its values set the "
                         "sequence boundaries, so pass them on q's device")
    if device is not None and getattr(cu_seqlens, "device", device) != device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device} but q is on {device}: "
                         "all inputs must share a device")
    try:
        values = cu_seqlens.tolist()
    except TypeError as err:  # a JAX tracer: the offsets set shapes, so they must be known now
        raise TypeError("cu_seqlens must be concrete (its values set the sequence boundaries); "
                        "pass it from outside jit, or close over it") from err
    return np.array(values, dtype=np.int64)


def check_cu_seqlens(offsets, T: int, B: int) -> int:
    """Check the values of a packed batch's offsets (from :func:`read_offsets`: a NumPy integer
    array ``[N + 1]``) and return N, the number of sequences.

    FLA's convention: the T tokens of a batch with ``B = 1`` hold N sequences, sequence n the
    tokens ``offsets[n]`` up to (not including) ``offsets[n + 1]``. The offsets start at 0, end at
    T and never decrease; a sequence may be empty (equal offsets): it has no rows of o, and its
    final state is its initial state (zeros without one). A wrong batch size or offsets is a
    ValueError naming cu_seqlens; an object :func:`read_offsets` has not read is a TypeError.
    """
    if not (isinstance(offsets, np.ndarray) and dtype_name(offsets) in OFFSET_DTYPES
            and offsets.ndim == 1 and len(offsets) >= 2):
        raise TypeError("check_cu_seqlens takes the offsets read by read_offsets (a 1-D NumPy int array "
                        f"[N + 1]), got {type(offsets).__name__}: read cu_seqlens first")
    if B != 1:
        raise ValueError(f"cu_seqlens needs one packed sequence batch, B = 1, got B = {B}")
    if offsets[0] != 0 or offsets[-1] != T:
        raise ValueError(f"cu_seqlens must start at 0 and end at T = {T}, "
                         f"got {int(offsets[0])} ... {int(offsets[-1])}")
    lengths = np.diff(offsets)
    if (lengths < 0).any():
        n = int(np.argmax(lengths < 0))
        raise ValueError(f"cu_seqlens must not decrease (sequence lengths >= 0), got "
                         f"cu_seqlens[{n}] = {int(offsets[n])} > cu_seqlens[{n + 1}] = {int(offsets[n + 1])}")
    return len(offsets) - 1


def packed_layout(offsets):
    """Where the tokens of a packed batch go when each sequence gets a row of its own.

    ``offsets``: the values of a checked cu_seqlens (N + 1 ints ending at T). Returns NumPy int
    arrays ``(gather, rows, cols)``: ``gather [N, L]`` (L the longest length) holds the packed index of
    token t of sequence n, and T past the sequence's end (a padding slot); ``rows [T]`` and
    ``cols [T]`` give each packed token's sequence and position, the inverse map.
    """
    offsets = np.asarray(offsets)
    lengths = np.diff(offsets)
    t = np.arange(lengths.max())
    gather = np.where(t < lengths[:, None], offsets[:-1, None] + t, offsets[-1])
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    return gather, rows, cols


# ----------------------------------------------------------------------------- head sizes

MAX_K = 256
"""Largest K per head any kernel (Triton or Pallas) accepts: kernels that need a sum over every key in
one program (q·k scores, the fused kernels' state slices) hold a chunk's whole K, padded to a power of
two, in one block."""

MAX_V = 4096
"""Largest V per head any kernel accepts. Every kernel tiles V, so on-chip blocks do not grow with V;
HBM buffers do (chunk_gla's states take ``4·K·V`` bytes per chunk and head, 4 MiB at K = 256,
V = 4096). Tested up to V = 1024 (the GLA paper's 1.3B head is K = 256, V = 512)."""


def check_head_dims(K: int, V: int, where: str = "this kernel") -> None:
    """K (of q and k) at most :data:`MAX_K` and V (of v) at most :data:`MAX_V`, else a ValueError naming them."""
    if K > MAX_K:
        raise ValueError(f"q, k: head dim K={K} must be at most {MAX_K} for {where}")
    if V > MAX_V:
        raise ValueError(f"v: head dim V={V} must be at most {MAX_V} for {where}")


# ----------------------------------------------------------------------------- tensors

def check_inputs(q, k, v, g=None, initial_state=None, *, gate_ranks=(None, 1, 3, 4),
                 max_dim=None, cu_seqlens=None) -> Dims:
    """Check the ``[B,T,H,D]`` layout of q, k, v, the log-gate g, the offsets and the initial state.

    ``gate_ranks`` lists the gate ranks this form accepts (None = no gate); ``max_dim`` bounds
    K and V for kernels. With ``cu_seqlens`` (the offsets as :func:`read_offsets` returns them, checked
    by :func:`check_cu_seqlens`) the batch is packed, B = 1, and the initial state is ``[N, H, K, V]``;
    otherwise it is ``[B, H, K, V]``. Every size must be at least 1. Returns the sizes and the gate kind.
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
    if min(B, H, K) < 1 or V < 1:
        raise ValueError(f"q and v must have B, H, K, V >= 1 (empty batches are not computed), "
                         f"got q {tuple(q.shape)}, v {tuple(v.shape)}")
    if dtype_name(k) != dtype_name(q) or dtype_name(v) != dtype_name(q):
        raise TypeError(f"q, k, v must share one dtype, got {dtype_name(q)}, {dtype_name(k)}, {dtype_name(v)}")
    if max_dim is not None and (K > max_dim or V > max_dim):
        raise ValueError(f"q/v head dims K={K}, V={V} must be at most {max_dim} for this kernel")
    gate = check_gate_shape(g, B, T, H, K, gate_ranks)
    N = B if cu_seqlens is None else check_cu_seqlens(cu_seqlens, T, B)
    if initial_state is not None:
        if tuple(initial_state.shape) != (N, H, K, V):
            lead = "B" if cu_seqlens is None else "N"
            raise ValueError(f"initial_state must have shape [{lead}, H, K, V] = {(N, H, K, V)}, "
                             f"got {tuple(initial_state.shape)}")
        _check_float("initial_state", initial_state, ("float32", "float64"))
    return Dims(B, T, H, K, V, gate)


def check_gate_shape(g, B, T, H, K, gate_ranks) -> str:
    """The log-gate ``g``'s rank among ``gate_ranks`` (None, 1, 3, 4), its shape for that rank (``[H]``,
    ``[B, T, H]``, ``[B, T, H, K]``) and its floating dtype, else a ValueError or TypeError naming ``g``
    and the shapes expected; returns the family its rank picks: ``"none"``, ``"const"``, ``"scalar"``
    or ``"gla"``. Values are not read (:func:`check_gate_values` does that)."""
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


# ----------------------------------------------------------------------------- gate values

_GATE_AXES = {1: ("h",), 3: ("b", "t", "h"), 4: ("b", "t", "h", "k")}

HARD_RESET_ADVICE = ("a hard reset (gate exactly 0) is not supported: split the sequences with "
                     "cu_seqlens")
GATES_ARE = "log forget gates <= 0 (finite; the natural log of gates in (0, 1])"
PROBABILITY_ADVICE = ("{name} looks like gate probabilities, not their logs: pass the natural log of "
                      "the gate (e.g. logsigmoid(x), not sigmoid(x))")


def _host_bool(x) -> np.ndarray:
    """A boolean tensor (PyTorch, JAX or NumPy) as a NumPy array on the host."""
    if hasattr(x, "detach"):  # PyTorch
        return x.detach().cpu().numpy()
    return np.asarray(x)


def gate_value_error(name: str, g, index: tuple, what: str = GATES_ARE, advice: bool = True) -> ValueError:
    """The error for the invalid log-gate ``g[index]``: names the argument and the position
    (``g[b=0, t=5, h=1, k=3]``, ``g_gamma[h=2]``), says what the value is and (``advice``) what to
    do. ``what`` describes what ``name`` holds (an intermediate such as a cumulative gate says so,
    without advice)."""
    value = float(g[index])
    axes = _GATE_AXES.get(len(index), tuple(f"dim{i}" for i in range(len(index))))
    where = f"{name}[{', '.join(f'{a}={int(i)}' for a, i in zip(axes, index))}]"
    head = f"{name} must hold {what}"
    if math.isnan(value):
        return ValueError(f"{head}, got NaN at {where}")
    if not advice:
        return ValueError(f"{head}, got {value:.3g} at {where}")
    if value == -math.inf:
        return ValueError(f"{head}, got -inf at {where}: {HARD_RESET_ADVICE}")
    return ValueError(f"{head}, got {value:.3g} > 0 at {where}: {PROBABILITY_ADVICE.format(name=name)}")


def valid_gate_mask(g):
    """Where ``g`` (a PyTorch, JAX or NumPy array) is a valid log-gate: finite and ≤ 0 (NaN fails both
    comparisons)."""
    return (g <= 0) & (g > -math.inf)


def invalid_gates_to_nan(g, where):
    """``g`` with every invalid log-gate replaced by NaN, by the array's framework's ``where``
    (``torch.where``, ``jnp.where``): how code that cannot afford a sync (a kernel's wrapper, a traced
    program) makes an invalid gate loud instead of finite and wrong."""
    return where(valid_gate_mask(g), g, math.nan)


def check_gate_values(name: str, g, what: str = GATES_ARE, advice: bool = True) -> None:
    """Raise :func:`gate_value_error` for the first invalid entry of the log-gate ``g``, if any.

    ``g`` is a PyTorch tensor, a concrete JAX array or a NumPy array; valid means finite and
    ≤ 0 (NaN, positive values and -inf are invalid). The test runs where g lives; reading its
    result is one device sync (a second one, and a host copy of the mask, only when g is bad).
    """
    if g is None:
        return
    bad = ~valid_gate_mask(g)
    if not bool(bad.any()):
        return
    mask = _host_bool(bad)
    index = np.unravel_index(int(np.argmax(mask)), mask.shape)
    raise gate_value_error(name, g, tuple(int(i) for i in index), what, advice)


# ----------------------------------------------------------------------------- options

def check_scale(scale, K: int) -> float:
    """The query scale as a Python float: ``K ** -0.5`` for None.

    Accepts finite real Python and NumPy scalars (``0.5``, ``1``, ``np.float32(0.5)``,
    ``np.int64(1)``). A bool, a complex number, a string or a tensor is a TypeError; NaN or inf
    is a ValueError.
    """
    if scale is None:
        return K ** -0.5
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    return float(scale)


def check_flag(name: str, value) -> bool:
    """A yes/no option such as ``output_final_state``, as a Python bool.

    Accepts ``True``/``False`` and ``numpy.bool_`` (what NumPy comparisons return); anything else,
    the ints 0 and 1 and None included, is a TypeError naming the option.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


def _check_size(name, value) -> None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int (Python or NumPy integer), got {value!r}")


def check_chunk_sizes(chunk_size, sub_chunk_size=None) -> None:
    """Chunk sizes are positive Python or NumPy integers (not bools, not floats), and the sub-chunk
    (when given) divides the chunk. Any fault is a ValueError naming the size."""
    _check_size("chunk_size", chunk_size)
    if sub_chunk_size is None:
        return
    _check_size("sub_chunk_size", sub_chunk_size)
    if chunk_size % sub_chunk_size:
        raise ValueError(f"sub_chunk_size={sub_chunk_size} must divide chunk_size={chunk_size}")
