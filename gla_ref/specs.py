"""Launch constants of the kernel families: the block sizes and on-chip budgets their grids follow.

Plain Python: importing it loads neither torch, Triton nor JAX, so the kernel drawings of
:mod:`gla_ref.viz.kernels` (and a notebook cell on a machine without them) read the very numbers the
kernels launch with. Each kernel module takes these values from here and keeps its own public name for
them (``gla_ref.triton.fused_recurrent.STATE_BUDGET is RECURRENT_STATE_BUDGET``); an autotuned kernel's
config list starts with the blocks held here (the one config the Triton interpreter runs). Changing a
value here changes the kernel. Grouped by family, each constant names the kernel attribute it is.

Held here: every constant a drawing needs (the forward kernels of chapters 4 and 5). Constants no drawing
reads (the backward kernels' own, the wide fused tiles, the Mosaic GPU launcher's) stay in their modules.
"""

from __future__ import annotations

# --- gla_ref.triton.fused_recurrent ----------------------------------------------------------------

RECURRENT_STATE_BUDGET = 4096
"""``STATE_BUDGET``: most float32 state entries a program keeps in registers, BV = budget // BK (≥ 16)."""

# --- gla_ref.triton.fused_chunk ----------------------------------------------------------------------

FUSED_STATE_ELEMENTS = 8192
"""``forward.STATE_ELEMENTS``: float32 state elements a program holds (32 KiB); one state dimension is
kept whole and the other cut into blocks of ``FUSED_STATE_ELEMENTS // whole`` (≥ 16)."""

# --- gla_ref.triton.chunk (chunk_gla; its steps 1 and 2 also serve chunk_simple_gla) --------------------

CUMSUM_BLOCK_D = 64
"""Most gate columns (BD) one program of ``cumsum.chunk_cumsum_kernel`` sums: BD = min(64, D rounded up)."""

STATE_FWD_BLOCKS = (32, 128)
"""(BK, BV) of the first autotune config of ``state.chunk_state_fwd_kernel`` (the interpreter's only one)."""

SUB_CHUNK = 16
"""``intra.SUB_CHUNK``: c, the sub-chunk of the intra-chunk scores (tl.dot's smallest tile)."""

WHOLE_CHUNK_KEYS = 64
"""``intra.WHOLE_CHUNK_KEYS``: key columns per step of the whole-chunk form's loop over K."""

OUTPUT_BLOCKS = (64, 64)
"""(BK, BV) of the first autotune config of ``output.chunk_output_kernel``."""

# --- gla_ref.triton.chunk_simple ------------------------------------------------------------------

BLOCK_CONFIGS_FIRST = 64
"""The block of the first config of ``common.host.block_configs``: BV of ``simple_output_kernel``, which
autotunes over ``block_configs("BV")`` (as do the value-block kernels of both backward passes)."""

SIMPLE_OUTPUT_BLOCK_K = 64
"""Most key columns (BK) per step of ``simple_output_kernel``'s loop over K: BK = min(64, K rounded up)."""

# --- gla_ref.teaching.historical (the five-kernel pipeline) ---------------------------------------

HISTORICAL_CHUNK = 16
"""``CHUNK``: BT, the chunk size, fixed as in the original (tl.dot's smallest tile)."""

HISTORICAL_MAX_BLOCK = 64
"""``MAX_BLOCK``: BK and BV are at most this; larger K or V is split over programs."""

# --- gla_ref.pallas -------------------------------------------------------------------------------

PALLAS_SUB_CHUNK = 16
"""``chunk_math.SUB``: c, the sub-chunk of the two-level intra-chunk scores (16 = Triton's smallest dot)."""

TPU_LANES = 128
"""``launchers.tpu.LANES``: K and V are padded to a multiple of this (the TPU's vector lanes)."""

TPU_BLOCK_V = 128
"""``launchers.tpu.BLOCK_V``: value columns per program; V / BLOCK_V programs share a head."""

GPU_BLOCK_V = 64
"""``launchers.gpu.BLOCK_V``: value columns per program, keeping the ``[BV, K]`` float32 state in registers."""
