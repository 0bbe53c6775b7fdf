"""Every Triton kernel family (chunk, fused_chunk, fused_recurrent, chunk_simple, the teaching and historical
kernels) and gla_ref.triton.common (tiles, launch cache, autotune, ptxas, shared memory), CUDA graphs, head sizes
and the log-gate contract."""
