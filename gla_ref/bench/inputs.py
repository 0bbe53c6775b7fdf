"""What the benchmarks feed the kernels: the paper's gate strength, the paper's setups, torch and JAX inputs.

Every benchmark input is drawn here, once: q, k, v ~ N(0, 1) in the activation dtype and log forget gates
of the GLA paper's strength, ``logsigmoid(x) / 16`` with x ~ N(0, 1) in float32 (the paper's low-rank gate
``logsigmoid(x W1 W2 + b) / τ`` with ``τ = 16``, :data:`GATE_STRENGTH`), all from one seeded generator in
the order q, k, v, g (then the output cotangent, when asked for). The gate's shape sets the model family,
as everywhere in gla_ref: ``"gla"`` ``[B, T, H, K]``, ``"scalar"`` ``[B, T, H]``, ``"const"`` ``[H]``
(``g_gamma``: the ALiBi slopes of :mod:`gla_ref.reference.gates` as log-decays), ``"none"`` (no gate).

Importing this module loads no framework; each function imports the one it draws with.
"""

from __future__ import annotations

GATE_STRENGTH = 16
"""τ of the paper's gate ``logsigmoid(x) / τ`` (GLA, arXiv 2312.06635, §4.4: τ = 16 makes the forget gates
close to 1, so the state remembers long)."""

PAPER_GATE = f"logsigmoid(x) / {GATE_STRENGTH}, x ~ N(0, 1), float32"
"""The gate every benchmark draws, in words (stored in each result beside its rows)."""

GATES = ("gla", "scalar", "const", "none")
"""Gate kinds, by the shape of ``g``: ``[B, T, H, K]``, ``[B, T, H]``, ``[H]`` (g_gamma), None."""

PAPER_SETUPS = {
    "v1_fig2_left": {
        "paper": "arXiv 2312.06635v1, Fig. 2 (left): fwd+bwd time, FlashAttention-2 (CUDA) vs GLA (Triton)",
        "B": 32, "gla": {"H": 4, "K": 128, "V": 256, "gate": "gla"}, "attention": {"H": 16, "D": 64}},
    "icml_fig2": {
        "paper": "ICML 2024 version, Fig. 2: speed and memory, FlashLinearAttention w/ and w/o materialisation "
                 "vs FlashAttention-2 and a pure-PyTorch chunk form, C = 64",
        "B": 32, "gla": {"H": 16, "K": 64, "V": 64, "gate": "none", "chunk_size": 64},
        "attention": {"H": 16, "D": 64}},
    "v1_fig2_right": {
        "paper": "arXiv 2312.06635v1, Fig. 2 (right): inter-chunk against intra-chunk time as the chunk size grows",
        "B": 32, "T": 2048, "gla": {"H": 4, "K": 128, "V": 256, "gate": "gla"}, "chunk_sizes": (16, 32, 64, 128, 256)},
}
"""The paper's own speed setups: model width d = 1024 with 4 GLA heads (K = d/2/4 = 128, V = d/4 = 256)
against softmax attention with 16 heads of 64, batch 32 (v1 Fig. 2), and plain linear attention with
16 heads of 64 (ICML Fig. 2)."""

PAPER_HEADS = {"340M": {"H": 4, "K": 128, "V": 256}, "1.3B": {"H": 4, "K": 256, "V": 512}}
"""The GLA paper's per-head sizes at its two model scales (d = 1024 and 2048, 4 heads, K = d/2/H, V = d/H)."""

HEADLINE_SHAPES = ((64, 64), (128, 128), (128, 256), (256, 512))
"""The four (K, V) head shapes of the speed targets (FLA's benchmarks' 64 and 128, the paper's two heads)."""

VARLEN_LENGTHS = (7000, 300, 2048, 1, 4500, 64, 9000, 1234, 777, 3000, 4000, 845)
"""A packed batch of mixed lengths: a one-token sequence, lengths that are not multiples of the chunk,
one long document (32 769 tokens; padded to the longest, 108 000)."""


def parse_shape(text: str) -> tuple[int, int]:
    """``"128x256"`` → ``(128, 256)`` (K × V); a ValueError that says so otherwise."""
    try:
        K, V = (int(x) for x in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"a shape is KxV, e.g. 128x256, got {text!r}") from None
    if K < 1 or V < 1:
        raise ValueError(f"a shape's sizes must be positive, got {text!r}")
    return K, V


def gate_shape(gate: str, B: int, T: int, H: int, K: int):
    """The shape of ``g`` for a gate kind (None for ``"none"``)."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    return {"gla": (B, T, H, K), "scalar": (B, T, H), "const": (H,), "none": None}[gate]


def g_gamma(H: int):
    """One constant log-decay per head, ``[H]`` float64 NumPy: the ALiBi slopes as log-decays
    (:func:`gla_ref.reference.gates.slopes_to_g_gamma`), the ``"const"`` gate of every benchmark."""
    import numpy as np

    from gla_ref.reference import gates

    return np.asarray(gates.slopes_to_g_gamma(gates.build_slope_tensor(H)), dtype=np.float64)


def torch_inputs(B, T, H, K, V, gate="gla", dtype="bfloat16", device=None, *, seed=0, requires_grad=True,
                 cotangent=False):
    """``[q, k, v, g]`` as torch tensors (g None for ``gate="none"``), drawn in that order from one seeded
    generator on ``device`` (default :func:`gla_ref.device.torch_device`): q, k ``[B, T, H, K]`` and v
    ``[B, T, H, V]`` ~ N(0, 1) in ``dtype``, g of :data:`PAPER_GATE` in float32. Every tensor is a leaf
    that requires grad unless ``requires_grad=False``. With ``cotangent=True`` returns ``(inputs, do)``,
    do ``[B, T, H, V]`` ~ N(0, 1) in ``dtype`` drawn next from the same generator."""
    import torch
    import torch.nn.functional as F

    from gla_ref import device as gla_device

    dev = gla_device.torch_device() if device is None else device
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    gen = torch.Generator(device=dev).manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, device=dev, dtype=dt, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, device=dev, dtype=dt, generator=gen)
    shape = gate_shape(gate, B, T, H, K)
    if gate == "const":
        g = torch.as_tensor(g_gamma(H), dtype=torch.float32, device=dev)
    elif shape is not None:
        g = F.logsigmoid(torch.randn(shape, device=dev, generator=gen)) / GATE_STRENGTH
    else:
        g = None
    inputs = [q, k, v, g]
    if requires_grad:
        for x in inputs:
            if x is not None:
                x.requires_grad_(True)
    if not cotangent:
        return inputs
    return inputs, torch.randn(B, T, H, V, device=dev, dtype=dt, generator=gen)


def packed_inputs(lengths, H, K, V, gate="gla", dtype="bfloat16", device=None, *, seed=0, requires_grad=True):
    """The sequences of ``lengths`` packed into one ``B = 1`` batch of ``sum(lengths)`` tokens
    (:func:`torch_inputs`, the same draws), and their int64 offsets ``cu_seqlens`` ``[N + 1]`` on the same
    device: ``(inputs, cu_seqlens)``."""
    import torch

    inputs = torch_inputs(1, sum(lengths), H, K, V, gate, dtype, device, seed=seed, requires_grad=requires_grad)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64,
                           device=inputs[0].device)
    return inputs, offsets


def pad(x, lengths):
    """``[1, ΣT, ...]`` packed → ``[N, max T, ...]``, zeros after each sequence's end (a log-gate of 0 there:
    the state passes the padding unchanged, so the final states are exact)."""
    out = x.new_zeros(len(lengths), max(lengths), *x.shape[2:])
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = x[0, start:start + n]
        start += n
    return out


def unpad(o, lengths):
    """The real tokens of a padded ``[N, max T, ...]`` output, packed again as ``[1, ΣT, ...]``."""
    import torch

    return torch.cat([o[i, :n] for i, n in enumerate(lengths)])[None]


def jax_inputs(B, T, H, K, V, gate="gla", dtype="bfloat16", *, seed=0):
    """``(q, k, v, g, do)`` as JAX arrays: five keys split from ``jax.random.key(seed)``; q, k from the
    first two, v and the output cotangent do from the next two (``[B, T, H, V]``), all ~ N(0, 1) in
    ``dtype``; g of :data:`PAPER_GATE` from the fifth (float32), the ALiBi ``g_gamma`` for ``"const"``,
    None for ``"none"``."""
    import jax
    import jax.numpy as jnp

    dt = jnp.dtype(dtype)
    keys = jax.random.split(jax.random.key(seed), 5)
    q, k = (jax.random.normal(key, (B, T, H, K), dt) for key in keys[:2])
    v, do = (jax.random.normal(key, (B, T, H, V), dt) for key in keys[2:4])
    shape = gate_shape(gate, B, T, H, K)
    if gate == "const":
        g = jnp.asarray(g_gamma(H), jnp.float32)
    elif shape is not None:
        g = jax.nn.log_sigmoid(jax.random.normal(keys[4], shape)) / GATE_STRENGTH
    else:
        g = None
    return q, k, v, g, do
