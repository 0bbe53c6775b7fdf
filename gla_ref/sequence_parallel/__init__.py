"""Sequence parallelism for GLA: one sequence split along T across devices (paper, Appendix B).

The chunkwise form is a two-stage scan. A slice of the sequence acts on the state entering it as an
affine map: from a zero state it builds its own state, ``S_zero`` ``[K, V]`` per head, and it
decays whatever state enters by its total decay ``γ = exp(Σ_{t in slice} g_t)`` ``[K]``. States
therefore travel along the devices in sequence order,

    S_in(d+1) = diag(γ_d) S_in(d) + S_zero(d),        S_in(0) = initial_state (or 0),

and each device, once it has the state entering its slice, runs its slice's whole chunk pass from it
with the same kernels one device runs (state kernel, intra-chunk kernel, output kernel). The backward
runs the same chain the other way with the states' gradients, ``dS_in(d) = diag(γ_d) dS_out(d) +
dS_in_local(d)``, then the slice's whole backward from ``dS_out``. Only a K×V state per device
crosses the interconnect, whatever T is, and nothing over the slice runs outside the kernels.

Modules, imported by name (this package loads no framework):

* :mod:`gla_ref.sequence_parallel.torch` — ``chunk_gla(..., group)`` for ranks of a
  ``torch.distributed`` group, each slice by the Triton kernels one at a time
  (:mod:`~gla_ref.sequence_parallel.torch_slices`), an autograd Function that sends states forward
  and their gradients back with send/recv, plus ``count_traffic`` and ``bytes_per_call``;
* :mod:`gla_ref.sequence_parallel.jax`   — ``chunk_gla(..., mesh, axis)`` with ``shard_map``, each
  slice by the Pallas kernels inside a ``custom_vjp``, the chain by ``ppermute``;
* :mod:`gla_ref.sequence_parallel.local` — process groups on one machine started from Python (no
  ``torchrun``), for notebooks, tests and benchmarks;
* :mod:`gla_ref.sequence_parallel.costs` — the bytes and the time of the chain as models, and the
  collectives of a compiled JAX program.
"""
