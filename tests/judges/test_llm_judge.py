"""LLM judges against a real local OpenAI-compatible HTTP server (`openai_peer.py`), faults included."""

import base64
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from jaxagent import secrets
from jaxagent.agents import base
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.judges import llm
from jaxagent.judges.llm import LLMJudge, LLMJudgeConfig
from jaxagent.types import Action, ActionKind, Step, Task, Trajectory, Verdict
from openai_peer import Peer, PeerState

KEY = "sk-jaxagent-test-0123456789abcdef"


def _png(path, value, size=8):
  path.write_bytes(base.png_bytes(np.full((size, size, 3), value, np.uint8)))


def _webvoyager_traj(i, answer, tmp_path, n_steps=4):
  """A trajectory whose last step answers `answer` (None: the episode did not end with ANSWER)."""
  task = Task(id=f"t{i}", intent=f"Find item {i}", site="shop", start_url="http://127.0.0.1/")
  steps = []
  for s in range(n_steps):
    name = f"wv_{i}_{s}.png"
    if not (tmp_path / name).exists():
      _png(tmp_path / name, (i * 7 + s * 31) % 256)
    last = s == n_steps - 1
    action = Action(ActionKind.ANSWER, text=answer) if last and answer is not None else Action(ActionKind.CLICK, element=s)
    steps.append(Step(step=s, action=action, image_path=name, action_text="..."))
  return task, Trajectory(task=task, steps=steps)


def _config(peer, tmp_path, **kw):
  d = dict(base_url=peer.base_url, model="judge-model", api_key_env="JAXAGENT_TEST_KEY", image_root=str(tmp_path),
           backoff_initial_s=0.01, backoff_max_s=0.05, timeout_s=5.0, max_retries=5, concurrency=8)
  d.update(kw)
  return LLMJudgeConfig(**d)


@pytest.fixture(autouse=True)
def _key(monkeypatch):
  monkeypatch.setenv("JAXAGENT_TEST_KEY", KEY)


def test_verdict_parsing_is_the_originals():
  assert llm.parse_webvoyager_verdict("... NOT SUCCESS").success == 0.0
  assert llm.parse_webvoyager_verdict("Verdict: SUCCESS").success == 1.0
  assert llm.parse_webvoyager_verdict("NOT SUCCESS, well, SUCCESS").success == 0.0  # NOT SUCCESS checked first
  unjudged = llm.parse_webvoyager_verdict("cannot tell")
  assert unjudged.success is None and "neither SUCCESS nor NOT SUCCESS" in unjudged.reason
  assert llm.parse_digirl_status("Q: x\nA: y\nStatus: success").success == 1.0
  assert llm.parse_digirl_status("Status: failure").success == 0.0
  assert llm.parse_digirl_status("no status").success == 0.0


def test_webvoyager_protocol_over_http(tmp_path):
  with Peer() as peer:
    judge = LLMJudge(_config(peer, tmp_path))
    cases = [("the price is correct", 1.0), ("wrong page", 0.0), ("unsure", None), (None, 0.0)]
    verdicts = [judge.evaluate(*_webvoyager_traj(i, a, tmp_path)) for i, (a, _) in enumerate(cases)]
    assert [v.success for v in verdicts] == [c[1] for c in cases]
    assert "no ANSWER" in verdicts[3].reason  # scored 0 without asking, as auto_eval.py does
    assert len(peer.state.bodies) == 3
    body = peer.state.bodies[0]
    assert (body["model"], body["temperature"], body["seed"], body["max_tokens"]) == ("judge-model", 0.0, 42, 1000)
    assert body["messages"][0] == {"role": "system", "content": P.AUTO_EVAL_SYSTEM_PROMPT}
    parts = body["messages"][1]["content"]
    assert parts[0] == {"type": "text", "text": "TASK: Find item 0\nResult Response: the price is correct\n"
                                                 "3 screenshots at the end: "}
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url", "image_url", "text"]
    assert parts[-1] == {"type": "text", "text": "Your verdict:\n"}
    shown = [np.asarray(Image.open(io.BytesIO(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))))[0, 0, 0]
             for p in parts[1:4]]
    assert shown == [31, 62, 93]  # the LAST 3 of the 4 screenshots, in order
    assert peer.state.auth_headers == {f"Bearer {KEY}"}
  s = judge.stats
  assert (s.requests, s.api_calls, s.cache_hits, s.retries, s.failures) == (3, 3, 0, {}, {})
  assert s.prompt_tokens > 0 and s.completion_tokens > 0
  assert s.cost_usd == pytest.approx(s.prompt_tokens / 1000 * 0.01 + s.completion_tokens / 1000 * 0.03)
  assert s.verdicts == {"success": 1, "failure": 2, "unjudged": 1}


def test_cache_makes_rejudging_free(tmp_path):
  cache = tmp_path / "cache"
  pairs = [_webvoyager_traj(i, "correct" if i % 2 else "wrong", tmp_path) for i in range(6)]
  with Peer() as peer:
    first = LLMJudge(_config(peer, tmp_path, cache_dir=str(cache))).evaluate_many(pairs)
    calls = len(peer.state.bodies)
    again = LLMJudge(_config(peer, tmp_path, cache_dir=str(cache)))
    second = again.evaluate_many(pairs)
    assert len(peer.state.bodies) == calls == 6  # nothing new reached the server
    assert first == second == [Verdict(float(i % 2), "judge: " + ("SUCCESS" if i % 2 else "NOT SUCCESS"))
                               for i in range(6)]
    assert (again.stats.cache_hits, again.stats.api_calls, again.stats.prompt_tokens) == (6, 0, 0)
    # A different screenshot is a different request: a miss.
    _png(tmp_path / "wv_0_3.png", 200)
    again.evaluate(*pairs[0])
    assert again.stats.api_calls == 1 and len(peer.state.bodies) == 7
  entries = [os.path.join(r, n) for r, _, names in os.walk(cache) for n in names]
  assert len(entries) == 7 and not any(n.endswith(".tmp") for n in entries)
  for path in entries:
    with open(path, encoding="utf-8") as f:
      entry = json.load(f)
    assert set(entry) == {"content", "prompt_tokens", "completion_tokens", "model"} and KEY not in json.dumps(entry)


@pytest.mark.slow
def test_fault_injection_every_trajectory_judged_or_unjudged(tmp_path):
  state = PeerState(fault_rate=0.35, seed=1234, timeout_sleep=2.0)
  expected = {}
  pairs = []
  for i in range(200):
    answer = "correct" if i % 3 == 0 else "wrong" if i % 3 == 1 else "unsure"
    expected[i] = {"correct": 1.0, "wrong": 0.0, "unsure": None}[answer]
    pairs.append(_webvoyager_traj(i, answer, tmp_path, n_steps=2))
  with Peer(state) as peer:
    # A deadline far from the retries' own time: this test counts attempts (the deadline has its own test in
    # test_judge_faults.py), and 4 × timeout_s ran out after one slow attempt on a loaded machine.
    judge = LLMJudge(_config(peer, tmp_path, timeout_s=1.0, max_retries=4, deadline_s=60.0))
    verdicts = judge.evaluate_many(pairs)
  s = judge.stats
  assert len(verdicts) == 200
  unjudged_by_api = 0
  for i, v in enumerate(verdicts):
    assert isinstance(v, Verdict) and v.reason
    if v.reason.startswith("unjudged:"):
      unjudged_by_api += 1
      assert v.success is None and "gave up after 5 attempts" in v.reason
    else:
      assert v.success == expected[i], (i, v)
  assert sum(s.verdicts.values()) == 200
  assert sum(s.failures.values()) == unjudged_by_api
  assert set(s.retries) == {"429", "5xx", "timeout", "malformed"}, s.retries
  assert s.api_calls == 200 + sum(s.retries.values())
  # The server saw every call, except that on a loaded machine a call can time out on the client before the
  # server's handler thread has read it (the server then never counts it): only timeouts may go missing.
  server_calls = sum(state.outcomes.values())
  assert s.api_calls - s.retries.get("timeout", 0) - unjudged_by_api <= server_calls <= s.api_calls
  # Every injected fault cost a retry or ended in "unjudged" (on a loaded machine a slow "ok" may time out too).
  server_faults = sum(n for outcome, n in state.outcomes.items() if outcome != "ok")
  assert 0 < server_faults <= sum(s.retries.values()) + unjudged_by_api
  json.dumps(s.as_dict())  # the stats are loggable as they are


def test_key_never_leaks(tmp_path):
  state = PeerState(auth_echo=True)  # the server puts the key it received into its error message
  with Peer(state) as peer:
    judge = LLMJudge(_config(peer, tmp_path, cache_dir=str(tmp_path / "cache")))
    v = judge.evaluate(*_webvoyager_traj(0, "correct", tmp_path))
  assert v.success is None and v.reason.startswith("unjudged: http_401")
  assert secrets.REDACTED in v.reason and KEY not in v.reason
  assert judge.stats.api_calls == 1 and judge.stats.failures == {"http_401": 1}  # 4xx: no retries
  assert KEY not in json.dumps(judge.stats.as_dict()) and KEY not in repr(judge.config)
  for root, _, files in os.walk(tmp_path):  # screenshots, and the (empty) cache: nothing holds the key
    for name in files:
      with open(os.path.join(root, name), "rb") as f:
        assert KEY.encode() not in f.read(), name


def test_logging_filter_redacts(tmp_path):
  import logging  # pylint: disable=g-import-not-at-top

  secrets.register_secret(KEY)
  stream = io.StringIO()
  handler = logging.StreamHandler(stream)
  handler.addFilter(secrets.RedactingFilter())
  logger = logging.getLogger("jaxagent.test_redaction")
  logger.addHandler(handler)
  try:
    logger.error("request with %s failed", KEY)
  finally:
    logger.removeHandler(handler)
  assert stream.getvalue() == f"request with {secrets.REDACTED} failed\n"


def test_missing_key_is_named_in_the_reason(tmp_path, monkeypatch):
  monkeypatch.delenv("JAXAGENT_TEST_KEY")
  with Peer(PeerState(auth_echo=True)) as peer:
    v = LLMJudge(_config(peer, tmp_path)).evaluate(*_webvoyager_traj(0, "correct", tmp_path))
  assert v.success is None and "no API key was found: set $JAXAGENT_TEST_KEY" in v.reason


def test_redact_and_key_file(tmp_path, monkeypatch):
  assert secrets.redact(f"call failed: Bearer {KEY}") == f"call failed: Bearer {secrets.REDACTED}"
  assert secrets.redact("key sk-abcdefgh12345678 here") == f"key {secrets.REDACTED} here"
  monkeypatch.delenv("JAXAGENT_OTHER_KEY", raising=False)
  key_file = tmp_path / "key.txt"
  key_file.write_text("file-secret-value-42\n")
  assert secrets.load_api_key("JAXAGENT_OTHER_KEY", str(key_file)) == "file-secret-value-42"
  assert secrets.redact("oops file-secret-value-42") == f"oops {secrets.REDACTED}"
  assert secrets.load_api_key("JAXAGENT_OTHER_KEY", "") is None
  with pytest.raises(ValueError, match="api key file '.*missing.txt' cannot be read.*key_file"):
    secrets.load_api_key("JAXAGENT_OTHER_KEY", str(tmp_path / "missing.txt"))
  with pytest.raises(ValueError, match=r"unknown key\(s\) \['api_key'\]"):
    LLMJudgeConfig.from_config({"api_key": KEY})


def _digirl_traj(task_text, values, tmp_path):
  """Steps s -> s+1 over screens with the given fill values (64x64, so the 1/4 image is 16x16)."""
  for v in set(values):
    if not (tmp_path / f"d{v}.png").exists():
      _png(tmp_path / f"d{v}.png", v, size=64)
  steps = [Step(step=t, image_path=f"d{values[t]}.png", next_image_path=f"d{values[t + 1]}.png")
           for t in range(len(values) - 1)]
  task = Task(id=task_text, intent=task_text, site="launcher", start_url="/", profile="device")
  return task, Trajectory(task=task, steps=steps)


def test_digirl_per_step_protocol(tmp_path):
  with Peer() as peer:
    judge = LLMJudge(_config(peer, tmp_path, protocol="digirl", digirl_task_set="zero_shot"))
    # Step 0 leaves the screen unchanged (no call); step 1 changes it: the judge says success.
    v = judge.evaluate(*_digirl_traj("please succeed", [10, 10, 90, 150], tmp_path))
    assert v == Verdict(1.0, "step 1: judge: Status: success")
    assert len(peer.state.bodies) == 1
    parts = peer.state.bodies[0]["messages"][0]["content"]
    assert parts[0]["text"] == ("You're an expert in evaluating whether the Screenshot successfully completes the "
                                "Task.\n=====Your Turn=====\nScreenshot: ")
    assert parts[2]["text"].startswith("Task: please succeed\nRespond in this format:\nQ: What should I expect")
    img = Image.open(io.BytesIO(base64.b64decode(parts[1]["image_url"]["url"].split(",", 1)[1])))
    assert img.size == (16, 16)  # downscaled 4x, as process_image does
    # A failing task: every new screen is judged once; returning to a seen screen costs no call.
    v = judge.evaluate(*_digirl_traj("do it", [10, 90, 150, 90], tmp_path))
    assert v.success == 0.0 and "step 2: screen seen before" in v.reason
    assert len(peer.state.bodies) == 3
    # Per-step rewards for the RL loop: 0 until the first success, which ends the list.
    rewards = judge.step_rewards(*_digirl_traj("succeed later", [10, 10, 90, 150], tmp_path))
    assert [r.success for r in rewards] == [0.0, 1.0]
    task, traj = _digirl_traj("x", [10, 90], tmp_path)
    traj.steps[0].next_image_path = None
    v = judge.evaluate(task, traj)
    assert v.success is None and "Step.next_image_path" in v.reason


def test_digirl_judges_an_unstored_episode_from_its_observations(tmp_path):
  """The collector judges an episode before the store writes its screenshots: the in-memory screens serve."""
  from jaxagent.types import Observation  # pylint: disable=g-import-not-at-top
  task, traj = _digirl_traj("please succeed", [10, 10, 90], tmp_path)
  screens = [np.full((64, 64, 3), v, np.uint8) for v in (10, 10, 90)]
  for step, screen in zip(traj.steps, screens):
    step.image_path = step.next_image_path = None
    step.observation = Observation(url="", screenshot=screen)
  traj.final_observation = Observation(url="", screenshot=screens[-1])
  with Peer() as peer:
    judge = LLMJudge(_config(peer, tmp_path, protocol="digirl", digirl_task_set="zero_shot"))
    assert [r.success for r in judge.step_rewards(task, traj)] == [0.0, 1.0]  # step 0: unchanged, no call
    assert len(peer.state.bodies) == 1


def test_digirl_step_left_unjudged_when_the_api_fails(tmp_path):
  with Peer(PeerState(fault_rate=1.0, faults=["429"])) as peer:
    judge = LLMJudge(_config(peer, tmp_path, protocol="digirl", max_retries=1))
    rewards = judge.step_rewards(*_digirl_traj("please succeed", [10, 90, 150], tmp_path))
    assert [r.success for r in rewards] == [None, None] and "gave up after 2 attempts" in rewards[0].reason
    v = judge.evaluate(*_digirl_traj("please succeed", [10, 90, 150], tmp_path))
    assert v.success is None and judge.stats.retries == {"429": 4}


def test_unreadable_screenshot_is_unjudged(tmp_path):
  task, traj = _webvoyager_traj(0, "correct", tmp_path)
  traj.steps[-1].image_path = "does_not_exist.png"
  with Peer() as peer:
    v = LLMJudge(_config(peer, tmp_path)).evaluate(task, traj)
    assert v.success is None and "does_not_exist.png" in v.reason and not peer.state.bodies


# DigiRL's evaluate.py (commit c74ec34): (screenshot, Task, Status) of each exemplar, in the original's order.
GENERAL = [
    ("screenshot_menu.png", "Open the settings.", "failure"),
    ("screenshot_hotel.png", "Find hotels in washington dc", "failure"),
    ("screenshot_restaurant.png", "What's a good restaurant in Portland?", "success"),
    ("screenshot_foodmenu.png", "What's on the menu at In-N-Out?", "failure"),
    ("screenshot_news.png", "What's the news in Suriname?", "failure"),
    ("screenshot_weather.png", "What's the weather like in Chicago?", "failure"),
    ("screenshot_alarm.png", "Set an alarm for 6pm.", "failure"),
    ("screenshot_frenchnews_blocked.png", "What's the news in French today?", "failure"),
    ("screenshot_frenchnews_okay.png", "What's the news in French today?", "success"),
]
WEBSHOP = [
    ("step1_bestbuy.png", "Go to bestbuy.com", "failure"),
    ("step1_costco.png", "Go to costco.com", "success"),
    ("step2_bestbuy.png", 'Go to bestbuy.com, search for "macbook"', "failure"),
    ("step2_ebay.png", 'Go to ebay.com, search for "corsair k70"', "failure"),
    ("step2_walmart.png", 'Go to walmart.com, search for "macbook air"', "failure"),
    ("step2_walmart2.png", 'Go to walmart.com, search for "razer huntsman"', "failure"),
    ("step2_ebay2.png", 'Go to ebay.com, search for "lenovo thinkpad"', "success"),
    ("step3_ebay.png", 'Go to ebay.com, search for "razer thresher", select the first entry', "failure"),
    ("step3_target.png", 'Go to target.com, search for "razer kraken", and select the first entry', "failure"),
    ("step3_ebay2.png", 'Go to ebay.com, search for "acer predator", and select the first entry', "failure"),
    ("step3_bestbuy.png", 'Go to bestbuy.com, search for "macbook", select the first entry', "success"),
]
SYSTEM = "You're an expert in evaluating whether the Screenshot successfully completes the Task."


def _check_few_shot_parts(parts, expected, intent, image_of):
  """`parts`: the user message's parts (either form); `image_of(part)` -> PIL image. The layout is
  call_gemini's: system+Examples, then (\nScreenshot:, image, text) per exemplar, then the Your-Turn block."""
  n = len(expected)
  assert len(parts) == 1 + 3 * n + 4
  assert parts[0] == {"type": "text", "text": SYSTEM + "\n=====Examples====="}
  for i, (name, task, status) in enumerate(expected):
    head, img, text = parts[1 + 3 * i: 4 + 3 * i]
    assert head == {"type": "text", "text": "\nScreenshot:"}
    assert text["type"] == "text" and text["text"].startswith(f"Task: {task}\nQ: What should I expect to see on")
    lines = text["text"].split("\n")
    assert len(lines) == 4 and lines[2].startswith("A: I should expect to see") and lines[3] == f"Status: {status}"
    shown = image_of(img)
    assert shown.size == (270, 570)  # 1080x2280 downscaled 4x, as process_image sends it
    with Image.open(os.path.join(llm.DIGIRL_ASSETS, name)) as bundled:
      assert np.array_equal(np.asarray(shown), np.asarray(bundled)), name
  tail = parts[1 + 3 * n:]
  assert tail[0] == {"type": "text", "text": "=====Your Turn====="}
  assert tail[1] == {"type": "text", "text": "\nScreenshot: "}
  assert tail[3]["type"] == "text" and tail[3]["text"] == (
      f"Task: {intent}\nRespond in this format:\nQ: What should I expect to see on the screenshot if I've <repeat "
      "the task>?\nA: I should expect to see <first expectation, then what's in the given screenshot.>\nStatus: "
      "success or failure (don't return anything else)\nStart with \"Q:\".")
  return image_of(tail[2])


def test_digirl_few_shot_messages_are_the_originals():
  current = np.full((8, 8, 3), 77, np.uint8)
  for task_set, expected in (("general", GENERAL), ("webshop", WEBSHOP)):
    messages = llm.digirl_messages("Open Chrome", current, task_set)
    assert len(messages) == 1 and messages[0]["role"] == "user"
    parts = messages[0]["content"]
    assert [p["type"] for p in parts].count("image") == len(expected) + 1
    assert len(llm.DIGIRL_EXEMPLARS[task_set]) == len(expected)

    def image_of(part):
      assert part["type"] == "image"
      return Image.open(part["image"]) if isinstance(part["image"], str) else Image.fromarray(part["image"])

    shown = _check_few_shot_parts(parts, expected, "Open Chrome", image_of)
    assert np.asarray(shown)[0, 0, 0] == 77  # the current screenshot comes last
  assert len(GENERAL) == 9 and len(WEBSHOP) == 11
  # Verbatim, typos included (a few spot checks beyond the Task/Status lines checked above).
  general = {e.image: e.text for e in llm.DIGIRL_GENERAL_EXEMPLARS}
  webshop = {e.image: e.text for e in llm.DIGIRL_WEBSHOP_EXEMPLARS}
  assert general["screenshot_restaurant.png"].endswith('"Li Pigeon", "Portland City Grill", and "Higgins",\n'
                                                       "Status: success")
  assert "I'm in the eBay ebay website with some search suggestions" in webshop["step2_ebay.png"]
  assert ('search results for "razer huntsman". The screenshot shows I\'m in Google search'
          in webshop["step2_walmart.png"])
  assert len(set(general.values())) == 9 and len(set(webshop.values())) == 11
  # The zero-shot prompt is the earlier simplified one.
  zero = llm.digirl_messages("Open Chrome", current, "zero_shot")[0]["content"]
  assert [p["type"] for p in zero] == ["text", "image", "text"]
  assert zero[0]["text"] == SYSTEM + "\n=====Your Turn=====\nScreenshot: "
  assert llm.digirl_messages("x", current)[0]["content"][0]["text"].endswith("=====Examples=====")  # default: general
  with pytest.raises(ValueError, match="task_set 'shopping' is unknown; allowed values: 'general', 'webshop', "
                                       "'zero_shot'"):
    llm.digirl_messages("x", current, "shopping")


def test_digirl_task_set_is_validated():
  assert LLMJudgeConfig().digirl_task_set == "general"
  assert LLMJudgeConfig.from_config({"protocol": "digirl", "digirl_task_set": "webshop"}).digirl_task_set == "webshop"
  msg = r"LLMJudgeConfig.digirl_task_set 'Webshop' is unknown; allowed values: 'general', 'webshop', 'zero_shot'"
  with pytest.raises(ValueError, match=msg):
    LLMJudgeConfig(protocol="digirl", digirl_task_set="Webshop")
  with pytest.raises(ValueError, match=msg):
    LLMJudgeConfig.from_config({"protocol": "digirl", "digirl_task_set": "Webshop"})


def test_bundled_exemplar_screenshots():
  names = sorted(os.listdir(llm.DIGIRL_ASSETS))
  pngs = [n for n in names if n.endswith(".png")]
  assert sorted(pngs) == sorted(n for n, _, _ in GENERAL + WEBSHOP)
  assert sum(os.path.getsize(os.path.join(llm.DIGIRL_ASSETS, n)) for n in names) < 1.5e6
  with open(os.path.join(llm.DIGIRL_ASSETS, "README.txt"), encoding="utf-8") as f:
    notice = f.read()
  assert "github.com/DigiRL-agent/digirl" in notice and "c74ec34029eb5092bf17a64211f2d0284c7d1ba8" in notice
  assert "Apache License 2.0" in notice and "LICENSE.txt" in names


def test_digirl_few_shot_over_http(tmp_path):

  def image_of(part):
    assert part["type"] == "image_url"
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))

  with Peer() as peer:
    judge = LLMJudge(_config(peer, tmp_path, protocol="digirl"))  # the default task set: "general"
    # Three changed screens; the first is judged a success, which ends the judging: one request only.
    rewards = judge.step_rewards(*_digirl_traj("please succeed", [10, 90, 150, 200], tmp_path))
    assert rewards == [Verdict(1.0, "step 0: judge: Status: success")]
    assert len(peer.state.bodies) == 1
    messages = peer.state.bodies[0]["messages"]
    assert len(messages) == 1 and messages[0]["role"] == "user"
    parts = messages[0]["content"]
    assert [p["type"] for p in parts].count("image_url") == 10
    shown = _check_few_shot_parts(parts, GENERAL, "please succeed", image_of)
    assert shown.size == (16, 16) and np.asarray(shown)[0, 0, 0] == 90  # the new screen of step 0, downscaled 4x
    # The webshop set over the same wire: its 11 exemplars' screenshots; a failure on every new screen.
    shop = LLMJudge(_config(peer, tmp_path, protocol="digirl", digirl_task_set="webshop"))
    v = shop.evaluate(*_digirl_traj("do it", [10, 90, 150], tmp_path))
    assert v.success == 0.0 and "step 1: judge: Status: failure" in v.reason
    assert len(peer.state.bodies) == 3
    shown = _check_few_shot_parts(peer.state.bodies[2]["messages"][0]["content"], WEBSHOP, "do it", image_of)
    assert np.asarray(shown)[0, 0, 0] == 150


@pytest.mark.parametrize("key, value, rule", [("timeout_s", -1.0, "a number > 0"),
                                              ("max_retries", "3", "an integer >= 0"),
                                              ("concurrency", 0, "an integer >= 1")])
def test_a_bad_judge_setting_is_refused_at_construction_naming_the_key_and_the_fix(key, value, rule):
  with pytest.raises(ValueError, match=rf"LLMJudgeConfig: {key}={value!r} must be {rule} .*; set {key}="):
    LLMJudgeConfig(**{key: value})
  with pytest.raises(ValueError, match=rf"LLM judge config: {key}={value!r} must be {rule} .*; set {key}="):
    LLMJudge({key: value})


def test_each_protocol_has_its_module_and_llm_keeps_their_names():
  from jaxagent.judges import digirl, digirl_prompts, webvoyager
  assert llm.parse_webvoyager_verdict is webvoyager.parse_webvoyager_verdict
  assert llm.webvoyager_messages is webvoyager.webvoyager_messages
  assert llm.digirl_messages is digirl.digirl_messages and llm.parse_digirl_status is digirl.parse_digirl_status
  assert llm.DIGIRL_EXEMPLARS is digirl_prompts.DIGIRL_EXEMPLARS and os.path.isdir(llm.DIGIRL_ASSETS)
  assert llm.PROTOCOLS == ("webvoyager", "digirl")
