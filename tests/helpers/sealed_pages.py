"""A loaded library whose read-only pages can never be made writable again, as a sealing loader, a seccomp policy or
PaX MPROTECT leave it: for the accelerator claim's tests (test_torch_builds.py), in a process of their own -- nothing
here can be undone in the process that does it.

Two ways, each refused with the reason where this machine does not allow it:
* `seal`: the mseal system call (Linux 6.10 and later) on each of the library's read-only mappings: mprotect on them
  then fails with EPERM, for everyone;
* `forbid_making_writable`: a seccomp filter (no new privileges, no root needed) that answers EPERM to mprotect and
  pkey_mprotect asking for PROT_WRITE on an address inside the library's mappings, and lets every other call through.

`make_writable_errno` tries what the claim did before the per-object virtual table (mprotect the page holding a
virtual table read-write): 0 where that works (and the page is read-only again after), else the errno.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import shutil
import struct
import subprocess

PROT_READ, PROT_WRITE = 1, 2
MSEAL_X86_64 = 462  # the syscall's number on x86_64 (include/uapi/asm-generic/unistd.h gives 462 to every arch)
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
PAGE = os.sysconf("SC_PAGE_SIZE")


class Unavailable(RuntimeError):
    """This machine cannot make pages unchangeable this way (the reason is the message)."""


def mappings(path: str) -> list[tuple[int, int, str]]:
    """(start, end, permissions) of every mapping of the file `path` in this process, from /proc/self/maps."""
    real = os.path.realpath(path)
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and os.path.realpath(fields[5].strip()) == real:
                start, end = (int(part, 16) for part in fields[0].split("-"))
                found.append((start, end, fields[1]))
    if not found:
        raise ValueError(f"{path} is not mapped in this process")
    return found


def read_only_ranges(path: str) -> list[tuple[int, int]]:
    return [(start, end) for start, end, perms in mappings(path) if perms.startswith("r--")]


def _x86_64() -> None:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise Unavailable(f"written for Linux on x86_64, this is {platform.system()} on {platform.machine()}")


def seal(path: str) -> int:
    """mseal every read-only mapping of `path`; returns how many. Unavailable where the kernel has no mseal."""
    _x86_64()
    probe = _LIBC.mmap(None, PAGE, PROT_READ, 0x22, -1, 0)  # MAP_PRIVATE | MAP_ANONYMOUS
    if _LIBC.syscall(MSEAL_X86_64, ctypes.c_void_p(probe), ctypes.c_size_t(PAGE), ctypes.c_ulong(0)) != 0:
        code = ctypes.get_errno()
        raise Unavailable(f"mseal: {os.strerror(code)} (kernel {platform.release()}; mseal is Linux 6.10 and later)")
    ranges = read_only_ranges(path)
    for start, end in ranges:
        if _LIBC.syscall(MSEAL_X86_64, ctypes.c_void_p(start), ctypes.c_size_t(end - start), ctypes.c_ulong(0)) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"mseal {start:#x}-{end:#x} of {path}: {os.strerror(code)}")
    return len(ranges)


# Classic BPF, as seccomp runs it (linux/filter.h, linux/seccomp.h, linux/audit.h).
_LD_W_ABS, _JEQ_K, _JGE_K, _JGT_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x25, 0x45, 0x06
_AUDIT_ARCH_X86_64 = 0xC000003E
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_NR_MPROTECT, _NR_PKEY_MPROTECT, _NR_SECCOMP = 10, 329, 317
_PR_SET_NO_NEW_PRIVS, _SECCOMP_SET_MODE_FILTER = 38, 1
# struct seccomp_data: nr (4 bytes), arch (4), instruction_pointer (8), args[6] (8 each, little-endian halves)
_NR, _ARCH, _ARG0_LOW, _ARG0_HIGH, _ARG2_LOW = 0, 4, 16, 20, 32


def _program(low: int, high: int) -> list[tuple[int, int, int, int]]:
    """mprotect / pkey_mprotect with PROT_WRITE and low <= address < high: EPERM; everything else: allowed.

    Written as (label,) marks, (load offset), (jump op, k, label if true, label if false); assembled to BPF below."""
    low_high, low_low, high_high, high_low = low >> 32, low & 0xFFFFFFFF, high >> 32, high & 0xFFFFFFFF
    steps: list[tuple] = [
        ("load", _ARCH), (_JEQ_K, _AUDIT_ARCH_X86_64, "nr", "allow"),
        ("nr",), ("load", _NR), (_JEQ_K, _NR_MPROTECT, "prot", "pkey"),
        ("pkey",), (_JEQ_K, _NR_PKEY_MPROTECT, "prot", "allow"),
        ("prot",), ("load", _ARG2_LOW), (_JSET_K, PROT_WRITE, "above_low", "allow"),
        # address >= low, 64 bits compared as two halves
        ("above_low",), ("load", _ARG0_HIGH), (_JGT_K, low_high, "below_high", "low_same"),
        ("low_same",), (_JEQ_K, low_high, "low_half", "allow"),
        ("low_half",), ("load", _ARG0_LOW), (_JGE_K, low_low, "below_high", "allow"),
        # address < high
        ("below_high",), ("load", _ARG0_HIGH), (_JGT_K, high_high, "allow", "high_same"),
        ("high_same",), (_JEQ_K, high_high, "high_half", "deny"),
        ("high_half",), ("load", _ARG0_LOW), (_JGE_K, high_low, "allow", "deny"),
        ("allow",), ("return", _SECCOMP_RET_ALLOW),
        ("deny",), ("return", _SECCOMP_RET_ERRNO | errno.EPERM),
    ]
    labels: dict[str, int] = {}
    for step in steps:
        if len(step) == 1:
            labels[step[0]] = len([s for s in steps[: steps.index(step)] if len(s) > 1])
    code = []
    for step in (s for s in steps if len(s) > 1):
        here = len(code)
        if step[0] == "load":
            code.append((_LD_W_ABS, 0, 0, step[1]))
        elif step[0] == "return":
            code.append((_RET_K, 0, 0, step[1]))
        else:
            op, k, if_true, if_false = step
            code.append((op, labels[if_true] - here - 1, labels[if_false] - here - 1, k))
    return code


def forbid_making_writable(path: str) -> tuple[int, int]:
    """Install the seccomp filter for the address span of `path`'s mappings; returns that span."""
    _x86_64()
    spans = mappings(path)
    low, high = min(start for start, _, _ in spans), max(end for _, end, _ in spans)
    code = _program(low, high)
    filters = b"".join(struct.pack("<HBBI", *instruction) for instruction in code)  # struct sock_filter
    buffer = ctypes.create_string_buffer(filters, len(filters))

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = _Program(len(code), ctypes.cast(buffer, ctypes.c_void_p))
    if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise Unavailable(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    if _LIBC.syscall(_NR_SECCOMP, _SECCOMP_SET_MODE_FILTER, 0, ctypes.byref(program)) != 0:
        raise Unavailable(f"seccomp(SECCOMP_SET_MODE_FILTER): {os.strerror(ctypes.get_errno())}")
    return low, high


def make_writable_errno(address: int) -> int:
    """mprotect the page holding `address` read-write, as the claim did before: 0 if allowed (and its protection put
    back after), else the errno."""
    page = address & ~(PAGE - 1)
    protection = _protection(page)
    if _LIBC.mprotect(ctypes.c_void_p(page), PAGE, PROT_READ | PROT_WRITE) != 0:
        return ctypes.get_errno()
    _LIBC.mprotect(ctypes.c_void_p(page), PAGE, protection)
    return 0


def _protection(address: int) -> int:
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(part, 16) for part in span.split("-"))
            if start <= address < end:
                return (PROT_READ if perms[0] == "r" else 0) | (PROT_WRITE if perms[1] == "w" else 0) | (
                    4 if perms[2] == "x" else 0)
    raise ValueError(f"{address:#x} is not mapped")


def symbol_address(path: str, name: str) -> tuple[int, int]:
    """(address in this process, size) of a symbol of the loaded library `path`, local ones too (from `nm`, which
    comes with the compiler the emulated device is built with)."""
    nm = shutil.which("nm")
    if nm is None:
        raise Unavailable("nm (binutils) is not installed")
    listing = subprocess.run([nm, "-S", path], capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[3] == name:
            value, size = int(fields[0], 16), int(fields[1], 16)
            base = min(start for start, _, _ in mappings(path))  # a shared object's first segment is at vaddr 0
            return base + value, size
    raise ValueError(f"{name} is not in {path}'s symbol table")
