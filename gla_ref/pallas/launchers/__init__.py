"""Pallas launchers of the shared chunk math: GPU (Triton backend), TPU (Mosaic) and Mosaic GPU."""
