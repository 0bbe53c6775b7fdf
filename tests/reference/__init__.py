"""The references (gla_ref.reference: torch_ref and jax_ref forms, gates, hand-written grads, attention, packed
batches) against float64 ground truth, against each other, under property tests and on bad input."""
