"""A real OpenAI-compatible HTTP server on 127.0.0.1 for judge tests (the peer, not jaxagent's own server).

It answers `POST /v1/chat/completions` with canned replies that depend on the request, so a test knows
the right verdict: a WebVoyager-protocol answer containing "correct" -> "... SUCCESS", "wrong" ->
"... NOT SUCCESS", anything else -> a reply with neither; a DigiRL-protocol task containing "succeed"
-> "Status: success", else "Status: failure"; WebArena's fuzzy-match prompt -> "correct" iff the
reference appears in the student answer; WebRL's task-creator prompt (`gen_task.py`) -> three backticked tasks
(`creator_reply`). In fault mode a seeded RNG makes a fraction of requests
fail with 429 (with Retry-After), 500, a timeout (the reply comes after the client gave up), a body that
is not JSON, or a 200 without `choices`.
"""

from __future__ import annotations

import collections
import http.server
import json
import random
import re
import threading
import time


class PeerState:
  def __init__(self, fault_rate=0.0, seed=0, faults=("429", "500", "timeout", "malformed", "no_choices"),
               timeout_sleep=1.0, auth_echo=False):
    self.fault_rate = fault_rate
    self.rng = random.Random(seed)
    self.faults = list(faults)
    self.timeout_sleep = timeout_sleep
    self.auth_echo = auth_echo
    self.lock = threading.Lock()
    self.outcomes = collections.Counter()
    self.auth_headers = set()
    self.bodies = []  # every request body, in arrival order

  def draw(self) -> str:
    with self.lock:
      if self.rng.random() < self.fault_rate:
        return self.rng.choice(self.faults)
      return "ok"


def creator_reply(site: str, seeds: list[str]) -> str:
  """GPT-4o's shape of answer to gen_task.py: prose, then numbered backticked tasks: one from the first seed, one
  the same for every request on `site`, one from the last seed."""
  return (f"Here are some new tasks for {site}:\n\n1. `Find {seeds[0]} again`\n"
          f"2. `Show the newest {site} items`\n3. `Compare {seeds[-1]} with the cheapest one`\n\nEnjoy!")


def canned_reply(body: dict) -> str:
  texts = []
  for m in body["messages"]:
    if isinstance(m["content"], str):
      texts.append(m["content"])
    else:
      texts += [p["text"] for p in m["content"] if p.get("type") == "text"]
  joined = "\n".join(texts)
  if joined.startswith("You are a smart task creator"):  # WebRL's gen_task.py
    site = joined.split("when they use ", 1)[1].split(" in their daily lives", 1)[0]
    return creator_reply(site, re.findall(r"^- `([^`]+)`$", joined.split("#Given Task#\n")[-1], flags=re.M))
  if "Help a teacher to grade the answer of a student" in joined:  # WebArena's llm_fuzzy_match
    reference = joined.split("reference answer: ", 1)[1].split("\n", 1)[0]
    student = joined.split("student answer: ", 1)[1].split("\n", 1)[0]
    return "correct" if reference.lower() in student.lower() else "incorrect"
  if "\nResult Response: " in joined:  # the user turn (the system prompt mentions "3. Result Response: ")
    answer = joined.split("\nResult Response: ", 1)[1].split("\n", 1)[0]
    if "correct" in answer:
      return "The screenshots confirm the answer. Verdict: SUCCESS"
    if "wrong" in answer:
      return "The answer contradicts the screenshot. Verdict: NOT SUCCESS"
    return "I cannot decide from these screenshots."
  if "=====Your Turn=====" in joined:
    task = joined.split("=====Your Turn=====", 1)[1].split("Task: ", 1)[1].split("\n", 1)[0]  # not an exemplar's
    status = "success" if "succeed" in task else "failure"
    return f"Q: What should I expect to see on the screenshot if I've done it?\nA: I see it.\nStatus: {status}"
  return "unknown request"


def make_handler(state: PeerState):
  class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
      pass

    def _send(self, status: int, payload: bytes, headers: dict | None = None):
      try:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
          self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)
      except (BrokenPipeError, ConnectionResetError):
        pass  # the client timed out and left

    def do_POST(self):  # noqa: N802
      body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
      auth = self.headers.get("Authorization", "")
      with state.lock:
        state.auth_headers.add(auth)
        state.bodies.append(body)
      if self.path != "/v1/chat/completions":
        return self._send(404, b'{"error": {"message": "not found"}}')
      if state.auth_echo:
        state.outcomes["401"] += 1
        msg = {"error": {"message": f"Incorrect API key provided: {auth.split(' ', 1)[-1]}", "type": "auth"}}
        return self._send(401, json.dumps(msg).encode())
      outcome = state.draw()
      with state.lock:
        state.outcomes[outcome] += 1
      if outcome == "429":
        return self._send(429, b'{"error": {"message": "rate limited"}}', {"Retry-After": "0"})
      if outcome == "500":
        return self._send(500, b'{"error": {"message": "internal error"}}')
      if outcome == "malformed":
        return self._send(200, b'{"id": "x", "choices": [{"message": ')
      if outcome == "no_choices":
        return self._send(200, b'{"id": "x", "object": "chat.completion", "created": 0, "model": "m"}')
      if outcome == "timeout":
        time.sleep(state.timeout_sleep)
      reply = canned_reply(body)
      payload = {
          "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}],
          "usage": {"prompt_tokens": len(json.dumps(body)) // 100, "completion_tokens": len(reply) // 4,
                    "total_tokens": len(json.dumps(body)) // 100 + len(reply) // 4},
      }
      return self._send(200, json.dumps(payload).encode())

  return Handler


class Peer:
  """Context manager: a threaded server on an ephemeral port; `base_url` ends in /v1."""

  def __init__(self, state: PeerState | None = None, server: http.server.HTTPServer | None = None):
    self.state = state or PeerState()
    self.server = server or http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state))
    self.server.daemon_threads = True
    self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

  @property
  def base_url(self) -> str:
    return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

  def __enter__(self):
    self.thread.start()
    return self

  def __exit__(self, *exc):
    self.server.shutdown()
    self.server.server_close()
    self.thread.join(timeout=5)
