"""Launch a LaunchPlan's kernel on the caller's stream through the CUDA driver API (cuda-python), as TensorRT would.

    arch = device_arch(device)                           # "sm_90a" on H100/H200, "sm_80", "sm_86", "sm_89", ...
    plan = plan_attention(shapes, dtypes, attrs, arch)   # ints only here
    launch(plan, arch, [q.ptr, k.ptr, v.ptr], [o.ptr], stream=handle, device=q.device)

The kernel's arguments are the input pointers (None entries, i.e. missing optional inputs, are dropped), then the
plan's scalars as int32, then the output pointers: TensorRT's AOT plugin ABI. The device's primary context (the
one torch and CuPy use) is made current for the launch. Compiled PTX is loaded once per (source, arch, defines,
device) in this process: a source edited while the process runs is not reloaded.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

from trt_fusedattn.launcher import fast_launch
from trt_fusedattn.launcher.compile import compile_ptx
from trt_fusedattn.launcher.plan import LaunchPlan

DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory above this needs the opt-in attribute
_INT32 = (-(2 ** 31), 2 ** 31 - 1)


class LaunchError(RuntimeError):
    """No usable GPU/driver/cuda-python, or a driver call failed; the message names the call and the error."""


@functools.lru_cache(maxsize=None)
def driver():
    """cuda-python's driver module (``cuda.bindings.driver``, or ``cuda.cuda`` before cuda-bindings 12.6), initialised."""
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        try:
            from cuda import cuda as drv
        except ImportError:
            raise LaunchError("cuda-python is not installed: pip install 'cuda-bindings>=12.6' "
                              "(or trt_fusedattn[gpu])") from None
    try:
        (err,) = drv.cuInit(0)
    except Exception as exc:  # the driver library itself is missing (cuda.pathfinder raises)
        raise LaunchError(f"no NVIDIA driver found ({type(exc).__name__}); install the NVIDIA driver and run on a "
                          "machine with a GPU") from None
    if err != drv.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"cuInit failed: {_error_text(drv, err)}; is an NVIDIA GPU visible "
                          "(CUDA_VISIBLE_DEVICES, driver loaded)?")
    return drv


def _error_text(drv, err) -> str:
    name = drv.cuGetErrorName(err)[1]
    desc = drv.cuGetErrorString(err)[1]
    decode = lambda b: b.decode() if isinstance(b, bytes) else str(b)  # noqa: E731
    return f"{decode(name)} ({decode(desc)})"


def check(result, what: str):
    """Unpack a cuda-python result tuple ``(CUresult, *values)``; raise LaunchError naming ``what`` on failure."""
    drv = driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"{what} failed: {_error_text(drv, err)}")
    return values[0] if len(values) == 1 else tuple(values) or None


def device_count() -> int:
    return check(driver().cuDeviceGetCount(), "cuDeviceGetCount")


@functools.lru_cache(maxsize=None)
def _device(ordinal: int):
    count = device_count()
    if not 0 <= ordinal < count:
        raise LaunchError(f"no CUDA device {ordinal}: this machine has {count}")
    return check(driver().cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")


def device_attribute(ordinal: int, name: str) -> int:
    """``cuDeviceGetAttribute`` by short name, e.g. ``MAX_SHARED_MEMORY_PER_BLOCK_OPTIN``."""
    drv = driver()
    attr = getattr(drv.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return check(drv.cuDeviceGetAttribute(attr, _device(ordinal)), f"cuDeviceGetAttribute({name})")


@functools.lru_cache(maxsize=None)
def device_arch(ordinal: int = 0) -> str:
    """The arch our kernels are compiled for on this device: ``sm_80``, ``sm_86``, ``sm_89``, ``sm_90a``, ...
    (arch-specific ``a`` from Hopper on, since wgmma/tcgen05 need it)."""
    major = device_attribute(ordinal, "COMPUTE_CAPABILITY_MAJOR")
    minor = device_attribute(ordinal, "COMPUTE_CAPABILITY_MINOR")
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


@functools.lru_cache(maxsize=None)
def primary_context(ordinal: int):
    """The device's primary context, retained for the life of the process (shared with torch, CuPy, the runtime)."""
    return check(driver().cuDevicePrimaryCtxRetain(_device(ordinal)), f"cuDevicePrimaryCtxRetain({ordinal})")


@contextlib.contextmanager
def current_context(ordinal: int):
    """Make device ``ordinal``'s primary context current for the block, restoring the caller's afterwards."""
    drv = driver()
    ctx = primary_context(ordinal)
    current = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is not None and int(current) == int(ctx):
        yield ctx
        return
    check(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        yield ctx
    finally:
        check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")


def pointer_device(ptr: int) -> int:
    """The ordinal of the device that owns device pointer ``ptr``; 0 when no driver can be asked."""
    try:
        drv = driver()
    except LaunchError:
        return 0
    attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    err, ordinal = drv.cuPointerGetAttribute(attr, ptr)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"0x{ptr:x} is not a CUDA device pointer ({_error_text(drv, err)}); "
                          "pass a CUDA device array")
    return int(ordinal)


@functools.lru_cache(maxsize=None)
def _load_function(source: str, arch: str, defines: tuple, kernel: str, ordinal: int):
    """(module, function, shared memory opt-in set so far) for one specialization on one device."""
    drv = driver()
    ptx = compile_ptx(source, arch, dict(defines))
    with current_context(ordinal):
        image = ctypes.create_string_buffer(ptx.encode())  # NUL-terminated, alive during the call
        try:
            module = check(drv.cuModuleLoadData(ctypes.addressof(image)),
                           f"cuModuleLoadData({source.rsplit('/', 1)[-1]}, {arch}) on device {ordinal} "
                           f"({device_arch(ordinal)})")
        except LaunchError as exc:
            if "UNSUPPORTED_PTX_VERSION" in str(exc):
                raise LaunchError(f"{exc}; the NVIDIA driver is older than nvcc: update the driver or point "
                                  "CUDA_HOME at a CUDA toolkit no newer than the driver") from None
            raise
        function = check(drv.cuModuleGetFunction(module, kernel.encode()),
                         f"cuModuleGetFunction({kernel!r}): is it declared extern \"C\" __global__?")
    return module, function, [DEFAULT_SHARED_LIMIT]


def precompile(plans: Iterable[LaunchPlan], arch: str | None = None, *, device: int = 0, workers: int = 12) -> None:
    """Compile (cached) and load every plan's kernel on ``device`` now, in parallel threads (nvcc and the driver's
    PTX JIT are single-threaded), so that tests and benchmarks time no compile and dozens of specializations load
    in seconds rather than one by one at their first launch. ``arch`` None means the device's."""
    arch = arch or device_arch(device)
    kernels = {(str(p.source), tuple(sorted(p.defines.items())), p.kernel) for p in plans}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda k: _load_function(k[0], arch, k[1], k[2], device), kernels))


@functools.lru_cache(maxsize=None)
def _libcuda():
    """The driver library through ctypes: the entry points of a repeated launch for the C launcher, or the two calls
    themselves where it cannot be built (cuCtxGetCurrent, cuLaunchKernel: about 1 us each there against several
    through cuda-python's wrappers). No argtypes: the callers pass every argument as the C type it is already
    (ctypes pointers, ints of 32 bits), which saves argtypes' conversions (~1 us a launch on this project's CPUs;
    NOTES.md "Host overhead")."""
    driver()  # initialised, with cuda-python's error if there is no driver
    lib = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    lib.cuCtxGetCurrent.restype = lib.cuLaunchKernel.restype = ctypes.c_int
    return lib


def _as_int(value, what: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise LaunchError(f"{what} is {value!r}: the direct launcher needs plain ints (plan made with int shapes)")
    return int(value)


def _allow_shared_memory(function, opted_in: list, shared: int, ordinal: int):
    if shared <= opted_in[0]:
        return
    limit = device_attribute(ordinal, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
    if shared > limit:
        raise LaunchError(f"kernel wants {shared} bytes of shared memory; device {ordinal} allows {limit}")
    drv = driver()
    check(drv.cuFuncSetAttribute(function, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 shared), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
    opted_in[0] = shared


def kernel_arguments(pointers_in: Sequence, scalars: Sequence, pointers_out: Sequence) -> list:
    """ctypes values in the AOT ABI order: input pointers (None dropped), int32 scalars, output pointers."""
    args = [ctypes.c_uint64(int(getattr(p, "ptr", p))) for p in pointers_in if p is not None]
    for i, s in enumerate(scalars):
        value = _as_int(s, f"scalar {i}")
        if not _INT32[0] <= value <= _INT32[1]:
            raise LaunchError(f"scalar {i} = {value} does not fit the kernel's int32 argument")
        args.append(ctypes.c_int32(value))
    return args + [ctypes.c_uint64(int(getattr(p, "ptr", p))) for p in pointers_out]


class PreparedLaunch:
    """One plan's kernel, loaded on one device, with its grid, block, shared memory and int32 scalars converted once:
    a call fills in only the pointers and launches. The direct API keeps one per shape, so a repeated call costs a
    few microseconds of Python instead of a plan and argument conversion (issue 10: <= 15 us per call)."""

    def __init__(self, plan: LaunchPlan, arch: str | None, n_inputs: int, n_outputs: int, *, device: int = 0):
        arch = arch or device_arch(device)
        grid = tuple(_as_int(g, f"grid[{i}]") for i, g in enumerate(plan.grid))
        block = tuple(_as_int(b, f"block[{i}]") for i, b in enumerate(plan.block))
        self.grid, self.block = (grid + (1, 1))[:3], (block + (1, 1))[:3]
        self.shared = _as_int(plan.shared_mem, "shared_mem")
        self.device, self.kernel = device, plan.kernel
        self.n_inputs, self.n_outputs = n_inputs, n_outputs
        # one array of pointer slots (inputs, then outputs), filled by one slice assignment per launch
        self._pointers = (ctypes.c_uint64 * (n_inputs + n_outputs))()
        self._scalars = kernel_arguments((), plan.scalars, ())  # alive as long as params
        slot = ctypes.addressof(self._pointers)
        addresses = ([slot + 8 * i for i in range(n_inputs)] + [ctypes.addressof(a) for a in self._scalars]
                     + [slot + 8 * (n_inputs + i) for i in range(n_outputs)])
        self.params = (ctypes.c_void_p * len(addresses))(*addresses)
        self.function = None
        self._launch_now = lambda stream, pointers: 0  # an empty grid launches nothing (and needs no module)
        if 0 not in self.grid:
            _, self.function, opted_in = _load_function(str(plan.source), arch, tuple(sorted(plan.defines.items())),
                                                        plan.kernel, device)
            with current_context(device):
                _allow_shared_memory(self.function, opted_in, self.shared, device)
            lib, context = _libcuda(), int(primary_context(device))
            fast = fast_launch.module()
            if fast is not None:  # one C call: the context check, the parameters on its stack, cuLaunchKernel
                self._record = fast_launch.launch_record(lib, int(self.function), context, self.params, self.grid,
                                                         self.block, self.shared, n_inputs, n_outputs)
                self._launch_now = functools.partial(fast.launch, ctypes.addressof(self._record))
            else:
                self._prepare_ctypes_launch(lib, context)

    def _prepare_ctypes_launch(self, lib, context: int) -> None:
        """The launch through ctypes where the C launcher cannot be built: the two driver calls with their
        arguments bound once as the C types they take (no argtypes conversions)."""
        self._context, self._current = context, ctypes.c_void_p()
        self._get_current, self._current_ref = lib.cuCtxGetCurrent, ctypes.byref(self._current)
        # cuLaunchKernel's arguments before the stream (function, grid, block, shared memory); the dimensions fit
        # a C int (CUDA limits them below 2^31)
        self._launch = lib.cuLaunchKernel
        self._head = (ctypes.c_void_p(int(self.function)), *self.grid, *self.block, self.shared)
        self._params = ctypes.c_void_p(ctypes.addressof(self.params))
        self._lock = threading.Lock()  # the pointer slots are shared: fill and launch as one step
        self._launch_now = self._launch_ctypes

    def _launch_ctypes(self, stream: int, pointers: Sequence[int]) -> int:
        with self._lock:
            self._pointers[:] = pointers
            self._get_current(self._current_ref)
            if self._current.value == self._context:
                return self._launch(*self._head, ctypes.c_void_p(stream), self._params, None)
            with current_context(self.device):
                return self._launch(*self._head, ctypes.c_void_p(stream), self._params, None)

    def __call__(self, pointers_in: Sequence, pointers_out: Sequence, stream: int = 0) -> None:
        present = [p for p in pointers_in if p is not None]
        if len(present) != self.n_inputs or len(pointers_out) != self.n_outputs:
            raise LaunchError(f"{self.kernel} was prepared for {self.n_inputs} inputs and {self.n_outputs} "
                              f"outputs, got {len(present)} and {len(pointers_out)}")
        self.launch_pointers([int(getattr(p, "ptr", p)) for p in present + list(pointers_out)], stream)

    def launch_pointers(self, pointers: list, stream: int) -> None:
        """Launch with these pointers (a list of ints: the present inputs, then the outputs, as prepared;
        unchecked) on the raw ``stream``: the direct API's repeated-call path."""
        err = self._launch_now(stream, pointers)
        if err:
            drv = driver()
            raise LaunchError(f"cuLaunchKernel({self.kernel}, grid={self.grid}, block={self.block}, "
                              f"shared={self.shared}) failed: {_error_text(drv, drv.CUresult(err))}")


def launch(plan: LaunchPlan, arch: str | None, pointers_in: Sequence, pointers_out: Sequence, *,
           stream: int = 0, device: int = 0) -> None:
    """Compile (cached), load (once) and launch ``plan``'s kernel on ``stream`` (a raw CUstream handle, 0 for the
    legacy default) of ``device``. Pointers are ints or DeviceArrays; ``arch`` None means the device's. An empty
    grid (a zero-sized dimension) launches nothing. Asynchronous, like any kernel launch."""
    prepared = PreparedLaunch(plan, arch, sum(p is not None for p in pointers_in), len(pointers_out), device=device)
    prepared(pointers_in, pointers_out, stream)
