"""FusedAttention forward beside torch SDPA's flash (FlashAttention-2), cuDNN and memory-efficient backends, one run,
one GPU.

Grid (default): batch * seq = 16k tokens, hidden 2048 (head dim 64 -> 32 heads, 128 -> 16, 256 -> 8), causal and
not, seq 512..16k, bf16 and fp16; "ours" is the plan's default path on this GPU, ``--variants`` columns are tuning
overrides (e.g. 128:WGMMA=1 the single-role wgmma mainloop, 128:WGMMA=0 the mma.sync one). ``--deployment``: issue
10's model shapes (BERT with padding, ViT-L, Llama-3 prefill/chunked prefill/decode with GQA, Stable Diffusion,
Whisper) against each torch backend (the decode grid is benchmarks/attention_decode.py). Each kernel is
captured 10x in a CUDA graph (no launch gaps); each column of a point is replayed alone for a warm-up right before
its event-timed replays, in two passes (benchmarks/timing.py; ``--timing sequential`` is the method of the tables
before session 10). FLOPs: 4 * B * H * Lq * Lkv * D, halved when causal and square.

    python benchmarks/attention.py --out benchmarks/results/attention_h100.md [--quick] [--seqs 2048,8192]
        [--dims 64,128,256] [--dtypes bfloat16,float16] [--variants 128:WGMMA=1,...] [--deployment]
        [--timing sustained|sequential] [--clocks]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import subprocess

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from nvml_lib import Nvml
from timing import METHODS, Method, graph_of_calls, time_columns, time_ms
from trt_fusedattn.launcher import device_arch, launch, precompile
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention

TOKENS, HIDDEN = 16384, 2048
SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def ours_plan(q_shape, kv_shape, dtype: str, causal: bool, arch: str, tuning=None, *, lengths_shape=None,
              alignment="top_left"):
    """Our launch plan for BSHD Q of ``q_shape`` and K/V of ``kv_shape`` (``lengths_shape``: key lengths' shape)."""
    attrs = FUSED_ATTENTION.resolve({"layout": "BSHD", "causal": int(causal), "causal_alignment": alignment})
    return plan_attention([tuple(q_shape), tuple(kv_shape), tuple(kv_shape), None, lengths_shape],
                          [dtype] * 3 + [None, None if lengths_shape is None else "int32"], attrs, arch, tuning=tuning)


def ours(q, k, v, out, causal: bool, tuning=None, *, key_lengths=None, alignment="top_left"):
    """A closure launching our kernel on BSHD q/k/v into ``out`` (plan made once, like an engine)."""
    arch = device_arch(q.device.index or 0)
    plan = ours_plan(q.shape, k.shape, str(q.dtype).removeprefix("torch."), causal, arch, tuning,
                     lengths_shape=None if key_lengths is None else tuple(key_lengths.shape), alignment=alignment)
    precompile([plan], arch)
    ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), None, None if key_lengths is None else key_lengths.data_ptr()]
    return lambda: launch(plan, arch, ptrs, [out.data_ptr()],
                          stream=torch.cuda.current_stream().cuda_stream, device=q.device.index or 0)


def sdpa(q, k, v, causal: bool, backend, *, mask=None):
    """torch SDPA on the same BSHD memory viewed as [B, H, S, D] (as FA2 takes it); GQA through enable_gqa."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    gqa = q.shape[2] != k.shape[2]

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal,
                                                                    enable_gqa=gqa)
    return run


def versions() -> str:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    return (f"device {torch.cuda.get_device_name()}, driver {driver}, CUDA {torch.version.cuda}, torch {torch.__version__}"
            f", cuDNN {torch.backends.cudnn.version()}, python {platform.python_version()}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def read_bandwidth() -> float:
    """Measured device read bandwidth, TB/s: a sum over 1 GiB of float32 (reads it once, writes one number)."""
    src = torch.randn(2 ** 28, device="cuda")
    return src.numel() * 4 / time_ms(lambda: src.sum()) / 1e9


def ceilings() -> str:
    """The measured ceilings of the floor (NOTES.md): bf16 matrix product, device-to-device copy, device read."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gemm = 2 * 8192 ** 3 / time_ms(lambda: a @ b) / 1e9
    src = torch.randn(2 ** 28, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / time_ms(lambda: dst.copy_(src)) / 1e9  # bytes per ms / 1e9 = TB/s
    return (f"measured ceilings: bf16 GEMM 8192^3 {gemm:.0f} TFLOP/s, device copy {copy:.2f} TB/s (read + write), "
            f"device read {read_bandwidth():.2f} TB/s (sum of 1 GiB float32)")


def parse_tuning(spec: str) -> dict:
    """'BLOCK_N=128+RESCALE_THRESHOLD=0.0f' -> {'BLOCK_N': 128, 'RESCALE_THRESHOLD': '0.0f'}: one set of plan tuning
    overrides (integers, or float literals kept as the C text)."""
    return {k: (v if v.endswith("f") else int(v)) for k, v in (kv.split("=") for kv in spec.split("+"))}


def parse_variants(text: str) -> dict:
    """'64:BLOCK_N=128+Q_IN_REGISTERS=0,128:RESCALE_THRESHOLD=0.0f' -> {64: [{...}], 128: [{...}]}: plan tuning
    overrides to time beside the default, per head dim."""
    variants: dict = {}
    for item in filter(None, text.split(",")):
        dim, spec = item.split(":")
        variants.setdefault(int(dim), []).append(parse_tuning(spec))
    return variants


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def runnable(fn):
    """``fn`` if it runs here, also inside a CUDA graph (a torch backend refuses a problem by RuntimeError), else
    None."""
    try:
        graph_of_calls(fn, 1)
        return fn
    except RuntimeError:
        return None


def torch_backend_calls(q, k, v, causal: bool, mask=None) -> tuple[dict, torch.Tensor | None]:
    """Closures of the torch SDPA backends (None for one that does not take this problem; FA2 takes no mask), and
    the first runnable one's output in BSHD."""
    backends = {"flash (FA2)": SDPBackend.FLASH_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION,
                "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}
    calls = {name: runnable(sdpa(q, k, v, causal, backend, mask=mask)) for name, backend in backends.items()}
    ref = next((fn().transpose(1, 2) for fn in calls.values() if fn), None)
    return calls, ref


def torch_backends(q, k, v, causal: bool, mask=None) -> tuple[dict, torch.Tensor | None]:
    """Median ms of each torch SDPA backend that takes this problem (nan for the others), each timed alone, and the
    first one's output."""
    calls, ref = torch_backend_calls(q, k, v, causal, mask)
    return {name: time_ms(fn) if fn else float("nan") for name, fn in calls.items()}, ref


def timed_columns(fns: dict, method: Method, nvml) -> tuple[dict, str]:
    """ms a call of each runnable column of ``fns`` (nan for None) timed together by ``method``, and their median SM
    clocks as 'MHz/MHz/..' in column order."""
    timings = time_columns({name: fn for name, fn in fns.items() if fn}, method, nvml)
    times = {name: timings[name].ms if name in timings else float("nan") for name in fns}
    return times, "/".join(f"{t.mhz:.0f}" for t in timings.values())


def variant_name(dim: int, tuning: dict) -> str:
    """A variant's column name: 'hd128 BLOCK_N=256 KV_STAGES=2'."""
    return f"hd{dim} " + " ".join(f"{k}={v}" for k, v in tuning.items())


def grid(dtypes, dims, seqs, variants, arch, method: Method, nvml=None) -> tuple[list, list, list]:
    """The FlashAttention-2 grid: ours (the plan's default path) beside torch's backends, plus tuning variants, each
    point's columns timed together by ``method``; with ``nvml`` a column of their median SM clocks."""
    header = ["dtype", "hd", "causal", "seq", "ours", "flash (FA2)", "cuDNN", "ours/FA2", "ours/cuDNN", "err vs FA2"]
    header += [variant_name(d, t) for d, ts in variants.items() for t in ts]
    header += ["SM MHz (columns in order)"] if nvml else []
    rows = []
    # every point's specializations compiled in parallel first (one by one they took most of a GPU job's minutes)
    precompile([ours_plan(shape, shape, str(dtype).removeprefix("torch."), causal, arch, t)
                for dtype in dtypes for dim in dims for causal in (False, True) for seq in seqs
                for shape in [(TOKENS // seq, seq, HIDDEN // dim, dim)] for t in [None] + variants.get(dim, [])], arch)
    for dtype in dtypes:
        for dim in dims:
            heads = HIDDEN // dim
            for causal in (False, True):
                for seq in seqs:
                    batch = TOKENS // seq
                    q, k, v = (torch.randn(batch, seq, heads, dim, device="cuda", dtype=dtype) for _ in range(3))
                    out = torch.full_like(q, float("nan"))
                    flops = 4 * batch * heads * seq * seq * dim / (2 if causal else 1)
                    tflops = lambda ms: flops / ms / 1e9  # noqa: E731
                    fns = {"ours": ours(q, k, v, out, causal)}
                    fns["ours"]()
                    fns["flash (FA2)"] = sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION)
                    err = rel_err(out, fns["flash (FA2)"]().transpose(1, 2))
                    fns["cuDNN"] = runnable(sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION))
                    fns.update({variant_name(dim, t): ours(q, k, v, out, causal, t) for t in variants.get(dim, [])})
                    t, clocks = timed_columns(fns, method, nvml)
                    row = [str(dtype).removeprefix("torch."), dim, int(causal), seq, f"{tflops(t['ours']):.0f}",
                           f"{tflops(t['flash (FA2)']):.0f}", f"{tflops(t['cuDNN']):.0f}",
                           f"{t['flash (FA2)'] / t['ours']:.2f}", f"{t['cuDNN'] / t['ours']:.2f}", f"{err:.1e}"]
                    row += [f"{tflops(t[variant_name(d, x)]):.0f}" if d == dim else ""
                            for d, xs in variants.items() for x in xs]
                    row += [clocks] if nvml else []
                    rows.append(row)
                    print(" | ".join(map(str, row)), flush=True)
    summary = []
    for dim in dims:
        pts = [r for r in rows if r[1] == dim and r[3] >= 2048]
        if pts:
            fa2, cudnn = [float(r[7]) for r in pts], [float(r[8]) for r in pts]
            summary.append(f"hd {dim} at seq >= 2k: ours >= 1.00x cuDNN at {sum(x >= 1.0 for x in cudnn)} of "
                           f"{len(cudnn)} points (ours/cuDNN {min(cudnn):.2f}-{max(cudnn):.2f}x, ours/FA2 "
                           f"{min(fa2):.2f}-{max(fa2):.2f}x)")
    return header, rows, summary


# Issue 10's deployment shapes: (name, batch, Lq, Lkv, Hq, Hkv, D, causal, alignment, key lengths)
DEPLOYMENT = (
    ("BERT-base, padded (key lengths)", 32, 512, 512, 12, 12, 64, False, "top_left", True),
    ("ViT-L/16", 32, 197, 197, 16, 16, 64, False, "top_left", False),
    ("Llama-3-8B prefill 1x4096", 1, 4096, 4096, 32, 8, 128, True, "top_left", False),
    ("Llama-3-8B prefill 4x2048", 4, 2048, 2048, 32, 8, 128, True, "top_left", False),
    ("chunked prefill 512 after 3584", 1, 512, 4096, 32, 8, 128, True, "bottom_right", False),
    ("decode 1 x 4k keys, batch 32", 32, 1, 4096, 32, 8, 128, False, "top_left", True),
    ("decode 16 x 4k keys, batch 8", 8, 16, 4096, 32, 8, 128, True, "bottom_right", False),
    ("decode 1 x 32k keys, batch 4", 4, 1, 32768, 32, 8, 128, False, "top_left", False),
    ("decode 16 x 32k keys, batch 1", 1, 16, 32768, 32, 8, 128, True, "bottom_right", False),
    ("SD self 2x4096, 8 heads", 2, 4096, 4096, 8, 8, 64, False, "top_left", False),
    ("SD cross 2x4096 x 77 keys", 2, 4096, 77, 8, 8, 64, False, "top_left", False),
    ("Whisper encoder 8x1500, 20 heads", 8, 1500, 1500, 20, 20, 64, False, "top_left", False),
)


def deployment(dtype, variants, method: Method, nvml=None, only: str = "") -> tuple[list, list, list]:
    """Issue 10's deployment table (the shapes whose name contains ``only``): ours vs each torch backend on the same
    inputs (key lengths become a boolean mask for torch, which FA2 cannot take), a shape's columns timed together by
    ``method``; TFLOP/s of the unmasked work, K/V bandwidth for decode."""
    header = ["shape", "ours ms", "flash (FA2) ms", "cuDNN ms", "mem-efficient ms", "best torch", "ours/best",
              "ours/cuDNN", "err vs torch", "ours TFLOP/s", "ours K/V TB/s"]
    header += [variant_name(d, t) + " ms" for d, ts in variants.items() for t in ts]
    header += ["SM MHz (columns in order)"] if nvml else []
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, b, lq, lkv, hq, hkv, d, causal, alignment, with_lengths in DEPLOYMENT:
        if only not in name:
            continue
        q = torch.randn(b, lq, hq, d, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(b, lkv, hkv, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        lengths = mask = None
        if with_lengths:
            lengths = torch.randint(lkv // 2, lkv + 1, (b,), device="cuda", dtype=torch.int32, generator=gen)
            mask = (torch.arange(lkv, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
        if causal and alignment == "bottom_right":  # torch's is_causal is top-left: give it the mask
            mask = torch.ones(lq, lkv, device="cuda", dtype=torch.bool).tril(lkv - lq)
        out = torch.full_like(q, float("nan"))
        fns = {"ours": ours(q, k, v, out, causal, key_lengths=lengths, alignment=alignment)}
        fns["ours"]()
        backends, ref = torch_backend_calls(q, k, v, causal and mask is None, mask)
        err = rel_err(out, ref) if ref is not None else float("nan")
        fns.update(backends)
        fns.update({variant_name(d, t): ours(q, k, v, out, causal, t, key_lengths=lengths, alignment=alignment)
                    for t in variants.get(d, [])})
        times, clocks = timed_columns(fns, method, nvml)
        t_ours = times["ours"]
        best_name = min((n for n in backends if times[n] == times[n]), key=times.get)
        best = times[best_name]
        keys = lkv if lengths is None else float(lengths.float().mean())
        flops = 4 * b * hq * lq * keys * d / (2 if causal and lq == lkv else 1)
        kv_bytes = 2 * b * hkv * keys * d * q.element_size()
        row = [name, f"{t_ours:.4f}"] + [f"{times[n]:.4f}" for n in ("flash (FA2)", "cuDNN", "mem-efficient")]
        row += [best_name, f"{best / t_ours:.2f}", f"{times['cuDNN'] / t_ours:.2f}", f"{err:.1e}",
                f"{flops / t_ours / 1e9:.0f}", f"{kv_bytes / t_ours / 1e9:.2f}"]
        row += [f"{times[variant_name(vd, t)]:.4f}" if vd == d else "" for vd, ts in variants.items() for t in ts]
        row += [clocks] if nvml else []
        rows.append(row)
        print(" | ".join(map(str, row)), flush=True)
    wins = [float(r[6]) for r in rows]
    return header, rows, [f"ours >= 1.00x the best torch backend on {sum(x >= 1.0 for x in wins)} of {len(wins)} shapes "
                          f"(ours/best {min(wins):.2f}-{max(wins):.2f}x)"]


def grid_parser(description: str, quick: str, variants: str) -> argparse.ArgumentParser:
    """The grid flags of both attention benchmarks (this one and attention_fp8.py): --out, --quick (help ``quick``),
    --seqs, --dims, --variants (help ``variants``), --timing, --clocks."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", help="markdown file for the table")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--seqs", default="", help="comma-separated sequence lengths instead of 512..16384")
    parser.add_argument("--dims", default="64,128,256", help="head dims of the grid")
    parser.add_argument("--variants", default="", help=variants)
    parser.add_argument("--timing", choices=sorted(METHODS), default="sustained",
                        help="how a point's columns are timed (benchmarks/timing.py); sequential: the method of the "
                             "tables before session 10")
    parser.add_argument("--clocks", action="store_true", help="a column of each column's median SM clock (NVML)")
    return parser


def grid_seqs(args) -> tuple[int, ...]:
    """The grid's sequence lengths: --seqs, else 2k and 8k under --quick, else SEQS."""
    return tuple(int(x) for x in args.seqs.split(",")) if args.seqs else (2048, 8192) if args.quick else SEQS


def write_report(head: str, header: list, rows: list, summary, out: str | None) -> str:
    """The markdown of one benchmark run (``head``, the table, its summary lines), written to ``out`` when given;
    the attention, decode and FP8 benchmarks all report this way."""
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    text = head + "\n".join(table) + "\n\n" + "\n".join(summary) + "\n"
    if out:
        with open(out, "w") as f:
            f.write(text)
    return text


def main():
    parser = grid_parser(__doc__.splitlines()[0], "bf16 only, seq 2k and 8k",
                         "tuning variants to time, e.g. 128:WGMMA=1,64:WGMMA=0")
    parser.add_argument("--deployment", action="store_true", help="issue 10's deployment shapes instead of the grid")
    parser.add_argument("--dtypes", default="", help="comma-separated grid dtypes (bfloat16,float16) instead of both")
    parser.add_argument("--only", default="", help="--deployment: only the shapes whose name contains this")
    args = parser.parse_args()
    dtypes = (tuple(getattr(torch, x) for x in args.dtypes.split(",")) if args.dtypes
              else (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float16))
    seqs = grid_seqs(args)
    arch = device_arch(0)
    method, nvml = METHODS[args.timing], Nvml(0) if args.clocks else None
    if args.deployment:
        header, rows, summary = deployment(torch.bfloat16, parse_variants(args.variants), method, nvml, args.only)
        intro = "Deployment shapes (issue 10), bfloat16, BSHD; best torch = fastest SDPA backend that runs the shape."
    else:
        header, rows, summary = grid(dtypes, tuple(int(x) for x in args.dims.split(",")), seqs,
                                     parse_variants(args.variants), arch, method, nvml)
        intro = (f"batch x seq = {TOKENS} tokens, hidden {HIDDEN}, BSHD; FLOPs 4*B*H*S^2*D (/2 causal); ours = the "
                 f"plan's default path on {arch}.")
    head = f"# FusedAttention forward\n\n{versions()}\n\n{ceilings()}\n\n{intro}\n\n{method.describe()}.\n\n"
    print(write_report(head, header, rows, summary, args.out))


if __name__ == "__main__":
    main()
