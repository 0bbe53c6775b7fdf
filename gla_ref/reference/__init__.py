"""The reference forms: GLA in PyTorch and JAX, the hand-written backward, attention and gates.

Importing this package loads no framework; import the module you use (also reachable as
:mod:`gla_ref.reference.torch` and :mod:`gla_ref.reference.jax`).
"""
