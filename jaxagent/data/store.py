"""An append-only trajectory store on disk that a crash can never corrupt.

Layout of a store directory:
  episodes.jsonl             one committed episode per line (task, steps, verdict, observations' text fields)
  images/<episode>/NNN.png   the screenshot each step acted on; `final.png` is the state after the last step
  images/.tmp-<episode>/     screenshots of an episode being written (never read; `remove_strays` cleans up)

`append` writes the PNGs into a temp directory, renames it into place, then commits the episode by appending
ONE line with a single `write` and `fsync`, under an exclusive `flock`. A writer killed at any point leaves
either a stray temp/image directory (never referenced) or a line without its trailing newline; readers index
only newline-terminated lines. Opening a store and every append repair such a tail under the lock, losing
nothing: a tail that is a whole record (a file that lost only its last newline, e.g. truncated by one byte) gets
its newline back and counts; a torn fragment is moved, byte for byte, to `episodes.jsonl.torn-<time>` beside
the log, with a warning. So the store holds exactly the episodes whose `append` returned. A record that cannot
be read is an error naming the file, the line and the episode.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import time
from typing import Any, Callable, Iterator
import uuid

import numpy as np
from PIL import Image

from jaxagent import types

_LOG = "episodes.jsonl"
_IMAGES = "images"
log = logging.getLogger(__name__)


class StoreError(ValueError):
  """A record of a store that cannot be read; the message names the file, the line and the episode."""


# ---------------------------------------------------------------------------------------- JSON schema


def _plain(x: Any) -> Any:
  """JSON-safe copy: numpy scalars/arrays to Python, tuples to lists, dataclasses to dicts."""
  if isinstance(x, dict):
    return {str(k): _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return _plain(dataclasses.asdict(x))
  return x


def observation_to_json(obs: types.Observation) -> dict[str, Any]:
  """Every field but the screenshot array (stored as a PNG beside it)."""
  d = {f.name: getattr(obs, f.name) for f in dataclasses.fields(obs) if f.name != "screenshot"}
  d["elements"] = [dataclasses.asdict(e) for e in obs.elements]
  return _plain(d)


def observation_from_json(d: dict[str, Any]) -> types.Observation:
  d = dict(d)
  d["elements"] = [types.Element(**{**e, "bbox": tuple(e["bbox"])}) for e in d.get("elements", [])]
  d["a11y_nodes"] = {int(k): v for k, v in d.get("a11y_nodes", {}).items()}
  d["viewport"] = tuple(d.get("viewport", (0, 0)))
  return types.Observation(**d)


def step_to_json(step: types.Step) -> dict[str, Any]:
  d = {f.name: getattr(step, f.name) for f in dataclasses.fields(step) if f.name not in ("action", "observation")}
  d = _plain(d)
  d["action"] = step.action.to_json() if step.action is not None else None
  d["observation"] = observation_to_json(step.observation) if step.observation is not None else None
  return d


def step_from_json(d: dict[str, Any]) -> types.Step:
  d = dict(d)
  d["action"] = types.Action.from_json(d["action"]) if d.get("action") is not None else None
  d["observation"] = observation_from_json(d["observation"]) if d.get("observation") is not None else None
  return types.Step(**d)


def trajectory_to_json(traj: types.Trajectory) -> dict[str, Any]:
  skip = ("task", "steps", "final_observation")
  d = _plain({f.name: getattr(traj, f.name) for f in dataclasses.fields(traj) if f.name not in skip})
  d["task"] = _plain(traj.task.to_json())
  d["steps"] = [step_to_json(s) for s in traj.steps]
  final = traj.final_observation
  d["final_observation"] = observation_to_json(final) if final is not None else None
  return d


def trajectory_from_json(d: dict[str, Any]) -> types.Trajectory:
  d = dict(d)
  d.pop("id", None)
  d["task"] = types.Task.from_json(d["task"])
  d["steps"] = [step_from_json(s) for s in d["steps"]]
  final = d.get("final_observation")
  d["final_observation"] = observation_from_json(final) if final is not None else None
  return types.Trajectory(**d)


# ----------------------------------------------------------------------------------------------- store


def _last_byte(path: str) -> bytes:
  with open(path, "rb") as f:
    f.seek(-1, os.SEEK_END)
    return f.read(1)


def _fsync_dir(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _write_png(path: str, image: np.ndarray) -> None:
  image = np.asarray(image)
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (3, 4):
    raise ValueError(f"screenshot at {path}: expected uint8 [H, W, 3|4], got {image.dtype} {image.shape}")
  with open(path, "wb") as f:
    Image.fromarray(image).save(f, format="PNG", compress_level=1)
    f.flush()
    os.fsync(f.fileno())


class TrajectoryStore:
  """`TrajectoryStore(path)`: `append(traj)`, `len`, iteration, `read(i)`, `load_image(rel)`, `scan`/`indices`/`filter`.

  Several processes may append to and read one store at once. Readers see a consistent prefix: a reader's
  `len` grows as writers commit (it re-indexes only the bytes appended since it last looked).
  """

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    os.makedirs(os.path.join(self.path, _IMAGES), exist_ok=True)
    self._log = os.path.join(self.path, _LOG)
    self._offsets: list[int] = []  # byte offset of each committed line
    self._indexed = 0  # bytes of the log indexed so far (always just after a newline)
    self._repair_on_open()

  def __getstate__(self):  # picklable for Grain workers: the index is rebuilt on demand
    return {"path": self.path}

  def __setstate__(self, state):
    self.__init__(state["path"])

  # -- writing

  def append(self, traj: types.Trajectory) -> str:
    """Commits one episode; returns its id. Sets the steps' `image_path`/`next_image_path` in place."""
    episode = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:10]}"
    tmp = os.path.join(self.path, _IMAGES, f".tmp-{episode}")
    final_dir = os.path.join(self.path, _IMAGES, episode)
    os.makedirs(tmp)
    shots = [s.observation.screenshot if s.observation is not None else None for s in traj.steps]
    shots.append(traj.final_observation.screenshot if traj.final_observation is not None else None)
    paths: list[str | None] = []
    for i, shot in enumerate(shots):
      if shot is None:
        paths.append(None)
        continue
      name = "final.png" if i == len(traj.steps) else f"{i:03d}.png"
      _write_png(os.path.join(tmp, name), shot)
      paths.append(f"{_IMAGES}/{episode}/{name}")
    os.rename(tmp, final_dir)
    _fsync_dir(os.path.join(self.path, _IMAGES))
    for i, step in enumerate(traj.steps):
      step.image_path = paths[i] if paths[i] is not None else step.image_path
      step.next_image_path = paths[i + 1] if paths[i + 1] is not None else step.next_image_path
    record = {"id": episode, **trajectory_to_json(traj)}
    self._commit((json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n").encode())
    traj.meta.setdefault("episode_id", episode)
    return episode

  def _commit(self, line: bytes) -> None:
    fd = os.open(self._log, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
      self._repair_tail(fd)
      os.write(fd, line)
      os.fsync(fd)
    finally:
      os.close(fd)  # releases the lock

  def _repair_on_open(self) -> None:
    """Repairs a tail without its newline (see the module docstring) if there is one and the store is writable."""
    try:
      if os.path.getsize(self._log) == 0 or _last_byte(self._log) == b"\n":
        return
      fd = os.open(self._log, os.O_RDWR | os.O_APPEND)
    except OSError:  # no log yet, or read-only: readers skip an unterminated tail anyway
      return
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
      self._repair_tail(fd)
    finally:
      os.close(fd)

  def _repair_tail(self, fd: int) -> None:
    """Under the lock: a tail after the last newline is a whole record missing its newline (kept) or a torn
    write (moved to a sidecar file, then cut off)."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
      return
    start = self._last_newline(fd, size)
    tail = os.pread(fd, size - start, start)
    try:
      record = json.loads(tail)
      whole = isinstance(record, dict) and "task" in record and "steps" in record
    except ValueError:
      whole = False
    if whole:
      os.write(fd, b"\n")
      log.warning("%s: its last record had lost its newline; restored it", self._log)
    else:
      sidecar = f"{self._log}.torn-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
      with open(sidecar, "wb") as f:
        f.write(tail)
        f.flush()
        os.fsync(f.fileno())
      os.ftruncate(fd, start)
      log.warning("%s: a torn last line (%d bytes, an append that never returned) was moved to %s", self._log,
                  len(tail), sidecar)
    os.fsync(fd)

  @staticmethod
  def _last_newline(fd: int, size: int) -> int:
    pos = size
    while pos > 0:
      start = max(0, pos - 65536)
      chunk = os.pread(fd, pos - start, start)
      nl = chunk.rfind(b"\n")
      if nl >= 0:
        return start + nl + 1
      pos = start
    return 0

  # -- reading

  def refresh(self) -> int:
    """Indexes lines committed since the last look; returns the number of episodes."""
    try:
      size = os.path.getsize(self._log)
    except FileNotFoundError:
      return 0
    if size < self._indexed:
      raise RuntimeError(f"{self._log} shrank below committed data ({size} < {self._indexed} bytes); "
                         "the store is append-only, do not edit it by hand")
    if size == self._indexed:
      return len(self._offsets)
    with open(self._log, "rb") as f:
      f.seek(self._indexed)
      data = f.read(size - self._indexed)
    pos = 0
    while True:
      nl = data.find(b"\n", pos)
      if nl < 0:  # incomplete tail: not committed (yet)
        break
      self._offsets.append(self._indexed + pos)
      pos = nl + 1
    self._indexed += pos
    return len(self._offsets)

  def __len__(self) -> int:
    return self.refresh()

  def read_json(self, i: int) -> dict[str, Any]:
    n = len(self)
    if not -n <= i < n:
      raise IndexError(f"episode {i} out of range; the store at {self.path} holds {n}")
    i %= n
    end = self._offsets[i + 1] if i + 1 < n else self._indexed
    with open(self._log, "rb") as f:
      f.seek(self._offsets[i])
      raw = f.read(end - self._offsets[i])
    try:
      record = json.loads(raw)
      if not isinstance(record, dict):
        raise ValueError(f"a record is a JSON object, not {type(record).__name__}")
    except ValueError as e:
      raise self._bad(i, raw, e) from None
    return record

  def read(self, i: int) -> types.Trajectory:
    """Episode i (commit order), without screenshot arrays (see `load_image`)."""
    d = self.read_json(i)
    try:
      traj = trajectory_from_json(d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise self._bad(i % len(self), json.dumps(d)[:200].encode(), e) from None
    traj.meta.setdefault("episode_id", d.get("id"))
    return traj

  def _bad(self, i: int, raw: bytes, error: Exception) -> StoreError:
    found = re.search(rb'"id"\s*:\s*"([^"]+)"', raw)
    episode = f"episode {found.group(1).decode(errors='replace')!r}" if found else "an unreadable episode id"
    return StoreError(f"{self._log}:{i + 1} (record {i}, {episode}): {type(error).__name__}: {error}. The other "
                      "records are intact; move this line out of the file (or restore it from a backup) to go on")

  def __iter__(self) -> Iterator[types.Trajectory]:
    for i in range(len(self)):
      yield self.read(i)

  def load_image(self, rel_path: str) -> np.ndarray:
    """A stored screenshot (a step's `image_path`) as uint8 [H, W, 3]."""
    with Image.open(os.path.join(self.path, rel_path)) as im:
      return np.asarray(im.convert("RGB"))

  def remove_strays(self, min_age_s: float = 3600.0) -> list[str]:
    """Deletes screenshot directories no committed episode references (left by writers that died), if older
    than `min_age_s` (younger ones may belong to a live writer). Returns what it removed."""
    committed = {self.read_json(i)["id"] for i in range(len(self))}
    root = os.path.join(self.path, _IMAGES)
    removed = []
    for name in sorted(os.listdir(root)):  # committed episodes' directories carry their id as name
      path = os.path.join(root, name)
      if name not in committed and time.time() - os.path.getmtime(path) >= min_age_s:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed

  def scan(self, success: bool | None = None,
           where: Callable[[types.Trajectory], bool] | None = None) -> Iterator[tuple[int, types.Trajectory]]:
    """(index, episode) pairs by judged success (True: success >= 0.5; False: judged and failed; None: all)
    and/or a predicate `where`."""
    for i in range(len(self)):
      traj = self.read(i)
      if success is not None and (traj.success is None or (traj.success >= 0.5) != success):
        continue
      if where is not None and not where(traj):
        continue
      yield i, traj

  def indices(self, success: bool | None = None,
              where: Callable[[types.Trajectory], bool] | None = None) -> list[int]:
    return [i for i, _ in self.scan(success, where)]

  def filter(self, success: bool | None = None,
             where: Callable[[types.Trajectory], bool] | None = None) -> Iterator[types.Trajectory]:
    for _, traj in self.scan(success, where):
      yield traj
