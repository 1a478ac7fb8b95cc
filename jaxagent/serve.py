"""An OpenAI-compatible server for jaxagent policies: `python -m jaxagent.serve --checkpoint DIR [--port N]`.

Endpoints
  * `POST /v1/chat/completions`: OpenAI chat messages; content is a string or a list of parts, `text` and
    `image_url` with a `data:image/...;base64,` URL (remote URLs are refused: the server fetches nothing).
    `max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `stop`, `n` (≤ 16 independent samples),
    `seed` (a choice's own sampling seed), `logprobs` + `top_logprobs` (≤ 20) in OpenAI's chat form, and
    `stream: true`: server-sent events, one chunk per decoded token as it is decoded.
  * `POST /v1/completions`: completion-mode prompts (a string or a list), the same sampling fields, `logprobs`
    (an integer: top alternatives per token) in OpenAI's `tokens` / `token_logprobs` / `top_logprobs` /
    `text_offset` form, `echo` (with `max_tokens: 0`, the prompt's own logprobs: what a scorer such as WebRL's
    outcome reward model reads; the first prompt token's is null), `stream`.
    Logprobs are the model's own at temperature 1 (log_softmax of its logits), whatever the sampling settings.
  * `GET /v1/models`: the one served model.
  * `POST /predict`: OpenWebVoyager's server shape (`reference/algorithms.md` §2.1): `{id, conversations:
    [{role, content}], images}` -> `{text, prompt_tokens, completion_tokens}`; `<image>` markers in the
    content take the images in order; generation defaults to the original's temperature 1.2 and 256 new
    tokens (`temperature` / `max_new_tokens` in the body override). The original sends `images` as
    base64(pickle(list[PIL.Image])). Unpickling a client's bytes runs arbitrary code, so that form is refused
    unless the server was started with `--allow-pickle` (only for clients you trust, on loopback); otherwise
    send `images` as a list of base64 PNG/JPEG strings (or data URLs).
  * `GET /stats`: the engine's counters (requests, prefills, decode steps, active slots, tokens), `GET /health`.

Requests are decoded with continuous batching (`serving/continuous.py`): a request joins the running decode
batch at the next step and leaves it when it ends. The
server binds 127.0.0.1 unless `--host` says otherwise and has no authentication: expose it only behind
something that has. Limits (request bytes, images per request, pixels per image, messages, new tokens,
prompt tokens) answer 413/400 with a message naming the limit; every malformed request is a 4xx, and an
unexpected failure while serving one request is a 500 for that request only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import dataclasses
import io
import json
import logging
import socket
import threading
import time
import uuid
from typing import Any

import numpy as np
from fastapi import Request  # at module level: FastAPI resolves the handlers' string annotations here

from jaxagent.data.tokenizer import IMAGE_TOKEN
from jaxagent.serving.continuous import TOP_LOGPROBS, ContinuousEngine
from jaxagent.serving.engine import Engine, GenerationRequest, RequestError

log = logging.getLogger("jaxagent.serve")

OWV_TEMPERATURE = 1.2  # OpenWebVoyager's hf_online_server.py
OWV_MAX_NEW_TOKENS = 256
MAX_N = 16  # choices per request


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


# ------------------------------------------------------------------------------------------------ app


def create_app(batcher: ContinuousEngine, model_name: str, *, limits: Limits = Limits(), allow_pickle: bool = False):
  """The FastAPI app serving `batcher` (a `ContinuousEngine`) as `model_name`."""
  from fastapi import FastAPI  # pylint: disable=g-import-not-at-top
  from fastapi.responses import JSONResponse, StreamingResponse  # pylint: disable=g-import-not-at-top

  app = FastAPI(title="jaxagent policy server")
  created = int(time.time())
  engine = batcher.engine

  def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

  async def read_json(request: Request) -> dict:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limits.max_request_bytes:
      raise BadRequest(f"request body of {length} bytes exceeds the server's {limits.max_request_bytes}", 413)
    raw = bytearray()
    async for chunk in request.stream():
      raw += chunk
      if len(raw) > limits.max_request_bytes:
        raise BadRequest(f"request body exceeds the server's {limits.max_request_bytes} bytes", 413)
    try:
      body = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError) as e:
      raise BadRequest(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
      raise BadRequest("the body must be a JSON object")
    return body

  async def run(gen_request: GenerationRequest):
    future = batcher.submit(gen_request)  # RequestError (400) raised here, before queueing
    return await asyncio.wrap_future(future)

  def handle(fn):
    async def wrapped(request: Request):
      try:
        return await fn(request)
      except BadRequest as e:
        return error(e.status, str(e))
      except RequestError as e:
        return error(400, str(e))
      except Exception as e:  # pylint: disable=broad-except  # one request's failure must not stop the server
        log.exception("request failed")
        return error(500, f"internal error: {type(e).__name__}: {e}", "server_error")
    return wrapped

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                        "owned_by": "jaxagent"}]}

  @app.get("/health")
  async def health():
    return {"status": "ok"}

  @app.get("/stats")
  async def stats():
    return batcher.stats()

  def check_model(body: dict):
    model = body.get("model", model_name)
    if model != model_name:
      raise BadRequest(f"model {model!r:.80} is not served here; this server serves {model_name!r}", 404)

  def sampling(body: dict, default_max: int) -> dict:
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

  def streamed(reqs: list[GenerationRequest], chunk_of, final_of):
    """Server-sent events: one chunk per decoded token of each choice as it is decoded, then each choice's
    final chunk, then [DONE]. `chunk_of(index, delta_text, token, logprob)`, `final_of(index, result)`."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    futures = []
    for i, r in enumerate(reqs):
      cb = lambda tok, lp, delta, i=i: loop.call_soon_threadsafe(events.put_nowait, ("token", i, tok, lp, delta))
      fut = batcher.submit(r, on_token=cb)
      fut.add_done_callback(lambda f, i=i: loop.call_soon_threadsafe(events.put_nowait, ("done", i, f)))
      futures.append(fut)

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
    return StreamingResponse(gen(), media_type="text/event-stream")

  def usage_of(results) -> dict:
    prompt = results[0].prompt_tokens if results else 0
    completion = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

  def token_text(token: int) -> str:
    return engine.policy.tokenizer.decode([token])

  def chat_logprobs(result, k: int) -> dict:
    content = []
    for tok, lp, (ids, lps) in zip(result.tokens, result.token_logprobs, result.top_logprobs):
      text = token_text(tok)
      content.append({"token": text, "logprob": lp, "bytes": list(text.encode()),
                      "top_logprobs": [{"token": token_text(t), "logprob": l, "bytes": list(token_text(t).encode())}
                                       for t, l in zip(ids[:k], lps[:k])]})
    return {"content": content}

  @app.post("/v1/chat/completions")
  @handle
  async def chat_completions(request: Request):
    body = await read_json(request)
    check_model(body)
    params = sampling(body, min(256, engine.max_new_tokens))
    want_logprobs = bool(body.get("logprobs", False))
    k = _number(body, "top_logprobs", 0, int) if want_logprobs else 0
    if not 0 <= k <= TOP_LOGPROBS:
      raise BadRequest(f"'top_logprobs' must be in [0, {TOP_LOGPROBS}]")
    reqs = requests_for(openai_messages_to_hf(body.get("messages"), limits), params)
    rid, now = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    if body.get("stream"):
      def chunk(i, delta, tok, lp):
        choice = {"index": i, "delta": {"content": delta}, "finish_reason": None}
        if want_logprobs:
          choice["logprobs"] = {"content": [{"token": token_text(tok), "logprob": lp,
                                             "bytes": list(token_text(tok).encode()), "top_logprobs": []}]}
        return {"id": rid, "object": "chat.completion.chunk", "created": now, "model": model_name,
                "choices": [choice]}

      def final(i, result):
        return {"id": rid, "object": "chat.completion.chunk", "created": now, "model": model_name,
                "choices": [{"index": i, "delta": {}, "finish_reason": result.finish_reason}],
                "usage": usage_of([result])}
      return streamed(reqs, chunk, final)
    results = await asyncio.gather(*(run(r) for r in reqs))
    choices = []
    for i, result in enumerate(results):
      choice = {"index": i, "message": {"role": "assistant", "content": result.text},
                "finish_reason": result.finish_reason}
      if want_logprobs:
        choice["logprobs"] = chat_logprobs(result, k)
      choices.append(choice)
    return {"id": rid, "object": "chat.completion", "created": now, "model": model_name, "choices": choices,
            "usage": usage_of(results)}

  def completion_logprobs(result, k: int, echo: bool) -> dict:
    """OpenAI's completions form: tokens, token_logprobs, top_logprobs ({token: logprob}), text_offset."""
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

  @app.post("/v1/completions")
  @handle
  async def completions(request: Request):
    body = await read_json(request)
    check_model(body)
    params = sampling(body, min(16, engine.max_new_tokens))  # OpenAI's completions default is 16 tokens
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
    rid, now = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    if body.get("stream"):
      def chunk(i, delta, tok, lp):
        lps = None if logprobs is None else {"tokens": [token_text(tok)], "token_logprobs": [lp],
                                             "top_logprobs": [{}], "text_offset": [0]}
        return {"id": rid, "object": "text_completion", "created": now, "model": model_name,
                "choices": [{"index": i, "text": delta, "logprobs": lps, "finish_reason": None}]}

      def final(i, result):
        return {"id": rid, "object": "text_completion", "created": now, "model": model_name,
                "choices": [{"index": i, "text": "", "logprobs": None, "finish_reason": result.finish_reason}],
                "usage": usage_of([result])}
      return streamed(reqs, chunk, final)
    results = await asyncio.gather(*(run(r) for r in reqs))
    choices = [{"index": i, "text": (prompts[i // params["n"]] if echo else "") + result.text,
                "logprobs": None if logprobs is None else completion_logprobs(result, logprobs, echo),
                "finish_reason": result.finish_reason} for i, result in enumerate(results)]
    prompt_tokens = sum(results[i].prompt_tokens for i in range(0, len(results), params["n"]))
    completion = sum(r.completion_tokens for r in results)
    return {"id": rid, "object": "text_completion", "created": now, "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion}}

  @app.post("/predict")
  @handle
  async def predict(request: Request):
    body = await read_json(request)
    max_new = _number(body, "max_new_tokens", min(OWV_MAX_NEW_TOKENS, engine.max_new_tokens), int)
    gen_request = GenerationRequest(prompt=owv_to_hf(body, limits, allow_pickle), max_tokens=max_new,
                                    temperature=_number(body, "temperature", OWV_TEMPERATURE))
    result = await run(gen_request)
    return {"text": result.text, "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens}

  return app


# ------------------------------------------------------------------------------------------- running


class RunningServer:
  """A uvicorn server on a background thread (tests, benchmarks, notebooks). `url` is its base URL."""

  def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
    import uvicorn  # pylint: disable=g-import-not-at-top

    self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self._sock.bind((host, port))
    self.host, self.port = self._sock.getsockname()[:2]
    self.url = f"http://{self.host}:{self.port}"
    self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=30))
    self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
    self._thread.start()
    deadline = time.monotonic() + 30
    while not self._server.started:
      if time.monotonic() > deadline or not self._thread.is_alive():
        raise RuntimeError("the policy server did not start")
      time.sleep(0.02)

  def close(self) -> None:
    self._server.should_exit = True
    self._thread.join(timeout=10)
    self._sock.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def build(checkpoint: str, *, max_batch: int = 8, max_new_tokens: int = 512, max_prompt_tokens: int | None = None,
          cache_len: int | None = None, limits: Limits = Limits(), allow_pickle: bool = False,
          served_model_name: str = "", seed: int = 0, mesh: dict | None = None):
  """(app, engine) for the policy at `checkpoint` (anything `serving.checkpoint.load_policy` reads: a recipe
  workdir's stage, a training workdir or step, an export, a HF directory, a .gguf file, `smollm2`), on one device
  or, with `mesh` (e.g. {"fsdp": 4, "tensor": 2}), sharded over this host's devices."""
  from jaxagent import sharding  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.checkpoint import load_policy  # pylint: disable=g-import-not-at-top

  policy = load_policy(checkpoint, mesh=sharding.local_mesh(mesh) if mesh else None)
  if policy.kind == "autoui":
    raise ValueError(f"--checkpoint {checkpoint} is an AutoUI (encoder-decoder) policy, which the server does not "
                     "run; act with it through pipeline.seq2seq_policy.Seq2SeqPolicy (the device recipes' actors)")
  from jaxagent.data import qwen_vl  # pylint: disable=g-import-not-at-top
  if qwen_vl.is_qwen(policy):
    raise ValueError(f"--checkpoint {checkpoint} is a Qwen2.5-VL policy, which the continuous-batching server does "
                     "not run (M-RoPE positions); act with it through pipeline.policy.VLMPolicy (the recipes' actors)")
  # The cache holds max_batch × (prompt + new tokens) slots: a long-context model's whole context would not fit.
  max_prompt_tokens = max_prompt_tokens or min(policy.context_length, 4096)
  engine = Engine(policy, max_batch=max_batch, max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
                  seed=seed)
  continuous = ContinuousEngine(engine, cache_len=cache_len, seed=seed)
  return create_app(continuous, served_model_name or policy.name, limits=limits, allow_pickle=allow_pickle), continuous


def parse_mesh(text: str, parser=None) -> dict[str, int]:
  """`--mesh fsdp=4,tensor=2` -> {"fsdp": 4, "tensor": 2}; a malformed entry is a usage error naming it."""
  from jaxagent.sharding import MESH_AXES  # pylint: disable=g-import-not-at-top
  out = {}
  for part in filter(None, (x.strip() for x in text.split(","))):
    axis, _, size = part.partition("=")
    if axis not in MESH_AXES or not size.lstrip("-").isdigit():
      message = f"--mesh {text!r}: {part!r} is not AXIS=SIZE with AXIS one of {MESH_AXES}"
      if parser is None:
        raise ValueError(message)
      parser.error(message)
    out[axis] = int(size)
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m jaxagent.serve", description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True,
                 help="a recipe stage or training workdir (W/il, W/actor, ...), a step dir, an export, a HF "
                      "directory, a .gguf file, or smollm2")
  p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
  p.add_argument("--port", type=int, default=8000)
  p.add_argument("--served-model-name", default="", help="model id clients send (default: the checkpoint's name)")
  p.add_argument("--max-batch", type=int, default=8, help="decode slots (requests decoded together)")
  p.add_argument("--cache-len", type=int, default=None,
                 help="KV-cache slots per request (default: max prompt tokens + max new tokens)")
  p.add_argument("--max-new-tokens", type=int, default=512, help="largest max_tokens a request may ask for")
  p.add_argument("--max-prompt-tokens", type=int, default=None,
                 help="default: the model's context length, at most 4096")
  p.add_argument("--max-images", type=int, default=Limits.max_images, help="images per request")
  p.add_argument("--max-request-mb", type=float, default=Limits.max_request_bytes / 2**20)
  p.add_argument("--mesh", default="",
                 help="shard the model over this host's devices, e.g. fsdp=4,tensor=2 or fsdp=-1 (default: one device)")
  p.add_argument("--allow-pickle", action="store_true",
                 help="accept /predict's pickled images (runs client-supplied code: trusted clients only)")
  args = p.parse_args(argv)
  limits = Limits(max_request_bytes=int(args.max_request_mb * 2**20), max_images=args.max_images)
  mesh = parse_mesh(args.mesh, p)
  app, batcher = build(args.checkpoint, max_batch=args.max_batch, cache_len=args.cache_len,
                       max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens, limits=limits,
                       allow_pickle=args.allow_pickle, served_model_name=args.served_model_name, mesh=mesh)
  import uvicorn  # pylint: disable=g-import-not-at-top
  print(f"serving {args.checkpoint} at http://{args.host}:{args.port}/v1", flush=True)
  try:
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
  finally:
    batcher.close()


if __name__ == "__main__":
  main()
