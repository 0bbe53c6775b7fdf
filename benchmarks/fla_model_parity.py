"""gla_ref's GLAForCausalLM against FLA's, at FLA's 340M GLA config (a CUDA GPU with FLA installed).

    python benchmarks/fla_model_parity.py [--batch 2] [--seq 256] [--new 64] [--seed 0]

Builds ``fla.models.GLAForCausalLM`` from FLA's 340M GLA config (d = 1024, 24 layers, 4 heads, vocabulary
32000, tied embeddings, norm eps 1e-6: FLA's legacy/training/configs/gla_340M.json) with FLA's random
initialisation, then ours with ``GLAForCausalLM.from_fla`` (FLA's config and ``state_dict`` as they are;
``backend="auto"``, so our Triton kernels), and prints one table row per check:

* logits in float32 (relative RMSE ≤ 1e-5) and in bfloat16 (≤ 1e-2), with the loss, on random tokens;
* logits of a left-padded batch (each row's real positions; FLA unpads with cu_seqlens, so do we);
* greedy decoding of ``--new`` tokens in float32 with the recurrent cache: ours (``generate``) must equal
  FLA's, decoded with FLA's own cache token by token. FLA's ``generate()`` is run too and reported: FLA
  0.6.0 reads the cache from ``past_key_values``, which transformers ≥ 5.2x passes as ``cache=``, so there
  it decodes every new token without its state (a row says whether it agrees with FLA's own loop).

Exits 1 if a check fails; prints why and exits 0 without CUDA or FLA.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FLA_340M = dict(attn_mode="chunk", bos_token_id=1, clamp_min=None, eos_token_id=2, expand_k=0.5, expand_v=1,
                fuse_cross_entropy=True, fuse_norm=True, hidden_act="swish", hidden_ratio=4, hidden_size=1024,
                initializer_range=0.02, intermediate_size=None, num_heads=4, num_hidden_layers=24, norm_eps=1e-6,
                tie_word_embeddings=True, use_cache=True, vocab_size=32000)
"""FLA's legacy/training/configs/gla_340M.json (use_gk/use_gv, which FLA 0.6.0 ignores, left out)."""


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def fla_greedy(fm, ids, n):
    """FLA's model decoding greedily with its own cache, one token at a time."""
    import torch

    out, x = fm(ids, use_cache=True), ids
    for _ in range(n):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        x = torch.cat([x, token], 1)
        out = fm(token, past_key_values=out.past_key_values, use_cache=True)
    return x


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256, help="prompt length (> 64: FLA's chunk mode)")
    parser.add_argument("--new", type=int, default=64, help="greedy tokens to decode")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU (FLA's kernels and ours need one for this comparison)")
        return 0
    try:
        import fla
        from fla.models import GLAConfig as FLAConfig
        from fla.models import GLAForCausalLM as FLAModel
    except ImportError as err:
        print(f"skipped: FLA is not importable ({err}); pip install gla_ref[fla]")
        return 0
    import transformers

    from gla_ref.models.torch import GLAForCausalLM

    torch.manual_seed(args.seed)
    fm = FLAModel(FLAConfig(**FLA_340M)).cuda().float().eval()
    t0 = time.perf_counter()
    ours = GLAForCausalLM.from_fla(fm).eval()
    print(f"FLA {fla.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}; {sum(p.numel() for p in fm.parameters()) / 1e6:.0f}M parameters, "
          f"from_fla {time.perf_counter() - t0:.1f} s")
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    ids = torch.randint(0, FLA_340M["vocab_size"], (args.batch, args.seq), device="cuda", generator=gen)
    rows = []

    def row(check, value, limit, ok=None):
        ok = (value <= limit) if ok is None else ok
        rows.append((check, value, limit, ok))

    with torch.no_grad():
        a, b = fm(ids, labels=ids), ours(ids, labels=ids)
        row("logits fp32, rel. RMSE", rel(b.logits, a.logits), 1e-5)
        row("loss fp32, rel. error", abs(float(b.loss) - float(a.loss)) / abs(float(a.loss)), 1e-5)

        mask = torch.ones_like(ids)
        for r in range(args.batch):
            mask[r, :(r * 37) % args.seq] = 0  # left padding of different lengths
        lp_a = fm(ids, attention_mask=mask).logits
        lp_b = ours(ids, attention_mask=mask).logits
        real = mask.bool()
        row("left-padded logits fp32 (real tokens), rel. RMSE", rel(lp_b[real], lp_a[real]), 1e-5)

        want = fla_greedy(fm, ids, args.new)
        got = ours.generate(ids, max_new_tokens=args.new, eos_token_id=None)
        same = int((got[:, args.seq:] == want[:, args.seq:]).all(1).sum())
        row(f"greedy {args.new} tokens fp32, rows equal to FLA's (cached loop)", float(same), float(args.batch),
            ok=torch.equal(got, want))
        try:
            fm.generation_config.eos_token_id = None
            hf = fm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new, do_sample=False)
            agree = hf.shape == want.shape and torch.equal(hf, want)
            rows.append((f"(info) FLA's generate() = FLA's cached loop", float(agree), 1.0, True))
        except Exception as err:  # reported, not judged: FLA's generate depends on the transformers version
            rows.append((f"(info) FLA's generate() raised {type(err).__name__}", 0.0, 1.0, True))

        fm.bfloat16()
        ours.bfloat16()
        a16, b16 = fm(ids).logits, ours(ids).logits
        row("logits bf16 (ours vs FLA), rel. RMSE", rel(b16, a16), 1e-2)
        rows.append(("(info) logits bf16: FLA vs FLA fp32", rel(a16, a.logits), 1.0, True))
        rows.append(("(info) logits bf16: ours vs FLA fp32", rel(b16, a.logits), 1.0, True))

    width = max(len(r[0]) for r in rows)
    print(f"\n{'check':<{width}}  {'value':>11}  {'limit':>8}  result")
    for check, value, limit, ok in rows:
        print(f"{check:<{width}}  {value:>11.3e}  {limit:>8.0e}  {'pass' if ok else 'FAIL'}")
    failed = [r[0] for r in rows if not r[3]]
    print("\nall checks pass" if not failed else f"\nFAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
