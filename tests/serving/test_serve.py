"""The policy server over real HTTP: the `openai` client (text, images, streaming), OpenWebVoyager's /predict,
malformed requests answered 4xx while the server keeps serving, and concurrent requests batched."""

import base64
import concurrent.futures
import io
import pickle

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from jaxagent import serve
from jaxagent.serving.engine import GenerationRequest


def _png(seed: int, size=(40, 56)) -> tuple[np.ndarray, str]:
  arr = np.random.RandomState(seed).randint(0, 256, (*size, 3)).astype(np.uint8)
  buf = io.BytesIO()
  Image.fromarray(arr).save(buf, format="PNG")
  return arr, base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def client(server):
  return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _chat(image_b64: str, text: str = "Task: open the cart."):
  return [{"role": "system", "content": "You are a web agent."},
          {"role": "user", "content": [{"type": "text", "text": text},
                                       {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image_b64}}]}]


def test_models_lists_the_served_model(client):
  assert [m.id for m in client.models.list().data] == ["tiny-vlm"]


def test_chat_with_image_matches_the_engine_and_streams_the_same(server, client):
  arr, b64 = _png(0)
  resp = client.chat.completions.create(model="tiny-vlm", messages=_chat(b64), max_tokens=12, temperature=0)
  text = resp.choices[0].message.content
  # the same conversation handed straight to the engine (the image as the decoded array): same greedy text
  direct = server.engine.generate([GenerationRequest(
      [{"role": "system", "content": "You are a web agent."},
       {"role": "user", "content": [{"type": "text", "text": "Task: open the cart."}, {"type": "image", "image": arr}]}],
      max_tokens=12, temperature=0.0)])[0]
  assert text == direct.text and resp.usage.prompt_tokens == direct.prompt_tokens
  assert resp.usage.completion_tokens == direct.completion_tokens <= 12
  assert resp.choices[0].finish_reason in ("stop", "length")
  # 1 image = 4 image tokens in the prompt (32px tower, patch 16)
  text_only = client.chat.completions.create(model="tiny-vlm", max_tokens=1, temperature=0, messages=[
      {"role": "system", "content": "You are a web agent."},
      {"role": "user", "content": [{"type": "text", "text": "Task: open the cart."}]}])
  assert resp.usage.prompt_tokens - text_only.usage.prompt_tokens == server.engine.policy.num_image_tokens
  stream = client.chat.completions.create(model="tiny-vlm", messages=_chat(b64), max_tokens=12, temperature=0,
                                          stream=True)
  chunks = list(stream)
  assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
  assert chunks[-1].choices[0].finish_reason == resp.choices[0].finish_reason


def test_predict_is_openwebvoyagers_shape(server, client):
  arr, b64 = _png(1)
  body = {"id": "q1", "conversations": [{"role": "user", "content": "Task: find the price. <image> Screenshot."}],
          "images": [b64], "temperature": 0, "max_new_tokens": 10}
  out = httpx.post(server.url + "/predict", json=body, timeout=300).json()
  assert set(out) == {"text", "prompt_tokens", "completion_tokens"}
  same = client.chat.completions.create(model="tiny-vlm", max_tokens=10, temperature=0, messages=[
      {"role": "user", "content": [{"type": "text", "text": "Task: find the price. "},
                                   {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
                                   {"type": "text", "text": " Screenshot."}]}])
  assert out["text"] == same.choices[0].message.content and out["prompt_tokens"] == same.usage.prompt_tokens
  # the original's pickled PIL list: refused by default, served with --allow-pickle
  pickled = base64.b64encode(pickle.dumps([Image.fromarray(arr)])).decode()
  refused = httpx.post(server.url + "/predict", json={**body, "images": pickled}, timeout=60)
  assert refused.status_code == 400 and "--allow-pickle" in refused.json()["error"]["message"]
  from fastapi.testclient import TestClient
  trusting = serve.create_app(server.batcher, "tiny-vlm", allow_pickle=True)
  with TestClient(trusting) as tc:
    assert tc.post("/predict", json={**body, "images": pickled}).json()["text"] == out["text"]


BAD = [
    ("not json", b"{oops", 400, "not valid JSON"),
    ("no messages", {"model": "tiny-vlm"}, 400, "'messages'"),
    ("bad role", {"model": "tiny-vlm", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("bad part", {"model": "tiny-vlm", "messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400,
     "content[0]"),
    ("bad base64", {"model": "tiny-vlm", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]}, 400, "base64"),
    ("not an image", {"model": "tiny-vlm", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]}]}, 400, "readable image"),
    ("remote url", {"model": "tiny-vlm", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}, 400, "fetches no URLs"),
    ("max_tokens", {"model": "tiny-vlm", "max_tokens": 100000, "messages": [{"role": "user", "content": "x"}]}, 400,
     "max_tokens"),
    ("max_tokens type", {"model": "tiny-vlm", "max_tokens": "ten", "messages": [{"role": "user", "content": "x"}]},
     400, "integer"),
    ("temperature", {"model": "tiny-vlm", "temperature": -1, "messages": [{"role": "user", "content": "x"}]}, 400,
     "temperature"),
    ("n", {"model": "tiny-vlm", "n": 17, "messages": [{"role": "user", "content": "x"}]}, 400, "'n' must be in"),
    ("model", {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, 404, "not served"),
    ("image token in text", {"model": "tiny-vlm", "messages": [{"role": "user", "content": "a <image> b"}]}, 400,
     "image tokens"),
    ("too long", {"model": "tiny-vlm", "messages": [{"role": "user", "content": "word " * 6000}]}, 400,
     "at most 4096"),
]


@pytest.mark.parametrize("name, body, status, needle", BAD, ids=[b[0] for b in BAD])
def test_malformed_requests_get_4xx_with_a_message(server, name, body, status, needle):
  del name
  kw = {"content": body} if isinstance(body, bytes) else {"json": body}
  r = httpx.post(server.url + "/v1/chat/completions", timeout=60, **kw)
  assert r.status_code == status, r.text
  assert needle in r.json()["error"]["message"]


def test_limits_answer_413_and_the_server_keeps_serving(server, client):
  _, b64 = _png(2)
  many = {"model": "tiny-vlm", "messages": [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}}] * 5}]}
  r = httpx.post(server.url + "/v1/chat/completions", json=many, timeout=60)
  assert r.status_code == 413 and "more than 4 images" in r.json()["error"]["message"]
  big = b'{"model": "tiny-vlm", "messages": [{"role": "user", "content": "' + b"x" * (3 * 2**20) + b'"}]}'
  r = httpx.post(server.url + "/v1/chat/completions", content=big, timeout=60)
  assert r.status_code == 413 and "exceeds" in r.json()["error"]["message"]
  bad_predict = httpx.post(server.url + "/predict", json={"conversations": [{"role": "user", "content": "<image>"}],
                                                           "images": []}, timeout=60)
  assert bad_predict.status_code == 400 and "1 <image> marker" in bad_predict.json()["error"]["message"]
  ok = client.chat.completions.create(model="tiny-vlm", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
  assert ok.usage.completion_tokens >= 1


def test_concurrent_requests_share_decode_steps(server, client):
  before = httpx.get(server.url + "/stats").json()

  def one(i):
    return client.chat.completions.create(model="tiny-vlm", max_tokens=8, temperature=1.0,
                                          messages=[{"role": "user", "content": f"request number {i}"}])

  with concurrent.futures.ThreadPoolExecutor(8) as ex:
    outs = list(ex.map(one, range(8)))
  after = httpx.get(server.url + "/stats").json()
  delta = {k: after[k] - before[k] for k in ("requests", "steps", "active_slot_steps", "completion_tokens")}
  assert delta["requests"] == 8 and all(o.usage.completion_tokens >= 1 for o in outs)
  assert delta["active_slot_steps"] >= 2 * delta["steps"], delta  # decode steps advanced several requests at once
