"""Pallas launchers on Mosaic GPU (Hopper, sm_90): the chunk_gla kernels as warpgroup kernels.

Status. The default of ``chunk_gla``, ``fused_chunk_gla`` and ``chunk_simple_gla`` on a Hopper GPU for the
calls it takes (bf16, chunk 64, ``K ≤ 128``, fused ``K ≤ 64``: :func:`supported`,
:func:`gla_ref.pallas.chunk.make_plan`), except scalar gates (``chunk_simple_gla``, g_gamma or g: 1.2-1.7x the
Triton-backend launcher's time there). On an H200 (jax 0.11.2, B=8, H=16, K=V=128, bf16) it was within 3.3e-3
of float64 for o, the final state and every gradient on every path
(benchmarks/results/pallas_mosaic_gpu_nvidia_h200.json), and ``chunk_gla`` on it faster than
``gla_ref.triton.chunk_gla`` in the same process: forward 0.88x, 0.96x and 0.92x, forward+backward 0.97x,
0.96x and 0.96x at T=4096, 8192 and 16384 (2026-11-27, benchmarks/results/mosaic_loops_nvidia_h200.json). On a
CPU the tests run it in jax's Mosaic GPU interpreter and lower it for CUDA
(tests/pallas/test_pallas_mosaic_gpu.py). Little is tuned: no warp specialisation, one warpgroup per program,
and a scalar gate's gradient rows leave the kernels ``K`` wide.

The kernels, one module per step of the algorithm, with the layout and the chunk math of the other launchers;
q, k, v, dO are read and o, dv written in the API's ``[B, T, H, D]`` (:data:`TOKEN_MAJOR`):

* :mod:`~gla_ref.pallas.launchers.mosaic_gpu.gates`: step 1, the chunk-local cumulative log-gates ``b`` of a
  per-key gate in one kernel;
* :mod:`~gla_ref.pallas.launchers.mosaic_gpu.states`: step 2, the state recurrence, :func:`state_fwd` (the
  states entering each chunk, ``h``, and the final state) and :func:`state_bwd` (the gradient of the state
  leaving each chunk, ``dso``, and ``dh0``), one sequential kernel run forwards or backwards;
* :mod:`~gla_ref.pallas.launchers.mosaic_gpu.output`: step 3, :func:`chunk_fwd_o`, each chunk's output, one
  program per chunk;
* :mod:`~gla_ref.pallas.launchers.mosaic_gpu.gradients`: :func:`chunk_bwd`, each chunk's ``dq, dk, dv`` and
  chunk-local gate gradient, one program per chunk;
* :mod:`~gla_ref.pallas.launchers.mosaic_gpu.fused`: :func:`fused_fwd` and :func:`fused_bwd`, the state
  kernel's loop with a per-chunk body: no state reaches HBM;
* :mod:`~gla_ref.pallas.launchers.mosaic_gpu.forms`: the forms of a chunk's scores (whole-chunk; sub-chunk,
  fast or exact; scalar gates) and their choice on the device (:func:`whole_chunk_gates`, :func:`gentle_gates`);
* :mod:`~gla_ref.pallas.launchers.mosaic_gpu.common`: sizes and checks, SMEM tile transforms, the interpreter
  switch.

Limits: bfloat16 only (a ``wgmma`` reads float32 as tf32), chunk 64, ``K ≤ 128`` and ``K ≤ 64`` on the fused
path (beyond them the tiles overflow a Hopper block's 227 KiB of SMEM); other calls raise before any kernel is
traced (:func:`check_call`).
"""

from gla_ref.reference.gates import SAFE_DECAY
from gla_ref.pallas.launchers.common import Dims
from gla_ref.pallas.launchers.mosaic_gpu import gates
from gla_ref.pallas.launchers.mosaic_gpu.common import (BLOCK_V, CHUNK_SIZE, MAX_K, MAX_K_FUSED, MIN_DIM, NAME,
                                                        TOKEN_MAJOR, check_call, check_supported, dims_of,
                                                        padded_dims, supported)
from gla_ref.pallas.launchers.mosaic_gpu.forms import gentle_gates, whole_chunk_gates
from gla_ref.pallas.launchers.mosaic_gpu.fused import fused_bwd, fused_fwd
from gla_ref.pallas.launchers.mosaic_gpu.gradients import chunk_bwd
from gla_ref.pallas.launchers.mosaic_gpu.output import chunk_fwd_o, output_dims
from gla_ref.pallas.launchers.mosaic_gpu.states import state_bwd, state_fwd

__all__ = ["BLOCK_V", "CHUNK_SIZE", "Dims", "MAX_K", "MAX_K_FUSED", "MIN_DIM", "NAME", "SAFE_DECAY", "TOKEN_MAJOR",
           "check_call", "check_supported", "chunk_bwd", "chunk_fwd_o", "dims_of", "fused_bwd", "fused_fwd", "gates",
           "gentle_gates", "output_dims", "padded_dims", "state_bwd", "state_fwd", "supported", "whole_chunk_gates"]
