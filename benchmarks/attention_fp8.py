"""FP8 (E4M3) FusedAttention forward beside cuDNN's FP8 SDPA (cuDNN frontend graph ``sdpa_fp8``), our BF16 kernel and
torch's best BF16 backend: one run, one GPU, same inputs and scales.

Grid (default): batch * seq = 16k tokens, hidden 2048 (head dim 64 -> 32 heads, 128 -> 16, 256 -> 8), causal and
not, seq 512..16k. Inputs: N(0, 1) (and with ``--outliers`` heavy-tailed with 0.1% outliers) quantized per tensor with
scale = amax / 448; P with p_scale 1/448. cuDNN's FP8 SDPA on Hopper writes an FP8 O, so "ours e4m3" (O quantized
with the same output scale) is the like-for-like column; "ours fp16" writes float16. Timings: CUDA-graph replays,
a point's columns timed together by --timing (benchmarks/timing.py: "sustained" by default, each column replayed
alone before its timed replays, as the H100's power cap makes a column's clock depend on what ran before it);
FLOPs 4 * B * H * S^2 * D, halved when causal. Error (seq <= --error-max-seq,
batch 0): RMSE and max |err| / max |ref| of the dequantized outputs against float64 attention of the unquantized
inputs.

    python benchmarks/attention_fp8.py --out benchmarks/results/attention_fp8_h100.md [--quick] [--seqs 2048,8192]
        [--dims 64,128,256] [--variants 128:KV_STAGES=2,...] [--fp8-only] [--timing sustained|sequential] [--clocks]
"""
from __future__ import annotations

import math

import torch

from attention import (HIDDEN, TOKENS, grid_parser, grid_seqs, ours, parse_variants, time_ms, timed_columns,
                       torch_backend_calls, variant_name, versions, write_report)
from nvml_lib import Nvml
from timing import METHODS, Method
from trt_fusedattn.fp8 import E4M3_MAX
from trt_fusedattn.launcher import device_arch, launch, precompile
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention

E4M3 = "float8_e4m3fn"
P_SCALE = 1.0 / E4M3_MAX


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def real_inputs(shape, outliers: bool, gen) -> torch.Tensor:
    """Inputs on the generator's device: N(0, 1), or heavy-tailed with outliers (also the CPU accuracy study's)."""
    x = torch.randn(shape, device=gen.device, generator=gen)
    if outliers:  # heavy-tailed (normal scale mixture) with 0.1% outliers of magnitude 20-35
        x = x * torch.exp(0.7 * torch.randn(shape, device=gen.device, generator=gen))
        hit = torch.rand(shape, device=gen.device, generator=gen) < 1e-3
        x = torch.where(hit, torch.sign(x) * (20 + 15 * torch.rand(shape, device=gen.device, generator=gen)), x)
    return x


class FP8Problem:
    """One grid point: real Q/K/V (float32), their e4m3 versions and per-tensor scales (amax / 448), BSHD."""

    def __init__(self, batch, seq, heads, dim, causal, outliers=False, seed=0):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.causal, self.dim = causal, dim
        self.real = [real_inputs((batch, seq, heads, dim), outliers, gen) for _ in range(3)]
        self.scales = [float(t.abs().amax()) / E4M3_MAX for t in self.real]
        self.fp8 = [quantize(t, s) for t, s in zip(self.real, self.scales)]
        # O ~ a convex combination of V's rows: |O| <= amax(V); the output scale maps that range onto e4m3
        self.output_scale = float(self.real[2].abs().amax()) / E4M3_MAX

    def attrs(self, output_dtype: str) -> dict:
        q_s, k_s, v_s = self.scales
        return FUSED_ATTENTION.resolve({
            "layout": "BSHD", "causal": int(self.causal), "q_scale": q_s, "k_scale": k_s, "v_scale": v_s,
            "p_scale": 0.0, "output_dtype": output_dtype,  # 0: 1/448 (P_SCALE), the contract's default
            "output_scale": self.output_scale if output_dtype == "float8e4m3fn" else 0.0})


def fp8_plan(problem: FP8Problem, output_dtype: str, arch: str, tuning=None):
    """Our FP8 launch plan for this problem (its scales are compile-time: each grid point is a specialization)."""
    return plan_attention([tuple(problem.fp8[0].shape)] * 3 + [None, None], [E4M3] * 3 + [None, None],
                          problem.attrs(output_dtype), arch, tuning=tuning)


def ours_fp8(problem: FP8Problem, out: torch.Tensor, output_dtype: str, arch: str, tuning=None):
    """A closure launching our FP8 kernel (plan made once, like an engine)."""
    q, k, v = problem.fp8
    plan = fp8_plan(problem, output_dtype, arch, tuning)
    precompile([plan], arch)
    ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), None, None]
    return lambda: launch(plan, arch, ptrs, [out.data_ptr()], stream=torch.cuda.current_stream().cuda_stream,
                          device=q.device.index or 0)


def cudnn_fp8(problem: FP8Problem, out: torch.Tensor):
    """A closure executing cuDNN's FP8 SDPA graph on the same e4m3 inputs and scales (descale Q/K/V = our q/k/v
    scales, P quantized with scale_s = 1 / p_scale and dequantized with descale_s = p_scale, O written as
    e4m3(O / output_scale)), or None with the reason when this cuDNN cannot build it."""
    import cudnn
    q, k, v = problem.fp8
    batch, seq, heads, dim = q.shape
    handle = cudnn.create_handle()
    e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32, handle=handle)
    dims, strides = (batch, heads, seq, dim), (seq * heads * dim, dim, heads * dim, 1)  # BSHD memory as BHSD
    tq, tk, tv = (graph.tensor(name=n, dim=dims, stride=strides, data_type=e4m3) for n in ("q", "k", "v"))
    values = [*problem.scales, P_SCALE, 1.0 / P_SCALE, 1.0 / problem.output_scale]
    scalars = [torch.full((1, 1, 1, 1), x, device="cuda", dtype=torch.float32) for x in values]
    scale_tensors = [graph.tensor(name=n, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
                     for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")]
    o, _, amax_s, amax_o = graph.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=scale_tensors[0], descale_k=scale_tensors[1],
                                          descale_v=scale_tensors[2], descale_s=scale_tensors[3],
                                          scale_s=scale_tensors[4], scale_o=scale_tensors[5], is_inference=True,
                                          attn_scale=1.0 / math.sqrt(dim), use_causal_mask=problem.causal)
    o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
    amaxes = [torch.empty((1, 1, 1, 1), device="cuda", dtype=torch.float32) for _ in range(2)]
    for t in (amax_s, amax_o):
        t.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    workspace = torch.empty(graph.get_workspace_size(), device="cuda", dtype=torch.uint8)
    pack = {tq: q, tk: k, tv: v, o: out, amax_s: amaxes[0], amax_o: amaxes[1], **dict(zip(scale_tensors, scalars))}

    def run():
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        graph.execute(pack, workspace, handle=handle)
    return run


def float64_reference(problem: FP8Problem) -> torch.Tensor:
    """Attention of batch 0's unquantized inputs in float64 (torch's math path), BSHD."""
    q, k, v = (t[:1].transpose(1, 2).double() for t in problem.real)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=problem.causal).transpose(1, 2)


def errors(out: torch.Tensor, ref: torch.Tensor) -> str:
    """RMSE and max |err| / max |ref| of batch 0 of a dequantized output."""
    diff = out[:1].double() - ref
    return f"{diff.pow(2).mean().sqrt().item():.2e} / {(diff.abs().max() / ref.abs().max()).item():.2e}"


def dequantized(out: torch.Tensor, scale: float) -> torch.Tensor:
    return out.float() * scale if out.dtype == torch.float8_e4m3fn else out.float()


def fp8_gemm_ceiling() -> str:
    """The FP8 matrix-product ceiling of this GPU (torch._scaled_mm, 8192^3, e4m3 in, bfloat16 out)."""
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    try:
        ms = time_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    except RuntimeError as exc:  # the table says so rather than losing the run
        return f"fp8 GEMM ceiling not measured ({str(exc).splitlines()[0]})"
    return f"measured ceiling: fp8 GEMM 8192^3 {2 * 8192 ** 3 / ms / 1e9:.0f} TFLOP/s (torch._scaled_mm)"


def cudnn_fp8_if_built(problem: FP8Problem, out: torch.Tensor, where: str):
    """cudnn_fp8's closure after one checked call, or None (the reason printed) where this cuDNN cannot run it."""
    try:
        run = cudnn_fp8(problem, out)
        run()
        torch.cuda.synchronize()
        return run
    except Exception as exc:  # a cuDNN that cannot build this graph: the table says nan, the log says why
        print(f"cuDNN FP8 {where}: {type(exc).__name__}: {exc}".splitlines()[0])
        return None


def grid(dims, seqs, causals, variants, arch, error_max_seq: int, outliers: bool, on_row, fp8_only: bool = False,
         method: Method = METHODS["sustained"], nvml=None):
    """The grid's rows (``on_row(header, rows)`` after each, so a crash keeps what was measured) and a summary, each
    point's columns timed together by ``method`` (with ``nvml`` a column of their median SM clocks); ``fp8_only``
    leaves the 16-bit columns (ours fp16-out, ours BF16, torch) empty, for short GPU jobs."""
    header = ["hd", "causal", "seq", "ours e4m3 TFLOP/s", "cuDNN FP8", "ours/cuDNN FP8", "ours fp16-out", "ours BF16",
              "best torch BF16", "ours FP8/best BF16", "RMSE / max rel: ours", "cuDNN FP8", "ours BF16"]
    header += [variant_name(d, t) for d, ts in variants.items() for t in ts]
    header += ["SM MHz (columns in order)"] if nvml else []
    points = [(dim, causal, seq) for dim in dims for causal in causals for seq in seqs]

    def problem_of(dim, causal, seq):
        return FP8Problem(TOKENS // seq, seq, HIDDEN // dim, dim, causal, outliers, seed=seq + dim + int(causal))

    # Every point's data is made once, before its specializations (the scales are compile-time: each point's amax)
    # are compiled in parallel (one at a time they took most of a run); a point's data is freed after its row. Peak
    # GPU memory: ~0.5 GB a point (float32 inputs + e4m3), 17 GB for the full 36-point grid.
    problems = {point: problem_of(*point) for point in points}

    def plans_of(dim, problem):  # the default and each variant with an e4m3 output, the default with float16
        outputs = [("float8e4m3fn", t) for t in [None] + variants.get(dim, [])]
        return [fp8_plan(problem, out, arch, t) for out, t in outputs + ([] if fp8_only else [("float16", None)])]
    precompile([plan for (dim, _, _), problem in problems.items() for plan in plans_of(dim, problem)], arch)
    rows = []
    for dim, causal, seq in points:
        batch, heads = TOKENS // seq, HIDDEN // dim
        problem = problems.pop((dim, causal, seq))
        flops = 4 * batch * heads * seq * seq * dim / (2 if causal else 1)
        tflops = lambda ms: f"{flops / ms / 1e9:.0f}"  # noqa: E731
        shape = problem.fp8[0].shape
        out8 = torch.full(shape, float("nan"), device="cuda").to(torch.float8_e4m3fn)
        out16 = torch.full(shape, float("nan"), device="cuda", dtype=torch.float16)
        cudnn_out = torch.full(shape, float("nan"), device="cuda").to(torch.float8_e4m3fn)
        q16, k16, v16 = (t.to(torch.bfloat16) for t in problem.real)
        out_bf16 = torch.full_like(q16, float("nan"))
        fns = {"ours e4m3": ours_fp8(problem, out8, "float8e4m3fn", arch),
               "cuDNN FP8": cudnn_fp8_if_built(problem, cudnn_out, f"hd{dim} causal {causal} seq {seq}")}
        torch_names = []
        if not fp8_only:
            fns["ours fp16-out"] = ours_fp8(problem, out16, "float16", arch)
            fns["ours BF16"] = ours(q16, k16, v16, out_bf16, causal)
            torch_calls, _ = torch_backend_calls(q16, k16, v16, causal)
            torch_names = [f"torch {name}" for name in torch_calls]
            fns.update(zip(torch_names, torch_calls.values()))
        fns.update({variant_name(dim, x): ours_fp8(problem, out8, "float8e4m3fn", arch, x)
                    for x in variants.get(dim, [])})
        t, clocks = timed_columns(fns, method, nvml)
        fns["ours e4m3"]()  # out8 from the default again (the variants wrote it last), for the error columns
        t_e4m3, t_cudnn, t_fp16, t_bf16 = (t.get(name, float("nan"))
                                           for name in ("ours e4m3", "cuDNN FP8", "ours fp16-out", "ours BF16"))
        t_torch = min((t[name] for name in torch_names if t[name] == t[name]), default=float("nan"))
        if fns["cuDNN FP8"] is None:
            cudnn_out = None
        row = [dim, int(causal), seq, tflops(t_e4m3), tflops(t_cudnn), f"{t_cudnn / t_e4m3:.2f}",
               tflops(t_fp16), tflops(t_bf16), tflops(t_torch), f"{t_torch / t_e4m3:.2f}"]
        if seq <= error_max_seq:
            ref = float64_reference(problem)
            row += [errors(dequantized(out8, problem.output_scale), ref),
                    errors(dequantized(cudnn_out, problem.output_scale), ref) if cudnn_out is not None else "",
                    "" if fp8_only else errors(out_bf16, ref)]
        else:
            row += ["", "", ""]
        row += [tflops(t[variant_name(d, x)]) if d == dim else "" for d, xs in variants.items() for x in xs]
        row += [clocks] if nvml else []
        rows.append(row)
        print(" | ".join(map(str, row)), flush=True)
        on_row(header, rows)
        del problem
    summary = []
    for dim in dims:
        pts = [float(r[5]) for r in rows if r[0] == dim and r[2] >= 2048 and r[5] != "nan"]
        if pts:
            summary.append(f"hd {dim} at seq >= 2k: ours FP8 >= 1.00x cuDNN FP8 at {sum(x >= 1.0 for x in pts)} of "
                           f"{len(pts)} points (ours/cuDNN {min(pts):.2f}-{max(pts):.2f}x)")
    return header, rows, summary


def main():
    parser = grid_parser(__doc__.splitlines()[0], "seq 2k and 8k only",
                         "FP8 tuning variants to time, e.g. 128:KV_STAGES=2")
    parser.add_argument("--error-max-seq", type=int, default=4096, help="measure errors up to this sequence length")
    parser.add_argument("--outliers", action="store_true", help="heavy-tailed inputs with outliers (FA3's test)")
    parser.add_argument("--fp8-only", action="store_true", help="skip the 16-bit columns (fp16-out, BF16, torch)")
    args = parser.parse_args()
    seqs = grid_seqs(args)
    arch = device_arch(0)
    method, nvml = METHODS[args.timing], Nvml(0) if args.clocks else None
    intro = (f"batch x seq = {TOKENS} tokens, hidden {HIDDEN}, BSHD; CUDA-graph replays, median; FLOPs 4*B*H*S^2*D "
             f"(/2 causal); inputs {'heavy-tailed with outliers' if args.outliers else 'N(0, 1)'}, per-tensor "
             f"scales amax/448, p_scale 1/448; ours = the plan's FP8 path on {arch}; errors on batch 0 vs float64 "
             f"of the unquantized inputs (RMSE / max |err| / max |ref|).")
    try:
        import cudnn
        cudnn_version = f", cuDNN backend {cudnn.backend_version()}, frontend {cudnn.__version__}"
    except Exception as exc:  # the table says it when the frontend is missing
        cudnn_version = f", cuDNN frontend unavailable ({type(exc).__name__})"
    head = (f"# FP8 FusedAttention forward\n\n{versions()}{cudnn_version}\n\n{fp8_gemm_ceiling()}\n\n{intro}\n\n"
            f"{method.describe()}.\n\n")

    def write(header, rows, summary=()):
        return write_report(head, header, rows, summary, args.out)

    header, rows, summary = grid(tuple(int(x) for x in args.dims.split(",")), seqs, (False, True),
                                 parse_variants(args.variants), arch, args.error_max_seq, args.outliers, write,
                                 args.fp8_only, method, nvml)
    print(write(header, rows, summary))


if __name__ == "__main__":
    main()
