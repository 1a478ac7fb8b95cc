"""What an episode changes on the sites, kept per session so parallel episodes never meet.

A session is the `<id>` in `/s/<id>/...`: the first request creates it empty, `reset` drops it (a reset
costs a dict deletion, not a container restart). The JSON form (`to_json`) is what `/__state__/<id>`
serves to the state-match evaluator.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import re
import threading
from typing import Any

from jaxagent.envs.sites.perturb import Perturbation

SESSION_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DEFAULT_SETTINGS = {"wifi": True, "bluetooth": False, "dark_mode": False, "notifications": True,
                    "location": True}


@dataclasses.dataclass
class SessionState:
  cart: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # {product_id, colour, size, qty}
  orders: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # {id, items, name, address, ...}
  replies: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # {thread_id, author, body}
  settings: dict[str, bool] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SETTINGS))
  cookie_consent: bool = False
  requests: int = 0
  perturbation: Perturbation = dataclasses.field(default_factory=Perturbation)  # set by `/__episode__/<id>`
  page_gets: int = 0  # page requests so far (transient failures are drawn per request)
  page_views: int = 0  # pages rendered so far (the interstitial covers one of them)
  popup_open: bool = False

  def to_json(self) -> dict[str, Any]:
    return copy.deepcopy(dataclasses.asdict(self))

  def add_to_cart(self, product_id: int, colour: str, size: str, qty: int) -> None:
    for item in self.cart:
      if (item["product_id"], item["colour"], item["size"]) == (product_id, colour, size):
        item["qty"] += qty
        return
    self.cart.append({"product_id": product_id, "colour": colour, "size": size, "qty": qty})


class SessionStore:
  """Thread-safe map session id -> `SessionState`, bounded (least recently used sessions are evicted)."""

  def __init__(self, max_sessions: int = 20000):
    self._states: collections.OrderedDict[str, SessionState] = collections.OrderedDict()
    self._lock = threading.RLock()
    self._max = max_sessions

  @staticmethod
  def check_id(session: str) -> str:
    if not SESSION_RE.match(session):
      raise ValueError(f"session id {session!r} must match {SESSION_RE.pattern} (letters, digits, _ . -)")
    return session

  def get(self, session: str) -> SessionState:
    with self._lock:
      state = self._states.get(session)
      if state is None:
        state = self._states[self.check_id(session)] = SessionState()
        while len(self._states) > self._max:
          self._states.popitem(last=False)
      else:
        self._states.move_to_end(session)
      return state

  def peek(self, session: str) -> SessionState | None:
    with self._lock:
      return self._states.get(session)

  def reset(self, session: str) -> None:
    with self._lock:
      self._states.pop(session, None)

  def start_episode(self, session: str, perturbation: Perturbation) -> SessionState:
    """A fresh state for `session`, perturbed as `perturbation` says."""
    with self._lock:
      self._states.pop(self.check_id(session), None)
      state = self.get(session)
      state.perturbation = perturbation
      return state

  def lock(self) -> threading.RLock:
    """Held while a request mutates a session (requests run on several threads)."""
    return self._lock

  def __len__(self) -> int:
    return len(self._states)
