"""Counts what browser crashes cost: MiniWoB++ episodes through an `EnvPool` while a killer SIGKILLs Chromium.

  python data_tools/fault_probe.py --kills 20 --json /tmp/fault_probe.json

Runs episodes (4 workers, `click-button`, 5 steps each, element 0 clicked every step) until at least `--kills`
SIGKILLs have landed inside an episode (an episode retried because of it), then closes the pool and reports:
episodes lost or duplicated (in the returned list and in the store), episodes errored (retries exhausted),
processes of the pool still alive, and every file or directory left in a fresh $TMPDIR that the run used.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
from typing import Sequence


def _chromium_browsers(pool_lib, marker: str) -> list[int]:
  out = []
  for pid in pool_lib.marked_pids(marker):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    except OSError:
      continue
    if args and os.path.basename(args[0]) in (b"chromium", b"chrome", b"headless_shell") and \
        not any(a.startswith(b"--type=") for a in args):
      out.append(pid)
  return out


def probe(kills_wanted: int, workers: int, batch: int, seed: int) -> dict:
  from jaxagent import types
  from jaxagent.data.store import TrajectoryStore
  from jaxagent.envs import miniwob
  from jaxagent.envs import pool as pool_lib
  from jaxagent.rl.collector import collect

  class ClickFirst:
    def act(self, observations, histories):
      return ["click 0"] * len(observations)

  def parse(text):
    return types.Action(types.ActionKind.CLICK, element=0)

  rng = random.Random(seed)
  out_dir = tempfile.mkdtemp(prefix="fault-probe-store-")
  store = TrajectoryStore(out_dir)
  trajs, tasks, kills = [], [], []
  with pool_lib.EnvPool({"kind": "miniwob"}, num_workers=workers, step_timeout=8, reset_timeout=30,
                        max_retries=2) as pool:
    marker = pool.marker
    stop = threading.Event()

    def killer():
      while not stop.wait(rng.uniform(1.5, 3.0)):
        browsers = [pid for pid in _chromium_browsers(pool_lib, marker) if pid not in kills]
        if browsers:
          victim = rng.choice(browsers)
          try:
            os.kill(victim, signal.SIGKILL)
            kills.append(victim)
          except ProcessLookupError:
            pass

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
      while sum(t.attempts > 1 for t in trajs) < kills_wanted:
        chunk = [miniwob.make_task("click-button", seed=len(tasks) + i, max_steps=5) for i in range(batch)]
        tasks += chunk
        trajs += collect(pool, ClickFirst(), parse, chunk, store=store, progress=False)
    finally:
      stop.set()
      thread.join()
    restarts = pool.restarts
  alive = pool_lib.marked_pids(marker)
  stored = [t.task.id for t in TrajectoryStore(out_dir)]
  shutil.rmtree(out_dir, ignore_errors=True)
  return {"episodes": len(tasks), "chromium_kills": len(kills), "worker_restarts": restarts,
          "episodes_hit_by_a_kill": sum(t.attempts > 1 for t in trajs),
          "errored": sum(t.status == "errored" for t in trajs),
          "lost_or_duplicated_returned": len(tasks) - len({t.task.id for t in trajs if t is not None}),
          "lost_or_duplicated_stored": len(tasks) - len(set(stored)) + (len(stored) - len(set(stored))),
          "processes_left": len(alive)}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--kills", type=int, default=20, help="kills that must land inside an episode")
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--batch", type=int, default=16, help="episodes per collection round")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default="")
  args = parser.parse_args(argv)
  tmp = tempfile.mkdtemp(prefix="fp-", dir="/tmp")  # short: Chromium's socket path lives under it
  os.environ["TMPDIR"] = tmp
  tempfile.tempdir = None  # re-read TMPDIR
  try:
    result = probe(args.kills, args.workers, args.batch, args.seed)
    result["tmp_entries_left"] = sorted(os.listdir(tmp))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  print(json.dumps(result, indent=1))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
