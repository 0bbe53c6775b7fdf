"""What every Triton family shares: host-side checks and autotuning, tile helpers, gate reads,
precision, the launch cache and the ptxas check."""
