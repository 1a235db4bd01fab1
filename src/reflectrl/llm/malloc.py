"""Freed memory back to the operating system: glibc's allocator told to map large blocks apart.

PyTorch's CPU tensors come from malloc. glibc serves a large block from its own mapping (returned
to the system when freed) only above a threshold that it raises as such blocks are freed (up to
32 MB); above that, blocks come from the heap, where a GRPO step's mix of transient sizes (the
generation's logits, the update's checkpointed activations, a chunk's full-vocabulary logits, the
optimizer's state) fragments it: freed memory is kept, and the process grows step after step. On
SmolLM2-135M at 4 prompts x 8 completions x 128 tokens with activation checkpointing, full
fine-tuning, the peak resident memory was 5.17 GB after one step and 6.10 GB after two; with the
threshold held at 64 KB, 2.87 GB and 3.23 GB (this CPU; `bench/llm_vs_trl.py` prints it).
`MALLOC_MMAP_THRESHOLD_=65536` in the environment does the same for any process (TRL's included).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
THRESHOLD = 64 * 1024


def map_large_blocks(threshold: int = THRESHOLD) -> bool:
    """Blocks of `threshold` bytes or more mapped apart (returned when freed), the heap trimmed as it
    frees: True where glibc took it (False on another C library: nothing changes)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(mallopt(M_TRIM_THRESHOLD, threshold))
