"""`SiteServer`: the bundled sites on a loopback port, under uvicorn in a background thread.

`ensure_server()` starts one per process on first use (port 0 picks a free port) and returns its base URL;
`episode_task(task)` turns a bundled-site task into one bound to a fresh session on that server, which is all
an environment needs: `__SITES__` in the task's URLs becomes `http://127.0.0.1:<port>/s/<session>`.
"""

from __future__ import annotations

import atexit
import dataclasses
import re
import socket
import threading
import time
import uuid

import httpx
import uvicorn

from jaxagent import local_http
from jaxagent.envs.sites import app as app_lib
from jaxagent.envs.sites import perturb
from jaxagent.envs.sites.urls import PLACEHOLDER, check_site, resolve


class SiteServer:
  """A real HTTP server for the sites; a context manager, also `start()`/`stop()`."""

  def __init__(self, port: int = 0, host: str = "127.0.0.1", seed: int = 0):
    self.host, self.seed = host, seed
    self.app = app_lib.create_app(seed)
    self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self._sock.bind((host, port))
    self.port = self._sock.getsockname()[1]
    config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
    self._server = uvicorn.Server(config)
    self._thread: threading.Thread | None = None

  @property
  def base_url(self) -> str:
    return f"http://{self.host}:{self.port}"

  def start(self, timeout: float = 20.0) -> "SiteServer":
    if self._thread is not None:
      return self
    self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                    name=f"site-server-{self.port}", daemon=True)
    self._thread.start()
    deadline = time.monotonic() + timeout
    while not self._server.started:
      if not self._thread.is_alive() or time.monotonic() > deadline:
        raise RuntimeError(f"site server on {self.base_url} did not start within {timeout} s")
      time.sleep(0.01)
    return self

  def stop(self) -> None:
    if self._thread is None:
      return
    self._server.should_exit = True
    self._thread.join(timeout=10)
    self._thread = None
    self._sock.close()

  def serve_forever(self) -> None:
    """Starts (if need be) and blocks until interrupted (the `serve` command)."""
    self.start()
    try:
      while self._thread is not None and self._thread.is_alive():
        self._thread.join(timeout=0.5)
    except KeyboardInterrupt:
      pass
    finally:
      self.stop()

  def __enter__(self) -> "SiteServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


_server: SiteServer | None = None
_server_lock = threading.Lock()


def ensure_server(seed: int = 0, host: str = "127.0.0.1") -> str:
  """The base URL of this process's site server, started on first call (free port, stopped at exit), listening
  on `host` (loopback; an address other machines reach for a Ray fleet: `config.env.sites_address`)."""
  global _server
  with _server_lock:
    if _server is None or _server._thread is None:
      _server = SiteServer(seed=seed, host=host).start()
      atexit.register(_server.stop)
    elif _server.seed != seed:
      raise ValueError(f"this process's site server serves seed {_server.seed}, not {seed}; "
                       f"start a SiteServer(seed={seed}) yourself to serve both")
    elif _server.host != host:
      raise ValueError(f"this process's site server listens on {_server.host}, not {host}; one run serves the "
                       "sites on one address (config.env.sites_address)")
    return _server.base_url


def stop_server() -> None:
  global _server
  with _server_lock:
    if _server is not None:
      _server.stop()
      _server = None


def new_session() -> str:
  return uuid.uuid4().hex[:16]


def episode_task(task, base_url: str | None = None, session: str | None = None):
  """`task` bound to a new session on the site server (started if need be).

  Returns a copy whose `start_url` and `meta["home_url"]` are absolute, `allowed_origins` is the server's origin
  and `meta` gains `session`, `base_url` and `state_url` (the evaluators read them). Tasks of other sites
  (MiniWoB, the live web) come back unchanged.
  """
  check_site(task)
  if PLACEHOLDER not in task.start_url:
    return task
  base_url = base_url or ensure_server(task.seed)
  served = world_seed(base_url)
  if served != task.seed:
    raise ValueError(f"Task {task.id!r} belongs to world seed {task.seed}, but the site server at {base_url} serves "
                     f"world seed {served}: its products, posts and answers would not match the task's evaluator. "
                     f"Serve SiteServer(seed={task.seed}) (the recipes: tasks and server both follow tasks.seed)")
  session = session or new_session()
  pert = perturbation_of(task)
  if pert.level:
    start_episode(base_url, session, pert)
  meta = dict(task.meta)
  for key in ("home_url",):
    if key in meta:
      meta[key] = resolve(meta[key], base_url, session)
  meta.update(session=session, base_url=base_url, state_url=f"{base_url}/__state__/{session}")
  return dataclasses.replace(task, start_url=resolve(task.start_url, base_url, session), meta=meta,
                             allowed_origins=(base_url,))


def perturbation_of(task) -> perturb.Perturbation:
  """The episode's perturbations: `task.meta["perturb"]` (level, layout, shortcut...), seeded by the task's id,
  which carries the episode's tag and index (`<task id>@<tag><k>`), so every policy meets the same episode."""
  spec = dict(task.meta.get("perturb") or {})
  if not spec.get("level"):
    return perturb.NONE
  spec.setdefault("seed", perturb.episode_seed(task.id))
  try:
    return perturb.Perturbation.from_json(spec)
  except (TypeError, ValueError) as e:
    raise ValueError(f"task {task.id!r}: field 'meta.perturb' {spec}: {e}") from None


def start_episode(base_url: str, session: str, pert: perturb.Perturbation, timeout: float = 10.0) -> None:
  local_http.post(f"{base_url.rstrip('/')}/__episode__/{session}", timeout, json=pert.to_json())


def world_seed(base_url: str, timeout: float = 10.0) -> int:
  """The world seed a site server serves (its `/healthz` says `ok seed=N ...`); asked at every binding, since a
  port may be reused by a server of another world."""
  r = local_http.get(f"{base_url.rstrip('/')}/healthz", timeout)
  found = re.search(r"\bseed=(-?\d+)", r.text)
  if found is None:
    raise RuntimeError(f"{base_url}/healthz does not name its world seed: {r.text[:100]!r}")
  return int(found.group(1))


def fetch_state(base_url: str, session: str, timeout: float = 10.0) -> dict:
  return local_http.get(f"{base_url.rstrip('/')}/__state__/{session}", timeout).json()


def reset_session(base_url: str, session: str, timeout: float = 10.0) -> None:
  httpx.delete(f"{base_url.rstrip('/')}/__state__/{session}", timeout=timeout).raise_for_status()
