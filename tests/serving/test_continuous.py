"""Continuous batching and the completion API: a request joins a running decode and both get the tokens they get
alone; logprobs (chosen, alternatives, echoed prompt) equal log_softmax of the model's own logits; n choices;
token-by-token streaming; the OpenAI client's completions call."""

import json
import threading

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest

from jaxagent import serve
from jaxagent.serving.checkpoint import random_policy
from jaxagent.serving.continuous import ContinuousEngine, choose_rows
from jaxagent.serving.engine import Engine, GenerationRequest

PROMPTS = ["Find the price of the kettle.", "hi", "a much longer prompt about shopping for many things " * 4]


@pytest.fixture(scope="module")
def decoder():
  return random_policy("decoder", seed=1)


@pytest.fixture(scope="module")
def continuous(decoder):
  engine = ContinuousEngine(Engine(decoder, max_batch=4, max_new_tokens=48, max_prompt_tokens=256))
  yield engine
  engine.close()


@pytest.fixture(scope="module")
def text_server(continuous):
  app = serve.create_app(continuous, "tiny-decoder")
  with serve.RunningServer(app) as running:
    yield running


def _alone(decoder, prompt, n):
  return Engine(decoder, max_batch=1, max_new_tokens=48).generate(
      [GenerationRequest(prompt, max_tokens=n, temperature=0.0)])[0]


@pytest.mark.slow
def test_a_request_joins_a_running_decode(decoder, continuous):
  first_tokens = threading.Event()
  seen = []
  long = continuous.submit(GenerationRequest(PROMPTS[0], max_tokens=40, temperature=0.0),
                           on_token=lambda *a: (seen.append(a), len(seen) >= 3 and first_tokens.set()))
  assert first_tokens.wait(60)
  steps_before = continuous.stats()["steps"]
  short = continuous.submit(GenerationRequest(PROMPTS[2], max_tokens=6, temperature=0.0)).result(60)
  assert not long.done() or long.result().completion_tokens == 40
  joined = continuous.stats()
  assert joined["active_slot_steps"] > joined["steps"]  # some steps decoded both
  long = long.result(60)
  assert continuous.stats()["steps"] - steps_before < 40 + 6  # the short one rode along, it did not queue
  for result, prompt, n in ((long, PROMPTS[0], 40), (short, PROMPTS[2], 6)):
    alone = _alone(decoder, prompt, n)
    assert result.text == alone.text and result.completion_tokens == alone.completion_tokens


@pytest.mark.slow
def test_greedy_matches_the_batch_sampler_for_mixed_lengths(decoder, continuous):
  futures = [continuous.submit(GenerationRequest(p, max_tokens=10, temperature=0.0)) for p in PROMPTS]
  batch = Engine(decoder, max_batch=4, max_new_tokens=48).generate(
      [GenerationRequest(p, max_tokens=10, temperature=0.0) for p in PROMPTS])
  assert [f.result(60).text for f in futures] == [b.text for b in batch]


@pytest.mark.slow
def test_logprobs_are_the_models_own(decoder, continuous):
  result = continuous.submit(GenerationRequest(PROMPTS[0], max_tokens=8, temperature=1.0, echo=True, seed=3)
                             ).result(60)
  ids = np.asarray(result.prompt_ids + result.tokens)
  logits = decoder.model(jnp.asarray(ids[None]))[0]
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  p = len(result.prompt_ids)
  want = logp[np.arange(len(ids) - 1), ids[1:]]
  np.testing.assert_allclose(result.prompt_logprobs[0], want[:p - 1], atol=1e-4)
  np.testing.assert_allclose(result.token_logprobs, want[p - 1:], atol=1e-4)
  top_ids, top_lps = result.top_logprobs[0]
  np.testing.assert_allclose(top_lps[:5], np.sort(logp[p - 1])[::-1][:5], atol=1e-4)
  assert top_ids[0] == int(np.argmax(logp[p - 1]))


@pytest.mark.slow
def test_choose_rows_applies_each_rows_settings():
  logits = jnp.asarray(np.random.RandomState(0).randn(4, 50).astype(np.float32))
  keys = jax.random.split(jax.random.key(0), 4)
  tokens, lps, _, _ = choose_rows(logits, keys, jnp.asarray([0.0, 1.0, 1.0, 5.0]), jnp.asarray([1.0, 1.0, 1e-6, 1.0]),
                                  jnp.asarray([0, 1, 0, 0]))
  best = np.argmax(np.asarray(logits), axis=-1)
  assert tokens[0] == best[0] and tokens[1] == best[1] and tokens[2] == best[2]  # greedy, top-k 1, tiny top-p
  np.testing.assert_allclose(lps, np.asarray(jax.nn.log_softmax(logits))[np.arange(4), np.asarray(tokens)], atol=1e-6)


def test_completions_logprobs_echo_and_n(text_server):
  client = openai.OpenAI(base_url=text_server.url + "/v1", api_key="none")
  out = client.completions.create(model="tiny-decoder", prompt=PROMPTS[0], max_tokens=5, temperature=1.0, n=3,
                                  logprobs=2)
  assert len(out.choices) == 3 and all(len(c.logprobs.tokens) == c.logprobs.text_offset.__len__() for c in out.choices)
  assert all(len(c.logprobs.top_logprobs[0]) == 2 for c in out.choices)
  scored = httpx.post(text_server.url + "/v1/completions", timeout=60, json={
      "model": "tiny-decoder", "prompt": PROMPTS[0], "max_tokens": 0, "echo": True, "logprobs": 0}).json()
  lp = scored["choices"][0]["logprobs"]
  assert scored["choices"][0]["text"] == PROMPTS[0] and lp["token_logprobs"][0] is None
  assert len(lp["token_logprobs"]) == scored["usage"]["prompt_tokens"] and scored["usage"]["completion_tokens"] == 0
  bad = httpx.post(text_server.url + "/v1/completions", timeout=60,
                   json={"model": "tiny-decoder", "prompt": "x", "max_tokens": 0})
  assert bad.status_code == 400 and "echo" in bad.text


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streaming_sends_tokens_as_they_decode(text_server, endpoint):
  if endpoint == "chat":
    url, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPTS[0]}]}
    text_of = lambda c: c["delta"].get("content", "")
  else:
    url, body = "/v1/completions", {"prompt": PROMPTS[0]}
    text_of = lambda c: c["text"]
  body.update(model="tiny-decoder", max_tokens=12, temperature=0.0)
  whole = httpx.post(text_server.url + url, json=body, timeout=60).json()
  chunks = []
  with httpx.stream("POST", text_server.url + url, json={**body, "stream": True}, timeout=60) as r:
    for line in r.iter_lines():
      if line.startswith("data: ") and line != "data: [DONE]":
        chunks.append(json.loads(line[6:]))
  texts = [text_of(c["choices"][0]) for c in chunks if c["choices"][0]["finish_reason"] is None]
  whole_text = whole["choices"][0]["message"]["content"] if endpoint == "chat" else whole["choices"][0]["text"]
  assert "".join(texts) == whole_text
  # a chunk per decoded token, except tokens that add no text yet (a character's first bytes, a special token)
  assert 1 < len(texts) <= whole["usage"]["completion_tokens"]
  assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_chat_logprobs_in_openai_form(text_server):
  client = openai.OpenAI(base_url=text_server.url + "/v1", api_key="none")
  out = client.chat.completions.create(model="tiny-decoder", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4, temperature=0.0, logprobs=True, top_logprobs=3, n=2)
  assert len(out.choices) == 2
  content = out.choices[0].logprobs.content
  assert 1 <= len(content) <= 4
  assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)
