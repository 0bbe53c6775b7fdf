"""Sequence parallelism (gla_ref.sequence_parallel): JAX on simulated devices, torch on gloo groups. The
_sp_*.py files are scripts the tests run in fresh processes, never imported by pytest."""
