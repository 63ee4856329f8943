"""The reference runner's memory: a heap that gives freed tensors back, freed memory back to the
system between stages, and float64 reductions of large tensors without a float64 copy of them.

glibc serves an allocation from its heap below M_MMAP_THRESHOLD and from its own mapping above
it, and raises the threshold (up to 32 MiB) each time a mapped block is freed. A backward's
activations (a few MiB each for a 0.5B model) then land on the heap, where what is freed stays
in the process between steps as holes the next step's differently sized tensors do not fit:
measured on the reference runner's fp32 trace of a 1.98 GB checkpoint, 5.41 GiB peak with
glibc's default, 5.21 GiB with a fixed 16 MiB threshold and 4.18 GiB with 1 MiB, in the same
time (43.9 s against 45.8 s). bound_heap fixes it at 1 MiB (a fixed value also stops glibc's
raising it).

A tensor freed by Python goes back to glibc's allocator, which keeps large freed blocks in its
arenas: without a trim, every stage of make_reference (forwards, traces, the envelope's
variations) would count the previous stages' garbage in its RSS.

The envelope's gradient spreads are float64 reductions; `t.double().norm()` of a tied
embedding's gradient (0.5 GB in fp32 for a 150k-word vocabulary) would make a 1 GB copy at the
moment the backward holds the most. float64_norm_and_sum reduces a slice at a time instead. (The
bundle's own step-1 figures keep whole-tensor reductions: the training gate compares them bit
for bit with its own, and a slice-wise sum differs in the last bits.)
"""

import ctypes
import gc
import math

import torch

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 1 << 20


def bound_heap(threshold=MMAP_THRESHOLD_BYTES):
    """Fixes glibc's mmap threshold at `threshold` bytes for this process (see the module
    docstring): allocations from it up are mapped and returned to the system when freed.
    Returns False where there is no glibc mallopt (the process keeps its allocator's default)."""
    try:
        return ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, int(threshold)) == 1
    except (OSError, AttributeError):
        return False


# Elements per slice of a float64 reduction: 4 Mi (32 MiB of float64).
REDUCTION_SLICE_ELEMENTS = 1 << 22


def return_freed_memory():
    """gc, then glibc's malloc_trim(0) where there is one (elsewhere gc alone)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def float64_norm_and_sum(t, slice_elements=REDUCTION_SLICE_ELEMENTS):
    """(L2 norm, sum) of tensor t as Python floats, each element converted to float64 and the
    squares and values summed in float64, one slice of the flattened tensor at a time (the
    slices' partial sums added in order). Equal to t.double().norm() and .sum() up to float64
    rounding (relative 1e-15), far below any bar these figures meet."""
    flat = t.detach().reshape(-1)
    squares, total = 0.0, 0.0
    for lo in range(0, flat.numel(), slice_elements):
        part = flat[lo:lo + slice_elements].double()
        squares += part.square().sum().item()
        total += part.sum().item()
    return math.sqrt(squares), total
