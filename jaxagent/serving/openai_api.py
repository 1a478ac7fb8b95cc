"""The OpenAI-compatible protocol over a `ContinuousEngine`, without HTTP (the endpoints: `jaxagent/serve.py`).

A request body (already-parsed JSON) goes through small pure functions that validate it and build the engine's
`GenerationRequest`s (every malformed field is a `BadRequest` naming it), then a handler turns it into the
response dict, or with `stream` an async iterator of server-sent events. The HTTP layer only reads the body and
routes: so each piece can be tested by calling it, and the wire format lives in one place.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import io
import json
import time
import uuid
from typing import Any, AsyncIterator, Callable

import numpy as np

from jaxagent.data.tokenizer import IMAGE_TOKEN
from jaxagent.serving.continuous import TOP_LOGPROBS, ContinuousEngine
from jaxagent.serving.engine import GenerationRequest, GenerationResult

OWV_TEMPERATURE = 1.2  # OpenWebVoyager's hf_online_server.py
OWV_MAX_NEW_TOKENS = 256
MAX_N = 16  # choices per request

TokenText = Callable[[int], str]  # a token id -> its text (the served tokenizer's decode of that one token)


@dataclasses.dataclass(frozen=True)
class Limits:
  max_request_bytes: int = 32 * 2**20
  max_images: int = 16  # per request
  max_image_pixels: int = 4096 * 4096
  max_messages: int = 512


class BadRequest(Exception):
  def __init__(self, message: str, status: int = 400):
    super().__init__(message)
    self.status = status


@dataclasses.dataclass(frozen=True)
class ServedModel:
  """What the handlers serve: the engine, the model id clients name, and the request limits."""

  batcher: ContinuousEngine
  model_name: str
  limits: Limits = Limits()
  allow_pickle: bool = False
  created: int = dataclasses.field(default_factory=lambda: int(time.time()))  # /v1/models' `created`
  agent: dict | None = None  # a trained actor's agent.json: the format a client prompts it in

  @property
  def max_new_tokens(self) -> int:
    return self.batcher.engine.max_new_tokens

  def token_text(self, token: int) -> str:
    return self.batcher.engine.policy.tokenizer.decode([token])


# --------------------------------------------------------------------------------------------- parsing


def decode_image(data: str, where: str, limits: Limits) -> np.ndarray:
  """A base64 image (bare or as a data URL) -> uint8 [H, W, 3]; BadRequest naming `where` otherwise."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  if not isinstance(data, str):
    raise BadRequest(f"{where}: expected a base64 string, got {type(data).__name__}")
  if data.startswith("data:"):
    head, sep, data = data.partition(",")
    if not sep or ";base64" not in head:
      raise BadRequest(f"{where}: a data URL must read 'data:image/png;base64,<data>'")
  elif data.startswith(("http://", "https://", "file:")):
    raise BadRequest(f"{where}: the server fetches no URLs; inline the image as 'data:image/png;base64,...'")
  try:
    raw = base64.b64decode(data, validate=True)
  except (binascii.Error, ValueError):
    raise BadRequest(f"{where}: not valid base64") from None
  try:
    with Image.open(io.BytesIO(raw)) as im:
      if im.width * im.height > limits.max_image_pixels:
        raise BadRequest(f"{where}: image of {im.width}x{im.height} exceeds the server's {limits.max_image_pixels} "
                         "pixels", 413)
      return np.asarray(im.convert("RGB"))
  except BadRequest:
    raise
  except Exception as e:  # pylint: disable=broad-except  # PIL raises many types for bad bytes
    raise BadRequest(f"{where}: not a readable image ({type(e).__name__})") from None


def _number(body: dict, key: str, default, kind=float):
  value = body.get(key, default)
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
    raise BadRequest(f"'{key}' must be {'an integer' if kind is int else 'a number'}, got {value!r:.50}")
  return kind(value)


def _stop(body: dict) -> tuple[str, ...]:
  stop = body.get("stop")
  if stop is None:
    return ()
  if isinstance(stop, str):
    return (stop,)
  if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 8:
    return tuple(stop)
  raise BadRequest("'stop' must be a string or a list of at most 8 strings")


def openai_messages_to_hf(messages: Any, limits: Limits) -> list[dict[str, Any]]:
  """OpenAI chat messages -> the HF multimodal chat convention (image parts decoded to arrays)."""
  if not isinstance(messages, list) or not messages:
    raise BadRequest("'messages' must be a non-empty list of {role, content}")
  if len(messages) > limits.max_messages:
    raise BadRequest(f"'messages' has {len(messages)} entries; the server accepts at most {limits.max_messages}")
  out, n_images = [], 0
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or "content" not in m:
      raise BadRequest(f"messages[{i}] must be an object with 'role' and 'content'")
    role = m.get("role")
    if role == "developer":
      role = "system"
    if role not in ("system", "user", "assistant"):
      raise BadRequest(f"messages[{i}].role={role!r:.40}; use 'system', 'user' or 'assistant'")
    content = m["content"]
    if isinstance(content, str):
      out.append({"role": role, "content": content})
      continue
    if not isinstance(content, list):
      raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
    parts = []
    for j, p in enumerate(content):
      where = f"messages[{i}].content[{j}]"
      kind = p.get("type") if isinstance(p, dict) else None
      if kind == "text" and isinstance(p.get("text"), str):
        parts.append({"type": "text", "text": p["text"]})
      elif kind == "image_url":
        url = p.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        n_images += 1
        if n_images > limits.max_images:
          raise BadRequest(f"more than {limits.max_images} images in one request (the server's --max-images)", 413)
        parts.append({"type": "image", "image": decode_image(url, where + ".image_url.url", limits)})
      else:
        raise BadRequest(f"{where}: expected {{'type': 'text', 'text': str}} or {{'type': 'image_url', "
                         f"'image_url': {{'url': 'data:image/png;base64,...'}}}}, got type {kind!r:.40}")
    out.append({"role": role, "content": parts})
  return out


def owv_to_hf(body: dict, limits: Limits, allow_pickle: bool) -> list[dict[str, Any]]:
  """OpenWebVoyager's `/predict` body -> HF chat messages (`<image>` markers become image parts)."""
  conversations = body.get("conversations")
  if not isinstance(conversations, list) or not conversations:
    raise BadRequest("'conversations' must be a non-empty list of {role, content}")
  images = _owv_images(body.get("images"), limits, allow_pickle)
  markers = sum(c.get("content", "").count(IMAGE_TOKEN) for c in conversations
                if isinstance(c, dict) and isinstance(c.get("content"), str))
  if markers != len(images):
    raise BadRequest(f"the conversations hold {markers} {IMAGE_TOKEN} marker(s) but {len(images)} image(s) were "
                     "sent; send one image per marker, in order")
  it = iter(images)
  messages = []
  for i, c in enumerate(conversations):
    if not isinstance(c, dict) or not isinstance(c.get("content"), str):
      raise BadRequest(f"conversations[{i}] must be {{'role': str, 'content': str}}")
    role = {"human": "user", "gpt": "assistant"}.get(c.get("role"), c.get("role"))
    if role not in ("system", "user", "assistant"):
      raise BadRequest(f"conversations[{i}].role={c.get('role')!r:.40}; use 'system', 'user' or 'assistant'")
    pieces = c["content"].split(IMAGE_TOKEN)
    parts: list[dict[str, Any]] = []
    for k, piece in enumerate(pieces):
      if k:
        parts.append({"type": "image", "image": next(it)})
      if piece:
        parts.append({"type": "text", "text": piece})
    messages.append({"role": role, "content": parts})
  return messages


def _owv_images(images: Any, limits: Limits, allow_pickle: bool) -> list[Any]:
  if images is None or images == []:
    return []
  if isinstance(images, str):  # the original's base64(pickle(list[PIL.Image]))
    if not allow_pickle:
      raise BadRequest("'images' is a pickle; unpickling client data can run arbitrary code, so this server "
                       "refuses it. Send 'images' as a list of base64 PNG strings, or start the server with "
                       "--allow-pickle for trusted clients")
    import pickle  # pylint: disable=g-import-not-at-top
    try:
      loaded = pickle.loads(base64.b64decode(images))  # noqa: S301  # opted in with --allow-pickle
    except Exception as e:  # pylint: disable=broad-except
      raise BadRequest(f"'images': cannot unpickle ({type(e).__name__})") from None
    if not isinstance(loaded, list) or len(loaded) > limits.max_images:
      raise BadRequest(f"'images' must unpickle to a list of at most {limits.max_images} PIL images")
    return [np.asarray(im.convert("RGB")) if hasattr(im, "convert") else np.asarray(im) for im in loaded]
  if not isinstance(images, list):
    raise BadRequest("'images' must be a list of base64 image strings")
  if len(images) > limits.max_images:
    raise BadRequest(f"{len(images)} images; the server accepts at most {limits.max_images}", 413)
  return [decode_image(x, f"images[{i}]", limits) for i, x in enumerate(images)]


def check_model(body: dict, model_name: str) -> None:
  """A request naming another model is a 404: a client pointed at the wrong server should hear so."""
  model = body.get("model", model_name)
  if model != model_name:
    raise BadRequest(f"model {model!r:.80} is not served here; this server serves {model_name!r}", 404)


def sampling_params(body: dict, default_max: int) -> dict:
  """The sampling fields both completion endpoints share: {n, max_tokens, temperature, top_p, stop, seed}.
  (`max_tokens` against the engine's limit and `temperature` < 0 are the engine's `RequestError`s.)"""
  n = _number(body, "n", 1, int)
  if not 1 <= n <= MAX_N:
    raise BadRequest(f"'n' must be in [1, {MAX_N}]")
  max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
  max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", default_max, int)
  seed = body.get("seed")
  if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
    raise BadRequest(f"'seed' must be an integer, got {seed!r:.50}")
  return {"n": n, "max_tokens": max_tokens, "temperature": _number(body, "temperature", 1.0),
          "top_p": _number(body, "top_p", 1.0), "stop": _stop(body), "seed": seed}


def requests_for(prompt, params: dict, **extra) -> list[GenerationRequest]:
  """`n` independent samples of one prompt (a fixed `seed` gives each choice its own offset)."""
  n, seed = params["n"], params["seed"]
  common = {k: v for k, v in params.items() if k not in ("n", "seed")}
  return [GenerationRequest(prompt=prompt, seed=None if seed is None else seed + i, **common, **extra)
          for i in range(n)]


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  requests: list[GenerationRequest]  # n per conversation
  logprobs: bool
  top_logprobs: int
  stream: bool


def parse_chat(served: ServedModel, body: dict) -> ChatRequest:
  """A `/v1/chat/completions` body -> its engine requests; the checks run in this order, so the first bad field
  is the one the 4xx names."""
  check_model(body, served.model_name)
  params = sampling_params(body, min(256, served.max_new_tokens))
  want_logprobs = bool(body.get("logprobs", False))
  k = _number(body, "top_logprobs", 0, int) if want_logprobs else 0
  if not 0 <= k <= TOP_LOGPROBS:
    raise BadRequest(f"'top_logprobs' must be in [0, {TOP_LOGPROBS}]")
  reqs = requests_for(openai_messages_to_hf(body.get("messages"), served.limits), params)
  return ChatRequest(reqs, want_logprobs, k, bool(body.get("stream")))


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
  requests: list[GenerationRequest]  # n per prompt, prompt by prompt
  prompts: list[str]
  n: int
  logprobs: int | None  # top alternatives per token; None: no logprobs
  echo: bool
  stream: bool


def parse_completion(served: ServedModel, body: dict) -> CompletionRequest:
  """A `/v1/completions` body -> its engine requests (OpenAI's completions default is 16 new tokens)."""
  check_model(body, served.model_name)
  params = sampling_params(body, min(16, served.max_new_tokens))
  prompts = body.get("prompt")
  prompts = [prompts] if isinstance(prompts, str) else prompts
  if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
    raise BadRequest("'prompt' must be a string or a non-empty list of strings")
  logprobs = body.get("logprobs")
  if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                               or not 0 <= logprobs <= TOP_LOGPROBS):
    raise BadRequest(f"'logprobs' must be an integer in [0, {TOP_LOGPROBS}] (top alternatives per token)")
  echo = bool(body.get("echo", False))
  if params["max_tokens"] == 0 and not echo:
    raise BadRequest("'max_tokens': 0 needs 'echo': true (the prompt's logprobs are then the whole answer)")
  reqs = [r for p in prompts for r in requests_for(p, params, echo=echo)]
  return CompletionRequest(reqs, prompts, params["n"], logprobs, echo, bool(body.get("stream")))


def parse_predict(served: ServedModel, body: dict) -> GenerationRequest:
  """OpenWebVoyager's `/predict` body -> one request, at the original's defaults (temperature 1.2, 256 tokens)."""
  max_new = _number(body, "max_new_tokens", min(OWV_MAX_NEW_TOKENS, served.max_new_tokens), int)
  prompt = owv_to_hf(body, served.limits, served.allow_pickle)
  return GenerationRequest(prompt=prompt, max_tokens=max_new, temperature=_number(body, "temperature", OWV_TEMPERATURE))


# ------------------------------------------------------------------------------------------ formatting


def usage_of(results: list[GenerationResult]) -> dict:
  """One prompt's usage: its prompt counted once, every choice's completion tokens."""
  prompt = results[0].prompt_tokens if results else 0
  completion = sum(r.completion_tokens for r in results)
  return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _chat_token(text: str, logprob) -> dict:
  return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(result: GenerationResult, k: int, token_text: TokenText) -> dict:
  """OpenAI's chat form: per generated token {token, logprob, bytes, top_logprobs: its k best alternatives}."""
  content = []
  for tok, lp, (ids, lps) in zip(result.tokens, result.token_logprobs, result.top_logprobs):
    top = [_chat_token(token_text(t), l) for t, l in zip(ids[:k], lps[:k])]
    content.append({**_chat_token(token_text(tok), lp), "top_logprobs": top})
  return {"content": content}


def completion_logprobs(result: GenerationResult, k: int, echo: bool, token_text: TokenText) -> dict:
  """OpenAI's completions form: tokens, token_logprobs, top_logprobs ({token: logprob}), text_offset; with echo
  the prompt's tokens come first (the first one has no logprob: nothing precedes it)."""
  tokens, token_lps, tops = [], [], []
  if echo:
    ids = result.prompt_ids
    chosen, top_ids, top_lps = result.prompt_logprobs or ([], [], [])
    tokens += [token_text(t) for t in ids]
    token_lps += [None] + list(chosen)
    tops += [None] + [{token_text(t): l for t, l in zip(a[:k], b[:k])} for a, b in zip(top_ids, top_lps)]
  for tok, lp, (ids, lps) in zip(result.tokens, result.token_logprobs, result.top_logprobs):
    tokens.append(token_text(tok))
    token_lps.append(lp)
    tops.append({token_text(t): l for t, l in zip(ids[:k], lps[:k])})
  offsets, pos = [], 0
  for t in tokens:
    offsets.append(pos)
    pos += len(t)
  return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def _head(rid: str, kind: str, created: int, model: str) -> dict:
  return {"id": rid, "object": kind, "created": created, "model": model}


def chat_response(head: dict, chat: ChatRequest, results: list[GenerationResult], token_text: TokenText) -> dict:
  choices = []
  for i, result in enumerate(results):
    choice = {"index": i, "message": {"role": "assistant", "content": result.text},
              "finish_reason": result.finish_reason}
    if chat.logprobs:
      choice["logprobs"] = chat_logprobs(result, chat.top_logprobs, token_text)
    choices.append(choice)
  return {**head, "choices": choices, "usage": usage_of(results)}


def chat_chunk(head: dict, index: int, delta: str, logprob: dict | None) -> dict:
  """One streamed token of choice `index`; `logprob` is its logprobs entry when they were asked for."""
  choice = {"index": index, "delta": {"content": delta}, "finish_reason": None}
  if logprob is not None:
    choice["logprobs"] = {"content": [logprob]}
  return {**head, "choices": [choice]}


def chat_final_chunk(head: dict, index: int, result: GenerationResult) -> dict:
  return {**head, "choices": [{"index": index, "delta": {}, "finish_reason": result.finish_reason}],
          "usage": usage_of([result])}


def completion_response(head: dict, cmpl: CompletionRequest, results: list[GenerationResult],
                        token_text: TokenText) -> dict:
  """Choices prompt by prompt (n each); usage counts each prompt once."""
  choices = [{"index": i, "text": (cmpl.prompts[i // cmpl.n] if cmpl.echo else "") + result.text,
              "logprobs": None if cmpl.logprobs is None else completion_logprobs(result, cmpl.logprobs, cmpl.echo,
                                                                                 token_text),
              "finish_reason": result.finish_reason} for i, result in enumerate(results)]
  prompt_tokens = sum(results[i].prompt_tokens for i in range(0, len(results), cmpl.n))
  completion = sum(r.completion_tokens for r in results)
  return {**head, "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                                 "total_tokens": prompt_tokens + completion}}


def completion_chunk(head: dict, index: int, delta: str, logprobs: dict | None) -> dict:
  return {**head, "choices": [{"index": index, "text": delta, "logprobs": logprobs, "finish_reason": None}]}


def completion_final_chunk(head: dict, index: int, result: GenerationResult) -> dict:
  return {**head, "choices": [{"index": index, "text": "", "logprobs": None, "finish_reason": result.finish_reason}],
          "usage": usage_of([result])}


# -------------------------------------------------------------------------------------------- handlers


async def _result(batcher: ContinuousEngine, request: GenerationRequest) -> GenerationResult:
  future = batcher.submit(request)  # RequestError (400) raised here, before queueing
  return await asyncio.wrap_future(future)


def stream_events(batcher: ContinuousEngine, reqs: list[GenerationRequest], chunk_of, final_of) -> AsyncIterator[str]:
  """Server-sent events: one chunk per decoded token of each choice as it is decoded, then each choice's final
  chunk, then [DONE]. `chunk_of(index, delta_text, token, logprob)`, `final_of(index, result)`. Submits every
  request now, before the first event, so a request the engine refuses is still a 4xx, not a broken stream; call
  it on the event loop."""
  loop = asyncio.get_running_loop()
  events: asyncio.Queue = asyncio.Queue()
  for i, r in enumerate(reqs):
    cb = lambda tok, lp, delta, i=i: loop.call_soon_threadsafe(events.put_nowait, ("token", i, tok, lp, delta))
    fut = batcher.submit(r, on_token=cb)
    fut.add_done_callback(lambda f, i=i: loop.call_soon_threadsafe(events.put_nowait, ("done", i, f)))

  async def gen():
    pending = len(reqs)
    while pending:
      kind, i, *rest = await events.get()
      if kind == "token":
        tok, lp, delta = rest
        if delta:
          yield f"data: {json.dumps(chunk_of(i, delta, tok, lp))}\n\n"
      else:
        pending -= 1
        future = rest[0]
        if future.exception() is not None:
          yield f"data: {json.dumps({'error': {'message': str(future.exception()), 'type': 'server_error'}})}\n\n"
        else:
          yield f"data: {json.dumps(final_of(i, future.result()))}\n\n"
    yield "data: [DONE]\n\n"
  return gen()


def models(served: ServedModel) -> dict:
  """GET /v1/models: the one served model (with a trained actor's `agent`: how it was trained to be prompted)."""
  model = {"id": served.model_name, "object": "model", "created": served.created, "owned_by": "jaxagent"}
  if served.agent is not None:
    model["agent"] = {k: v for k, v in served.agent.items() if k != "chat_template"}
  return {"object": "list", "data": [model]}


async def chat_completion(served: ServedModel, body: dict) -> dict | AsyncIterator[str]:
  """POST /v1/chat/completions: the response object, or with `stream` its server-sent events."""
  chat = parse_chat(served, body)
  rid, now = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
  if chat.stream:
    head = _head(rid, "chat.completion.chunk", now, served.model_name)

    def chunk(i, delta, tok, lp):
      logprob = {**_chat_token(served.token_text(tok), lp), "top_logprobs": []} if chat.logprobs else None
      return chat_chunk(head, i, delta, logprob)
    return stream_events(served.batcher, chat.requests, chunk, lambda i, result: chat_final_chunk(head, i, result))
  results = await asyncio.gather(*(_result(served.batcher, r) for r in chat.requests))
  return chat_response(_head(rid, "chat.completion", now, served.model_name), chat, results, served.token_text)


async def completion(served: ServedModel, body: dict) -> dict | AsyncIterator[str]:
  """POST /v1/completions: the response object, or with `stream` its server-sent events."""
  cmpl = parse_completion(served, body)
  rid, now = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
  head = _head(rid, "text_completion", now, served.model_name)
  if cmpl.stream:
    def chunk(i, delta, tok, lp):
      lps = None if cmpl.logprobs is None else {"tokens": [served.token_text(tok)], "token_logprobs": [lp],
                                                "top_logprobs": [{}], "text_offset": [0]}
      return completion_chunk(head, i, delta, lps)
    return stream_events(served.batcher, cmpl.requests, chunk,
                         lambda i, result: completion_final_chunk(head, i, result))
  results = await asyncio.gather(*(_result(served.batcher, r) for r in cmpl.requests))
  return completion_response(head, cmpl, results, served.token_text)


async def predict(served: ServedModel, body: dict) -> dict:
  """POST /predict (OpenWebVoyager's server): {text, prompt_tokens, completion_tokens}."""
  result = await _result(served.batcher, parse_predict(served, body))
  return {"text": result.text, "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens}
