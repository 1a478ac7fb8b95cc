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
batch at the next step and leaves it when it ends. The protocol (validating a body, shaping responses and stream
events) is `serving/openai_api.py`; this module routes HTTP to its handlers and runs the server. The
server binds 127.0.0.1 unless `--host` says otherwise and has no authentication: expose it only behind
something that has. Limits (request bytes, images per request, pixels per image, messages, new tokens,
prompt tokens) answer 413/400 with a message naming the limit; every malformed request is a 4xx, and an
unexpected failure while serving one request is a 500 for that request only.
"""

from __future__ import annotations

import argparse
import os
import json
import logging
import socket
import threading
import time

from fastapi import FastAPI, Request  # Request at module level: FastAPI resolves the routes' string annotations here
from fastapi.responses import JSONResponse, StreamingResponse

from jaxagent import host_memory
from jaxagent.serving import openai_api as api
from jaxagent.serving.continuous import ContinuousEngine
from jaxagent.serving.engine import Engine, RequestError
from jaxagent.serving.openai_api import BadRequest, Limits

log = logging.getLogger("jaxagent.serve")


# ------------------------------------------------------------------------------------------------ app


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
  """OpenAI's error body: {"error": {message, type, code}} with `code` the HTTP status."""
  return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


async def read_json(request: Request, limits: Limits) -> dict:
  """The body as a JSON object, read in chunks so an oversized one is refused (413) before it is all in memory."""
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


def json_route(served: api.ServedModel, handler):
  """A POST endpoint over `handler(served, body)`: a dict answers as JSON, an iterator as server-sent events;
  BadRequest / RequestError answer 4xx, any other failure 500 for this request only (the server keeps serving)."""
  async def wrapped(request: Request):  # the name is the OpenAPI operation id's stem: kept as it was
    try:
      out = await handler(served, await read_json(request, served.limits))
    except BadRequest as e:
      return error(e.status, str(e))
    except RequestError as e:
      return error(400, str(e))
    except Exception as e:  # pylint: disable=broad-except  # one request's failure must not stop the server
      log.exception("request failed")
      return error(500, f"internal error: {type(e).__name__}: {e}", "server_error")
    return out if isinstance(out, dict) else StreamingResponse(out, media_type="text/event-stream")
  return wrapped


def create_app(batcher: ContinuousEngine, model_name: str, *, limits: Limits = Limits(), allow_pickle: bool = False,
               agent: dict | None = None):
  """The FastAPI app serving `batcher` (a `ContinuousEngine`) as `model_name` (a trained actor's `agent` spec
  reported by `/v1/models`): routes only, over the handlers of `serving/openai_api.py`."""
  served = api.ServedModel(batcher, model_name, limits=limits, allow_pickle=allow_pickle, agent=agent)
  app = FastAPI(title="jaxagent policy server")

  @app.get("/v1/models")
  async def models():
    return api.models(served)

  @app.get("/health")
  async def health():
    return {"status": "ok"}

  @app.get("/stats")
  async def stats():
    return batcher.stats()

  app.post("/v1/chat/completions")(json_route(served, api.chat_completion))
  app.post("/v1/completions")(json_route(served, api.completion))
  app.post("/predict")(json_route(served, api.predict))
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
  from jaxagent.agents import spec as agent_spec  # pylint: disable=g-import-not-at-top
  from jaxagent.models.hf import gguf  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.checkpoint import load_policy, workdir_of  # pylint: disable=g-import-not-at-top

  policy = load_policy(checkpoint, mesh=sharding.local_mesh(mesh) if mesh else None)
  where = gguf.checkpoint_dir(checkpoint)
  agent = agent_spec.read(workdir_of(where)) if os.path.isdir(where) else None
  if policy.kind == "autoui":
    raise ValueError(f"--checkpoint {checkpoint} is an AutoUI (encoder-decoder) policy, which the server does not "
                     "run; act with it through pipeline.policy.load (the device recipes' actors)")
  from jaxagent.models import qwen_vl  # pylint: disable=g-import-not-at-top
  if qwen_vl.is_qwen(policy):
    raise ValueError(f"--checkpoint {checkpoint} is a Qwen2.5-VL policy, which the continuous-batching server does "
                     "not run (M-RoPE positions); act with it through pipeline.policy.load (the recipes' actors)")
  # The cache holds max_batch × (prompt + new tokens) slots: a long-context model's whole context would not fit.
  max_prompt_tokens = max_prompt_tokens or min(policy.context_length, 4096)
  engine = Engine(policy, max_batch=max_batch, max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
                  seed=seed)
  continuous = ContinuousEngine(engine, cache_len=cache_len, seed=seed)
  return create_app(continuous, served_model_name or policy.name, limits=limits, allow_pickle=allow_pickle,
                    agent=agent), continuous


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
  host_memory.keep_freed_memory()  # XLA:CPU's large buffers: no fresh pages every request
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
