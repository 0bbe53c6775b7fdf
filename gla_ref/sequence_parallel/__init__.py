"""Sequence parallelism for GLA: one sequence split along T across devices (paper, Appendix B).

The chunkwise form is a two-stage scan. Each device runs it on its own slice of the sequence
starting from a zero state, which gives its outputs up to one missing term and two numbers per
head: the state its slice builds from zero, ``S_zero`` ``[K, V]``, and the slice's total decay,
``γ = exp(Σ_{t in slice} g_t)`` ``[K]``. States then travel along the devices in sequence order,

    S_in(d+1) = diag(γ_d) S_in(d) + S_zero(d),        S_in(0) = initial_state (or 0),

and each device adds what the state entering its slice gives its queries,
``o_t += scale · (q_t ⊙ exp(b_t)) S_in`` with ``b_t`` the cumulative log-gate from the slice start.
Only a K×V state per device crosses the interconnect, whatever T is.

Two modules, imported by name (this package loads no framework):

* :mod:`gla_ref.sequence_parallel.jax`   — ``chunk_gla(..., mesh, axis)`` with ``shard_map`` and a
  ``ppermute`` chain; autodiff gives the backward chain.
* :mod:`gla_ref.sequence_parallel.torch` — ``chunk_gla(..., group)`` for ranks of a
  ``torch.distributed`` group: an autograd Function that sends states forward and their gradients
  back with send/recv, plus ``count_traffic`` and ``bytes_per_call`` to measure and predict the bytes.
"""
