"""FP8 FusedAttention under sustained load: time, energy, power and SM clock a call, the default beside tuning
variants, each timed twice in the order default, variants, default, variants (drift shows as the repeats' spread).

    python benchmarks/attention_fp8_energy.py --points 128:0:4096,256:1:8192 --variants "V_BULK_COPY=1" --out x.md
"""
from __future__ import annotations

import argparse

import torch

from attention import HIDDEN, TOKENS, parse_tuning, versions, write_report
from attention_fp8 import FP8Problem, fp8_plan, ours_fp8
from energy import Nvml, sustained
from trt_fusedattn.launcher import device_arch, precompile


def tuning_of(spec: str) -> dict | None:
    """'A=1+B=2' -> {'A': 1, 'B': 2}; '' -> None (the default)."""
    return parse_tuning(spec) if spec else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", required=True, help="hd:causal:seq,... (batch x seq = 16k tokens, hidden 2048)")
    parser.add_argument("--variants", default="", help="tunings beside the default, e.g. V_BULK_COPY=1,A=1+B=2")
    parser.add_argument("--seconds", type=float, default=1.0, help="sustained replays per measurement")
    parser.add_argument("--out", help="markdown file for the table")
    args = parser.parse_args()
    arch, nvml = device_arch(0), Nvml(0)
    points = [tuple(int(x) for x in p.split(":")) for p in args.points.split(",")]
    specs = [""] + [v for v in args.variants.split(",") if v]
    problems = {(d, c, s): FP8Problem(TOKENS // s, s, HIDDEN // d, d, bool(c), seed=s + d + c) for d, c, s in points}
    precompile([fp8_plan(p, "float8e4m3fn", arch, tuning_of(v)) for p in problems.values() for v in specs], arch)
    header = ["hd", "causal", "seq", "kernel", "ms (1st / 2nd)", "TFLOP/s", "mJ a call (1st / 2nd)", "W", "SM MHz",
              "mJ vs default"]
    rows = []
    head = (f"# FP8 FusedAttention under sustained load\n\n{versions()}\n\nbatch x seq = {TOKENS} tokens, hidden "
            f"{HIDDEN}, BSHD, e4m3 out; each kernel replayed back to back (CUDA graphs of 20 calls) for "
            f"{args.seconds} s, twice, in the order default, variants, default, variants; energy from NVML's total "
            f"energy counter over the window, SM clock the median of samples between replays.\n\n")
    for (dim, causal, seq), problem in problems.items():
        out = torch.empty(problem.fp8[0].shape, device="cuda").to(torch.float8_e4m3fn)
        runs = {v: [] for v in specs}
        for _ in range(2):
            for v in specs:
                runs[v].append(sustained(ours_fp8(problem, out, "float8e4m3fn", arch, tuning_of(v)), nvml,
                                         args.seconds))
        flops = 4 * (TOKENS // seq) * (HIDDEN // dim) * seq * seq * dim / (2 if causal else 1)
        base_mj = sum(r["mj"] for r in runs[""]) / 2
        for v in specs:
            r = runs[v]
            ms, mj = [x["ms"] for x in r], [x["mj"] for x in r]
            rows.append([dim, causal, seq, v or "default", f"{ms[0]:.3f} / {ms[1]:.3f}",
                         f"{flops / (sum(ms) / 2) / 1e9:.0f}", f"{mj[0]:.1f} / {mj[1]:.1f}",
                         f"{sum(x['w'] for x in r) / 2:.0f}", f"{sum(x['mhz'] for x in r) / 2:.0f}",
                         f"{sum(mj) / 2 / base_mj:.3f}"])
            print(" | ".join(map(str, rows[-1])), flush=True)
        write_report(head, header, rows, (), args.out)
    print(write_report(head, header, rows, (), args.out))


if __name__ == "__main__":
    main()
