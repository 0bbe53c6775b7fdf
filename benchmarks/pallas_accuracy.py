"""bf16 accuracy of the Pallas kernels on a GPU, compiled (not interpreted), against the float64 recurrence.

``python benchmarks/pallas_accuracy.py [--T 256 2048] [--out PATH]`` runs ``chunk_gla``, ``fused_chunk_gla`` and
``chunk_simple_gla`` (both paths, with a scalar gate and with a constant ``g_gamma``) on the GPU launcher with bf16 inputs (B=2, H=2, K=V=64, chunk 64, gates
logsigmoid(x)/16, initial and final state) and records the relative RMSE of o, the final state and every gradient.
The numbers come from the test suite's own checker (``gla_ref.testing.pallas_cases``: ``check_variant``, the float64
recurrence and the float32 chunk form as references, both on the kernel's own bf16 inputs and cotangents), so
they are exactly what the tests hold to their bounds.
Writes ``benchmarks/results/pallas_accuracy_<device>.json`` stamped by ``bench.environment()``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from gla_ref import bench  # noqa: E402

VARIANTS = ("chunk", "fused", "simple_chunk", "simple_fused", "gamma_chunk", "gamma_fused")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp

    if jax.default_backend() != "gpu":
        parser.error("this script measures the compiled GPU launcher and needs a GPU")
    from gla_ref.testing.pallas_cases import check_variant

    rows = []
    for variant in VARIANTS:
        for T in args.T:
            errors = check_variant(variant, chunk_size=64, dtype=jnp.bfloat16, launcher="gpu", interpret=False,
                                   tol=1.0, B=2, T=T, H=2, K=64, V=64, tau=16.0)
            rows.append({"variant": variant, "T": T, "rel_rmse": {k: float(e) for k, e in errors.items()}})
    about = ("gla_ref.pallas on the GPU launcher (Pallas Triton backend), compiled: bf16 inputs, B=2, H=2, K=V=64, "
             "chunk 64, gates logsigmoid(x)/16, initial and final state; relative RMSE of each tensor against the "
             "float64 recurrence on the same bf16-rounded q, k, v and cotangents (the larger of that and the error "
             "against the float32 jax_ref chunk form)")
    path = bench.write_result({"env": bench.environment(), "about": about, "rows": rows}, "pallas_accuracy",
                              ROOT / "benchmarks" / "results", args.out)
    print("wrote", path)
    return path


if __name__ == "__main__":
    main()
