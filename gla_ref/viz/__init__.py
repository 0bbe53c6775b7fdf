"""Figures: the chapters' plots, the kernel drawings and the sequence-parallel diagrams (Matplotlib only)."""
