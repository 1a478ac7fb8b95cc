"""TrajectoryStore: lossless round trip, filters, crash safety (SIGKILLed writers)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from jaxagent import types
from jaxagent.data import store as store_lib


def _shot(seed, h=24, w=32):
  return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _traj(i, n_steps=3, success=None):
  task = types.Task(id=f"task-{i}", intent=f"click {i}", site="miniwob", start_url="http://x/", max_steps=5,
                    evaluator={"kind": "url_match", "url": "/done"}, allowed_origins=("http://x",), seed=i)
  steps = []
  for t in range(n_steps):
    obs = types.Observation(
        url=f"http://x/{t}", intent=task.intent, step=t, screenshot=_shot(100 * i + t),
        elements=[types.Element(1, "button", "OK", (1.0, 2.0, 3.0, 4.0), "button", {"id": "ok"})],
        a11y_tree="[1] button 'OK'", a11y_nodes={1: {"text": "OK", "union_bound": [1, 2, 3, 4]}},
        viewport=(160, 210), error="" if t else "previous action invalid")
    steps.append(types.Step(step=t, obs_text=f"prompt {t}", action_text=f"Click [{t}]",
                            action=types.Action(types.ActionKind.CLICK, element=t), reward=float(t == n_steps - 1),
                            done=t == n_steps - 1, mc_return=0.5 ** (n_steps - 1 - t), url=f"http://x/{t}",
                            info={"score": np.float32(0.25), "ids": np.arange(2)}, observation=obs,
                            candidates=["a", "b"] if t == 0 else None, logprob=-1.5))
  final = types.Observation(url="http://x/end", screenshot=_shot(100 * i + 99))
  return types.Trajectory(task, steps, success=success, verdict_reason="r", answer="", attempts=2,
                          policy="scripted", meta={"note": i}, final_observation=final)


def test_round_trip_keeps_every_field_and_screenshot(tmp_path):
  store = store_lib.TrajectoryStore(tmp_path)
  original = _traj(1, success=1.0)
  episode = store.append(original)
  assert len(store) == 1 and original.meta["episode_id"] == episode
  back = store.read(0)
  assert back.task == original.task
  assert (back.success, back.attempts, back.policy, back.meta["note"]) == (1.0, 2, "scripted", 1)
  for s, o in zip(back.steps, original.steps):
    assert (s.action, s.action_text, s.obs_text, s.reward, s.done, s.mc_return, s.candidates, s.logprob) == (
        o.action, o.action_text, o.obs_text, o.reward, o.done, o.mc_return, o.candidates, o.logprob)
    assert s.info == {"score": 0.25, "ids": [0, 1]}
    assert s.observation.elements == o.observation.elements
    assert s.observation.a11y_nodes == o.observation.a11y_nodes and s.observation.viewport == (160, 210)
    assert s.observation.error == o.observation.error and s.observation.screenshot is None
    np.testing.assert_array_equal(store.load_image(s.image_path), o.observation.screenshot)
  assert [s.next_image_path for s in back.steps[:-1]] == [s.image_path for s in back.steps[1:]]
  np.testing.assert_array_equal(store.load_image(back.steps[-1].next_image_path),
                                original.final_observation.screenshot)
  assert back.final_observation.url == "http://x/end"


def test_filters_by_success_and_predicate(tmp_path):
  store = store_lib.TrajectoryStore(tmp_path)
  for i, success in enumerate([1.0, 0.0, None, 1.0]):
    store.append(_traj(i, n_steps=1, success=success))
  assert store.indices(success=True) == [0, 3]
  assert store.indices(success=False) == [1]
  assert [t.task.id for t in store.filter(where=lambda t: t.success is None)] == ["task-2"]
  assert [t.task.seed for t in store] == [0, 1, 2, 3]


def test_torn_tail_is_invisible_and_cut_by_the_next_writer(tmp_path):
  store = store_lib.TrajectoryStore(tmp_path)
  store.append(_traj(0, n_steps=1))
  with open(tmp_path / "episodes.jsonl", "ab") as f:
    f.write(b'{"id": "half-writt')  # a writer died in the middle of its line
  reader = store_lib.TrajectoryStore(tmp_path)
  assert len(reader) == 1
  store.append(_traj(1, n_steps=1))
  assert len(reader) == 2 and reader.read(1).task.id == "task-1"
  lines = (tmp_path / "episodes.jsonl").read_bytes().splitlines()
  assert [json.loads(x)["task"]["id"] for x in lines] == ["task-0", "task-1"]


_WRITER = textwrap.dedent("""
    import sys
    sys.path[:0] = {path!r}
    sys.path.insert(0, {here!r})
    import test_store
    from jaxagent.data import store as store_lib
    store = store_lib.TrajectoryStore({root!r})
    print("writing", flush=True)
    for i in range(10_000):
      traj = test_store._traj(i, n_steps=4)
      for s in traj.steps:  # big screenshots: the kill lands mid-episode most of the time
        s.observation.screenshot = test_store._shot(i, 300, 400)
      print(store.append(traj), flush=True)
""")


@pytest.mark.slow
def test_sigkilled_writers_never_corrupt_the_store(tmp_path):
  root = tmp_path / "store"
  code = _WRITER.format(path=sys.path, here=os.path.dirname(__file__), root=str(root))
  confirmed, extra_allowed = set(), 0
  for delay in (0.05, 0.2, 0.4):
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "writing\n"
    confirmed.add(writer.stdout.readline().strip())  # one episode committed, then kill it mid-stream
    time.sleep(delay)
    writer.send_signal(signal.SIGKILL)
    out, _ = writer.communicate()
    confirmed.update(out.split())
    extra_allowed += 1  # an episode may commit between its last line and the kill
  stray = [d for d in os.listdir(root / "images") if d.startswith(".tmp-")]
  assert stray, "no kill landed while an episode's screenshots were being written"
  store = store_lib.TrajectoryStore(root)
  ids = [store.read_json(i)["id"] for i in range(len(store))]
  assert len(ids) == len(set(ids))
  assert confirmed <= set(ids), "an append that returned was lost"
  assert len(set(ids) - confirmed) <= extra_allowed
  for traj in store:  # every committed episode is whole, images included
    assert len(traj.steps) == 4
    for s in traj.steps:
      assert store.load_image(s.image_path).shape == (300, 400, 3)
  assert set(store.remove_strays(min_age_s=0)) >= set(stray)
  assert sorted(os.listdir(root / "images")) == sorted(ids)
  store.append(_traj(0, n_steps=1))
  assert len(store_lib.TrajectoryStore(root)) == len(ids) + 1

