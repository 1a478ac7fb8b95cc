"""The policy server over real HTTP: the `openai` client (text, images, streaming), OpenWebVoyager's /predict,
malformed requests answered 4xx while the server keeps serving, and concurrent requests batched; then the
protocol's pieces (`serving/openai_api.py`: validation, logprobs and usage shapes) called directly."""

import base64
import concurrent.futures
import io
import pickle
import re

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from jaxagent import serve
from jaxagent.serving import openai_api as api
from jaxagent.serving.engine import GenerationRequest, GenerationResult


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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ----------------------------------------------------------------- the protocol's pieces, without HTTP or a model


def _served(max_new_tokens: int = 64):
  """A ServedModel over a stand-in engine: parsing reads only its token limit, formatting only its tokenizer."""
  from types import SimpleNamespace  # pylint: disable=g-import-not-at-top
  engine = SimpleNamespace(max_new_tokens=max_new_tokens, policy=SimpleNamespace(tokenizer=None))
  return api.ServedModel(SimpleNamespace(engine=engine), "m")


@pytest.mark.parametrize("body, needle", [
    ({"temperature": "hot"}, "'temperature' must be a number, got 'hot'"),
    ({"top_p": True}, "'top_p' must be a number"),
    ({"max_tokens": 2.5}, "'max_tokens' must be an integer"),
    ({"max_completion_tokens": "ten", "max_tokens": 4}, "'max_tokens' must be an integer, got 'ten'"),
    ({"n": 0}, "'n' must be in [1, 16]"),
    ({"seed": "1"}, "'seed' must be an integer"),
    ({"stop": ["a"] * 9}, "'stop' must be a string or a list of at most 8 strings"),
])
def test_sampling_params_name_the_bad_field(body, needle):
  with pytest.raises(api.BadRequest, match=re.escape(needle)) as e:
    api.sampling_params(body, 16)
  assert e.value.status == 400


def test_sampling_params_defaults_and_seeded_choices():
  assert api.sampling_params({}, 16) == {"n": 1, "max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "stop": (),
                                         "seed": None}
  params = api.sampling_params({"n": 3, "seed": 7, "max_completion_tokens": 5, "max_tokens": 9, "stop": "\n"}, 16)
  reqs = api.requests_for("hi", params, echo=True)
  assert [r.seed for r in reqs] == [7, 8, 9] and {(r.max_tokens, tuple(r.stop), r.echo) for r in reqs} == {
      (5, ("\n",), True)}


def test_parse_checks_the_model_first_then_the_fields_in_order():
  served = _served()
  with pytest.raises(api.BadRequest, match="not served here") as e:
    api.parse_chat(served, {"model": "gpt-9", "n": 99, "messages": "x"})
  assert e.value.status == 404
  with pytest.raises(api.BadRequest, match=re.escape("'top_logprobs' must be in [0, 20]")):
    api.parse_chat(served, {"logprobs": True, "top_logprobs": 21, "messages": "x"})
  chat = api.parse_chat(served, {"messages": [{"role": "developer", "content": "be brief"}], "n": 2, "stream": 1,
                                 "top_logprobs": 99})  # top_logprobs is ignored without logprobs
  assert chat.stream and not chat.logprobs and len(chat.requests) == 2
  assert chat.requests[0].prompt == [{"role": "system", "content": "be brief"}] and chat.requests[0].max_tokens == 64
  with pytest.raises(api.BadRequest, match="needs 'echo': true"):
    api.parse_completion(served, {"prompt": "x", "max_tokens": 0})
  cmpl = api.parse_completion(_served(max_new_tokens=8), {"prompt": ["a", "b"], "n": 2, "logprobs": 0})
  assert [r.prompt for r in cmpl.requests] == ["a", "a", "b", "b"] and cmpl.requests[0].max_tokens == 8
  assert cmpl.logprobs == 0 and not cmpl.echo
  predict = api.parse_predict(served, {"conversations": [{"role": "human", "content": "hi"}]})
  assert (predict.temperature, predict.max_tokens) == (api.OWV_TEMPERATURE, 64)
  assert predict.prompt == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


_TEXT = {1: "a", 2: "é", 3: "bc", 5: "The", 6: " cat"}.__getitem__


def test_chat_logprobs_in_openais_form():
  result = GenerationResult("aé", 4, 2, "length", tokens=[1, 2], token_logprobs=[-0.1, -0.2],
                            top_logprobs=[([1, 3, 2], [-0.1, -2.0, -3.0]), ([2, 1, 3], [-0.2, -1.5, -4.0])])
  out = api.chat_logprobs(result, 2, _TEXT)
  assert out["content"][1] == {"token": "é", "logprob": -0.2, "bytes": [195, 169], "top_logprobs": [
      {"token": "é", "logprob": -0.2, "bytes": [195, 169]}, {"token": "a", "logprob": -1.5, "bytes": [97]}]}
  assert [t["token"] for t in out["content"][0]["top_logprobs"]] == ["a", "bc"]
  assert api.chat_logprobs(result, 0, _TEXT)["content"][0]["top_logprobs"] == []


def test_completion_logprobs_echo_the_prompt_first():
  result = GenerationResult("bc", 2, 1, "length", tokens=[3], token_logprobs=[-0.7], top_logprobs=[([3], [-0.7])],
                            prompt_ids=[5, 6], prompt_logprobs=([-1.25], [[6, 1]], [[-1.25, -2.5]]))
  out = api.completion_logprobs(result, 1, True, _TEXT)
  assert out == {"tokens": ["The", " cat", "bc"], "token_logprobs": [None, -1.25, -0.7],
                 "top_logprobs": [None, {" cat": -1.25}, {"bc": -0.7}], "text_offset": [0, 3, 7]}
  assert api.completion_logprobs(result, 0, False, _TEXT) == {"tokens": ["bc"], "token_logprobs": [-0.7],
                                                               "top_logprobs": [{}], "text_offset": [0]}
  # two prompts, n=2 each: the echoed text is each choice's own prompt, and each prompt counts once in usage
  cmpl = api.CompletionRequest([], ["The", "a"], 2, None, True, False)
  results = [GenerationResult(t, p, 1, "stop") for t, p in (("x", 2), ("y", 2), ("z", 1), ("w", 1))]
  out = api.completion_response({"id": "cmpl-1"}, cmpl, results, _TEXT)
  assert [c["text"] for c in out["choices"]] == ["Thex", "They", "az", "aw"]
  assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_a_trained_actors_server_reports_how_it_acts(tmp_path):
  """`serve.build` on a directory with an `agent.json` lists the format a client prompts the actor in."""
  from jaxagent.agents import spec as agent_spec  # pylint: disable=g-import-not-at-top
  from jaxagent.agents.webrl import WebRL  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.checkpoint import export_policy, random_policy  # pylint: disable=g-import-not-at-top

  loaded = random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16, intermediate_size=128)
  path = export_policy(loaded, str(tmp_path / "actor"))
  assert "agent" not in api.models(api.ServedModel(None, "m"))["data"][0]  # a model with no agent.json
  agent_spec.write(path, WebRL(compact=True), loaded.tokenizer.chat_template)
  app, _ = serve.build(path, max_batch=1, max_new_tokens=8)
  route = next(r for r in app.routes if getattr(r, "path", "") == "/v1/models")
  import asyncio  # pylint: disable=g-import-not-at-top
  listed = asyncio.run(route.endpoint())["data"][0]
  assert listed["agent"] == {"format": "webrl", "options": WebRL(compact=True).options(), "parse": "faithful"}
