"""Where the test suite's time goes: runs `scripts/test.sh` with each test's end time and the machine's busy
share (from `/proc/stat`) sampled once a second, then prints the seconds each pytest-xdist worker spent per
directory and module and how busy the machine was.

    python scripts/suite_profile.py [--log /tmp/suite.log] [-- [--lane LANE] extra pytest args]

LANE: multiprocess, long, multiprocess,long or all (`scripts/test.sh` says what each holds).

A test's seconds are those between its worker's previous report and its own (its module's import and fixtures
included). Linux only (`/proc/stat`).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = re.compile(r"^\[(gw\d+)\] \[\s*\d+%\] \w+ (\S+)")


def cpu_times() -> tuple[int, int]:
  """(all, idle + iowait) jiffies of the whole machine since boot."""
  with open("/proc/stat", encoding="ascii") as f:
    fields = [int(v) for v in f.readline().split()[1:]]
  return sum(fields), fields[3] + fields[4]


def sample_busy(stop: threading.Event, out: list[float]) -> None:
  total, idle = cpu_times()
  while not stop.wait(1.0):
    t, i = cpu_times()
    out.append(1.0 - (i - idle) / max(t - total, 1))
    total, idle = t, i


def worker_seconds(reports: list[tuple[float, str, str]]) -> collections.Counter:
  """{test node id: seconds} from (time, worker, node id) reports."""
  last, seconds = {}, collections.Counter()
  for t, worker, nodeid in reports:
    seconds[nodeid] += t - last.get(worker, 0.0)
    last[worker] = t
  return seconds


def main() -> int:
  argv = sys.argv[1:]
  ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--log", default="", help="also write the suite's output here")
  parser.add_argument("--top", type=int, default=20, help="modules listed")
  flags = parser.parse_args(ours)
  busy, stop = [], threading.Event()
  sampler = threading.Thread(target=sample_busy, args=(stop, busy), daemon=True)
  sampler.start()
  start = time.monotonic()
  proc = subprocess.Popen(["bash", "scripts/test.sh", *extra, "-v", "-v"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  reports, log = [], open(flags.log, "w", encoding="utf-8") if flags.log else None
  for line in proc.stdout:
    t = time.monotonic() - start
    if log:
      log.write(f"{t:8.1f} {line}")
    if (m := REPORT.match(line)):
      reports.append((t, m.group(1), m.group(2)))
    elif not line.startswith(("tests/", "[gw")):
      sys.stdout.write(line)
  code = proc.wait()
  if log:
    log.close()
  wall = time.monotonic() - start
  stop.set()
  sampler.join()
  seconds = worker_seconds(reports)
  modules, dirs = collections.Counter(), collections.Counter()
  for nodeid, s in seconds.items():
    module = nodeid.split("::")[0]
    modules[module] += s
    dirs[os.path.dirname(module)] += s
  print(f"\nwall {wall:.0f} s; worker-seconds {sum(seconds.values()):.0f}; machine busy "
        f"{sum(busy) / max(len(busy), 1):.1%} on average over {len(busy)} one-second samples")
  for title, counts, n in (("directory", dirs, len(dirs)), ("module", modules, flags.top)):
    print(f"\nworker-seconds by {title}:")
    for name, s in counts.most_common(n):
      print(f"  {s:7.1f}  {name}")
  return code


if __name__ == "__main__":
  sys.exit(main())
