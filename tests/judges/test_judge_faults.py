"""No verdict lost for good: the LLM judge over real HTTP to a real local server that injects faults
(`fault_server.py`): error statuses, bodies that are not JSON or not a completion, empty replies, resets,
stalls and trickles, and cache files of the wrong shape. A fault leaves a verdict unjudged, never wrong, never
cached, never raised; asking again on a healthy server gets the real verdict."""

import json
import logging
import os
import random
import time

import numpy as np
import pytest

from jaxagent.agents import base
from jaxagent.judges.llm import LLMJudge, LLMJudgeConfig
from jaxagent.types import Action, ActionKind, Step, Task, Trajectory
from fault_server import FaultServer, FaultState

KEY = "sk-jaxagent-test-fault-0123456789"


@pytest.fixture(autouse=True)
def _key(monkeypatch):
  monkeypatch.setenv("JAXAGENT_TEST_KEY", KEY)


def _png(path, value, size=8):
  if not path.exists():
    path.write_bytes(base.png_bytes(np.full((size, size, 3), value, np.uint8)))


def _wv(i, answer, tmp_path):
  """A WebVoyager trajectory of two steps whose last one answers `answer` ("correct" -> 1, "wrong" -> 0)."""
  task = Task(id=f"t{i}", intent=f"Find item {i}", site="shop", start_url="http://127.0.0.1/")
  steps = []
  for s in range(2):
    _png(tmp_path / f"f_{i}_{s}.png", (i * 7 + s * 31) % 256)
    action = Action(ActionKind.ANSWER, text=answer) if s == 1 else Action(ActionKind.CLICK, element=s)
    steps.append(Step(step=s, action=action, image_path=f"f_{i}_{s}.png", action_text="..."))
  return task, Trajectory(task=task, steps=steps)


def _digirl(intent, values, tmp_path):
  """DigiRL steps s -> s+1 over 64x64 screens of the given fill values."""
  for v in set(values):
    _png(tmp_path / f"d{v}.png", v, size=64)
  steps = [Step(step=t, image_path=f"d{values[t]}.png", next_image_path=f"d{values[t + 1]}.png")
           for t in range(len(values) - 1)]
  task = Task(id=intent, intent=intent, site="launcher", start_url="/", profile="device")
  return task, Trajectory(task=task, steps=steps)


def _config(server, tmp_path, **kw):
  d = dict(base_url=server.base_url, model="judge-model", api_key_env="JAXAGENT_TEST_KEY",
           image_root=str(tmp_path), cache_dir=str(tmp_path / "cache"), backoff_initial_s=0.01,
           backoff_max_s=0.02, timeout_s=5.0, max_retries=0, concurrency=8)
  d.update(kw)
  return LLMJudgeConfig(**d)


def _cache_entries(tmp_path):
  root = tmp_path / "cache"
  return sorted(os.path.join(r, n) for r, _, names in os.walk(root) for n in names)


def _contents(tmp_path):
  out = []
  for path in _cache_entries(tmp_path):
    with open(path, encoding="utf-8") as f:
      out.append(json.load(f)["content"])
  return out


# ---------------------------------------------------------------- (a) a reply that is no verdict is not cached


@pytest.mark.parametrize("fault", ["empty", "blank", "garbage"])
def test_non_verdict_reply_is_not_cached(tmp_path, fault):
  with FaultServer(FaultState(script=[fault])) as server:
    first = LLMJudge(_config(server, tmp_path)).evaluate(*_wv(0, "correct", tmp_path))
    assert first.success is None  # no retries allowed: unjudged, with the reason
    assert _contents(tmp_path) == []  # and nothing cached
    again = LLMJudge(_config(server, tmp_path)).evaluate(*_wv(0, "correct", tmp_path))
    assert again.success == 1.0 and len(server.state.log) == 2  # asked again: the real verdict
    cached = LLMJudge(_config(server, tmp_path))
    assert cached.evaluate(*_wv(0, "correct", tmp_path)).success == 1.0 and len(server.state.log) == 2
    assert cached.stats.cache_hits == 1


def test_empty_reply_is_retried_and_the_real_one_cached(tmp_path):
  with FaultServer(FaultState(script=["empty", "blank"])) as server:
    judge = LLMJudge(_config(server, tmp_path, max_retries=3))
    assert judge.evaluate(*_wv(0, "wrong", tmp_path)).success == 0.0
    assert [o for o, _ in server.state.log] == ["empty", "blank", "ok"]
    assert judge.stats.retries == {"empty": 2} and judge.stats.failures == {}
    assert _contents(tmp_path) == ["The answer contradicts the screenshot. Verdict: NOT SUCCESS"]


# --------------------------------------------------------- (b) a cache file of the wrong shape is a miss, replaced

BAD_ENTRIES = [b"[]", b'["content", "x"]', b"{}", b'{"prompt_tokens": 3}', b'{"content": 5}', b'{"content": null}',
               b'{"content": ["SUCCESS"]}', b'"Verdict: SUCCESS"', b"null", b"42", b'{"content": "Verd', b"",
               b"\xff\xfe\x00garbage", b'{"content": ""}', b'{"content": "As an AI language model I"}']


@pytest.mark.slow  # over 2 s alone
def test_wrong_shape_cache_files_are_misses_and_replaced(tmp_path, caplog):
  with FaultServer() as server:
    pair = _wv(0, "correct", tmp_path)
    assert LLMJudge(_config(server, tmp_path)).evaluate(*pair).success == 1.0
    [path] = _cache_entries(tmp_path)
    with open(path, "rb") as f:
      good = json.loads(f.read())
    for n, bad in enumerate(BAD_ENTRIES, start=2):
      with open(path, "wb") as f:
        f.write(bad)
      caplog.clear()
      with caplog.at_level(logging.WARNING):
        v = LLMJudge(_config(server, tmp_path)).evaluate(*pair)
      assert v.success == 1.0, (bad, v)
      assert len(server.state.log) == n, bad  # a miss: asked again
      assert any(path in r.getMessage() for r in caplog.records), (bad, caplog.text)
      with open(path, encoding="utf-8") as f:
        assert json.load(f) == good, bad  # overwritten by the good reply
    # A cache slot that cannot be written (a directory squats on it): the verdict is still given.
    os.remove(path)
    os.makedirs(path)
    with caplog.at_level(logging.WARNING):
      v = LLMJudge(_config(server, tmp_path)).evaluate(*pair)
    assert v.success == 1.0 and path in caplog.text


# ------------------------------------------------------------- (c) DigiRL: a failing step is unjudged, never 0.0


@pytest.mark.parametrize("fault", ["empty", "blank", "garbage"])
def test_digirl_failing_step_leaves_the_episode_unjudged(tmp_path, fault):
  with FaultServer(FaultState(script=[fault])) as server:
    judge = LLMJudge(_config(server, tmp_path, protocol="digirl", digirl_task_set="zero_shot"))
    pair = _digirl("do it", [10, 90, 150], tmp_path)  # the healthy judge says failure on both new screens
    v = judge.evaluate(*pair)
    assert v.success is None and "step 0: " in v.reason, v
    assert len(server.state.log) == 2  # step 1 is still judged
    again = LLMJudge(_config(server, tmp_path, protocol="digirl", digirl_task_set="zero_shot"))
    assert [r.success for r in again.step_rewards(*pair)] == [0.0, 0.0]  # asked again: the real verdicts
    assert again.evaluate(*pair).success == 0.0
    assert len(server.state.log) == 3  # step 0 asked again once; step 1's verdict came from the cache
    # A success task whose first judged step fails: that step is unjudged, the success still counts.
    server.state.script.append(fault)
    rewards = again.step_rewards(*_digirl("please succeed", [10, 90, 150], tmp_path))
    assert [r.success for r in rewards] == [None, 1.0]


# ------------------------------------------------------------- (d) a trickling server cannot hold a call


@pytest.mark.slow
def test_trickling_server_is_cut_off_at_timeout(tmp_path):
  state = FaultState(fault_rate=1.0, faults=["trickle"], trickle_interval=0.5, trickle_s=6.0)
  with FaultServer(state) as server:
    judge = LLMJudge(_config(server, tmp_path, timeout_s=1.0))
    t0 = time.monotonic()
    v = judge.evaluate(*_wv(0, "correct", tmp_path))
    took = time.monotonic() - t0
    assert v.success is None and "timeout" in v.reason and took < 2.0, (took, v)
    # Retries included, the whole call ends by its deadline.
    judge = LLMJudge(_config(server, tmp_path, timeout_s=1.0, max_retries=50, deadline_s=2.0))
    t0 = time.monotonic()
    v = judge.evaluate(*_wv(1, "correct", tmp_path))
    took = time.monotonic() - t0
    assert v.success is None and "deadline" in v.reason and took < 2.8, (took, v)
    assert judge.stats.failures == {"timeout": 1} and _contents(tmp_path) == []
    # The default deadline is a few attempts' worth: 50 retries of 0.5 s each cannot hold a call for 25 s.
    judge = LLMJudge(_config(server, tmp_path, timeout_s=0.5, max_retries=50))
    t0 = time.monotonic()
    v = judge.evaluate(*_wv(2, "correct", tmp_path))
    assert v.success is None and time.monotonic() - t0 < 3.0


# ------------------------------------------------ (e) the measurement: 40 % faults, then re-judging the lost ones


@pytest.mark.slow
def test_no_verdict_lost_for_good_under_40pc_faults(tmp_path):
  rng = random.Random(7)
  pairs, expected = [], []
  for i in range(200):
    answer = rng.choice(["correct", "wrong"])
    pairs.append(_wv(i, answer, tmp_path))
    expected.append(1.0 if answer == "correct" else 0.0)
  digirl_pairs, digirl_expected = [], []
  for i in range(40):
    # A success task has one step, so a reply taken for a failure shows as a wrong verdict.
    screens = [10 + i, 90 + i] if i % 2 else [10 + i, 90 + i, 150 + i]
    digirl_pairs.append(_digirl(f"please succeed {i}" if i % 2 else f"do it {i}", screens, tmp_path))
    digirl_expected.append(1.0 if i % 2 else 0.0)
  state = FaultState(fault_rate=0.4, seed=2024, timeout_sleep=2.0, trickle_interval=0.2, trickle_s=3.0)
  with FaultServer(state) as server:
    kw = dict(timeout_s=1.0, max_retries=3)
    judge = LLMJudge(_config(server, tmp_path, **kw))
    dj = LLMJudge(_config(server, tmp_path, protocol="digirl", digirl_task_set="zero_shot", **kw))
    first = judge.evaluate_many(pairs)
    dfirst = dj.evaluate_many(digirl_pairs)
    calls = judge.stats.requests + dj.stats.requests
    outcomes = dict(state.outcomes)
    faults = sum(n for o, n in outcomes.items() if o != "ok")
    attempts = sum(outcomes.values())
    verdicts, truth = first + dfirst, expected + digirl_expected
    unjudged = [i for i, v in enumerate(verdicts) if v.success is None]
    wrong = [i for i, v in enumerate(verdicts) if v.success is not None and v.success != truth[i]]
    # Re-judge the unjudged ones on a healthy server, with new judges sharing the cache (a resumed run).
    state.fault_rate = 0.0
    rejudge = LLMJudge(_config(server, tmp_path, **kw))
    drejudge = LLMJudge(_config(server, tmp_path, protocol="digirl", digirl_task_set="zero_shot", **kw))
    everything = pairs + digirl_pairs
    final = list(verdicts)
    for i in unjudged:
      final[i] = (rejudge if i < len(pairs) else drejudge).evaluate(*everything[i])
  lost = [i for i, v in enumerate(final) if v.success != truth[i]]
  print(f"\njudge calls {calls} (HTTP attempts {attempts}, faults injected {faults}: {outcomes}); "
        f"verdicts {len(verdicts)}: first pass unjudged {len(unjudged)}, wrong {len(wrong)}; "
        f"lost for good after re-judging {len(lost)}")
  assert calls >= 200 and faults >= 0.3 * attempts
  assert wrong == [], [(i, verdicts[i]) for i in wrong]
  assert lost == [], [(i, final[i]) for i in lost]
  assert all(c.strip() for c in _contents(tmp_path))
