"""Resumable stages: each writes `<workdir>/<name>/` and, when finished, an atomic `DONE` holding its summary.

A rerun skips finished stages (and says so, naming any config value that differs from the one the stage ran
with, since the skipped stage's outputs keep the old value), runs the rest, and adds each stage's wall time to
`<workdir>/timings.json`.

Under `jax.distributed` every process runs every stage (each its share of the rollouts, all of them the
collective trainings); process 0 decides whether a stage is done, for all, and writes the markers, the config
and the timings alone, after a barrier that every process reaches once its part of the stage is over.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np

from jaxagent.pipeline import distributed
from jaxagent.pipeline import provenance

DONE = "DONE"
RUN_CONFIG = "run_config.json"  # the flat config a stage ran with, and under "provenance" what ran it
PROVENANCE = "provenance"  # run_config.json's key for provenance.provenance(): commit, packages, machine


def write_text(path: str, text: str) -> None:
  """Writes `path` atomically (a reader sees the old file or the new one, never a torn one)."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def write_json(path: str, obj: Any) -> None:
  write_text(path, json.dumps(obj, indent=1, ensure_ascii=False))


def read_json(path: str) -> Any:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def save_png(path: str, image) -> str:
  """`image` (uint8 HxWx3) as a PNG at `path`, atomically; an existing file is kept (a resumed stage)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top  # PIL only where images are written
  if not os.path.exists(path):
    tmp = f"{path}.tmp{os.getpid()}.png"
    Image.fromarray(np.asarray(image)).save(tmp)
    os.replace(tmp, path)
  return path


def flatten(config) -> dict[str, Any]:
  """`{"a.b": value}` of a (nested) ConfigDict or dict, values as JSON would hold them."""
  d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  out: dict[str, Any] = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update({f"{k}.{kk}": vv for kk, vv in flatten(v).items()})
    else:
      out[k] = list(v) if isinstance(v, tuple) else v
  return out


def say(line: str) -> None:
  """`line` and its newline to stdout in one write. Under `launch.local` (unbuffered output) `print` writes the
  text and the newline apart, and a native library's log line (Gloo's, from another thread) can land between
  them, so the line a reader (or a test) looks for is no longer a line."""
  sys.stdout.write(line + "\n")
  sys.stdout.flush()


def brief(value: Any, max_items: int = 12) -> Any:
  """`value` for a log line: a dict or list longer than `max_items` (an evaluation's per-episode outcomes) becomes
  "<N entries>"; the full summary is in the stage's DONE file."""
  if isinstance(value, dict):
    return f"<{len(value)} entries>" if len(value) > max_items else {k: brief(v, max_items) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return f"<{len(value)} entries>" if len(value) > max_items else [brief(v, max_items) for v in value]
  return value


# `python -m jaxagent.main --stop_after=NAME`: the run ends once the stage NAME is done (a recipe's start alone, say)
STOP_AFTER: str | None = None


class StopAfter(Exception):
  """Raised by `Stages.run` once the stage `STOP_AFTER` names is done; `jaxagent.main` ends the run there."""


class Stages:
  """The stage runner of one recipe run: `summary = stages.run(name, fn)` calls `fn(stage_dir)` unless the
  stage is DONE, and returns its summary (a JSON-able dict) either way."""

  def __init__(self, workdir: str, tag: str, config=None):
    self.workdir, self.tag = workdir, tag
    self.config = flatten(config) if config is not None else None
    os.makedirs(workdir, exist_ok=True)
    self.timings_path = os.path.join(workdir, "timings.json")
    self.times: dict[str, float] = read_json(self.timings_path) if os.path.exists(self.timings_path) else {}

  def dir(self, name: str) -> str:
    return os.path.join(self.workdir, name)

  def is_done(self, name: str) -> bool:
    return os.path.exists(os.path.join(self.dir(name), DONE))

  def run(self, name: str, fn: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    out = self.dir(name)
    if distributed.agree(self.is_done(name)):  # process 0's view, so that no process runs a stage alone
      say(f"[{self.tag}] {name}: done already, skipped{self._drift(out)}")
      self._stop_after(name)
      return read_json(os.path.join(out, DONE))
    os.makedirs(out, exist_ok=True)
    main = distributed.is_main()
    if self.config is not None and main:
      write_json(os.path.join(out, RUN_CONFIG), {**self.config, PROVENANCE: provenance.provenance()})
    say(f"[{self.tag}] {name} ...")
    t0 = time.monotonic()
    summary = fn(out)
    distributed.barrier(f"{self.tag}/{name}: ran")  # DONE only once every process's share is in
    self.times[name] = self.times.get(name, 0.0) + time.monotonic() - t0
    if main:
      write_json(self.timings_path, self.times)
      write_json(os.path.join(out, DONE), summary)
    distributed.barrier(f"{self.tag}/{name}: recorded")  # no process reads the marker before it is written
    say(f"[{self.tag}] {name}: {json.dumps(brief(summary))}")
    self._stop_after(name)
    return summary

  def _stop_after(self, name: str) -> None:
    if STOP_AFTER and name == STOP_AFTER:
      say(f"[{self.tag}] stopping after {name} (--stop_after)")
      raise StopAfter(name)

  def _drift(self, out: str) -> str:
    """'; it ran with k=old (now new), ...' for the config values that differ from the finished stage's."""
    path = os.path.join(out, RUN_CONFIG)
    if self.config is None or not os.path.exists(path):
      return ""
    ran = read_json(path)
    ran.pop(PROVENANCE, None)  # the commit and machine it ran on, not a config value
    keys = sorted(k for k in set(ran) | set(self.config) if ran.get(k) != self.config.get(k))
    if not keys:
      return ""
    diffs = ", ".join(f"{k}={ran.get(k)!r} (now {self.config.get(k)!r})" for k in keys)
    return (f"; it ran with {diffs}: to rerun it with the new values, delete {out} and the directories of the "
            "finished stages after it")

  def nested_times(self) -> dict[str, float]:
    """`<sub>/<stage>` times of the runners in this workdir's subdirectories that are not its own stages (WebRL's
    `phase<t>/`); a runner inside one of its stages (DigiRL's `online/`) is in that stage's time already."""
    out = {}
    subs = [d for d in os.listdir(self.workdir) if d not in self.times and os.path.isdir(self.dir(d))]
    for sub in sorted(subs, key=lambda d: (len(d), d)):  # phase2 before phase10
      path = os.path.join(self.dir(sub), "timings.json")
      if os.path.exists(path):
        out.update({f"{sub}/{k}": v for k, v in read_json(path).items()})
    return out

  def table(self) -> str:
    times = {**self.times, **self.nested_times()}
    width = max([16] + [len(k) for k in times])
    rows = [f"  {k:<{width}} {v:8.1f} s" for k, v in times.items()]
    return "\n".join(["stage times (this workdir, all runs):"] + rows +
                     [f"  {'total':<{width}} {sum(times.values()):8.1f} s"])
