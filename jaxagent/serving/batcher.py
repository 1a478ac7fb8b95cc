"""Dynamic batching: concurrent requests gathered for a few milliseconds into one sampler call.

One worker thread owns the engine. It blocks for the first request, then keeps collecting until as many
requests as the previous batch held are waiting (at most `max_batch`) or `max_wait_ms` has passed since
the first, takes whatever else is already queued, and runs them together. Waiting for the previous
batch's size is what keeps batches full under a steady load of N clients that each send their next
request when the last one returns: their replies leave together, so their next requests arrive within a
few ms of each other, while a lone client (previous batch of 1) never waits. While the sampler runs, new
requests queue up and form the next batch. Each request's preparation (tokenising, image preprocessing) happens on the
submitting thread so that malformed input fails there, at once, and the worker only samples.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time

from jaxagent.serving.engine import Engine, GenerationRequest, GenerationResult


class Batcher:
  def __init__(self, engine: Engine, *, max_wait_ms: float = 20.0, max_batch: int | None = None):
    self.engine = engine
    self._last_batch = 1
    self.max_wait_s = max_wait_ms / 1000
    self.max_batch = int(max_batch or engine.max_batch)
    self._queue: queue.Queue = queue.Queue()
    self._closed = threading.Event()
    self._thread = threading.Thread(target=self._run, name="jaxagent-batcher", daemon=True)
    self._thread.start()

  def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
    """A future of the `GenerationResult`; raises `RequestError` here for a malformed request."""
    if self._closed.is_set():
      raise RuntimeError("the batcher is closed")
    prepared = self.engine.prepare(request)
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._queue.put((prepared, future))
    return future

  def generate(self, request: GenerationRequest) -> GenerationResult:
    return self.submit(request).result()

  def _gather(self) -> list:
    first = self._queue.get()
    if first is None:
      return []
    batch = [first]
    target = min(self.max_batch, self._last_batch)
    deadline = time.monotonic() + self.max_wait_s
    while len(batch) < self.max_batch:
      remaining = deadline - time.monotonic()
      try:
        if len(batch) < target and remaining > 0:
          item = self._queue.get(timeout=remaining)
        else:
          item = self._queue.get_nowait()  # past the target or the deadline: only what is already here
      except queue.Empty:
        break
      if item is None:
        self._queue.put(None)  # let the loop see the shutdown after this batch
        break
      batch.append(item)
    self._last_batch = len(batch)
    return batch

  def _run(self) -> None:
    while not self._closed.is_set():
      batch = self._gather()
      if not batch:
        break
      try:
        results = self.engine.generate([prepared for prepared, _ in batch])
      except Exception as e:  # pylint: disable=broad-except  # the error belongs to the requests, not the server
        for _, future in batch:
          future.set_exception(e)
        continue
      for (_, future), result in zip(batch, results):
        future.set_result(result)

  def close(self) -> None:
    self._closed.set()
    self._queue.put(None)
    self._thread.join(timeout=30)
