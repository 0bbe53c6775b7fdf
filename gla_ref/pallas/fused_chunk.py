"""``fused_chunk_gla``: the fused Pallas path (paper §3.3 "without materialisation", Alg. 5/6).

One kernel runs over a head's chunks in order, keeping the state on chip (a VMEM scratch
buffer on TPU, a loop carry on GPU): each chunk's output comes from the state entering it plus
the two-level intra-chunk scores, then the state moves on. No per-chunk state reaches HBM; only
the final state is written, when asked for. The backward pass re-builds the state the same way
in a forward loop (for ``dq``) and carries the state gradient on chip in a backward loop (for
``dk, dv`` and ``dh0``); the gate gradient is the closed form of :mod:`gla_ref.pallas.chunk`.
"""

from __future__ import annotations

from gla_ref.pallas.chunk import checked_run

__all__ = ["fused_chunk_gla"]


def fused_chunk_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                    chunk_size=64, launcher=None, interpret=None):
    """GLA with the fused Pallas kernel; arguments and result as :func:`gla_ref.pallas.chunk_gla`."""
    return checked_run(q, k, v, g, scale, initial_state, output_final_state, chunk_size, launcher,
                       interpret, fused=True)
