"""FLA's GatedLinearAttention layer against gla_ref's, on the same weights (a CUDA GPU with FLA installed).

    python benchmarks/fla_layer_check.py [--out PATH] [--only NAME ...] [--keep EARLIER.json]

Builds ``fla.layers.GatedLinearAttention`` at the GLA paper's 340M and 1.3B widths (d = 1024, 4 heads:
K = 128, V = 256; d = 2048, 4 heads: K = 256, V = 512) and a small one, loads its ``state_dict`` into
``gla_ref.layers.torch.GatedLinearAttention`` (:meth:`load_fla_state_dict`), and runs both on the same
input in float32 and bf16: FLA's layer at T = 64 (where it runs its ``fused_recurrent`` kernel, whose few
autotune configs compile in seconds, unlike its chunk kernels' minutes per shape) against our ``chunk``
backend, and once at T = 500 in FLA's ``chunk`` mode. Each row holds
the relative RMSE of our output against FLA's, of each against our float64 reference layer (the same
weights in float64 through ``torch_ref``), and of the input gradient. Writes
``benchmarks/results/fla_layer_<device>.json`` stamped with the device, versions, FLA's version and date.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gla_ref import bench  # noqa: E402

SHAPES = [  # (name, hidden size, heads, B, T)
    ("small", 256, 4, 2, 64),
    ("340M head (K=128, V=256)", 1024, 4, 2, 64),
    ("1.3B head (K=256, V=512)", 2048, 4, 2, 64),
    ("small, FLA chunk mode", 256, 4, 2, 500),
]


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def compare(name, d, H, B, T, dtype):
    """One row: our layer and FLA's on FLA's weights, both against the float64 reference layer."""
    import torch
    from fla.layers import GatedLinearAttention as FLALayer

    from gla_ref.layers.torch import GatedLinearAttention

    torch.manual_seed(0)
    fla = FLALayer(mode="chunk", hidden_size=d, num_heads=H).cuda()
    ours = GatedLinearAttention(d, num_heads=H, backend="chunk").cuda()
    ours.load_fla_state_dict(fla)
    ref = copy.deepcopy(ours).double()
    ref._kernel = None  # the float64 torch_ref path, same weights
    fla, ours = fla.to(dtype), ours.to(dtype)
    x = torch.randn(B, T, d, device="cuda")
    outs = {}
    for label, layer, xin in (("fla", fla, x.to(dtype)), ("ours", ours, x.to(dtype)), ("ref", ref, x.double())):
        xin = xin.detach().requires_grad_()
        y = layer(xin)[0]
        y.backward(torch.ones_like(y))
        outs[label] = (y.detach(), xin.grad)
    return {"name": name, "dtype": str(dtype).replace("torch.", ""), "d": d, "H": H, "B": B, "T": T,
            "fla_mode": "fused_recurrent" if T <= 64 else "chunk",
            "ours_vs_fla": rel(outs["ours"][0], outs["fla"][0]),
            "ours_vs_ref": rel(outs["ours"][0], outs["ref"][0]), "fla_vs_ref": rel(outs["fla"][0], outs["ref"][0]),
            "dx_ours_vs_ref": rel(outs["ours"][1], outs["ref"][1]), "dx_fla_vs_ref": rel(outs["fla"][1], outs["ref"][1])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only the shapes whose name starts so")
    parser.add_argument("--keep", type=pathlib.Path, help="start from the rows of this earlier result")
    args = parser.parse_args(argv)
    import fla
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("fla_layer_check.py needs a CUDA GPU (FLA's kernels are Triton, compiled for it)")
    bench.show_tuning()
    env = {**bench.environment(), "fla": fla.__version__}
    out = args.out or ROOT / "benchmarks" / "results" / f"fla_layer_{bench.slug(env['device'])}.json"
    rows = json.loads(args.keep.read_text())["rows"] if args.keep else []
    for shape in [s for s in SHAPES if not args.only or any(s[0].startswith(n) for n in args.only)]:
        for dtype in (torch.float32, torch.bfloat16):
            rows.append(compare(*shape, dtype))
            print({k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
            out.write_text(json.dumps({"env": env, "rows": rows}, indent=1))  # a run cut short keeps its rows
    print("wrote", out)


if __name__ == "__main__":
    main()
