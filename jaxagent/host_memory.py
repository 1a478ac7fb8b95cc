"""The host allocator, set for XLA:CPU's large buffers: freed memory stays in the process for the next step.

glibc serves an allocation over its mmap threshold (at most 32 MiB by default) with a mapping of its own and unmaps
it when freed, so every large buffer XLA:CPU allocates (a step's temporaries, a product's result) is fresh pages,
each faulted in and zeroed by the kernel when first written: on a Zen 4, a bfloat16 product writing a 50 MB result
ran at 270 GFLOP/s where one writing 25 MB, or the same one with the thresholds below, ran at 400
(docs/results/performance.md#freed-memory). Raising the mmap and trim thresholds serves those buffers from
the heap and keeps what they free for the next allocation, as PyTorch's users get from jemalloc or tcmalloc. The
cost: the process keeps its peak host memory instead of returning it between steps.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt(3)'s parameters, and the largest threshold glibc 2.36 accepts for mmap (below HEAP_MAX's half on 64-bit
# is what older versions allow; larger values are refused with 0 and change nothing).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1
# The environment variables glibc reads at start for the same settings: a user's own choice is kept.
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
  """Raises glibc's mmap and trim thresholds for this process (`mallopt`). True when both took; False where the C
  library is not glibc (macOS, musl), where the environment already sets them, or where glibc refused a value:
  nothing changes then."""
  if not sys.platform.startswith("linux") or any(os.environ.get(name) for name in _ENV):
    return False
  try:
    libc = ctypes.CDLL("libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
