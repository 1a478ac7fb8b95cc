"""Per-process temp roots for browsers, so no temporary file outlives its process.

Every temporary file of a process's browsers (Playwright's profile and artifact dirs, Chromium's own temp files,
downloads) lives under one root named after the process, `jxb-<pid>-<start time>-*` (short: Chromium's singleton
socket goes in `<root>/org.chromium.Chromium.XXXXXX/SingletonSocket`, and a Unix socket path has at most 107
bytes, so a root that would be too long goes in /tmp instead of $TMPDIR). The browser
module removes it when its driver stops or the process exits; a process killed outright (a pool SIGKILLs a crashed
or hung worker) cannot, so the next process that starts a browser, and every pool that kills or closes workers,
sweeps the roots of processes that no longer run. The start time in the name tells a reused pid apart.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import psutil

PREFIX = "jxb-"
_MAX_ROOT = 107 - len("/org.chromium.Chromium.XXXXXX/SingletonSocket") - 1


def _process_tag(pid: int) -> str | None:
  try:
    process = psutil.Process(pid)
    if process.status() == psutil.STATUS_ZOMBIE:
      return None
    return f"{pid}-{int(process.create_time())}"
  except psutil.NoSuchProcess:
    return None


def _dirs() -> list[str]:
  return list(dict.fromkeys([tempfile.gettempdir(), "/tmp"]))


def make_root() -> str:
  """A new temp root for this process, in $TMPDIR if its path is short enough for Chromium, else in /tmp."""
  prefix = f"{PREFIX}{_process_tag(os.getpid())}-"
  parent = next((d for d in _dirs() if len(os.path.join(d, prefix)) + 8 <= _MAX_ROOT and os.path.isdir(d)), None)
  if parent is None:
    raise OSError(f"no temp directory short enough for Chromium's socket path: $TMPDIR={tempfile.gettempdir()!r}; "
                  "set TMPDIR to a path of at most 40 characters")
  return tempfile.mkdtemp(prefix=prefix, dir=parent)


def sweep_stale(tmp_dir: str | None = None) -> list[str]:
  """Removes the temp roots of processes that no longer run (zombies included); returns their paths."""
  removed = []
  for entry in (e for d in ([tmp_dir] if tmp_dir else _dirs()) if os.path.isdir(d) for e in os.scandir(d)):
    if not entry.name.startswith(PREFIX):
      continue
    pid = entry.name[len(PREFIX):].split("-", 1)[0]
    if not pid.isdigit():
      continue
    tag = _process_tag(int(pid))
    if tag is None or not entry.name.startswith(f"{PREFIX}{tag}-"):  # gone, or the pid is another process's now
      shutil.rmtree(entry.path, ignore_errors=True)
      removed.append(entry.path)
  return removed
