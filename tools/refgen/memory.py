"""Freed memory back to the system between the reference runner's stages.

A tensor freed by Python goes back to glibc's allocator, which keeps large freed blocks in its
arenas: without a trim, every stage of make_reference (forwards, traces, the envelope's
variations) would count the previous stages' garbage in its RSS.
"""

import ctypes
import gc


def return_freed_memory():
    """gc, then glibc's malloc_trim(0) where there is one (elsewhere gc alone)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
