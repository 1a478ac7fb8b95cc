"""collect(): batched policy calls, slot refilling, invalid actions, truncation, crash retries, store + judge.

Runs a small deterministic env defined here (`GuessEnv`: say the number the page shows) in a real `EnvPool`;
the same collector on real Chromium/MiniWoB++ is exercised by `tests/envs/test_pool_miniwob.py`.
"""

import dataclasses
import os
import pathlib
import re

import numpy as np
import pytest

from jaxagent import types
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.pool import EnvPool
from jaxagent.rl import collector


class GuessEnv:
  """Shows a target number; `type` with that text earns reward 1 and ends the episode. `task.meta["die_at"]`
  kills the worker at that step while `die_file` has fewer than `die_times` lines (shared by retries)."""

  def reset(self, task):
    self.task, self.t = task, 0
    return self._obs("")

  def _obs(self, error):
    shot = np.full((4, 6, 3), self.t, np.uint8)
    return types.Observation(url=f"guess://{self.task.id}/{self.t}", step=self.t,
                             intent=self.task.intent or self.task.meta.get("goal", ""),
                             screenshot=shot, error=error, extra={"target": self.task.meta["target"]})

  def step(self, action):
    self.t += 1
    meta = self.task.meta
    if meta.get("die_at") == self.t:
      counter = pathlib.Path(meta["die_file"])
      if (counter.read_text().count("\n") if counter.exists() else 0) < meta["die_times"]:
        with counter.open("a") as f:
          f.write("x\n")
        os._exit(9)
    if action.kind == types.ActionKind.INVALID:
      return self._obs(action.reason), 0.0, False, {}
    correct = action.text == str(meta["target"])
    return self._obs("" if correct else "wrong"), float(correct), correct, {"guess": action.text}

  def close(self):
    pass


SPEC = {"kind": f"{GuessEnv.__module__}:GuessEnv"}


class ScriptedPolicy:
  """Says the target, after `meta["fumbles"]` garbage outputs; records every batch it is called with."""

  def __init__(self):
    self.batches = []

  def act(self, observations, histories):
    self.batches.append([o.url for o in observations])
    outs = []
    for obs, hist in zip(observations, histories):
      fumbles = int(obs.intent.split()[-1])
      outs.append("mumble" if len(hist) < fumbles else f"say {obs.extra['target']}")
    return outs


def parse(text):
  m = re.fullmatch(r"say (\d+)", text)
  if m:
    return types.Action(types.ActionKind.TYPE, text=m.group(1))
  return types.Action.invalid(f"Invalid action format: {text!r}")


class RewardJudge:
  def evaluate(self, task, traj):
    return types.Verdict(float(traj.trajectory_reward > 0), f"reward {traj.trajectory_reward}")


class RecordingPool(EnvPool):
  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.rounds = []

  def advance(self, resets=None, steps=None):
    self.rounds.append((sorted(resets or {}), sorted(steps or {})))
    return super().advance(resets, steps)


def _task(i, fumbles=0, max_steps=4, **meta):
  return types.Task(id=f"g{i}", intent=f"guess the number; fumbles {fumbles}", site="guess",
                    start_url=f"guess://{i}", max_steps=max_steps, meta={"target": 10 + i, **meta})


@pytest.fixture(scope="module")
def pool():
  with RecordingPool(SPEC, num_workers=3, max_retries=1, step_timeout=10, reset_timeout=10) as p:
    yield p


def test_batches_refills_and_records_everything(pool, tmp_path):
  tasks = [_task(i, fumbles=i % 3) for i in range(7)]
  policy = ScriptedPolicy()
  store = TrajectoryStore(tmp_path)
  first_round = len(pool.rounds)
  trajs = collector.collect(pool, policy, parse, tasks, store=store, progress=False, gamma=0.5,
                            judge=RewardJudge(), obs_text=lambda task, obs, hist: f"{task.id}@{len(hist)}")
  assert [t.task for t in trajs] == tasks
  assert all(t.status == "completed" and t.success == 1.0 for t in trajs)
  assert [len(t.steps) for t in trajs] == [1 + i % 3 for i in range(7)]
  # One policy call per round with every live episode in it, never more than the pool's slots.
  assert len(policy.batches[0]) == 3 and max(len(b) for b in policy.batches) == 3
  assert sum(len(b) for b in policy.batches) == sum(len(t.steps) for t in trajs)
  rounds = pool.rounds[first_round:]
  assert len(policy.batches) == len(rounds) - 1, "one policy call between two pool rounds"
  assert [len(b) for b in policy.batches] == [len(steps) for _, steps in rounds[1:]]
  # A finished slot gets its next task in the same round as the others' steps.
  assert any(resets and steps for resets, steps in rounds)
  t = trajs[2]  # two fumbles, then the answer
  assert [s.action_text for s in t.steps] == ["mumble", "mumble", "say 12"]
  assert [s.action.kind for s in t.steps] == [types.ActionKind.INVALID] * 2 + [types.ActionKind.TYPE]
  assert t.steps[1].observation.error == "Invalid action format: 'mumble'", "invalid reason is fed back"
  assert [s.url for s in t.steps] == ["guess://g2/0", "guess://g2/1", "guess://g2/2"]
  assert [s.obs_text for s in t.steps] == ["g2@0", "g2@1", "g2@2"]
  assert [s.reward for s in t.steps] == [0, 0, 1] and [s.done for s in t.steps] == [False, False, True]
  np.testing.assert_allclose([s.mc_return for s in t.steps], [0.25, 0.5, 1.0])
  assert t.final_observation.url == "guess://g2/3"
  assert len(store) == 7
  back = {s.task.id: s for s in store}
  assert back["g2"].steps[1].observation.error == t.steps[1].observation.error
  np.testing.assert_array_equal(store.load_image(back["g2"].steps[2].image_path), np.full((4, 6, 3), 2))


def test_a_goal_the_page_states_becomes_the_tasks_intent(pool):
  goal = "guess the number; fumbles 1"
  task = types.Task(id="g9", intent="", site="guess", start_url="guess://9", max_steps=4,
                    meta={"target": 19, "goal": goal})  # as MiniWoB's: the utterance is known at reset
  trajs = collector.collect(pool, ScriptedPolicy(), parse, [task], progress=False,
                            obs_text=lambda task, obs, hist: f"{task.intent}@{len(hist)}")
  assert trajs[0].task.intent == goal and trajs[0].task.id == "g9"
  assert [s.obs_text for s in trajs[0].steps] == [f"{goal}@0", f"{goal}@1"]  # what training reads = the prompt


def test_truncation_at_max_steps(pool):
  trajs = collector.collect(pool, ScriptedPolicy(), parse, [_task(0, fumbles=9, max_steps=3)], progress=False)
  assert trajs[0].status == "truncated" and len(trajs[0].steps) == 3 and trajs[0].success is None


def test_crashes_retry_then_error_and_no_task_is_lost(pool, tmp_path):
  once = _task(1, fumbles=1, die_at=2, die_file=str(tmp_path / "once"), die_times=1)
  always = _task(2, fumbles=1, die_at=1, die_file=str(tmp_path / "always"), die_times=99)
  tasks = [_task(0), once, always, _task(3)]
  trajs = collector.collect(pool, ScriptedPolicy(), parse, tasks, progress=True)
  assert [t.task.id for t in trajs] == ["g0", "g1", "g2", "g3"]
  assert trajs[1].status == "completed" and trajs[1].attempts == 2
  assert [s.step for s in trajs[1].steps] == [0, 1], "the failed attempt's steps are dropped"
  assert len(trajs[1].meta["errors"]) == 1 and "exit code 9" in trajs[1].meta["errors"][0]
  assert trajs[2].status == "errored" and trajs[2].attempts == 2 and "exit code 9" in trajs[2].error
  assert trajs[0].status == trajs[3].status == "completed"


class ConstantPolicy:
  """Replies `text` to every observation."""

  def __init__(self, text):
    self.text = text

  def act(self, observations, histories):
    return [self.text] * len(observations)


def test_early_stop_ends_an_episode_with_its_reason(pool, tmp_path):
  from jaxagent.agents.webrl import early_stop
  store = TrajectoryStore(tmp_path)
  tasks = [_task(0, max_steps=9), _task(1, max_steps=5), _task(2, fumbles=2, max_steps=9)]
  trajs = collector.collect(pool, ConstantPolicy("garbage"), parse, tasks[:2], store=store, progress=False,
                            judge=RewardJudge(), early_stop=early_stop)
  t = trajs[0]  # garbage every step: VAB's 5 parse failures
  assert len(t.steps) == 5 and all(s.action.kind == types.ActionKind.INVALID for s in t.steps)
  assert t.status == "completed" and t.meta["early_stop"] == "Failed to parse actions for 5 times"
  assert t.answer == "Early stop: Failed to parse actions for 5 times" and t.success == 0.0
  assert store.read(0).meta["early_stop"] == t.meta["early_stop"]
  # max_steps comes first (VAB's early_stop checks it first too): truncated, no early stop
  assert trajs[1].status == "truncated" and len(trajs[1].steps) == 5 and "early_stop" not in trajs[1].meta
  # a valid but wrong guess five times over: the repeat rule
  t = collector.collect(pool, ConstantPolicy("say 99"), parse, tasks[:1], progress=False, early_stop=early_stop)[0]
  assert len(t.steps) == 5 and t.meta["early_stop"] == "Same action for 5 times" and t.status == "completed"
  # an episode that ends on its own is untouched; without the rule, garbage runs to max_steps
  t = collector.collect(pool, ScriptedPolicy(), parse, tasks[2:], progress=False, early_stop=early_stop)[0]
  assert t.status == "completed" and len(t.steps) == 3 and "early_stop" not in t.meta and not t.answer
  t = collector.collect(pool, ConstantPolicy("garbage"), parse, tasks[:1], progress=False)[0]
  assert t.status == "truncated" and len(t.steps) == 9 and "early_stop" not in t.meta


def test_several_policies_share_one_scheduling_and_load_lazily(pool, tmp_path):
  """Job b's first episode takes the slot job a's last episodes leave free, so the two together take fewer pool
  rounds than one after the other; b, given as a loader, is loaded once, when its first episode starts; each round
  calls each live job's policy once, on its own episodes alone."""
  a_tasks = [_task(i, fumbles=3 if i == 0 else 0) for i in range(4)]
  b_tasks = [dataclasses.replace(_task(i), id=f"b{i}", start_url=f"guess://b{i}") for i in range(3)]
  a, b, loads = ScriptedPolicy(), ScriptedPolicy(), []

  def load_b():
    loads.append(len(a.batches))
    return b

  first_round = len(pool.rounds)
  out = collector.collect_jobs(pool, [
      collector.Job(a, a_tasks, parse, TrajectoryStore(tmp_path / "a"), judge=RewardJudge(), policy_name="a"),
      collector.Job(load_b, b_tasks, parse, TrajectoryStore(tmp_path / "b"), judge=RewardJudge(), policy_name="b"),
  ], progress=False)
  together = len(pool.rounds) - first_round
  assert [[t.task.id for t in trajs] for trajs in out] == [[t.id for t in a_tasks], [t.id for t in b_tasks]]
  assert all(t.status == "completed" and t.success == 1.0 for trajs in out for t in trajs)
  assert {t.policy for t in out[0]} == {"a"} and {t.policy for t in out[1]} == {"b"}
  assert len(TrajectoryStore(tmp_path / "a")) == 4 and len(TrajectoryStore(tmp_path / "b")) == 3
  assert all(url.startswith("guess://g") for batch in a.batches for url in batch)
  assert all(url.startswith("guess://b") for batch in b.batches for url in batch)
  assert len(loads) == 1 and 1 <= loads[0] < len(a.batches), "b starts while a's last episode still runs"

  first_round = len(pool.rounds)
  collector.collect(pool, ScriptedPolicy(), parse, a_tasks, progress=False)
  collector.collect(pool, ScriptedPolicy(), parse, b_tasks, progress=False)
  assert together < len(pool.rounds) - first_round
