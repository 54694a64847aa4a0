"""How one attention point's time settles after a switch (why the grid's first-timed column ran low at 2k): after a
second of a preceding load, or after idling, the point's CUDA graph is replayed back to back, and each replay's time
a call, SM clock, power, temperature and NVML's clock-limit reasons are recorded, then shown per interval since the
switch.

    python benchmarks/attention_clock_trace.py --point bfloat16,64,0,2048 --before bfloat16,256,1,16384 --out t.md
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn.attention import SDPBackend

from attention import HIDDEN, TOKENS, ours, runnable, sdpa, versions, write_report
from nvml_lib import Nvml, clock_limit_names
from timing import REPS_IN_GRAPH, graph_of_calls, replays

EDGES_S = (0.0, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)


def point(spec: str):
    """'dtype,head dim,causal,seq' -> (q, k, v, out, causal, TFLOP a call) of the grid's shape."""
    dtype, dim, causal, seq = spec.split(",")
    dim, causal, seq = int(dim), bool(int(causal)), int(seq)
    q, k, v = (torch.randn(TOKENS // seq, seq, HIDDEN // dim, dim, device="cuda", dtype=getattr(torch, dtype))
               for _ in range(3))
    return q, k, v, torch.full_like(q, float("nan")), causal, 4 * TOKENS * seq * HIDDEN / (2 if causal else 1) / 1e12


def binned(scenario: str, samples: list, tflop: float) -> list[list]:
    """Table rows of ``samples`` per interval of EDGES_S since the switch: medians, and the limits seen."""
    rows = []
    for lo, hi in zip(EDGES_S, EDGES_S[1:]):
        part = [s for s in samples if lo <= s[0] < hi]
        if part:
            ms = statistics.median(s[1] for s in part)
            limits = 0
            for s in part:
                limits |= s[5]
            rows.append([scenario, f"{lo * 1e3:.0f}-{hi * 1e3:.0f}", len(part), f"{ms:.4f}", f"{tflop / ms * 1e3:.0f}",
                         f"{statistics.median(s[2] for s in part):.0f}", f"{statistics.median(s[3] for s in part):.0f}",
                         f"{max(s[4] for s in part)}", clock_limit_names(limits)])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", default="bfloat16,64,0,2048", help="dtype,head dim,causal,seq of the traced point")
    parser.add_argument("--before", default="bfloat16,256,1,16384", help="the preceding point (its ours kernel)")
    parser.add_argument("--seconds", type=float, default=1.6, help="trace length after each switch")
    parser.add_argument("--out", help="markdown file for the table")
    args = parser.parse_args()
    nvml = Nvml(0)
    q, k, v, out, causal, tflop = point(args.point)
    bq, bk, bv, bout, bcausal, _ = point(args.before)
    graphs = {"before": graph_of_calls(ours(bq, bk, bv, bout, bcausal), REPS_IN_GRAPH),
              "ours": graph_of_calls(ours(q, k, v, out, causal), REPS_IN_GRAPH)}
    cudnn = runnable(sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION))
    if cudnn:
        graphs["cuDNN"] = graph_of_calls(cudnn, REPS_IN_GRAPH)
    scenarios = [("ours after 1 s of the preceding point", "before", "ours"),
                 ("cuDNN after 1 s of the preceding point", "before", "cuDNN"),
                 ("ours after 2 s idle", None, "ours"),
                 ("cuDNN after 2 s idle", None, "cuDNN"),
                 ("ours after 1 s of cuDNN at the point", "cuDNN", "ours"),
                 ("cuDNN after 1 s of ours at the point", "ours", "cuDNN")]
    rows = []
    for name, first, traced in scenarios:
        if traced not in graphs or first and first not in graphs:
            continue
        if first:
            replays(graphs[first], seconds=1.0)
        else:
            torch.cuda.synchronize()
            time.sleep(2.0)
        sample = lambda: (nvml.sm_clock_mhz(), nvml.power_w(), nvml.temperature_c(), nvml.clock_limits())  # noqa: E731
        rows += binned(name, replays(graphs[traced], seconds=args.seconds, sample=sample), tflop)
        print("\n".join(" | ".join(map(str, r)) for r in rows[-len(EDGES_S) + 1:]), flush=True)
    header = ["scenario", "ms since the switch", "replays", "ms a call", "TFLOP/s", "SM MHz", "W", "max C",
              "clock limits seen"]
    head = (f"# Clock trace of one attention point\n\n{versions()}\n\npoint {args.point} (dtype, head dim, causal, seq; "
            f"{TOKENS} tokens, hidden {HIDDEN}), preceding point {args.before} (ours); replays of a {REPS_IN_GRAPH}-call "
            f"CUDA graph back to back, each sampled (NVML) while it runs; medians per interval.\n\n")
    print(write_report(head, header, rows, [], args.out))


if __name__ == "__main__":
    main()
