"""The warp-specialized prefill kernel as the driver's PTX JIT builds it (what the launcher and TensorRT run) beside
nvcc's own cubin of the same PTX: SASS of both, and timings of each load path, for one or more kernel trees.

Why: v6.3 (a tile loop around v4's main loop) lost 8-13% a K/V step on the H100 although nvcc's SASS of its loop was
within 8 instructions of v4's (NOTES.md, "v6.3 vs v4 steady-state SASS"); the launcher loads PTX, so the SASS that
ran was the driver's. This script shows whether the two compilers agree and whether the loss follows the loader.

A tree is a ``plugins`` folder (``attention/plan.py`` and its kernel sources, ``common/``); ``--tree NAME=DIR``
adds one beside the installed one (``tree``), its plan loaded from DIR (e.g. an older commit unpacked there).

    python benchmarks/attention_jit.py --tree v6_3=/tmp/v63/plugins --variants v6_3:PERSISTENT=0 --out DIR
    python benchmarks/attention_jit.py ... --profile v6_3:PERSISTENT=0:ptx:4096:0   # one config, 3 calls (ncu)
    python benchmarks/attention_jit.py --unchecked no_softmax=/tmp/diag/no_softmax/plugins --out DIR  # timing only
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import difflib
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

from attention import HIDDEN, TOKENS, parse_variants, sdpa, time_ms, versions, write_report
from trt_fusedattn.launcher.compile import nvcc_command, nvcc_path
from trt_fusedattn.plugins import attention as installed_attention
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION

launcher = importlib.import_module("trt_fusedattn.launcher.launch")  # the module (the package exports its function)
ARCH = "sm_90a"
CU_JIT_INPUT_PTX = 1
CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE = 3, 4, 12
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, CU_FUNC_ATTRIBUTE_NUM_REGS = 3, 4
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# cuModuleLoadData of the PTX (the driver JITs it, as the launcher does) / of cuLink's image of that PTX (the SASS
# dumped here; should time as 'ptx') / of nvcc's cubin
LOADS = ("ptx", "jit", "cubin")


def parse_tuning(spec: str) -> tuple:
    """'PERSISTENT=0+Q_STAGES=1' -> (('PERSISTENT', 0), ('Q_STAGES', 1)) ('-' or '': none), as --variants reads it."""
    return () if spec in ("", "-") else tuple(sorted(parse_variants(f"0:{spec}")[0][0].items()))


def load_plan_function(plugins: Path):
    """``plan_attention`` of the tree at ``plugins`` (its own sources; imports of the package resolve to the installed
    one, whose contract and launcher the older trees share)."""
    if plugins.resolve() == Path(installed_attention.__file__).parent.parent.resolve():
        from trt_fusedattn.plugins.attention.plan import plan_attention
        return plan_attention
    spec = importlib.util.spec_from_file_location(f"plan_{abs(hash(str(plugins)))}", plugins / "attention" / "plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.plan_attention


def nvcc(plan, plugins: Path, target: str, out: Path) -> str:
    """nvcc's PTX or cubin of ``plan``'s specialization with the tree's own headers only; returns ptxas's report."""
    flags = ("-Xptxas", "-v") if target == "cubin" else ()
    cmd = nvcc_command(Path(plan.source), ARCH, plan.defines, target, out, (str(plugins),), flags)
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"nvcc {target} of {plan.source} failed: {result.stderr[-2000:]}")
    return "\n".join(ln for ln in result.stderr.splitlines() if "ptxas" in ln or "bytes" in ln or "registers" in ln)


def libcuda():
    """The driver library with the argument types of the calls used here (the launcher's handle)."""
    lib = launcher._libcuda()
    vp, u, sz = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
    lib.cuLinkCreate_v2.argtypes = [u, vp, vp, ctypes.POINTER(vp)]
    lib.cuLinkAddData_v2.argtypes = [vp, ctypes.c_int, vp, sz, ctypes.c_char_p, u, vp, vp]
    lib.cuLinkComplete.argtypes = [vp, ctypes.POINTER(vp), ctypes.POINTER(sz)]
    lib.cuLinkDestroy.argtypes = [vp]
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), vp]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
    lib.cuFuncSetAttribute.argtypes = [vp, ctypes.c_int, ctypes.c_int]
    lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, vp]
    return lib


def _check(err: int, what: str):
    if err:
        raise RuntimeError(f"{what} failed with CUresult {err}")


def driver_jit_image(ptx: bytes) -> tuple[bytes, str]:
    """The cubin the driver's JIT makes of ``ptx`` (cuLinkCreate / AddData(PTX) / Complete, default options, as
    cuModuleLoadData compiles PTX), and its verbose info log."""
    lib = libcuda()
    log = ctypes.create_string_buffer(1 << 16)
    options = (ctypes.c_int * 3)(CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_LOG_VERBOSE)
    values = (ctypes.c_void_p * 3)(ctypes.addressof(log), len(log), 1)
    state, image, size = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
    data = ctypes.create_string_buffer(ptx)
    with launcher.current_context(0):
        _check(lib.cuLinkCreate_v2(3, options, values, ctypes.byref(state)), "cuLinkCreate")
        _check(lib.cuLinkAddData_v2(state, CU_JIT_INPUT_PTX, data, len(ptx), b"kernel.ptx", 0, None, None),
               "cuLinkAddData(PTX)")
        _check(lib.cuLinkComplete(state, ctypes.byref(image), ctypes.byref(size)), "cuLinkComplete")
        cubin = ctypes.string_at(image, size.value)
        lib.cuLinkDestroy(state)
    return cubin, log.value.decode(errors="replace")


class LoadedKernel:
    """One module image (PTX text or a cubin) loaded on device 0 with one plan's launch geometry and scalars."""

    def __init__(self, image: bytes, plan):
        lib = libcuda()
        self.lib, self.plan = lib, plan
        module, self.function = ctypes.c_void_p(), ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(image)  # PTX must be NUL-terminated
        with launcher.current_context(0):
            _check(lib.cuModuleLoadData(ctypes.byref(module), self._image), "cuModuleLoadData")
            _check(lib.cuModuleGetFunction(ctypes.byref(self.function), module, plan.kernel.encode()),
                   "cuModuleGetFunction")
            _check(lib.cuFuncSetAttribute(self.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          plan.shared_mem), "cuFuncSetAttribute")

    def attribute(self, attr: int) -> int:
        value = ctypes.c_int()
        _check(self.lib.cuFuncGetAttribute(ctypes.byref(value), attr, self.function), "cuFuncGetAttribute")
        return value.value

    def closure(self, q, k, v, out):
        """A zero-argument launch on torch's current stream (CUDA-graph capturable)."""
        args = launcher.kernel_arguments([q.data_ptr(), k.data_ptr(), v.data_ptr()], self.plan.scalars,
                                         [out.data_ptr()])
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        grid, block = (tuple(self.plan.grid) + (1, 1))[:3], (tuple(self.plan.block) + (1, 1))[:3]

        def run():
            _check(self.lib.cuLaunchKernel(self.function, *grid, *block, self.plan.shared_mem,
                                           torch.cuda.current_stream().cuda_stream, ctypes.addressof(params), None),
                   "cuLaunchKernel")
        run.keep = (args, params)
        return run


def cuobjdump() -> str:
    """$CUOBJDUMP, else cuobjdump on PATH, else beside nvcc or in /usr/local/cuda/bin."""
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                  str(Path(nvcc_path()).resolve().with_name("cuobjdump")), "/usr/local/cuda/bin/cuobjdump"]
    return next((c for c in candidates if c and Path(c).is_file()), "cuobjdump")


_SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*(/\*.*\*/)?\s*$")
_CODE_ADDRESS = re.compile(r"\b0x[0-9a-f]+\b")
_BRANCHES = ("BRA", "BSSY", "CALL.REL", "CALL.REL.NOINC", "JMP", "BREAK")


def sass(cubin: Path) -> list[tuple[int, str]]:
    """The kernel's SASS as (address, instruction) from ``cuobjdump -sass``, encodings dropped."""
    text = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return [(int(m.group(1), 16), m.group(2).rstrip(" ;")) for m in map(_SASS_LINE.match, text.splitlines()) if m]


def opcode(line: str) -> str:
    """The instruction's opcode with its modifiers (predicate guard dropped)."""
    return re.sub(r"^@!?U?P\w+\s+", "", line).split(" ")[0]


def normalized(code: list[tuple[int, str]]) -> list[str]:
    """Instructions with branch targets replaced by L, so that a moved block does not make every branch differ."""
    return [_CODE_ADDRESS.sub("L", text) if opcode(text) in _BRANCHES else text for _, text in code]


def mma_loops(code: list[tuple[int, str]]) -> list[str]:
    """The innermost backward-branch bodies that hold wgmmas or async copies (the MMA warpgroups' and the loader's
    K/V loops): span, instructions, wgmmas (HGMMA, QGMMA), LDGSTS, MUFU.EX2 and barrier waits."""
    spans = []
    for address, text in code:
        targets = _CODE_ADDRESS.findall(text) if opcode(text) == "BRA" else []
        if targets and int(targets[-1], 16) < address:
            body = [t for a, t in code if int(targets[-1], 16) <= a <= address]
            ops = collections.Counter(map(opcode, body))
            hgmma = sum(n for op, n in ops.items() if op[1:].startswith("GMMA"))  # HGMMA, QGMMA (FP8)
            copies = sum(n for op, n in ops.items() if op.startswith("LDGSTS"))
            if hgmma or copies:
                spans.append((int(targets[-1], 16), address, len(body), hgmma, copies, ops))
    loops = []
    for start, end, size, hgmma, copies, ops in spans:
        if not any(start <= s2 and e2 <= end and (s2, e2) != (start, end) for s2, e2, *_ in spans):
            waits = sum(n for op, n in ops.items() if "TRYWAIT" in op or op.startswith("BAR."))
            loops.append(f"loop {start:#x}-{end:#x}: {size} instructions, {hgmma} GMMA, {copies} LDGSTS, "
                         f"{ops['MUFU.EX2']} MUFU.EX2, {waits} waits/barriers")
    return loops


def sass_report(name: str, nvcc_code: list, jit_code: list) -> str:
    """Counts, wgmma loops, the opcode histogram's differences and the first differing lines of nvcc's vs the JIT's
    SASS."""
    nvcc_lines, jit_lines = normalized(nvcc_code), normalized(jit_code)
    ops_n, ops_j = collections.Counter(map(opcode, nvcc_lines)), collections.Counter(map(opcode, jit_lines))
    diff = list(difflib.unified_diff(nvcc_lines, jit_lines, "nvcc", "driver-jit", n=0, lineterm=""))
    changed = sum(1 for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---"))
    lines = [f"## {name}: nvcc {len(nvcc_lines)} instructions, driver JIT {len(jit_lines)}, "
             f"{changed} lines differ (unified diff, addresses and branch targets dropped)"]
    lines += ["nvcc " + loop for loop in mma_loops(nvcc_code)] + ["jit  " + loop for loop in mma_loops(jit_code)]
    delta = {op: (ops_n[op], ops_j[op]) for op in set(ops_n) | set(ops_j) if ops_n[op] != ops_j[op]}
    lines += [f"  {op}: nvcc {n} / jit {j}" for op, (n, j) in sorted(delta.items(), key=lambda x: -abs(x[1][0] - x[1][1]))]
    lines += diff[:300]
    return "\n".join(lines)


def build(trees: dict, configs: list, shapes: list, out: Path) -> dict:
    """Compile, JIT and load every (config, shape); write SASS and logs under ``out``. -> {(config, shape, load): kernel}."""
    kernels, reports = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for tree, tuning in configs:
            plugins, plan_of = trees[tree]
            for shape in shapes:
                batch, seq, heads, dim, causal = shape
                attrs = FUSED_ATTENTION.resolve({"layout": "BSHD", "causal": causal, "causal_alignment": "top_left"})
                plan = plan_of([(batch, seq, heads, dim)] * 3 + [None, None], ["bfloat16"] * 3 + [None, None],
                               attrs, ARCH, tuning=dict(tuning))
                tag = f"{tree}_hd{dim}_c{causal}"
                ptx_path, cubin_path = Path(tmp) / f"{tag}.ptx", out / f"{tag}.nvcc.cubin"
                if not cubin_path.exists():
                    nvcc(plan, plugins, "ptx", ptx_path)
                    ptxas = nvcc(plan, plugins, "cubin", cubin_path)
                    jit, log = driver_jit_image(ptx_path.read_bytes())
                    (out / f"{tag}.jit.cubin").write_bytes(jit)
                    try:
                        report = sass_report(tag, sass(cubin_path), sass(out / f"{tag}.jit.cubin"))
                    except (OSError, subprocess.CalledProcessError) as exc:  # no cuobjdump: the cubins stay in out
                        report = f"## {tag}: no SASS ({exc})"
                    reports.append(f"# {tag}\nnvcc ptxas: {ptxas}\ndriver JIT log: {log}\n{report}")
                    print("\n".join(reports[-1].splitlines()[:12]), flush=True)
                images = {"ptx": ptx_path.read_bytes(), "jit": (out / f"{tag}.jit.cubin").read_bytes(),
                          "cubin": cubin_path.read_bytes()}
                for load in LOADS:
                    kernels[(tree, tuning, shape, load)] = LoadedKernel(images[load], plan)
    (out / "sass_diff.txt").write_text("\n\n".join(reports) + "\n")
    return kernels


def config_name(tree: str, tuning: tuple) -> str:
    return tree + "".join(f" {k}={v}" for k, v in tuning)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PLUGINS_DIR: a kernel tree beside 'tree'")
    parser.add_argument("--unchecked", action="append", default=[],
                        help="NAME=PLUGINS_DIR: a diagnostic tree (a part of the kernel removed) timed without the "
                             "output check, since its outputs are wrong by design")
    parser.add_argument("--variants", default="", help="NAME:K=V+K=V,...: tuning configs of a tree to time too")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seqs", default="2048,4096,8192,16384", help="non-causal seqs")
    parser.add_argument("--causal-seqs", default="4096,16384")
    parser.add_argument("--out", required=True, help="folder for SASS, the diff report and the table")
    parser.add_argument("--profile", help="TREE:K=V+...|-:LOAD:SEQ:CAUSAL: build that one (SASS under --out/profile),"
                        " call it 3 times, exit")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    installed = Path(installed_attention.__file__).parent.parent
    trees = {"tree": (installed, load_plan_function(installed))}
    for item in args.tree + args.unchecked:
        name, folder = item.split("=", 1)
        trees[name] = (Path(folder), load_plan_function(Path(folder)))
    unchecked = {item.split("=", 1)[0] for item in args.unchecked}
    configs = [(name, ()) for name in trees]
    for item in filter(None, args.variants.split(",")):
        name, spec = item.split(":", 1)
        configs.append((name, parse_tuning(spec)))
    heads = HIDDEN // args.dim
    shapes = [(TOKENS // s, s, heads, args.dim, 0) for s in map(int, filter(None, args.seqs.split(",")))]
    shapes += [(TOKENS // s, s, heads, args.dim, 1) for s in map(int, filter(None, args.causal_seqs.split(",")))]
    if args.profile:
        tree, spec, load, seq, causal = args.profile.split(":")
        tuning, shape = parse_tuning(spec), (TOKENS // int(seq), int(seq), heads, args.dim, int(causal))
        (out / "profile").mkdir(exist_ok=True)
        kernel = build(trees, [(tree, tuning)], [shape], out / "profile")[(tree, tuning, shape, load)]
        q, k, v = (torch.randn(shape[:4], device="cuda", dtype=torch.bfloat16) for _ in range(3))
        run = kernel.closure(q, k, v, torch.empty_like(q))
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        return
    kernels = build(trees, configs, shapes, out)
    header = ["hd", "causal", "seq", "cuDNN"] + [f"{config_name(*c)} {load}" for c in configs for load in LOADS]
    rows, regs = [], []
    for shape in shapes:
        batch, seq, _, dim, causal = shape
        q, k, v = (torch.randn(batch, seq, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * batch * heads * seq * seq * dim / (2 if causal else 1)
        ref = sdpa(q, k, v, bool(causal), SDPBackend.CUDNN_ATTENTION)
        row = [dim, causal, seq, f"{flops / time_ms(ref) / 1e9:.0f}"]
        expected = ref().transpose(1, 2).float()
        for config in configs:
            for load in LOADS:
                kernel = kernels[(*config, shape, load)]
                out_t = torch.full_like(q, float("nan"))
                run = kernel.closure(q, k, v, out_t)
                run()
                torch.cuda.synchronize()
                err = ((out_t.float() - expected).norm() / expected.norm()).item()
                if config[0] not in unchecked and not err < 1e-2:
                    raise RuntimeError(f"{config_name(*config)} {load} at {shape}: relative error {err:.1e}")
                row.append(f"{flops / time_ms(run) / 1e9:.0f}")
                if shape == shapes[0] or causal and shape == shapes[-1]:
                    regs.append(f"{config_name(*config)} {load} causal={causal}: "
                                f"{kernel.attribute(CU_FUNC_ATTRIBUTE_NUM_REGS)} registers, "
                                f"{kernel.attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)} B local")
        rows.append(row)
        print(" | ".join(map(str, row)), flush=True)
    head = (f"# Warp-specialized attention: driver JIT (PTX loaded) vs nvcc cubin\n\n{versions()}\n\n"
            f"bf16, batch x seq = {TOKENS} tokens, hidden {HIDDEN}, BSHD; TFLOP/s from CUDA-graph replays, median; "
            f"'ptx' = cuModuleLoadData of the PTX (the driver JITs it, as the launcher and TensorRT do), 'jit' = of the "
            f"image cuLinkComplete made of that PTX (the SASS in sass_diff.txt), 'cubin' = "
            f"nvcc's cubin of the same specialization. Trees: "
            + ", ".join(f"{n} = {p}" for n, (p, _) in trees.items()) + "\n\n")
    print(write_report(head, header, rows, regs, str(out / "attention_jit.md")))


if __name__ == "__main__":
    main()
