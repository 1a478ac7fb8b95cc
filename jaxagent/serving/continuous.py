"""Continuous batching: requests join the running decode batch between steps, and leave it as soon as they end.

One worker thread owns `max_batch` decode slots over one KV cache [max_batch, L] whose rows each have their own
write index (`llama.KVCache.index` of shape [B]); L is a power of two covering the running requests' prompts and
token budgets (grown when a longer one joins, reset when the server idles), so a step attends over what the
running requests can use rather than the server's largest allowance. Between two decode steps it admits waiting requests
into free slots: each is prefilled alone (one jitted call per bucketed prompt length; a VLM's images are merged
into its prompt embeddings there) and its cache row copied into the slot. Each step is one jitted call that
advances every active slot by one token, sampling each row with its own temperature / top-p / top-k and its
own random key, so one compiled step serves every mix of requests. A slot is freed at its request's EOS, stop
string or `max_tokens`, and the next waiting request takes it at the next step. Tokens are handed to the
request's `on_token` callback as they are decoded (the server's token-by-token streaming).

Log-probabilities are the model's own at temperature 1 (`log_softmax(logits)`, before temperature and
filtering), as in `models/sampler.py`; each token also carries the `TOP_LOGPROBS` most likely alternatives.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import queue
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent.models import sampler
from jaxagent.serving.engine import Engine, GenerationRequest, GenerationResult, RequestError, _Prepared, prompt_bucket

TOP_LOGPROBS = 20  # alternatives kept per token (OpenAI's limit for top_logprobs)
TokenCallback = Callable[[int, float, str], None]  # (token id, logprob, text delta)


def choose_rows(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Per-row sampling of [B, V] logits: (tokens [B], their logprobs [B], top ids [B, K], top logprobs [B, K]).

  Row b is greedy when temperature[b] == 0, else sampled from its temperature-scaled logits after its own
  top-k (0 = off) and top-p (1 = off) filters, the order and rules of `sampler.filter_logits`.
  """
  logp = jax.nn.log_softmax(logits, axis=-1)
  greedy = temperature <= 0
  scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
  desc = -jnp.sort(-scaled, axis=-1)
  kth = jnp.take_along_axis(desc, jnp.clip(top_k - 1, 0, logits.shape[-1] - 1)[:, None], axis=-1)
  scaled = jnp.where((top_k[:, None] > 0) & (scaled < kth), -jnp.inf, scaled)
  desc = -jnp.sort(-scaled, axis=-1)
  probs = jax.nn.softmax(desc, axis=-1)
  keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p[:, None]
  cutoff = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
  scaled = jnp.where((top_p[:, None] < 1.0) & (scaled < cutoff), -jnp.inf, scaled)
  sampled = jax.vmap(jax.random.categorical)(keys, scaled)
  tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
  top_lp, top_ids = jax.lax.top_k(logp, TOP_LOGPROBS)
  return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0], top_ids.astype(jnp.int32), top_lp


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_len", "echo"))
def _prefill(graphdef, state, ids, mask, images, key, temperature, top_p, top_k, cache_len: int, echo: bool):
  """One request's prompt [1, T] through a fresh cache row; its first token and, with `echo`, every prompt
  token's logprob and alternatives (the first token has none)."""
  model = nnx.merge(graphdef, state)
  cache = model.init_cache(1, cache_len)
  if images is None:
    hidden, cache = model.hidden_states(ids, attention_mask=mask, cache=cache)
  else:
    hidden, cache = model.hidden_states(inputs_embeds=model.embed(ids, images), attention_mask=mask, cache=cache)
  last = jnp.sum(mask, axis=1, dtype=jnp.int32) - 1
  logits = model.logits(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])
  first = choose_rows(logits, key[None], temperature[None], top_p[None], top_k[None])
  prompt = None
  if echo:
    logp = jax.nn.log_softmax(model.logits(hidden[0, :-1]), axis=-1)  # [T-1, V]: token t+1 given ≤ t
    chosen = jnp.take_along_axis(logp, ids[0, 1:, None], axis=-1)[:, 0]
    top_lp, top_ids = jax.lax.top_k(logp, TOP_LOGPROBS)
    prompt = (chosen, top_ids.astype(jnp.int32), top_lp)
  return cache, first, prompt


@jax.jit
def _insert(cache, row_cache, slot):
  """`row_cache` (batch 1, scalar index) copied into row `slot` of the slot cache (per-row index)."""
  put = lambda big, small: big.at[slot].set(small[0])
  return cache.map_slots(put, row_cache, index=cache.index.at[slot].set(row_cache.index))


@functools.partial(jax.jit, static_argnames=("size",))
def _grow(cache, size: int):
  """The slot cache with room for `size` slots per row (new slots empty; rows keep their indices)."""
  pad = lambda x: jnp.pad(x, [(0, 0), (0, size - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
  return cache.map_slots(pad)


@functools.partial(jax.jit, static_argnames=("graphdef",), donate_argnames=("cache",))
def _step(graphdef, state, cache, tokens, active, key_data, counts, temperature, top_p, top_k):
  """Every slot one token further (inactive slots write an invalid entry and are ignored); slot b samples with
  its request's key folded with its token count."""
  model = nnx.merge(graphdef, state)
  keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(key_data), counts)
  hidden, cache = model.hidden_states(tokens[:, None], attention_mask=active[:, None], cache=cache)
  return cache, choose_rows(model.logits(hidden[:, 0]), keys, temperature, top_p, top_k)


@dataclasses.dataclass
class _Slot:
  prepared: _Prepared
  future: concurrent.futures.Future
  on_token: TokenCallback | None
  key: jax.Array
  key_data: np.ndarray = None  # the key's raw bits, for the jitted step's per-row fold
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  top: list = dataclasses.field(default_factory=list)
  sent: str = ""  # text handed to on_token so far
  last: int = 0
  prompt_logprobs: Any = None


class ContinuousEngine:
  """The server's engine: `submit(request, on_token)` → a Future of `GenerationResult`; same `engine` attribute
  (preparation, limits, the policy) and `close()` as the dynamic `Batcher` it replaces."""

  def __init__(self, engine: Engine, *, max_batch: int | None = None, cache_len: int | None = None, seed: int = 0):
    self.engine = engine
    self.policy = engine.policy
    self.max_batch = int(max_batch or engine.max_batch)
    self.cache_len = int(cache_len or engine.max_prompt_tokens + engine.max_new_tokens)
    self._graphdef, self._state = nnx.split(self.policy.model)
    self._key = jax.random.key(seed)
    self._requests = 0
    self._queue: queue.Queue = queue.Queue()
    self._closed = threading.Event()
    self._stats = collections.Counter()
    self._programs: set = set()  # compiled shapes: a decode step per cache size, a prefill per prompt bucket
    self._blank_key = np.asarray(jax.random.key_data(self._key))
    self._stats_lock = threading.Lock()
    self._thread = threading.Thread(target=self._run, name="continuous-engine", daemon=True)
    self._thread.start()

  # ---- API
  def submit(self, request: GenerationRequest, on_token: TokenCallback | None = None) -> concurrent.futures.Future:
    """Prepares `request` on the caller's thread (a malformed one raises RequestError here) and queues it."""
    prepared = self.engine.prepare(request)
    if len(prepared.ids) + request.max_tokens > self.cache_len:
      raise RequestError(f"the prompt has {len(prepared.ids)} tokens and max_tokens={request.max_tokens}; this "
                         f"server's cache holds {self.cache_len} (start it with a larger --max-prompt-tokens)")
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._requests += 1
    key = jax.random.fold_in(self._key, self._requests if request.seed is None else 1_000_003 + request.seed)
    self._queue.put(_Slot(prepared, future, on_token, key, np.asarray(jax.random.key_data(key))))
    return future

  def generate(self, request: GenerationRequest) -> GenerationResult:
    return self.submit(request).result()

  def stats(self) -> dict[str, Any]:
    with self._stats_lock:
      out = dict(self._stats)
    for key in ("requests", "prefills", "prompt_tokens", "completion_tokens", "steps", "active_slot_steps"):
      out.setdefault(key, 0)
    out["distinct_shapes"] = len(self._programs)
    out["engine"] = "continuous"
    out["max_batch"] = self.max_batch
    return out

  def close(self) -> None:
    self._closed.set()
    self._queue.put(None)
    self._thread.join(timeout=30)

  # ---- worker
  def _count(self, **kw) -> None:
    with self._stats_lock:
      self._stats.update(kw)

  def _size_for(self, slots) -> int:
    """Cache slots per row: a power of two (≥ 128) covering every active request's prompt + max_tokens, so
    each step attends over what the running requests can use, not over the server's largest allowance."""
    need = max((len(s.prepared.ids) + s.prepared.request.max_tokens for s in slots if s is not None), default=1)
    return min(self.cache_len, max(128, 1 << (need - 1).bit_length()))

  def _empty_cache(self, size: int):
    cache = self.policy.model.init_cache(self.max_batch, size)
    # rows are copied in (`_insert`), then one token a row a step: never a prefill into the slot cache itself
    return dataclasses.replace(cache, index=jnp.zeros((self.max_batch,), jnp.int32), empty=False)

  def _run(self) -> None:
    b = self.max_batch
    slots: list[_Slot | None] = [None] * b
    cache = None
    while not self._closed.is_set():
      free = [i for i, s in enumerate(slots) if s is None]
      while free:  # admit waiting requests between steps
        try:
          item = self._queue.get(timeout=0.5) if len(free) == b else self._queue.get_nowait()
        except queue.Empty:
          break
        if item is None:
          return
        slot = free.pop(0)
        size = self._size_for(slots + [item])
        if cache is None or len(free) + 1 == b:
          cache = self._empty_cache(size)  # nothing running: start at the size this request needs
        elif size > cache.max_len:
          cache = _grow(cache, size)
          self._count(cache_grows=1)
        try:
          cache = self._admit(item, slot, cache)
        except Exception as e:  # pylint: disable=broad-except  # fail this request, keep serving the others
          item.future.set_exception(e)
          free.insert(0, slot)
          continue
        if self._finished(item):
          free.insert(0, slot)
        else:
          slots[slot] = item
      active = [s is not None for s in slots]
      if not any(active):
        continue
      self._count(steps=1, active_slot_steps=sum(active))
      cache = self._decode(slots, active, cache)

  @staticmethod
  def _sampling(slot: _Slot | None) -> tuple[float, float, int]:
    if slot is None:
      return 0.0, 1.0, 0
    r = slot.prepared.request
    return float(r.temperature), float(r.top_p), int(r.top_k)

  def _admit(self, slot: _Slot, row: int, cache):
    p, policy = slot.prepared, self.policy
    width = min(prompt_bucket(len(p.ids)), cache.max_len - p.request.max_tokens)
    ids = np.full((1, width), policy.pad_id, np.int32)
    ids[0, :len(p.ids)] = p.ids
    mask = np.zeros((1, width), bool)
    mask[0, :len(p.ids)] = True
    images = None
    if policy.kind == "vlm" and p.pixels is not None and len(p.pixels):
      images = jnp.asarray(p.pixels)
    temperature, top_p, top_k = self._sampling(slot)
    t0 = time.perf_counter()
    row_cache, first, prompt = _prefill(self._graphdef, self._state, ids, mask, images,
                                        jax.random.fold_in(slot.key, 0), np.float32(temperature),
                                        np.float32(top_p), np.int32(top_k), cache_len=cache.max_len,
                                        echo=bool(p.request.echo))
    if prompt is not None:
      chosen, top_ids, top_lp = jax.device_get(prompt)
      n = len(p.ids) - 1
      slot.prompt_logprobs = (chosen[:n].tolist(), top_ids[:n].tolist(), top_lp[:n].tolist())
    self._programs.add((width, cache.max_len, images is None or len(images), bool(p.request.echo)))
    self._count(prefills=1, prompt_tokens=len(p.ids))
    if p.request.max_tokens == 0:  # echo only: the prompt's logprobs, no generation
      self._finish(slot, "length")
      return cache
    cache = _insert(cache, row_cache, jnp.int32(row))
    self._append(slot, *(np.asarray(x)[0] for x in jax.device_get(first)))
    self._count(prefill_seconds_x1000=int(1000 * (time.perf_counter() - t0)))
    return cache

  def _decode(self, slots, active, cache):
    tokens = np.array([s.last if s is not None else self.policy.pad_id for s in slots], np.int32)
    temperature, top_p, top_k = zip(*(self._sampling(s) for s in slots))
    key_data = np.stack([s.key_data if s is not None else self._blank_key for s in slots])
    counts = np.array([len(s.tokens) if s is not None else 0 for s in slots], np.uint32)
    self._programs.add(("step", cache.max_len))
    cache, out = _step(self._graphdef, self._state, cache, tokens, np.asarray(active), key_data, counts,
                       np.asarray(temperature, np.float32), np.asarray(top_p, np.float32),
                       np.asarray(top_k, np.int32))
    toks, lps, top_ids, top_lps = jax.device_get(out)
    for i, s in enumerate(slots):
      if s is None:
        continue
      self._append(s, toks[i], lps[i], top_ids[i], top_lps[i])
      if self._finished(s):
        slots[i] = None
    self._count(completion_tokens=sum(active))
    return cache

  def _append(self, slot: _Slot, token, logprob, top_ids, top_lps) -> None:
    slot.tokens.append(int(token))
    slot.logprobs.append(float(logprob))
    slot.top.append((np.asarray(top_ids).tolist(), np.asarray(top_lps).tolist()))
    slot.last = int(token)
    if slot.on_token is not None:
      text = self.policy.tokenizer.decode(slot.tokens, skip_special_tokens=True)
      if not text.endswith("\ufffd"):  # hold back a character whose bytes are not all decoded yet
        delta, slot.sent = text[len(slot.sent):], text
        slot.on_token(int(token), float(logprob), delta)

  def _finished(self, slot: _Slot) -> bool:
    """Ends the request (resolving its future) if it is done; whether it did."""
    if slot.future.done():
      return True
    r = slot.prepared.request
    if slot.tokens and slot.tokens[-1] in self.policy.eos_ids:
      self._finish(slot, "stop")
      return True
    text = self.policy.tokenizer.decode(slot.tokens, skip_special_tokens=True) if r.stop else ""
    if r.stop and sampler.truncate_at_stop(text, r.stop) != text:
      self._finish(slot, "stop")
      return True
    if len(slot.tokens) >= r.max_tokens:
      self._finish(slot, "length")
      return True
    return False

  def _finish(self, slot: _Slot, reason: str) -> None:
    r = slot.prepared.request
    text = sampler.truncate_at_stop(self.policy.tokenizer.decode(slot.tokens, skip_special_tokens=True), r.stop)
    slot.future.set_result(GenerationResult(
        text, len(slot.prepared.ids), len(slot.tokens), reason, tokens=list(slot.tokens),
        token_logprobs=list(slot.logprobs), top_logprobs=list(slot.top), prompt_ids=slot.prepared.ids.tolist(),
        prompt_logprobs=slot.prompt_logprobs))
    self._count(requests=1)
