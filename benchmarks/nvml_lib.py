"""The few NVML calls the benchmarks need (energy counter, SM clock, power), through the driver's libnvidia-ml:
no Python binding required."""
from __future__ import annotations

import ctypes

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
# nvmlClocksEventReasons bits (nvml.h)
NVML_CLOCK_LIMITS = {0x1: "idle", 0x2: "app clocks", 0x4: "power cap", 0x8: "hw slowdown", 0x20: "sw thermal",
                     0x40: "hw thermal", 0x80: "power brake"}


class Nvml:
    """A handle on one GPU's NVML counters."""

    def __init__(self, device: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(device, ctypes.byref(self.handle)), "GetHandleByIndex")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"NVML {what} failed with status {status}: energy, clock and power cannot be read here")

    def energy_mj(self) -> int:
        """Energy the GPU used since the driver loaded, in millijoules."""
        value = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)), "energy")
        return value.value

    def sm_clock_mhz(self) -> int:
        value = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(value)), "clock")
        return value.value

    def power_w(self) -> float:
        value = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(value)), "power")
        return value.value / 1000.0

    def temperature_c(self) -> int:
        value = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetTemperature(self.handle, NVML_TEMPERATURE_GPU, ctypes.byref(value)),
                    "temperature")
        return value.value

    def clock_limits(self) -> int:
        """What holds the clocks below their maximum now: a bitmask of NVML_CLOCK_LIMITS (0: nothing)."""
        value = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle, ctypes.byref(value)),
                    "clock limits")
        return value.value


def clock_limit_names(mask: int) -> str:
    """'power+thermal'-style names of a clock_limits() mask ('-' for none)."""
    return "+".join(name for bit, name in NVML_CLOCK_LIMITS.items() if mask & bit) or "-"
