"""The Pallas kernels (gla_ref.pallas) and their launchers: interpreted on a CPU, lowered for TPU and GPU."""
