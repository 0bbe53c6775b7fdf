"""Pallas kernels on a GPU against jax_ref under jit and the Triton kernels.

``python benchmarks/bench_pallas.py [T ...]`` writes ``benchmarks/results/pallas_bench_<device>.json``
(the schema chapter 5 reads) and prints a table of median milliseconds.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

from gla_ref import bench

RESULTS = pathlib.Path(__file__).parent / "results"


def main():
    Ts = tuple(int(t) for t in sys.argv[1:]) or (1024, 2048, 4096)
    result = bench.time_pallas_gla(Ts)
    slug = re.sub(r"[^a-z0-9]+", "_", result["env"]["device"].lower()).strip("_")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"pallas_bench_{slug}.json"
    path.write_text(json.dumps(result, indent=1))
    for r in result["rows"]:
        print(f"T={r['T']:>6} {r['name']:<40} " + (f"{r['median_ms']:9.3f} ms (compile {r['compile_ms']:.0f} ms)"
                                                   if "median_ms" in r else r["error"]))
    print("wrote", path)


if __name__ == "__main__":
    main()
