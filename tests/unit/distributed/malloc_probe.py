"""Ask glibc how it serves a block now: with mmap (returned to the OS at its free) or from its heap.
mallinfo2's hblkhd counts the bytes held in mmapped blocks (glibc >= 2.33)."""

from __future__ import annotations

import ctypes

_FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS.split()]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype, libc.malloc.restype = _Mallinfo2, ctypes.c_void_p
    libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
    return libc


def has_mallinfo2() -> bool:
    return hasattr(ctypes.CDLL(None), "mallinfo2")


def mmapped(size: int) -> bool:
    """Whether glibc serves a block of `size` bytes with mmap now (its mmapped bytes grow while it lives)."""
    libc = _libc()
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(size)
    grew = libc.mallinfo2().hblkhd > before
    libc.free(block)
    return bool(grew)


def free_a_block(size: int) -> None:
    """malloc and free `size` bytes: where glibc's threshold is dynamic, it rises to `size` here."""
    libc = _libc()
    libc.free(libc.malloc(size))
