"""PyTorch references for Gated Linear Attention: four forms of one recurrence.

    S_t = diag(α_t) S_{t-1} + k_tᵀ v_t,   o_t = scale · q_t S_t,   α_t = exp(g_t)

* :func:`recurrent_gla`       — the recurrence itself, token by token.
* :func:`parallel_gla`        — the parallel form in log space (Eq. 4 of the paper).
* :func:`chunk_gla`           — chunkwise: inter-chunk through the state, intra-chunk by Eq. 4.
* :func:`chunk_gla_two_level` — chunkwise with secondary-level chunking (Fig. 3 / Fig. 7): blocks
  between sub-chunks by matmuls (operands optionally in half precision), diagonal blocks by Eq. 4.

Teaching variants that show why the log-space forms exist: :func:`parallel_gla_naive` and
:func:`chunk_gla_direct`. :mod:`gla_ref.reference.jax` mirrors this module function by function.

Inputs use the ``[B, T, H, D]`` layout; inside, tensors are ``[B, H, T, D]`` (chunked:
``[B, H, T/C, C, D]``). Math runs in float32 (float64 for float64 input); ``o`` comes back in q's
dtype, the final state in the math dtype. Every exponent evaluated is ≤ 0.

Packed batches: the four forms take ``cu_seqlens``, FLA's int32 or int64 offsets ``[N + 1]`` of N
sequences packed in a batch with B = 1 (a tensor on q's device, of any stride, or a NumPy array;
empty sequences allowed), and compute each sequence as if alone, from its own row of an
``[N, H, K, V]`` initial state; the offsets are read on the host (a sync for a CUDA tensor).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gla_ref._validate import (check_chunk_sizes, check_flag, check_gate_shape, check_gate_values,
                               check_inputs, check_scale, invalid_gates_to_nan, packed_layout,
                               read_offsets)

__all__ = ["recurrent_gla", "parallel_gla", "chunk_gla", "chunk_gla_two_level",
           "parallel_gla_naive", "chunk_gla_direct", "expand_gate"]


# ----------------------------------------------------------------------------- inputs

def expand_gate(g, B, T, H, K, *, dtype=torch.float32, device=None):
    """The log-gate as ``[B, T, H, K]`` for any accepted rank of g (zeros for None)."""
    check_gate_shape(g, B, T, H, K, (None, 1, 3, 4))
    if g is None:
        return torch.zeros(B, T, H, K, dtype=dtype, device=device)
    if g.ndim == 1:  # [H]: one constant decay per head
        return g.view(1, 1, H, 1).expand(B, T, H, K)
    if g.ndim == 3:  # [B, T, H]: one data-dependent scalar per token and head
        return g.unsqueeze(-1).expand(B, T, H, K)
    return g


def check_input_values(**tensors):
    """NaN/inf in any input is a ValueError naming the argument; the log-gate ``g`` must be finite
    and ≤ 0 (:func:`gla_ref._validate.check_gate_values`: the message names its first bad position)."""
    check_gate_values("g", tensors.get("g"))
    for name, x in tensors.items():
        if name != "g" and x is not None and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or inf values")


def check_sub_chunk_size(chunk_size, sub_chunk_size):
    """Like check_chunk_sizes, where None is not allowed for the sub-chunk."""
    if sub_chunk_size is None:
        raise ValueError("sub_chunk_size must be a positive int, got None")
    check_chunk_sizes(chunk_size, sub_chunk_size)


def _check_matmul_dtype(matmul_dtype):
    if matmul_dtype is not None and not (isinstance(matmul_dtype, torch.dtype)
                                         and matmul_dtype.is_floating_point):
        raise TypeError(f"matmul_dtype must be None or a floating torch dtype, got {matmul_dtype!r}")


def checked_inputs(q, k, v, g, scale, initial_state, cu_seqlens=None):
    """Validate the inputs; return ``((q, k, v, g, h0, scale), offsets)``: g as ``[B, T, H, K]``,
    h0 zeros ``[N, H, K, V]`` where no initial state is given, the default scale filled in, and
    the values of cu_seqlens as a list, or None (read on the host: a sync for a CUDA tensor;
    :func:`gla_ref._validate.read_offsets` says what it may be). Under ``torch.compile`` the values of q, k,
    v, g and the initial state are not read (that would break the graph and sync the device): NaN or inf
    inputs then give NaN outputs, and an invalid gate is made NaN, so the result is loud, never finite and
    wrong."""
    if cu_seqlens is not None:
        cu_seqlens = read_offsets(cu_seqlens, array_type=torch.Tensor, array_name="torch.Tensor",
                                  device=q.device if isinstance(q, torch.Tensor) else None)
    dims = check_inputs(q, k, v, g, initial_state, cu_seqlens=cu_seqlens)
    scale = check_scale(scale, dims.K)
    if torch.compiler.is_compiling():  # a compiled graph reads no value on the host: an invalid gate becomes NaN
        g = None if g is None else invalid_gates_to_nan(g, torch.where)
    else:
        check_input_values(q=q, k=k, v=v, g=g, initial_state=initial_state)
    g = expand_gate(g, dims.B, dims.T, dims.H, dims.K, device=q.device)
    offsets = None if cu_seqlens is None else cu_seqlens.tolist()
    if initial_state is None:  # an empty state: every form then has one code path
        N = dims.B if offsets is None else len(offsets) - 1
        initial_state = torch.zeros(N, dims.H, dims.K, dims.V, device=q.device)
    return (q, k, v, g, initial_state, scale), offsets


def _run(compute, inputs, offsets, **options):
    """``compute(q, k, v, g, h0, scale, **options) -> (o, S)`` on the whole batch, or, with the
    offsets of a packed batch, on its N sequences side by side, each from its own first token and
    its own row of h0: o back in packed order ``[1, T, H, V]``, S ``[N, H, K, V]``."""
    if offsets is None:
        return compute(*inputs, **options)
    gather, rows, cols = packed_layout(offsets)
    q, k, v, g, h0, scale = inputs
    o, S = compute(*(_unpack(x, gather) for x in (q, k, v, g)), h0, scale, **options)
    return o[torch.as_tensor(rows, device=o.device), torch.as_tensor(cols, device=o.device)][None], S


def _unpack(x, gather):
    """Packed ``[1, T, ...]`` → ``[N, L, ...]`` by the ``gather`` indices of :func:`packed_layout`,
    zeros past each sequence's end (zero keys and log-gates leave its final state exact)."""
    padded = torch.cat([x, x.new_zeros(1, 1, *x.shape[2:])], 1)
    return padded[0, torch.as_tensor(gather, device=x.device)]


def to_math_layout(q, k, v, g, h0, scale):
    """q·scale, k, v, g heads first (``[B, H, T, D]``) and h0, all in the math dtype (float32/float64)."""
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, g = (x.to(dt).transpose(1, 2) for x in (q, k, v, g))
    return q * scale, k, v, g, h0.to(dt)


def split_chunks(C, *xs):
    """``[B, H, T, D]`` → ``[B, H, N, C, D]``, T padded with zeros to N·C (zero log-gate = no decay)."""
    T = xs[0].shape[2]
    pad = -T % C
    return [F.pad(x, (0, 0, 0, pad)).unflatten(2, (-1, C)) for x in xs]


def to_output_layout(o, T, dtype):
    """``[B, H, T', V]`` or ``[B, H, N, C, V]`` → ``[B, T, H, V]`` in q's dtype (padding dropped)."""
    B, H, V = o.shape[0], o.shape[1], o.shape[-1]
    o = o.reshape(B, H, -1, V)[:, :, :T]
    return o.transpose(1, 2).to(dtype)


def _round_to(x, dtype):
    """A matmul operand rounded to ``dtype`` and back (a round trip: x keeps its dtype, not the precision
    ``dtype`` lacks), as fp16/bf16 tensor cores read it; the product accumulates in fp32. None: x as it is."""
    return x if dtype is None else x.to(dtype).to(x.dtype)


# ----------------------------------------------------------------------------- shared math

def _causal(L, device):
    return torch.ones(L, L, dtype=torch.bool, device=device).tril()


def _decay_scores(q, k, bq, bk, mask):
    """Eq. 4: ``P_ij = Σ_k q_ik k_jk exp(bq_ik − bk_jk)`` where ``mask_ij``, else 0.

    Masked pairs get exponent −inf *before* exp, so no positive exponent is ever evaluated.
    Memory is O(L²K): fine for a reference.
    """
    diff = bq[..., :, None, :] - bk[..., None, :, :]  # [..., Lq, Lk, K]
    decay = torch.exp(torch.where(mask[..., None], diff, float("-inf")))
    return (q[..., :, None, :] * k[..., None, :, :] * decay).sum(-1)


def _state_output(q, b, S):
    """What the state entering a block gives its queries: ``(q ⊙ exp(b)) S``, b ≤ 0 from the block start."""
    return (q * torch.exp(b)) @ S


def _advance_state(S, k, v, b):
    """The state after a block: ``diag(exp b_last) S + (k ⊙ exp(b_last − b))ᵀ v`` (exponents ≤ 0)."""
    b_last = b[..., -1:, :]
    S_new = (k * torch.exp(b_last - b)).transpose(-1, -2) @ v
    return torch.exp(b_last).transpose(-1, -2) * S + S_new


def scan_chunks(q, k, v, b, h0):
    """Inter-chunk part: each chunk's queries read the state entering it; returns (o_inter, S_N)."""
    S, outs = h0, []
    for n in range(q.shape[2]):  # N chunks, in order
        outs.append(_state_output(q[:, :, n], b[:, :, n], S))
        S = _advance_state(S, k[:, :, n], v[:, :, n], b[:, :, n])
    return torch.stack(outs, 2), S


def two_level_scores(q, k, b, c, matmul_dtype):
    """The intra-chunk matrix P ``[..., C, C]`` from sub-chunks of size c (Fig. 3).

    Diagonal blocks: Eq. 4 in full precision. Block (s, u), u < s: a matmul of
    ``(Q_s ⊙ exp(b − r_s)) (K_u ⊙ exp(r_s − b))ᵀ`` with r_s the cumulative gate at the first row of
    the query sub-chunk s, so both exponents are ≤ 0; operands rounded to ``matmul_dtype``.
    """
    *lead, C, K = q.shape
    Ns = C // c
    qs, ks, bs = (x.reshape(-1, Ns, c, K) for x in (q, k, b))  # [L, Ns, c, K], L = all leading dims
    P_diag = _decay_scores(qs, ks, bs, bs, _causal(c, q.device))  # [L, Ns, c, c]
    r = bs[..., :, :1, :]  # [L, Ns, 1, K]
    q_hat = qs * torch.exp(bs - r)
    earlier = torch.ones(Ns, Ns, dtype=torch.bool, device=q.device).tril(-1)  # [s, u]: u < s
    diff = r[..., :, None, :, :] - bs[..., None, :, :, :]  # [L, s, u, c, K]
    k_hat = ks[..., None, :, :, :] * torch.exp(torch.where(earlier[:, :, None, None], diff, float("-inf")))
    P_off = _round_to(q_hat, matmul_dtype)[..., :, None, :, :] @ _round_to(k_hat, matmul_dtype).transpose(-1, -2)
    diagonal = torch.eye(Ns, dtype=torch.bool, device=q.device)[:, :, None, None]
    P = torch.where(diagonal, P_diag[..., :, None, :, :], P_off)  # [L, s, u, c(i), c(j)]
    return P.transpose(-3, -2).reshape(*lead, C, C)


# ----------------------------------------------------------------------------- the four forms
# Each public form checks its inputs, then runs a private function holding only the math, on the
# whole batch or, with cu_seqlens, on the packed sequences side by side (:func:`_run`).

def recurrent_gla(q, k, v, g=None, *, scale=None, initial_state=None, output_final_state=False,
                  cu_seqlens=None):
    """GLA by its recurrence, one token at a time: the definition the other forms reproduce.

    ``S_t = diag(α_t) S_{t−1} + k_tᵀ v_t`` and ``o_t = scale · q_t S_t`` (token t included), with
    the forget gate ``α_t = exp(g_t)`` in (0, 1]. T sequential steps on a ``[K, V]`` state per head.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; one floating dtype.
        g: natural-log forget gates, finite and ≤ 0. Its shape picks the model: None (no decay:
            linear attention), ``[H]`` (one constant decay per head, RetNet), ``[B, T, H]`` (one gate
            per token and head, simple GLA / Mamba-2) or ``[B, T, H, K]`` (GLA: one per key feature).
            NaN, a positive value or -inf (a hard reset, gate 0: split the sequences with
            cu_seqlens instead) is a ValueError naming its first position ``(b, t, h[, k])``.
        scale: multiplies q; a finite real Python or NumPy scalar, default ``K ** -0.5``.
        initial_state: S_0, ``[B, H, K, V]`` float32 or float64 (``[N, H, K, V]`` with
            cu_seqlens), or None for zeros.
        output_final_state: a bool; whether to return the state after the last token.
        cu_seqlens: None, or int32/int64 offsets ``[N + 1]`` of N sequences packed in a batch with
            B = 1 (FLA's convention; a tensor on q's device or a NumPy array):
            0 = cu_seqlens[0] <= ... <= cu_seqlens[N] = T (an empty sequence's final state is its
            initial state). Each sequence is computed as if alone, from its own row of
            initial_state. Its values are read on the host (a device sync for a CUDA tensor).

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state ``[B, H, K, V]``
        (``[N, H, K, V]`` with cu_seqlens) in the math dtype (float32, or float64 for float64
        inputs) when output_final_state, else None. Differentiable in q, k, v, g and initial_state.

    Raises:
        ValueError or TypeError naming the argument, before any math: bad shapes, dtypes, options
        or offsets, empty sizes, NaN/inf inputs, an invalid gate (NaN, > 0, -inf).
    """
    check_flag("output_final_state", output_final_state)
    o, S = _run(_recurrent_gla, *checked_inputs(q, k, v, g, scale, initial_state, cu_seqlens))
    return o, (S if output_final_state else None)


def _recurrent_gla(q, k, v, g, h0, scale):
    dtype, T = q.dtype, q.shape[1]
    q, k, v, g, S = to_math_layout(q, k, v, g, h0, scale)
    outs = []
    for t in range(T):
        S = torch.exp(g[:, :, t, :, None]) * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(q[:, :, t, None, :] @ S)  # [B, H, 1, V]
    o = torch.cat(outs, 2)
    return to_output_layout(o, T, dtype), S


def parallel_gla(q, k, v, g=None, *, scale=None, initial_state=None, output_final_state=False,
                 cu_seqlens=None):
    """GLA in its parallel form, in log space (Eq. 4 of the paper), over the whole sequence.

    With ``b_t = Σ_{s≤t} g_s`` the cumulative log-gate, ``o = (P ⊙ M) V + (Q ⊙ exp b) S_0`` where
    ``P_ij = scale · Σ_k q_ik k_jk exp(b_ik − b_jk)`` and M is the causal mask (exponents ≤ 0);
    the final state is ``diag(exp b_T) S_0 + (K ⊙ exp(b_T − b))ᵀ V``. O(T²K) memory.

    Args:
        q, k, v, g, scale, initial_state, output_final_state, cu_seqlens: as in
            :func:`recurrent_gla` — q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; g natural-log gates
            ≤ 0, None, ``[H]``, ``[B, T, H]`` or ``[B, T, H, K]``; initial_state ``[B, H, K, V]``
            (``[N, H, K, V]`` with cu_seqlens, int32/int64 ``[N + 1]`` offsets into a batch with B = 1).

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state ``[B or N, H, K, V]``
        in the math dtype, or None unless output_final_state. Differentiable in every input.
    """
    check_flag("output_final_state", output_final_state)
    o, S = _run(_parallel_gla, *checked_inputs(q, k, v, g, scale, initial_state, cu_seqlens))
    return o, (S if output_final_state else None)


def _parallel_gla(q, k, v, g, h0, scale):
    dtype, T = q.dtype, q.shape[1]
    q, k, v, g, h0 = to_math_layout(q, k, v, g, h0, scale)
    b = g.cumsum(2)
    o = _decay_scores(q, k, b, b, _causal(T, q.device)) @ v + _state_output(q, b, h0)
    return to_output_layout(o, T, dtype), _advance_state(h0, k, v, b)


def chunk_gla(q, k, v, g=None, *, scale=None, initial_state=None, output_final_state=False,
              chunk_size=64, cu_seqlens=None):
    """GLA in chunks of C = ``chunk_size`` tokens (paper §4.2): intra-chunk by Eq. 4, inter-chunk
    through the state S_n entering each chunk.

    Within chunk n (counted from 0 as in the code, so S_n is the book's S_[n], the state entering
    chunk [n+1]; book/notation.md), with b = log Λ the cumulative log-gate from the chunk start,
    ``O_n = (P_n ⊙ M) V_n + (Q_n ⊙ exp b) S_n`` and
    ``S_{n+1} = diag(exp b_C) S_n + (K_n ⊙ exp(b_C − b))ᵀ V_n``.
    T is padded to a multiple of C with zero gates and zero keys (the final state stays exact);
    with cu_seqlens every sequence is chunked from its own first token.

    Args:
        q, k, v, g, scale, initial_state, output_final_state, cu_seqlens: as in
            :func:`recurrent_gla` — q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; g natural-log gates
            ≤ 0, None, ``[H]``, ``[B, T, H]`` or ``[B, T, H, K]``; initial_state ``[B, H, K, V]``
            (``[N, H, K, V]`` with cu_seqlens, int32/int64 ``[N + 1]`` offsets into a batch with B = 1).
        chunk_size: C, a positive Python or NumPy integer (any T works).

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state ``[B or N, H, K, V]``
        in the math dtype, or None unless output_final_state. Differentiable in every input.
    """
    check_chunk_sizes(chunk_size)
    check_flag("output_final_state", output_final_state)
    o, S = _run(_chunk_gla, *checked_inputs(q, k, v, g, scale, initial_state, cu_seqlens),
                chunk_size=int(chunk_size))
    return o, (S if output_final_state else None)


def _chunk_gla(q, k, v, g, h0, scale, *, chunk_size):
    dtype, T = q.dtype, q.shape[1]
    q, k, v, g, h0 = to_math_layout(q, k, v, g, h0, scale)
    q, k, v, g = split_chunks(chunk_size, q, k, v, g)
    b = g.cumsum(-2)  # cumulative log-gate from the chunk start
    o_intra = _decay_scores(q, k, b, b, _causal(chunk_size, q.device)) @ v
    o_inter, S = scan_chunks(q, k, v, b, h0)
    return to_output_layout(o_intra + o_inter, T, dtype), S


def chunk_gla_two_level(q, k, v, g=None, *, scale=None, initial_state=None, output_final_state=False,
                        chunk_size=64, sub_chunk_size=16, matmul_dtype=None, cu_seqlens=None):
    """GLA in chunks with secondary-level chunking (Fig. 3 / Fig. 7 of the paper).

    As :func:`chunk_gla`, but the intra-chunk matrix is built from sub-chunks of c =
    ``sub_chunk_size`` tokens: blocks between sub-chunks by plain matmuls whose operands are
    rescaled from the query sub-chunk's first row (exponents ≤ 0), diagonal blocks by Eq. 4.

    Args:
        q, k, v, g, scale, initial_state, output_final_state, cu_seqlens: as in
            :func:`recurrent_gla` — q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; g natural-log gates
            ≤ 0, None, ``[H]``, ``[B, T, H]`` or ``[B, T, H, K]``; initial_state ``[B, H, K, V]``
            (``[N, H, K, V]`` with cu_seqlens, int32/int64 ``[N + 1]`` offsets into a batch with B = 1).
        chunk_size, sub_chunk_size: C and c, positive integers with c dividing C.
        matmul_dtype: None, or a floating torch dtype (e.g. torch.float16) to which the operands
            of the inter-sub-chunk matmuls are rounded, simulating half-precision tensor cores
            with float32 accumulation.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state ``[B or N, H, K, V]``
        in the math dtype, or None unless output_final_state. Differentiable in every input.
    """
    check_sub_chunk_size(chunk_size, sub_chunk_size)
    _check_matmul_dtype(matmul_dtype)
    check_flag("output_final_state", output_final_state)
    o, S = _run(_chunk_gla_two_level, *checked_inputs(q, k, v, g, scale, initial_state, cu_seqlens),
                chunk_size=int(chunk_size), sub_chunk_size=int(sub_chunk_size), matmul_dtype=matmul_dtype)
    return o, (S if output_final_state else None)


def _chunk_gla_two_level(q, k, v, g, h0, scale, *, chunk_size, sub_chunk_size, matmul_dtype):
    dtype, T = q.dtype, q.shape[1]
    q, k, v, g, h0 = to_math_layout(q, k, v, g, h0, scale)
    q, k, v, g = split_chunks(chunk_size, q, k, v, g)
    b = g.cumsum(-2)
    o_intra = two_level_scores(q, k, b, sub_chunk_size, matmul_dtype) @ v
    o_inter, S = scan_chunks(q, k, v, b, h0)
    return to_output_layout(o_intra + o_inter, T, dtype), S


# ----------------------------------------------------------------------------- teaching variants

def parallel_gla_naive(q, k, v, g=None, *, scale=None):
    """``O = ((Q ⊙ B)(K / B)ᵀ ⊙ M) V`` with ``B = cumprod(α)`` in q's dtype.

    Numerically unsafe on purpose: for long T or strong gates B underflows, K/B overflows and
    the output holds inf/NaN. :func:`parallel_gla` is the log-space fix.
    """
    (q, k, v, g, _, scale), _ = checked_inputs(q, k, v, g, scale, None)
    T = q.shape[1]
    Bc = torch.cumprod(torch.exp(g.to(q.dtype)), dim=1)  # B_t = α_1 ⋯ α_t
    q, k, v, Bc = (x.transpose(1, 2) for x in (q * scale, k, v, Bc))
    A = (q * Bc) @ (k / Bc).transpose(-1, -2)
    A = torch.where(_causal(T, q.device), A, 0.0)
    return (A @ v).transpose(1, 2)


def chunk_gla_direct(q, k, v, g=None, *, scale=None, initial_state=None, output_final_state=False,
                     chunk_size=16, matmul_dtype=None):
    """One-level chunkwise form whose intra-chunk part is the plain matmul ``(Q ⊙ Λ)(K / Λ)ᵀ``.

    Λ = exp of the cumulative gate from the chunk start, so ``K / Λ`` grows like ``exp(C·|g|)``:
    with operands in half precision (``matmul_dtype``) it overflows once the chunk is long — the
    paper's "direct adaptation" that needs C = 16. :func:`chunk_gla_two_level` is the stable version.
    """
    check_chunk_sizes(chunk_size)
    _check_matmul_dtype(matmul_dtype)
    check_flag("output_final_state", output_final_state)
    chunk_size = int(chunk_size)
    (q, k, v, g, h0, scale), _ = checked_inputs(q, k, v, g, scale, initial_state)
    dtype, T = q.dtype, q.shape[1]
    q, k, v, g, h0 = to_math_layout(q, k, v, g, h0, scale)
    q, k, v, g = split_chunks(chunk_size, q, k, v, g)
    b = g.cumsum(-2)
    Lam = torch.exp(b)
    A = _round_to(q * Lam, matmul_dtype) @ _round_to(k / Lam, matmul_dtype).transpose(-1, -2)
    A = torch.where(_causal(chunk_size, q.device), A, 0.0)
    o_inter, S = scan_chunks(q, k, v, b, h0)
    return to_output_layout(A @ v + o_inter, T, dtype), (S if output_final_state else None)
