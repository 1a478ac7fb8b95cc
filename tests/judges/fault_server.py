"""A real OpenAI-compatible HTTP server on 127.0.0.1 that injects the faults a judge meets in the wild.

Healthy replies are `openai_peer.canned_reply`'s (so a test knows the right verdict). Each request's outcome
is the next entry of `FaultState.script` while it lasts, then a seeded draw: a fault with probability
`fault_rate`, else "ok". The faults:
  * "429" (with Retry-After: 0), "500", "503": an error status with a JSON error body;
  * "timeout": the healthy reply, after `timeout_sleep` s (the client has given up by then);
  * "non_json": 200, application/json, a body that is not JSON; "truncated": 200, JSON cut short;
  * "no_choices": 200 without `choices`; "empty_choices": `choices: []`; "null_content": `content: null`;
  * "html": 200, text/html, a captive-portal page;
  * "reset": the connection is closed with a TCP RST before anything is sent;
  * "empty": a valid completion whose content is ""; "blank": content "  \\n"; "garbage": content that is
    text but no verdict;
  * "trickle": the healthy reply, its body sent one byte every `trickle_interval` s for `trickle_s` s, then
    the rest (each read is quick, so a per-read timeout never fires).
"""

from __future__ import annotations

import collections
import http.server
import json
import random
import socket
import struct
import threading
import time

from openai_peer import Peer, canned_reply

FAULTS = ("429", "500", "503", "timeout", "non_json", "truncated", "no_choices", "empty_choices", "null_content",
          "html", "reset", "empty", "blank", "garbage", "trickle")


class FaultState:
  def __init__(self, fault_rate=0.0, seed=0, faults=FAULTS, script=(), timeout_sleep=2.0, trickle_interval=0.5,
               trickle_s=6.0):
    self.fault_rate = fault_rate
    self.rng = random.Random(seed)
    self.faults = list(faults)
    self.script = collections.deque(script)
    self.timeout_sleep = timeout_sleep
    self.trickle_interval = trickle_interval
    self.trickle_s = trickle_s
    self.lock = threading.Lock()
    self.stop = threading.Event()  # set on shutdown: sleeping and trickling handlers end at once
    self.outcomes = collections.Counter()
    self.log = []  # (outcome, request body), in arrival order

  def draw(self) -> str:
    with self.lock:
      if self.script:
        return self.script.popleft()
      if self.fault_rate and self.rng.random() < self.fault_rate:
        return self.rng.choice(self.faults)
      return "ok"


def completion(body: dict, content) -> bytes:
  reply = content if isinstance(content, str) else ""
  payload = {
      "id": "chatcmpl-f", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
      "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
      "usage": {"prompt_tokens": len(json.dumps(body)) // 100, "completion_tokens": len(reply) // 4,
                "total_tokens": len(json.dumps(body)) // 100 + len(reply) // 4},
  }
  return json.dumps(payload).encode()


def make_handler(state: FaultState):
  class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
      pass

    def _send(self, status: int, payload: bytes, content_type="application/json", headers=None, trickle=False):
      try:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
          self.send_header(k, v)
        self.end_headers()
        if trickle:
          end = time.monotonic() + state.trickle_s
          while payload and time.monotonic() < end and not state.stop.is_set():
            self.wfile.write(payload[:1])
            payload = payload[1:]
            state.stop.wait(state.trickle_interval)
        self.wfile.write(payload)
      except (BrokenPipeError, ConnectionResetError):
        self.close_connection = True  # the client gave up and left

    def _reset(self):
      self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
      self.connection.close()  # linger 0: the peer sees a RST
      self.close_connection = True

    def do_POST(self):  # noqa: N802
      body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
      outcome = state.draw()
      with state.lock:
        state.outcomes[outcome] += 1
        state.log.append((outcome, body))
      if outcome == "reset":
        return self._reset()
      if outcome == "429":
        return self._send(429, b'{"error": {"message": "rate limited"}}', headers={"Retry-After": "0"})
      if outcome in ("500", "503"):
        return self._send(int(outcome), b'{"error": {"message": "server error"}}')
      if outcome == "non_json":
        return self._send(200, b"upstream said: all good")
      if outcome == "truncated":
        return self._send(200, completion(body, canned_reply(body))[:40])
      if outcome == "no_choices":
        return self._send(200, b'{"id": "x", "object": "chat.completion", "created": 0, "model": "m"}')
      if outcome == "empty_choices":
        return self._send(200, b'{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}')
      if outcome == "null_content":
        return self._send(200, completion(body, None))
      if outcome == "html":
        return self._send(200, b"<html><body><h1>Please log in to the Wi-Fi</h1></body></html>", "text/html")
      if outcome == "empty":
        return self._send(200, completion(body, ""))
      if outcome == "blank":
        return self._send(200, completion(body, "  \n"))
      if outcome == "garbage":
        return self._send(200, completion(body, "As an AI language model I"))
      if outcome == "timeout" and state.stop.wait(state.timeout_sleep):
        return None
      return self._send(200, completion(body, canned_reply(body)), trickle=outcome == "trickle")

  return Handler


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def handle_error(self, request, client_address):  # resets and abandoned requests are the point here
    pass


class FaultServer(Peer):
  """Context manager: a threaded server on an ephemeral port; `base_url` ends in /v1."""

  def __init__(self, state: FaultState | None = None):
    state = state or FaultState()
    super().__init__(state, _Server(("127.0.0.1", 0), make_handler(state)))

  def __exit__(self, *exc):
    self.state.stop.set()
    super().__exit__(*exc)
