"""The forward passes cut into the pieces chapters 4 and 7 time apart (stages of one form or kernel)."""

from __future__ import annotations


def torch_chunk_parts(q, k, v, g, chunk_size=64, sub_chunk_size=16):
    """The pure-PyTorch chunk form (``torch_ref.chunk_gla_two_level``) cut at its two terms, to time
    them apart: ``(parts, combine)``, with ``parts["inter"]()`` the state recurrence and ``Q S``
    (``o_inter``) and ``parts["intra"]()`` the within-chunk product ``(P ⊙ M) V`` (``o_intra``), each a
    call without arguments on inputs prepared once; ``combine(o_inter, o_intra)`` gives ``o``."""
    from gla_ref.reference import torch as R

    R.check_sub_chunk_size(chunk_size, sub_chunk_size)
    (q_, k_, v_, g_, h0, scale), _ = R.checked_inputs(q, k, v, g, None, None)
    dtype, T = q.dtype, q.shape[1]
    qm, km, vm, gm, h0 = R.to_math_layout(q_, k_, v_, g_, h0, scale)
    qm, km, vm, gm = R.split_chunks(chunk_size, qm, km, vm, gm)
    b = gm.cumsum(-2)
    parts = {"inter": lambda: R.scan_chunks(qm, km, vm, b, h0)[0],
             "intra": lambda: R.two_level_scores(qm, km, b, sub_chunk_size, None) @ vm}
    return parts, lambda o_inter, o_intra: R.to_output_layout(o_intra + o_inter, T, dtype)


def triton_chunk_stages(q, k, v, g, chunk_size=64) -> dict:
    """The forward kernels of ``gla_ref.triton.chunk_gla`` as calls without arguments, each on inputs
    computed once here, to time them apart: ``cumsum``, ``state``, ``intra``, ``output`` (the keys of
    :func:`chunk_gla_stage_costs`). ``output()`` is chunk_gla's o. Chunk sizes as chunk_gla accepts."""
    from gla_ref._validate import check_scale
    from gla_ref.triton.common.host import check_chunk_size, prepare
    from gla_ref.triton.chunk.cumsum import chunk_gates_and_operands
    from gla_ref.triton.chunk.intra import chunk_intra_attention
    from gla_ref.triton.chunk.output import chunk_output
    from gla_ref.triton.chunk.state import chunk_state_fwd

    dims = prepare(q, k, v, g, None, gate_ranks=(4,))
    check_chunk_size(chunk_size)
    C, scale = chunk_size, check_scale(None, dims.K)
    q, k, v, g = (x.contiguous() for x in (q, k, v, g))
    b, qt, kt = chunk_gates_and_operands(q, k, g, scale, C)
    h, _ = chunk_state_fwd(kt, v, b, None, False, C, decayed=True)
    A = chunk_intra_attention(q, k, b, scale, C)
    return {"cumsum": lambda: chunk_gates_and_operands(q, k, g, scale, C),
            "state": lambda: chunk_state_fwd(kt, v, b, None, False, C, decayed=True),
            "intra": lambda: chunk_intra_attention(q, k, b, scale, C),
            "output": lambda: chunk_output(qt, v, h, A, C)}
