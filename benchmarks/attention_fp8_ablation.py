"""Where the FP8 attention kernel's time goes: our FP8 default beside cuDNN's FP8 SDPA and beside copies of our kernel
with one part removed (outputs wrong on purpose: timed only, never checked, never a plan choice), one process, one GPU,
the same inputs.

Each ablation is a copy of plugins/attention/ in a temporary folder with a few exact source replacements (each must
match exactly once, so a stale pattern fails loudly rather than timing the unchanged kernel); its plan is the
default plan with ``source`` pointed at the copy (plugins/common stays the installed one). ``--check`` only builds
each copy's PTX for the points (no GPU), to check the patterns on the CPU.

    python benchmarks/attention_fp8_ablation.py --points 128:0:8192,128:0:2048 --out table.md [--ablations a,b]
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import tempfile
from pathlib import Path

import torch

from attention import HIDDEN, TOKENS, parse_tuning, time_ms, versions, write_report
from attention_fp8 import E4M3, FP8Problem, cudnn_fp8, fp8_plan
from trt_fusedattn.launcher import device_arch, launch, precompile
from trt_fusedattn.launcher.compile import compile_ptx
from trt_fusedattn.plugins import attention as installed_attention
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention

_SOFTMAX = "attention_softmax.cuh"
_MMA = "attention_mma_warpgroups_sm90.cuh"
_MAINLOOP = "attention_mainloop_sm90.cuh"
_LOAD = "attention_load_sm90.cuh"
_TRANSPOSE_CALL = ("  transpose_v_tile<kLoadThreads>(staging + (step % kVStagingTiles) * kVTileElems,\n"
                   "                                 sV + KVPipeline::stage(step) * kVTileElems, tid);\n")
_V_COPY = "    load_kv_tile(staging + (step % kVStagingTiles) * kVTileElems, v_base, v_stride, n0, len_kv, tid);\n"
_K_COPY = "    load_kv_tile(sK + KVPipeline::stage(step) * kKTileElems, k_base, k_stride, n0, len_kv, tid);\n"
_SOFTMAX_CALL = ("  online_softmax<true>(s, st.row_max, st.row_sum, [&](int, int half, float alpha) "
                 "{ o_scale[half] = alpha; });\n")

# name -> (what is removed, [(file, regex, replacement, matches)]): each regex must match exactly `matches` times
ABLATIONS = {
    "no_exp": ("the exponentials (MUFU.EX2): p = its argument; max, FFMA, row sum and P's conversion kept",
               [(_SOFTMAX, re.escape("? exp2_fma(arg) : exp2_approx(arg);"), "? exp2_fma(arg) : arg;", 1)]),
    "no_softmax": ("the online softmax (max, exponentials, row sums, O rescale): S packed to e4m3 as it is",
                   [(_MMA, re.escape(_SOFTMAX_CALL), "  o_scale[0] = o_scale[1] = 1.f;\n", 1)]),
    "no_p_convert": ("P's e4m3 conversion (F2FP): each A register takes one float's bits",
                     [(_MAINLOOP, r"pack_e4m3x4\((p\[0\]\[[^,]+\]\[\d\]),[^;]*\);", r"__float_as_uint(\1);", 4)]),
    "no_transpose": ("the loader's V transpose (V copied into its staging tile, V^T never written)",
                     [(_LOAD, re.escape(_TRANSPOSE_CALL), "", 1)]),
    "no_v_path": ("V's copy and transpose (the loader copies K only)",
                  [(_LOAD, re.escape(_TRANSPOSE_CALL), "", 1), (_LOAD, re.escape(_V_COPY), "", 1)]),
    "no_kv_copies": ("the loader's K and V copies (the transpose of a stale staging tile kept): what TMA would free",
                     [(_LOAD, re.escape(_K_COPY), "", 1), (_LOAD, re.escape(_V_COPY), "", 1)]),
    "products_only": ("softmax and V transpose both removed: products, pipeline and copies",
                      [(_MMA, re.escape(_SOFTMAX_CALL), "  o_scale[0] = o_scale[1] = 1.f;\n", 1),
                       (_LOAD, re.escape(_TRANSPOSE_CALL), "", 1)]),
}


def ablated_tree(name: str, root: Path) -> Path:
    """A copy of plugins/attention/ under ``root``/``name`` with ABLATIONS[name]'s replacements; returns the copy's
    attention_sm90.cu."""
    src = Path(installed_attention.__file__).parent
    dst = root / name / "attention"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    for file, pattern, replacement, matches in ABLATIONS[name][1]:
        path = dst / file
        text, n = re.subn(pattern, replacement, path.read_text())
        if n != matches:
            raise RuntimeError(f"ablation {name}: pattern {pattern[:60]!r} matched {n} times in {file}, expected "
                               f"{matches}; update ABLATIONS to the kernel source")
        path.write_text(text)
    return dst / "attention_sm90.cu"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="128:0:8192", help="dim:causal:seq,... (batch x seq = 16k tokens)")
    parser.add_argument("--ablations", default=",".join(ABLATIONS), help=f"subset of {', '.join(ABLATIONS)}")
    parser.add_argument("--out", help="markdown file for the table")
    parser.add_argument("--tunings", default="", help="plan tuning overrides to time as columns too (all points' "
                        "head dims), e.g. KV_WHOLE_TILE_COPIES=1+VT_ADDRESS_STEP=1,KV_STAGES=2")
    parser.add_argument("--check", action="store_true", help="only build each copy's PTX for sm_90a (CPU)")
    args = parser.parse_args()
    names = [n for n in args.ablations.split(",") if n]
    tunings = {t: parse_tuning(t) for t in args.tunings.split(",") if t}
    points = [tuple(map(int, p.split(":"))) for p in args.points.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        sources = {n: ablated_tree(n, Path(tmp)) for n in names}
        if args.check:
            for (dim, causal, seq), (n, s) in ((p, ns) for p in points for ns in sources.items()):
                compile_ptx(s, "sm_90a", check_plan(dim, causal, seq).defines)
                print(f"{n} hd{dim} causal {causal}: PTX built")
            return
        arch = device_arch(0)
        problems, plans = {}, {}
        for dim, causal, seq in points:
            problem = FP8Problem(TOKENS // seq, seq, HIDDEN // dim, dim, bool(causal), seed=seq + dim + causal)
            default = fp8_plan(problem, "float8e4m3fn", arch)
            problems[(dim, causal, seq)] = problem
            plans[(dim, causal, seq)] = {"default": default, **{n: dataclasses.replace(default, source=s)
                                                                for n, s in sources.items()},
                                         **{t: fp8_plan(problem, "float8e4m3fn", arch, tuning)
                                            for t, tuning in tunings.items()}}
        precompile([p for ps in plans.values() for p in ps.values()], arch)
        columns = names + list(tunings)
        header = ["hd", "causal", "seq", "cuDNN FP8", "ours default"] + columns + ["ours default again"]
        rows = []
        for point, problem in problems.items():
            dim, causal, seq = point
            flops = 4 * TOKENS * HIDDEN * seq / (2 if causal else 1)  # 4 B H S^2 D with B S = TOKENS, H D = HIDDEN
            out = torch.full(problem.fp8[0].shape, float("nan"), device="cuda").to(torch.float8_e4m3fn)
            q, k, v = problem.fp8

            def timed(plan):
                ms = time_ms(lambda: launch(plan, arch, [q.data_ptr(), k.data_ptr(), v.data_ptr(), None, None],
                                            [out.data_ptr()], stream=torch.cuda.current_stream().cuda_stream))
                return f"{ms * 1e3:.0f} us ({flops / ms / 1e9:.0f})"
            row = [dim, causal, seq, timed_cudnn(problem, out, flops), timed(plans[point]["default"])]
            row += [timed(plans[point][c]) for c in columns] + [timed(plans[point]["default"])]
            rows.append(row)
            print(" | ".join(map(str, row)), flush=True)
    head = (f"# FP8 attention: where the time goes (ablations, timing only)\n\n{versions()}\n\nbatch x seq = {TOKENS} "
            f"tokens, hidden {HIDDEN}, BSHD, e4m3 output; CUDA-graph replays, median; cells: time a call (TFLOP/s). "
            "Ablated copies compute wrong outputs by design. Removed:\n\n"
            + "\n".join(f"- {n}: {ABLATIONS[n][0]}" for n in names) + "\n\n")
    print(write_report(head, header, rows, [], args.out))


def check_plan(dim: int, causal: int, seq: int):
    """The default FP8 plan of a grid point with placeholder scales (the specialization --check builds)."""
    attrs = FUSED_ATTENTION.resolve({"layout": "BSHD", "causal": causal, "q_scale": 0.01, "k_scale": 0.01,
                                     "v_scale": 0.01, "output_dtype": "float8e4m3fn", "output_scale": 0.01})
    shape = (TOKENS // seq, seq, HIDDEN // dim, dim)
    return plan_attention([shape] * 3 + [None, None], [E4M3] * 3 + [None, None], attrs, "sm_90a")


def timed_cudnn(problem: FP8Problem, out: torch.Tensor, flops: float) -> str:
    try:
        ms = time_ms(cudnn_fp8(problem, out))
    except Exception as exc:  # a cuDNN that cannot build this graph: the table says so
        return f"n/a ({type(exc).__name__})"
    return f"{ms * 1e3:.0f} us ({flops / ms / 1e9:.0f})"


if __name__ == "__main__":
    main()
