"""`host_memory.keep_freed_memory`: a large allocation comes from the heap, not a mapping of its own, once set; a
user's own allocator settings are kept. Each case in a fresh interpreter, whose allocator nothing else has set."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")

# Bytes glibc holds in mappings of their own (mallinfo2's hblkhd) before and while 64 MiB are allocated.
_PROBE = """
import ctypes, sys
from jaxagent import host_memory
kept = host_memory.keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
  _fields_ = [(name, ctypes.c_size_t) for name in
              ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
               "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
before = libc.mallinfo2().hblkhd
block = libc.malloc(64 << 20)
print(kept, libc.mallinfo2().hblkhd - before)
"""


def _probe(mode: str, **env) -> tuple[str, int]:
  environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
  out = subprocess.run([sys.executable, "-c", _PROBE, mode], env={**environ, **env}, capture_output=True, text=True,
                       check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout.split()
  return out[0], int(out[1])


def test_large_allocations_come_from_the_heap_once_set():
  kept, mapped = _probe("glibc")
  assert kept == "None" and mapped >= 64 << 20  # glibc's default: a mapping of its own, unmapped when freed
  assert _probe("keep") == ("True", 0)  # no mapping: the heap, kept when freed


def test_a_users_own_allocator_setting_is_kept():
  kept, mapped = _probe("keep", MALLOC_MMAP_THRESHOLD_=str(1 << 20))
  assert kept == "False" and mapped >= 64 << 20
