"""FusedAttention forward beside torch SDPA's flash (FlashAttention-2), cuDNN and memory-efficient backends, one run,
one GPU.

Grid (default): batch * seq = 16k tokens, hidden 2048 (head dim 64 -> 32 heads, 128 -> 16, 256 -> 8), causal and
not, seq 512..16k, bf16 and fp16; "ours" is the plan's default path on this GPU, ``--variants`` columns are tuning
overrides (e.g. 128:WGMMA=1 the single-role wgmma mainloop, 128:WGMMA=0 the mma.sync one). ``--deployment``: issue
10's model shapes (BERT with padding, ViT-L, Llama-3 prefill/chunked prefill/decode with GQA, Stable Diffusion,
Whisper) against each torch backend (the decode grid is benchmarks/attention_decode.py). Each kernel is
captured 10x in a CUDA graph (no launch gaps), warmed up, and the median of event-timed replays is reported. FLOPs: 4 * B * H * Lq * Lkv * D, halved when causal and square.

    python benchmarks/attention.py --out benchmarks/results/attention_h100.md [--quick] [--seqs 2048,8192]
        [--dims 64,128,256] [--dtypes bfloat16,float16] [--variants 128:WGMMA=1,...] [--deployment]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from trt_fusedattn.launcher import device_arch, launch, precompile
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention

TOKENS, HIDDEN = 16384, 2048
SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def graph_of_calls(fn, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back ``fn()`` calls, captured after a warm-up and replayed once, so what
    the timing and energy benchmarks replay never includes compiling, loading or autotuning."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_ms(fn, reps_in_graph: int = 10, replays: int = 15) -> float:
    """Median milliseconds of one ``fn()`` call, from replays of a CUDA graph holding ``reps_in_graph`` calls."""
    graph = graph_of_calls(fn, reps_in_graph)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps_in_graph)
    return statistics.median(times)


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


def parse_variants(text: str) -> dict:
    """'64:BLOCK_N=128+Q_IN_REGISTERS=0,128:RESCALE_THRESHOLD=0.0f' -> {64: [{...}], 128: [{...}]}: plan tuning
    overrides to time beside the default, per head dim."""
    variants: dict = {}
    for item in filter(None, text.split(",")):
        dim, spec = item.split(":")
        variants.setdefault(int(dim), []).append(
            {k: (v if v.endswith("f") else int(v)) for k, v in (kv.split("=") for kv in spec.split("+"))})
    return variants


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def torch_backends(q, k, v, causal: bool, mask=None) -> dict:
    """Median ms of each torch SDPA backend that takes this problem (FA2 takes no mask), and its output."""
    backends = {"flash (FA2)": SDPBackend.FLASH_ATTENTION, "cuDNN": SDPBackend.CUDNN_ATTENTION,
                "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}
    times, ref = {}, None
    for name, backend in backends.items():
        try:
            fn = sdpa(q, k, v, causal, backend, mask=mask)
            result = fn()
            times[name] = time_ms(fn)
            ref = result.transpose(1, 2) if ref is None else ref
        except RuntimeError:
            times[name] = float("nan")
    return times, ref


def grid(dtypes, dims, seqs, variants, arch) -> tuple[list, list]:
    """The FlashAttention-2 grid: ours (the plan's default path) beside torch's backends, plus tuning variants."""
    header = ["dtype", "hd", "causal", "seq", "ours", "flash (FA2)", "cuDNN", "ours/FA2", "ours/cuDNN", "err vs FA2"]
    header += [f"hd{d} " + " ".join(f"{k}={v}" for k, v in t.items()) for d, ts in variants.items() for t in ts]
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
                    t_ours = time_ms(ours(q, k, v, out, causal))
                    ref = sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION)().transpose(1, 2)
                    err = rel_err(out, ref)
                    t_fa2 = time_ms(sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION))
                    try:
                        t_cudnn = time_ms(sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION))
                    except RuntimeError:
                        t_cudnn = float("nan")
                    row = [str(dtype).removeprefix("torch."), dim, int(causal), seq, f"{tflops(t_ours):.0f}",
                           f"{tflops(t_fa2):.0f}", f"{tflops(t_cudnn):.0f}", f"{t_fa2 / t_ours:.2f}",
                           f"{t_cudnn / t_ours:.2f}", f"{err:.1e}"]
                    for d, ts in variants.items():
                        for t in ts:
                            row.append(f"{tflops(time_ms(ours(q, k, v, out, causal, t))):.0f}" if d == dim else "")
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


def deployment(dtype, variants) -> tuple[list, list]:
    """Issue 10's deployment table: ours vs each torch backend on the same inputs (key lengths become a boolean mask
    for torch, which FA2 cannot take); TFLOP/s of the unmasked work, K/V bandwidth for decode."""
    header = ["shape", "ours ms", "flash (FA2) ms", "cuDNN ms", "mem-efficient ms", "best torch", "ours/best",
              "ours/cuDNN", "err vs torch", "ours TFLOP/s", "ours K/V TB/s"]
    header += [f"hd{d} " + " ".join(f"{k}={v}" for k, v in t.items()) + " ms" for d, ts in variants.items() for t in ts]
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, b, lq, lkv, hq, hkv, d, causal, alignment, with_lengths in DEPLOYMENT:
        q = torch.randn(b, lq, hq, d, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(b, lkv, hkv, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        lengths = mask = None
        if with_lengths:
            lengths = torch.randint(lkv // 2, lkv + 1, (b,), device="cuda", dtype=torch.int32, generator=gen)
            mask = (torch.arange(lkv, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
        if causal and alignment == "bottom_right":  # torch's is_causal is top-left: give it the mask
            mask = torch.ones(lq, lkv, device="cuda", dtype=torch.bool).tril(lkv - lq)
        out = torch.full_like(q, float("nan"))
        t_ours = time_ms(ours(q, k, v, out, causal, key_lengths=lengths, alignment=alignment))
        times, ref = torch_backends(q, k, v, causal and mask is None, mask)
        best_name = min((n for n in times if times[n] == times[n]), key=times.get)
        best = times[best_name]
        keys = lkv if lengths is None else float(lengths.float().mean())
        flops = 4 * b * hq * lq * keys * d / (2 if causal and lq == lkv else 1)
        kv_bytes = 2 * b * hkv * keys * d * q.element_size()
        row = [name, f"{t_ours:.4f}"] + [f"{times[n]:.4f}" for n in ("flash (FA2)", "cuDNN", "mem-efficient")]
        row += [best_name, f"{best / t_ours:.2f}", f"{times['cuDNN'] / t_ours:.2f}",
                f"{rel_err(out, ref) if ref is not None else float('nan'):.1e}", f"{flops / t_ours / 1e9:.0f}",
                f"{kv_bytes / t_ours / 1e9:.2f}"]
        for vd, ts in variants.items():
            for t in ts:
                row.append(f"{time_ms(ours(q, k, v, out, causal, t, key_lengths=lengths, alignment=alignment)):.4f}"
                           if vd == d else "")
        rows.append(row)
        print(" | ".join(map(str, row)), flush=True)
    wins = [float(r[6]) for r in rows]
    return header, rows, [f"ours >= 1.00x the best torch backend on {sum(x >= 1.0 for x in wins)} of {len(wins)} shapes "
                          f"(ours/best {min(wins):.2f}-{max(wins):.2f}x)"]


def grid_parser(description: str, quick: str, variants: str) -> argparse.ArgumentParser:
    """The grid flags of both attention benchmarks (this one and attention_fp8.py): --out, --quick (help ``quick``),
    --seqs, --dims, --variants (help ``variants``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", help="markdown file for the table")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--seqs", default="", help="comma-separated sequence lengths instead of 512..16384")
    parser.add_argument("--dims", default="64,128,256", help="head dims of the grid")
    parser.add_argument("--variants", default="", help=variants)
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
    args = parser.parse_args()
    dtypes = (tuple(getattr(torch, x) for x in args.dtypes.split(",")) if args.dtypes
              else (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float16))
    seqs = grid_seqs(args)
    arch = device_arch(0)
    if args.deployment:
        header, rows, summary = deployment(torch.bfloat16, parse_variants(args.variants))
        intro = "Deployment shapes (issue 10), bfloat16, BSHD; CUDA-graph replays, median; best torch = fastest SDPA backend that runs the shape."
    else:
        header, rows, summary = grid(dtypes, tuple(int(x) for x in args.dims.split(",")), seqs,
                                     parse_variants(args.variants), arch)
        intro = (f"batch x seq = {TOKENS} tokens, hidden {HIDDEN}, BSHD; CUDA-graph replays, median; FLOPs 4*B*H*S^2*D "
                 f"(/2 causal); ours = the plan's default path on {arch}.")
    head = f"# FusedAttention forward\n\n{versions()}\n\n{ceilings()}\n\n{intro}\n\n"
    print(write_report(head, header, rows, summary, args.out))


if __name__ == "__main__":
    main()
