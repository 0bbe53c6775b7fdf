"""What the benchmarks time: every candidate by name, ours and the peers', and how each is built for a point.

A *point* is a dict of sizes (``B, T, H, K, V, dtype, gate``; optionally ``chunk_size``, ``lengths`` for a
packed batch, ``devices`` for sequence parallelism, ``setup`` naming the paper's figure). A candidate's
``build(point)`` imports what it needs and returns a :class:`Built`: ``run(q, k, v, g, **extra) -> o``
(torch), a function of ``(q, k, v, g)`` to jit (JAX), or the settings of a multi-process step (ranks). A
candidate that cannot run here raises :class:`Unavailable`, whose message says why (FLA not installed, no
CUDA, no TPU, too few GPUs): the runner records it in the row, and goes on.

Ours: the Triton families (``chunk_gla``, ``fused_chunk_gla``, ``chunk_simple_gla``,
``fused_recurrent_gla``), the forward stages of ``chunk_gla`` and of the PyTorch chunk form (chapter 4's and
the paper's chunk-size study), every Pallas kernel on every launcher (``pallas.<kernel>[gpu|mosaic_gpu|tpu]``),
the JAX reference under jit, and the sequence-parallel ``chunk_gla`` over several GPUs. Peers: FLA's
``chunk_gla``, ``chunk_simple_gla`` and ``fused_recurrent_gla``, SDPA's flash and cuDNN backends (causal
softmax attention), and the pure-PyTorch chunk form (``torch_ref.chunk_gla``, the paper's I/O-unaware
baseline). Importing this module loads no framework.
"""

from __future__ import annotations

import dataclasses
from typing import Callable


class Unavailable(Exception):
    """A candidate that cannot run on this machine; the message says why (recorded as ``unavailable``)."""


@dataclasses.dataclass(frozen=True)
class Built:
    """A candidate made for one point. ``run``: torch ``run(q, k, v, g, **extra) -> o``; JAX ``run(q, k, v, g)
    -> o`` (jitted by the measures); ranks: the keyword arguments of the step each rank runs.
    ``prepare(args, extra) -> (args, extra)`` runs once before any timing (padding a packed batch, cutting a
    form into stages), outside every measurement."""

    run: Callable
    prepare: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One entry of :data:`CANDIDATES`.

    ``side``: ``"ours"`` or ``"peer"``; ``framework``: ``"torch"``, ``"jax"`` or ``"ranks"`` (a torch step
    on several processes); ``gates``: the gate kinds it takes (:data:`gla_ref.bench.inputs.GATES`), its
    default first; ``cost``: the name of its forward cost model in :func:`gla_ref.bench.models.forward_cost`
    (None: no model, no roofline fraction); ``forward_only``: a forward stage, timed without backward;
    ``attention``: softmax attention, whose point may name its own heads (``point["attention"]``)."""

    name: str
    side: str
    framework: str
    what: str
    gates: tuple
    build: Callable[[dict], Built]
    cost: str | None = None
    forward_only: bool = False
    attention: bool = False


def _chunk_kw(point, name):
    """``chunk_size`` for the kernels that take one, when the point names it."""
    return {"chunk_size": point["chunk_size"]} if "chunk_size" in point and name != "fused_recurrent_gla" else {}


def _retune_state_kernel():
    """Forget chunk_gla's state kernel's tuned configs: its autotune key lacks the chunk size, so a point at a
    new chunk size must tune it anew (as ``benchmarks/bench_chunk_size.py`` does)."""
    from gla_ref.triton.chunk.state import chunk_state_fwd_kernel

    getattr(chunk_state_fwd_kernel, "cache", {}).clear()


def _triton(name):
    def build(point):
        from gla_ref import triton as kernels

        fn, kw = getattr(kernels, name), _chunk_kw(point, name)
        if kw and name == "chunk_gla":
            _retune_state_kernel()
        if point["gate"] == "const":
            return Built(lambda q, k, v, g, **x: fn(q, k, v, g_gamma=g, **kw, **x)[0])
        return Built(lambda q, k, v, g, **x: fn(q, k, v, g, **kw, **x)[0])
    return build


def _padded(name):
    """The kernel on the packed batch's sequences padded to the longest ([N, max T]): how one batches
    without ``cu_seqlens``; the padded tokens cost time and memory and their outputs are thrown away."""
    run = _triton(name)

    def build(point):
        from gla_ref.bench.inputs import pad

        lengths = point["lengths"]

        def prepare(args, extra):
            return [None if x is None else pad(x.detach(), lengths).requires_grad_(x.requires_grad) for x in args], {}
        return Built(run(point).run, prepare)
    return build


def _needs_cuda(what):
    import torch

    if not torch.cuda.is_available():
        raise Unavailable(f"{what}: CUDA only, and this machine has no CUDA GPU")


def _fla(module, name, gate_kw):
    def build(point):
        import importlib

        _needs_cuda("FLA's Triton kernels")
        try:
            fn = getattr(importlib.import_module(f"fla.ops.{module}"), name)
        except ImportError as err:
            raise Unavailable(f"FLA is not installed ({err}); pip install fla-core") from None
        key = "g_gamma" if point["gate"] == "const" else gate_kw
        return Built(lambda q, k, v, g, **x: fn(q, k, v, **{key: g}, **x)[0])
    return build


def _sdpa(backend):
    def build(point):
        _needs_cuda("SDPA's flash and cuDNN backends")
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = getattr(SDPBackend, backend)

        def run(q, k, v, g, **x):  # causal softmax attention in the [B, T, H, D] layout; g unused
            with sdpa_kernel(chosen):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True)
            return o.transpose(1, 2)
        return Built(run)
    return build


def _torch_ref(point):
    from gla_ref.reference import torch as torch_ref

    C = point.get("chunk_size", 64)
    return Built(lambda q, k, v, g, **x: torch_ref.chunk_gla(q, k, v, g, chunk_size=C, **x)[0])


def _stage(form, part):
    """One forward stage (:mod:`gla_ref.bench.stages`), cut out on the point's inputs once, then timed alone."""
    def build(point):
        C = point.get("chunk_size", 64)

        def prepare(args, extra):
            import torch

            from gla_ref.bench import stages

            q, k, v, g = (x.detach() for x in args)
            with torch.no_grad():
                if form == "torch":
                    parts, _ = stages.torch_chunk_parts(q, k, v, g, C, 16)
                else:
                    from gla_ref.triton.common.host import check_chunk_size

                    check_chunk_size(C)  # the library's own message for a chunk size it refuses
                    _retune_state_kernel()
                    parts = stages.triton_chunk_stages(q, k, v, g, C)
            return [parts[part]], {}
        return Built(lambda thunk: thunk(), prepare)
    return build


PALLAS_LAUNCHERS = ("gpu", "mosaic_gpu", "tpu")
"""Every Pallas launcher: the Triton backend on a GPU, Mosaic GPU (Hopper), Mosaic TPU."""


def _pallas(name, launcher):
    def build(point):
        from gla_ref import device

        platform = device.jax_platform()
        if launcher == "tpu" and platform != "tpu":
            raise Unavailable(f"the TPU launcher needs a TPU (JAX's platform here: {platform})")
        if launcher == "gpu" and platform == "tpu":
            raise Unavailable("the GPU launcher needs a GPU (or a CPU, interpreted)")
        if launcher == "mosaic_gpu":
            from gla_ref.pallas import compat

            if not compat.mosaic_gpu_runs_here():
                raise Unavailable("the Mosaic GPU launcher runs on Hopper GPUs (sm_90) only")
        from gla_ref import pallas

        fn, C = getattr(pallas, name), point.get("chunk_size", 64)
        if point["gate"] == "const":
            return Built(lambda q, k, v, g: fn(q, k, v, g_gamma=g, chunk_size=C, launcher=launcher)[0])
        return Built(lambda q, k, v, g: fn(q, k, v, g, chunk_size=C, launcher=launcher)[0])
    return build


def _jax_ref(point):
    from gla_ref.reference import jax as jax_ref

    C = point.get("chunk_size", 64)
    return Built(lambda q, k, v, g: jax_ref.chunk_gla(q, k, v, g, chunk_size=C)[0])


def _sequence_parallel(point):
    """The step every rank runs (:func:`gla_ref.bench.ranks.time_step`); needs ``point["devices"]`` GPUs
    (CPU processes over gloo without CUDA)."""
    import torch

    n = point["devices"]
    if torch.cuda.is_available() and torch.cuda.device_count() < n:
        raise Unavailable(f"needs {n} GPUs, this machine has {torch.cuda.device_count()}")
    return Built({key: point[key] for key in ("B", "T", "H", "K", "V", "dtype", "gate")}
                 | {"chunk_size": point.get("chunk_size", 64)})


def _entries():
    ours, peer = "ours", "peer"
    gla, simple, noneg = ("gla",), ("scalar", "const", "none"), ("none",)
    out = [
        Candidate("chunk_gla", ours, "torch", "gla_ref.triton.chunk_gla: states materialised, secondary chunking "
                  "(Alg. 3/4), C = 64", gla, _triton("chunk_gla"), "chunk_gla"),
        Candidate("fused_chunk_gla", ours, "torch", "gla_ref.triton.fused_chunk_gla: the state kept on chip "
                  "(Alg. 5/6), C = 16", ("gla", "none"), _triton("fused_chunk_gla"), "fused_chunk_gla"),
        Candidate("chunk_simple_gla", ours, "torch", "gla_ref.triton.chunk_simple_gla: a scalar gate per token "
                  "and head (or g_gamma, or none), C = 64", simple, _triton("chunk_simple_gla"), "chunk_simple_gla"),
        Candidate("fused_recurrent_gla", ours, "torch", "gla_ref.triton.fused_recurrent_gla: token by token, "
                  "the state on chip", ("gla", "none"), _triton("fused_recurrent_gla")),
        Candidate("chunk_gla.padded", ours, "torch", "gla_ref.triton.chunk_gla on a packed batch's sequences "
                  "padded to the longest, no cu_seqlens", gla, _padded("chunk_gla")),
        Candidate("fla.chunk_gla", peer, "torch", "FLA's fla.ops.gla.chunk_gla", gla,
                  _fla("gla", "chunk_gla", "g"), "chunk_gla"),
        Candidate("fla.chunk_simple_gla", peer, "torch", "FLA's fla.ops.simple_gla.chunk_simple_gla", simple,
                  _fla("simple_gla", "chunk_simple_gla", "g"), "chunk_simple_gla"),
        Candidate("fla.fused_recurrent_gla", peer, "torch", "FLA's fla.ops.gla.fused_recurrent_gla", ("gla", "none"),
                  _fla("gla", "fused_recurrent_gla", "gk")),
        Candidate("sdpa_flash", peer, "torch", "torch SDPA, SDPBackend.FLASH_ATTENTION, causal softmax attention",
                  noneg, _sdpa("FLASH_ATTENTION"), "sdpa_flash", attention=True),
        Candidate("sdpa_cudnn", peer, "torch", "torch SDPA, SDPBackend.CUDNN_ATTENTION, causal softmax attention",
                  noneg, _sdpa("CUDNN_ATTENTION"), "sdpa_flash", attention=True),
        Candidate("torch_ref.chunk_gla", peer, "torch", "gla_ref.torch_ref.chunk_gla: the chunk form in plain "
                  "PyTorch (I/O-unaware), C = 64", ("gla", "scalar", "const", "none"), _torch_ref),
    ]
    for part, what in (("inter", "the state recurrence over the chunks and Q S"),
                       ("intra", "within-chunk (P ⊙ M) V by sub-chunks of 16")):
        out.append(Candidate(f"torch_ref.chunk_gla.{part}", peer, "torch", f"the PyTorch chunk form's {what} "
                             "(gla_ref.bench.torch_chunk_parts)", gla, _stage("torch", part), forward_only=True))
    for part, what in (("cumsum", "g → the chunk-local cumulative gate and the decayed operands"),
                       ("state", "the inter-chunk recurrence, one state per chunk"),
                       ("intra", "the C × C blocks A (sub-chunk pairs by tl.dot, diagonal in float32)"),
                       ("output", "(Q ⊙ Λ) S + A V")):
        out.append(Candidate(f"chunk_gla.{part}", ours, "torch", f"gla_ref.triton.chunk_gla's forward kernel: "
                             f"{what} (gla_ref.bench.triton_chunk_stages)", gla, _stage("triton", part),
                             forward_only=True))
    for kernel, gates in (("chunk_gla", gla), ("fused_chunk_gla", gla), ("chunk_simple_gla", ("const", "scalar"))):
        for launcher in PALLAS_LAUNCHERS:
            out.append(Candidate(f"pallas.{kernel}[{launcher}]", ours, "jax", f"gla_ref.pallas.{kernel}, "
                                 f"launcher={launcher!r} (jax.custom_vjp; interpreted on a CPU)", gates,
                                 _pallas(kernel, launcher)))
    out.append(Candidate("jax_ref.chunk_gla", ours, "jax", "gla_ref.jax_ref.chunk_gla under jax.jit (the "
                         "reference chunk form, XLA-compiled)", ("gla", "scalar", "const", "none"), _jax_ref))
    out.append(Candidate("sp.torch.chunk_gla", ours, "ranks", "gla_ref.sequence_parallel.torch.chunk_gla: T split "
                         "over point['devices'] GPUs (one process each, NCCL), each slice by the Triton kernels",
                         gla, _sequence_parallel))
    return {c.name: c for c in out}


CANDIDATES = _entries()
"""Every candidate by name."""


def candidate(name: str) -> Candidate:
    """The candidate called ``name``; a ValueError listing the names otherwise."""
    if name not in CANDIDATES:
        raise ValueError(f"unknown candidate {name!r}; candidates: {', '.join(CANDIDATES)}")
    return CANDIDATES[name]


@dataclasses.dataclass
class Instance:
    """A candidate built and given its inputs at one point: what the measures call."""

    candidate: Candidate
    point: dict
    run: Callable
    args: list
    extra: dict
    leaves: list
    do: object = None


def instantiate(name: str, point: dict, *, seed: int = 0) -> Instance:
    """Build ``name`` for ``point`` and draw its inputs (:mod:`gla_ref.bench.inputs`, ``seed``) on this
    machine's device: torch leaves requiring grad and a cotangent ``do``; JAX arrays; nothing for ranks
    (each rank draws its own slice). Raises :class:`Unavailable` when the candidate cannot run here."""
    from gla_ref.bench import inputs as make

    c = candidate(name)
    if point.get("gate") not in c.gates:
        raise ValueError(f"{name} takes the gates {c.gates}, the point has {point.get('gate')!r}")
    built = c.build(point)
    if c.framework == "ranks":
        return Instance(c, point, built.run, [], {}, [])
    B, T, H, K, V = (point[key] for key in ("B", "T", "H", "K", "V"))
    if c.attention and "attention" in point:
        H, K, V = point["attention"]["H"], point["attention"]["D"], point["attention"]["D"]
    if c.framework == "jax":
        q, k, v, g, do = make.jax_inputs(B, T, H, K, V, point["gate"], point["dtype"], seed=seed)
        return Instance(c, point, built.run, [q, k, v, g], {}, [], do)
    extra = {}
    if "lengths" in point:
        args, extra["cu_seqlens"] = make.packed_inputs(point["lengths"], H, K, V, point["gate"], point["dtype"],
                                                       seed=seed)
    else:
        args = make.torch_inputs(B, T, H, K, V, point["gate"], point["dtype"], seed=seed)
    if built.prepare is not None:
        args, extra = built.prepare(args, extra)
    leaves = [x for x in args if getattr(x, "requires_grad", False)]
    do = None
    if not c.forward_only:  # the output cotangent: o has v's shape (padded with it), seeded apart
        import torch

        v = args[2]
        do = torch.randn(v.shape, device=v.device, dtype=v.dtype, generator=torch.Generator(v.device).manual_seed(seed + 1))
    return Instance(c, point, built.run, args, extra, leaves, do)
