"""The CUDA driver's virtual-memory calls as vLLM's CuMemAllocator makes them (cuMemCreate,
cuMemMap, cuMemSetAccess; csrc/cumem_allocator.cpp), through ctypes on libcuda, so that a
torch-only bench can copy into memory mapped anew, as a wake does, without vLLM. The
context is torch's: call torch.cuda.init() first."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", AllocFlags),
    ]


class AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


@dataclass
class Driver:
    """libcuda's calls used here, each raising RuntimeError with the call's name and code."""

    device: int = 0

    def __post_init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.prop = AllocationProp(type=PINNED, location=Location(ON_DEVICE, self.device))
        self.access = AccessDesc(location=Location(ON_DEVICE, self.device), flags=READ_WRITE)
        granularity = ctypes.c_size_t()
        self.call(
            "cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(self.prop), 0
        )
        self.granularity = granularity.value

    def call(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise RuntimeError(f"{name} returned CUresult {code}")

    def rounded(self, size: int) -> int:
        return -(-size // self.granularity) * self.granularity

    def reserve(self, size: int) -> int:
        """A virtual range of ``size`` bytes (rounded), nothing mapped."""
        ptr = ctypes.c_ulonglong()
        self.call(
            "cuMemAddressReserve",
            ctypes.byref(ptr),
            ctypes.c_size_t(self.rounded(size)),
            ctypes.c_size_t(0),
            ctypes.c_ulonglong(0),
            ctypes.c_ulonglong(0),
        )
        return ptr.value

    def create_and_map(self, ptr: int, size: int) -> int:
        """Physical memory for ``size`` bytes at ``ptr`` (as vLLM's create_and_map): its handle."""
        handle, size_t = ctypes.c_ulonglong(), ctypes.c_size_t(self.rounded(size))
        self.call(
            "cuMemCreate",
            ctypes.byref(handle),
            size_t,
            ctypes.byref(self.prop),
            ctypes.c_ulonglong(0),
        )
        self.call(
            "cuMemMap",
            ctypes.c_ulonglong(ptr),
            size_t,
            ctypes.c_size_t(0),
            handle,
            ctypes.c_ulonglong(0),
        )
        self.call(
            "cuMemSetAccess",
            ctypes.c_ulonglong(ptr),
            size_t,
            ctypes.byref(self.access),
            ctypes.c_size_t(1),
        )
        return handle.value

    def unmap_and_release(self, ptr: int, size: int, handle: int) -> None:
        self.call("cuMemUnmap", ctypes.c_ulonglong(ptr), ctypes.c_size_t(self.rounded(size)))
        self.call("cuMemRelease", ctypes.c_ulonglong(handle))

    def copy_to_device(self, dst: int, src: int, size: int) -> None:
        """A synchronous copy from host memory (cuMemcpyHtoD: the arena's cudaMemcpy)."""
        self.call(
            "cuMemcpyHtoD_v2", ctypes.c_ulonglong(dst), ctypes.c_void_p(src), ctypes.c_size_t(size)
        )
