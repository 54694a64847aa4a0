"""The launcher: nvcc compile + cache, array parsing, argument packing (CPU); real launches on torch/CuPy (GPU)."""
from __future__ import annotations

import contextlib
import ctypes
import sys
import types

import numpy as np
import pytest

from trt_fusedattn.launcher import ArrayError, CompileError, LaunchError, LaunchPlan
from trt_fusedattn.launcher import compile as comp
from trt_fusedattn.launcher import arrays as arr
from trt_fusedattn.launcher.launch import device_arch, kernel_arguments, launch

AXPB = r'''
#include "axpb_params.cuh"
extern "C" __global__ void axpb(const DTYPE* x, int n, DTYPE* y) {
  extern __shared__ unsigned char scratch[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (threadIdx.x == 0 && SHARED_BYTES > 0) scratch[SHARED_BYTES - 1] = 1;  // touch the whole dynamic allocation
  if (i < n) y[i] = (DTYPE)(A * (float)x[i] + B);
}
'''
HEADER = "#include <cuda_fp16.h>\n#define B 0.5f\n"


@pytest.fixture
def kernel_dir(tmp_path, monkeypatch):
    """A fresh compile cache and a tiny kernel source with a local header."""
    monkeypatch.setenv("TRT_FUSEDATTN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "axpb.cu").write_text(AXPB)
    (tmp_path / "axpb_params.cuh").write_text(HEADER)
    return tmp_path


def _defines(a=2.0, dtype="float", shared=0):
    return {"A": f"{a}f", "DTYPE": dtype, "SHARED_BYTES": shared}


def _has_nvcc() -> bool:
    try:
        return bool(comp.nvcc_path())
    except CompileError:
        return False


needs_nvcc = pytest.mark.skipif(not _has_nvcc(), reason="nvcc not found (CUDA toolkit)")


@needs_nvcc
def test_compile_ptx_caches_and_keys_on_defines_and_headers(kernel_dir, monkeypatch):
    calls = []
    real_run = comp.run_nvcc
    monkeypatch.setattr(comp, "run_nvcc", lambda cmd, src: calls.append(cmd) or real_run(cmd, src))
    source = kernel_dir / "axpb.cu"

    ptx = comp.compile_ptx(source, "sm_90a", _defines())
    assert ".target sm_90a" in ptx and ".entry axpb(" in ptx
    assert "-arch=compute_90a" in calls[0] and "-DA=2.0f" in calls[0]
    assert comp.compile_ptx(source, "sm_90a", _defines()) == ptx and len(calls) == 1  # cache hit

    assert comp.compile_ptx(source, "sm_90a", _defines(a=3.0)) != ptx and len(calls) == 2  # new define
    assert ".target sm_80" in comp.compile_ptx(source, "sm_80", _defines()) and len(calls) == 3

    (kernel_dir / "axpb_params.cuh").write_text(HEADER.replace("0.5f", "0.25f"))  # edited local header
    comp.compile_ptx(source, "sm_90a", _defines())
    assert len(calls) == 4
    cached = sorted(p.name for p in (kernel_dir / "cache").glob("*.ptx"))
    assert len(cached) == 4 and not list((kernel_dir / "cache").glob(".nvcc-*")), cached


@needs_nvcc
def test_compile_error_is_one_clean_line(kernel_dir):
    (kernel_dir / "broken.cu").write_text('extern "C" __global__ void k(int* p) { p[0] = undeclared_name; }\n')
    with pytest.raises(CompileError) as info:
        comp.compile_ptx(kernel_dir / "broken.cu", "sm_80")
    message = str(info.value)
    assert "\n" not in message and "broken.cu" in message and "undeclared_name" in message
    assert not list((kernel_dir / "cache").glob("broken*"))  # nothing half-written


@needs_nvcc
def test_compile_cubin_reports_ptxas_usage(kernel_dir):
    path, report = comp.compile_cubin(kernel_dir / "axpb.cu", "sm_90a", _defines())
    assert path.suffix == ".cubin" and path.stat().st_size > 0
    assert "Compiling entry function 'axpb' for 'sm_90a'" in report and "registers" in report


def test_compile_rejects_bad_arch_and_missing_source(tmp_path):
    with pytest.raises(CompileError, match="unknown GPU arch 'hopper'"):
        comp.arch_flag("hopper", "ptx")
    assert comp.arch_flag("sm_89", "ptx") == "-arch=compute_89"
    assert comp.arch_flag("sm_90a", "cubin") == "-arch=sm_90a"
    with pytest.raises(CompileError, match="does not exist"):
        comp.compile_ptx(tmp_path / "nope.cu", "sm_80")


def test_missing_nvcc_says_how_to_fix(monkeypatch, tmp_path):
    comp.nvcc_path.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(comp, "FALLBACK_NVCC", tmp_path / "nvcc")
    try:
        with pytest.raises(CompileError, match="install the CUDA toolkit .* or set CUDA_HOME"):
            comp.nvcc_path()
    finally:
        comp.nvcc_path.cache_clear()


def test_local_headers_followed_recursively(tmp_path):
    (tmp_path / "a.cu").write_text('#include "b.cuh"\n#include <cuda_fp16.h>\n')
    (tmp_path / "b.cuh").write_text('#include "sub/c.cuh"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.cuh").write_text("// leaf\n")
    assert [p.name for p in comp.local_headers(tmp_path / "a.cu")] == ["b.cuh", "c.cuh"]


class FakeDeviceArray:
    """Exposes only __cuda_array_interface__ (a made-up pointer: parsing only, never dereferenced)."""

    def __init__(self, shape, typestr, strides=None, ptr=0x7F0000001000, version=3):
        self.__cuda_array_interface__ = dict(shape=shape, typestr=typestr, strides=strides, data=(ptr, False),
                                             version=version)


@pytest.fixture
def made_up_pointers(monkeypatch):
    """The made-up pointers own no device: on a GPU machine the driver would refuse to be asked about them."""
    monkeypatch.setattr(arr, "_pointer_device", lambda ptr: 0)


@pytest.mark.parametrize("typestr,dtype", [("<f2", "float16"), ("<V2", "bfloat16"), ("<f4", "float32"),
                                           ("<i4", "int32"), ("|b1", "bool"), ("|V1", "float8_e4m3fn")])
def test_cuda_array_interface_dtypes(typestr, dtype, made_up_pointers):
    a = arr.device_array(FakeDeviceArray((2, 3), typestr), "x")
    assert (a.dtype, a.shape, a.strides, a.ptr) == (dtype, (2, 3), (3, 1), 0x7F0000001000)
    assert a.is_contiguous()


def test_cuda_array_interface_byte_strides_become_element_strides(made_up_pointers):
    # a [4, 6] float16 view of every other column of a [4, 12] array
    a = arr.device_array(FakeDeviceArray((4, 6), "<f2", strides=(24, 4)), "k")
    assert a.strides == (12, 2) and not a.is_contiguous()
    with pytest.raises(ArrayError, match="k .* is not contiguous"):
        arr.require(a, "k", contiguous=True)
    with pytest.raises(ArrayError, match="k has dtype float16; expected bfloat16 or float32"):
        arr.require(a, "k", dtypes=("bfloat16", "float32"))
    with pytest.raises(ArrayError, match="expected 4 dimensions"):
        arr.require(a, "k", ndim=4)
    with pytest.raises(ArrayError, match="not multiples of its item size"):
        arr.device_array(FakeDeviceArray((4, 6), "<f4", strides=(24, 6)), "k")
    with pytest.raises(ArrayError, match="typestr '<c8'"):
        arr.device_array(FakeDeviceArray((4,), "<c8"), "k")


def test_host_arrays_rejected_with_advice():
    with pytest.raises(ArrayError, match=r"^q is a host array \(numpy\b.*pass a CUDA device array: torch/CuPy/pycuda"):
        arr.device_array(np.zeros((2, 2), np.float32), "q")
    torch = pytest.importorskip("torch")
    with pytest.raises(ArrayError, match=r"^v is a host array \(torch, device cpu\)"):
        arr.device_array(torch.zeros(2, dtype=torch.bfloat16), "v")
    with pytest.raises(ArrayError, match="mask is a list, not a device array"):
        arr.device_array([1, 2], "mask")


def test_dlpack_capsule_parsed_with_ctypes():
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = host[1:, ::2]
    ptr, shape, strides, dtype, device = arr.parse_dlpack_capsule(view.__dlpack__())
    assert (shape, strides, dtype, device) == ((3, 3), (6, 2), "float32", (1, 0))
    assert ptr == view.ctypes.data
    assert arr.parse_dlpack_capsule(np.ones(5, np.int32).__dlpack__())[3] == "int32"


def test_dlpack_float8_capsule():
    """FP8 arrays (issue 11: torch.float8_e4m3fn, and any DLPack producer's kDLFloat8_e4m3fn) reach the kernels."""
    torch = pytest.importorskip("torch")
    t = torch.zeros(3, 5, dtype=torch.float8_e4m3fn)
    ptr, shape, strides, dtype, device = arr.parse_dlpack_capsule(t.__dlpack__())
    assert (ptr, shape, strides, dtype, device) == (t.data_ptr(), (3, 5), (5, 1), "float8_e4m3fn", (1, 0))


def test_prepared_launch_passes_pointers_then_scalars_then_outputs(tmp_path):
    """The prepared kernel parameters in the AOT ABI order: the pointer slots a launch fills, the int32 scalars
    converted once, the output slots (an empty grid loads no module: nothing here needs a GPU)."""
    from trt_fusedattn.launcher.launch import PreparedLaunch
    plan = LaunchPlan(tmp_path / "k.cu", "k", {}, (0, 1, 1), (128, 1, 1), 0, (7, -3, 2 ** 31 - 1))
    prepared = PreparedLaunch(plan, "sm_90a", 2, 1)
    prepared._pointers[:] = [0xA000, 0xB000, 0xC000]
    read = [ctypes.cast(prepared.params[i], ctypes.POINTER(t)).contents.value
            for i, t in enumerate([ctypes.c_uint64] * 2 + [ctypes.c_int32] * 3 + [ctypes.c_uint64])]
    assert read == [0xA000, 0xB000, 7, -3, 2 ** 31 - 1, 0xC000]
    prepared([0x1, None, 0x2], [0x3])  # an empty grid launches nothing
    with pytest.raises(LaunchError, match="prepared for 2 inputs and 1 outputs, got 3 and 1"):
        prepared([0x1, 0x2, 0x4], [0x3])


class FakeDriver:
    """The four driver entry points of a repeated launch as C callbacks, recording what the driver would see (the
    kernel parameters read through their addresses during the call, as cuLaunchKernel copies them)."""
    LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
    GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
    PUSH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)

    def __init__(self, kinds, current=0x77, error=0):
        self.kinds, self.current, self.error, self.launches, self.calls = kinds, current, error, [], []
        self._callbacks = [self.LAUNCH(self._launch), self.GET(self._get),
                           self.PUSH(lambda ctx: self.calls.append(("push", ctx)) or 0),
                           self.GET(lambda out: self.calls.append(("pop",)) or 0)]
        # as CDLL's functions: plain C function pointers without argtypes
        plain = [ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.cast(c, ctypes.c_void_p).value) for c in self._callbacks]
        self.cuLaunchKernel, self.cuCtxGetCurrent, self.cuCtxPushCurrent_v2, self.cuCtxPopCurrent_v2 = plain

    def _get(self, out):
        out[0] = self.current
        return 0

    def _launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values = [ctypes.cast(params[i], ctypes.POINTER(t)).contents.value for i, t in enumerate(self.kinds)]
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, values))
        return self.error


@pytest.mark.parametrize("path", ["C", "ctypes"])
def test_repeated_launch_passes_pointers_scalars_grid_and_stream(path, monkeypatch):
    """PreparedLaunch.launch_pointers, through the C launcher (built here) or ctypes, hands the driver the kernel,
    grid, block, shared memory, stream and the parameters in the AOT ABI order; it makes the primary context current
    only when it is not; a driver error is a one-line LaunchError naming the launch."""
    from trt_fusedattn.launcher import fast_launch
    launch_module = sys.modules["trt_fusedattn.launcher.launch"]  # (the package's name "launch" is the function)
    if path == "C" and fast_launch.module() is None:
        pytest.skip(f"C launcher not built: {fast_launch.unavailable_reason()}")
    if path == "ctypes":
        monkeypatch.setattr(fast_launch, "module", lambda: None)
    fake = FakeDriver([ctypes.c_uint64] * 2 + [ctypes.c_int32] * 3 + [ctypes.c_uint64])
    monkeypatch.setattr(launch_module, "_libcuda", lambda: fake)
    monkeypatch.setattr(launch_module, "_load_function", lambda *key: (None, 0x5000, [1 << 20]))
    monkeypatch.setattr(launch_module, "primary_context", lambda device: 0x77)
    monkeypatch.setattr(launch_module, "driver", lambda: types.SimpleNamespace(CUresult=int))  # error text only
    monkeypatch.setattr(launch_module, "_error_text", lambda drv, err: f"CUDA error {err}")
    monkeypatch.setattr(launch_module, "current_context", lambda device: contextlib.nullcontext(
        fake.calls.append(("current_context", device))))
    plan = LaunchPlan("k.cu", "k", {}, (3, 2), (128,), 4096, (7, -3, 2 ** 31 - 1))
    prepared = launch_module.PreparedLaunch(plan, "sm_90a", 2, 1)
    prepared.launch_pointers([0xA000, 0xB000, 0xC000], 0x99)
    assert fake.launches == [(0x5000, (3, 2, 1), (128, 1, 1), 4096, 0x99, [0xA000, 0xB000, 7, -3, 2 ** 31 - 1, 0xC000])]
    assert fake.calls == [("current_context", 0)]  # the shared-memory opt-in's context, at preparation only
    fake.current = 0x55  # another context is current on this thread
    prepared([0xA010, None, 0xB010], [0xC010], 0x98)
    assert fake.launches[-1][-1] == [0xA010, 0xB010, 7, -3, 2 ** 31 - 1, 0xC010]
    assert fake.calls[1:] == ([("push", 0x77), ("pop",)] if path == "C" else [("current_context", 0)])
    fake.error = 1
    with pytest.raises(LaunchError, match=r"cuLaunchKernel\(k, grid=\(3, 2, 1\), block=\(128, 1, 1\), "
                                          r"shared=4096\) failed: CUDA error 1"):
        prepared.launch_pointers([0xA020, 0xB020, 0xC020], 0)


def test_mixed_devices_rejected():
    make = lambda dev: arr.DeviceArray(0x1000, (2,), (1,), "float16", dev, "torch")  # noqa: E731
    assert arr.same_device([make(1), None, make(1)]) == 1
    with pytest.raises(ArrayError, match="q is on cuda:0 but v on cuda:1"):
        arr.same_device([make(0), make(0), make(1)], ["q", "k", "v"])


def test_stream_handles():
    class TorchLike:
        cuda_stream = 11

    class CupyLike:
        ptr = 12

    class Protocol:
        def __cuda_stream__(self):
            return (0, 13)

    assert [arr.stream_handle(s) for s in (10, TorchLike(), CupyLike(), Protocol())] == [10, 11, 12, 13]
    ref = arr.DeviceArray(0x1000, (2,), (1,), "float16", 0, "numba")
    assert arr.caller_stream(ref) == 0 and arr.caller_stream(ref, TorchLike()) == 11
    with pytest.raises(ArrayError, match="is not a CUDA stream"):
        arr.stream_handle("fast")


def test_kernel_arguments_follow_the_aot_abi():
    x = arr.DeviceArray(0xA000, (2,), (1,), "float16", 0, "torch")
    args = kernel_arguments([x, None, 0xB000], [7, np.int64(-3)], [0xC000])
    assert [type(a) for a in args] == [ctypes.c_uint64] * 2 + [ctypes.c_int32] * 2 + [ctypes.c_uint64]
    assert [a.value for a in args] == [0xA000, 0xB000, 7, -3, 0xC000]
    with pytest.raises(LaunchError, match="scalar 0 = 2147483648 does not fit"):
        kernel_arguments([], [2 ** 31], [])


def test_launch_needs_int_plans(tmp_path):
    class Symbolic:  # stands in for a TensorRT shape expression reaching the direct launcher by mistake
        pass

    plan = LaunchPlan(tmp_path / "k.cu", "k", {}, (Symbolic(), 1, 1), (128, 1, 1), 0, ())
    with pytest.raises(LaunchError, match="grid\\[0\\] is .*needs plain ints"):
        launch(plan, "sm_90a", [], [])


# ---------------------------------------------------------------- GPU: real launches

def _axpb_plan(source, n, dtype="float", shared=0, block=128):
    return LaunchPlan(source, "axpb", _defines(a=1.5, dtype=dtype, shared=shared),
                      ((n + block - 1) // block, 1, 1), (block, 1, 1), shared, (n,))


@pytest.mark.gpu
@pytest.mark.parametrize("n,shared", [(1000, 0), (4099, 80 * 1024)])
def test_launch_torch_on_side_stream(kernel_dir, n, shared):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    x = torch.randn(n, device="cuda", dtype=torch.float16)
    y = torch.full((n,), float("nan"), device="cuda", dtype=torch.float16)  # poisoned
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        xa, ya = arr.device_array(x, "x"), arr.device_array(y, "y")
        stream = arr.caller_stream(xa)
        assert stream == side.cuda_stream
        launch(_axpb_plan(kernel_dir / "axpb.cu", n, "__half", shared), None, [xa], [ya], stream=stream,
                   device=xa.device)
    side.synchronize()
    expected = (1.5 * x.float() + 0.5).half()
    torch.testing.assert_close(y, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_launch_cupy_with_explicit_stream_and_allocated_output(kernel_dir):
    cupy = pytest.importorskip("cupy")
    n = 777
    x = cupy.asarray(np.random.default_rng().standard_normal(n).astype(np.float32))
    xa = arr.device_array(x, "x")
    ya = arr.empty_like_kind(xa, (n,), "float32", "y")
    assert ya.kind == "cupy" and ya.shape == (n,)
    ya.obj.fill(np.nan)  # poisoned
    cupy.cuda.Device(xa.device).synchronize()  # the non-blocking stream does not wait for the default stream
    stream = cupy.cuda.Stream(non_blocking=True)
    launch(_axpb_plan(kernel_dir / "axpb.cu", n), device_arch(xa.device), [xa], [ya],
               stream=arr.stream_handle(stream), device=xa.device)
    stream.synchronize()
    # atol too: nvcc contracts a*x+b into one FMA, so results near 0 differ from numpy's two roundings by ~1 ulp of 1.
    np.testing.assert_allclose(cupy.asnumpy(ya.obj), 1.5 * cupy.asnumpy(x) + 0.5, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_device_arch_and_errors_on_device():
    arch = device_arch(0)
    assert arch.startswith("sm_") and (arch.endswith("a") or int(arch[3:]) < 90)
    with pytest.raises(LaunchError, match="no CUDA device 99"):
        device_arch(99)
