"""OpenWebVoyager recipe: retry-until-success, data mixing, query sets, the compact observation, and an
end-to-end smoke run through real Chromium that is SIGKILLed inside a stage and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import acting
from jaxagent import types
from jaxagent.pipeline.tasks import disjoint_sets, read_tasks
from jaxagent.recipes import openwebvoyager
from jaxagent.proj.owv import data as owv_data
from jaxagent.proj.owv import explore as owv_explore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _task(i: int) -> types.Task:
  return types.Task(id=f"q{i}", intent=f"query {i}", site="shop", start_url="__SITES__/shop/")


# ------------------------------------------------------------------------------ retry until success


def test_explore_reruns_failed_tasks_and_keeps_the_first_success():
  # Task i succeeds on attempt i (0-based); task 9 never does.
  succeed_at = {"q0": 0, "q1": 1, "q2": 4, "q3": 2, "q9": 99}
  calls = []

  def run_round(k, pending):
    calls.append((k, [t.id for t in pending]))
    return [types.Trajectory(t, success=1.0 if succeed_at[t.id] <= k else 0.0, meta={"attempt": k})
            for t in pending]

  tasks = [_task(i) for i in (0, 1, 2, 3, 9)]
  result = owv_explore.explore(tasks, 5, run_round)
  assert calls == [(0, ["q0", "q1", "q2", "q3", "q9"]), (1, ["q1", "q2", "q3", "q9"]), (2, ["q2", "q3", "q9"]),
                   (3, ["q2", "q9"]), (4, ["q2", "q9"])]
  assert set(result.solved) == {"q0", "q1", "q2", "q3"}
  assert {tid: traj.meta["attempt"] for tid, traj in result.solved.items()} == {"q0": 0, "q1": 1, "q2": 4, "q3": 2}
  assert result.attempts == {"q0": 1, "q1": 2, "q2": 5, "q3": 3, "q9": 5}
  assert result.episodes == 5 + 4 + 3 + 2 + 2
  s = result.summary(len(tasks))
  assert s["solved_rate"] == pytest.approx(0.8) and s["first_attempt_rate"] == pytest.approx(0.2)


def test_explore_stops_when_all_solved_and_rejects_bad_attempts():
  calls = []

  def run_round(k, pending):
    calls.append(k)
    return [types.Trajectory(t, success=1.0) for t in pending]

  assert set(owv_explore.explore([_task(0), _task(1)], 5, run_round).solved) == {"q0", "q1"}
  assert calls == [0]
  with pytest.raises(ValueError, match="max_attempts"):
    owv_explore.explore([_task(0)], 0, run_round)
  with pytest.raises(RuntimeError, match="1 trajectories for 2 tasks"):
    owv_explore.explore([_task(0), _task(1)], 2, lambda k, p: [types.Trajectory(p[0], success=0.0)])


class _NoRollouts:
  """Stands in for `pipeline.rollout.Rollouts` over a pool that must not be started: only stored episodes."""

  def run(self, policy, tasks, store, **kwargs):
    from jaxagent.pipeline.rollout import stored_by_id
    have = stored_by_id(store)
    if any(t.id not in have for t in tasks):
      raise RuntimeError("the pool was used")
    return [have[t.id] for t in tasks]


def test_exploration_resumes_from_the_store_without_rerunning_episodes(tmp_path):
  """A restarted exploration recomputes its rounds from the stored episodes: attempts already stored are not
  run again (the pool is never touched here, so any rerun would fail)."""
  from jaxagent.data.store import TrajectoryStore
  store = TrajectoryStore(str(tmp_path / "store"))
  for tid, k, ok in (("q0", 0, 1.0), ("q1", 0, 0.0), ("q1", 1, 1.0), ("q2", 0, 0.0), ("q2", 1, 0.0)):
    t = _task(int(tid[1:]))
    store.append(types.Trajectory(types.Task(id=owv_explore.attempt_id(t.id, k), intent=t.intent, site=t.site,
                                             start_url=t.start_url), success=ok, status="completed"))
  result = owv_explore.explore_rollouts(_NoRollouts(), None, [_task(0), _task(1), _task(2)],
                                        TrajectoryStore(store.path), judge=None, max_attempts=2, name="p")
  assert set(result.solved) == {"q0", "q1"} and result.attempts == {"q0": 1, "q1": 2, "q2": 2}
  assert result.solved["q1"].task.id == "q1#run1" and result.episodes == 5
  with pytest.raises(RuntimeError, match="pool was used"):  # a third attempt is not stored: it needs the pool
    owv_explore.explore_rollouts(_NoRollouts(), None, [_task(2)], TrajectoryStore(store.path), judge=None,
                                 max_attempts=3, name="p")


class _ScreenshotCountingJudge:
  """Stands in for the LLM judge (no endpoint here): says success iff it was shown every screenshot."""

  def __init__(self):
    self.shown = []

  def evaluate(self, task, trajectory):
    import numpy as np
    self.shown = [s.image_path for s in trajectory.steps]
    ok = all(isinstance(p, np.ndarray) for p in self.shown)
    return types.Verdict(1.0 if ok else 0.0, "saw screenshots" if ok else "no screenshots")


def test_referenced_judge_shows_in_memory_screenshots_and_records_programmatic_verdict():
  import numpy as np
  from jaxagent.judges import programmatic
  task = types.Task(id="q", intent="What is the answer?", site="shop", start_url="__SITES__/shop/",
                    evaluator={"kind": "string_match", "exact_match": "42"})
  shot = np.zeros((4, 4, 3), np.uint8)
  steps = [types.Step(step=0, action_text="Thought: x\n\nAction: ANSWER; 41",
                      action=types.Action(types.ActionKind.ANSWER, text="41"),
                      observation=types.Observation(url="u", screenshot=shot))]
  traj = types.Trajectory(task, steps=steps, answer="41", status="completed")
  inner = _ScreenshotCountingJudge()
  verdict = owv_explore.ReferencedJudge(inner, programmatic.programmatic_judge()).evaluate(task, traj)
  assert verdict.success == 1.0 and len(inner.shown) == 1 and inner.shown[0] is shot
  assert traj.meta["programmatic_success"] == 0.0 and traj.steps[0].image_path is None  # the original is untouched
  traj.success = verdict.success
  assert owv_explore.agreement([traj])["agreement"] == 0.0


def test_judge_agreement_against_programmatic_verdicts():
  trajs = [types.Trajectory(_task(i), success=s, meta={"programmatic_success": p})
           for i, (s, p) in enumerate([(1.0, 1.0), (1.0, 0.0), (0.0, 0.0), (0.0, 0.0)])]
  a = owv_explore.agreement(trajs + [types.Trajectory(_task(9), success=1.0)])
  assert a == {"judged": 4, "agreement": 0.75, "judge_positive": 0.5, "programmatic_positive": 0.25}
  assert owv_explore.agreement([types.Trajectory(_task(0), success=1.0)]) is None


# ----------------------------------------------------------------------------------------- mixing


def _items(name, n):
  return [{"id": f"{name}-{i}", "images": [], "conversations": []} for i in range(n)]


def test_mix_takes_each_source_weight_times():
  sources = {"il": _items("il", 10), "iter1": _items("iter1", 6), "iter2": _items("iter2", 4)}
  out = owv_data.mix(sources, {"il": 0.5, "iter1": 0.0, "iter2": 2.0}, seed=3)
  ids = [x["id"] for x in out]
  assert sum(i.startswith("il-") for i in ids) == 5 and len(set(i for i in ids if i.startswith("il-"))) == 5
  assert not any(i.startswith("iter1-") for i in ids)
  assert sorted(i for i in ids if i.startswith("iter2-")) == sorted([f"iter2-{k}" for k in range(4)] * 2)
  assert ids == [x["id"] for x in owv_data.mix(sources, {"il": 0.5, "iter1": 0.0, "iter2": 2.0}, seed=3)]
  assert ids != [x["id"] for x in owv_data.mix(sources, {"il": 0.5, "iter1": 0.0, "iter2": 2.0}, seed=4)]
  with pytest.raises(ValueError, match="'iter2' has no mixing weight"):
    owv_data.mix(sources, {"il": 1.0, "iter1": 1.0}, seed=0)
  with pytest.raises(ValueError, match="must be >= 0"):
    owv_data.mix(sources, {"il": -1.0, "iter1": 1.0, "iter2": 1.0}, seed=0)


def test_mix_weights_name_every_earlier_iteration():
  import ml_collections
  cfg = ml_collections.ConfigDict({"mix": {"il": 0.3, "previous": 0.5, "current": 1.0}})
  assert owv_data.mix_weights(cfg, 1) == {"il": 0.3, "iter1": 1.0}
  assert owv_data.mix_weights(cfg, 3) == {"il": 0.3, "iter1": 0.5, "iter2": 0.5, "iter3": 1.0}


# ---------------------------------------------------------------------------- queries, observation


def test_query_sets_are_disjoint_and_tagged():
  tasks = [_task(i) for i in range(20)]
  sets = disjoint_sets(tasks, {"il": 8, "iter1": 6, "iter2": 6}, seed=0)
  base = {n: {t.id.split("@")[0] for t in ts} for n, ts in sets.items()}
  assert [len(b) for b in base.values()] == [8, 6, 6]
  assert not (base["il"] & base["iter1"]) and not (base["iter1"] & base["iter2"]) and not (base["il"] & base["iter2"])
  assert all(t.id.endswith("@iter1") for t in sets["iter1"])


def test_the_default_tests_on_intents_in_no_training_query(tmp_path):
  """The protocol's rule on the default config: the test queries' intents are in neither the IL queries nor
  any iteration's exploration queries; `held_out` turns False when a test intent joins them."""
  from configs import openwebvoyager as owv_config
  from jaxagent.pipeline.tasks import read_tasks, write_tasks
  from jaxagent.recipes import openwebvoyager

  config, workdir = owv_config.get_config(), str(tmp_path)
  sizes = openwebvoyager.stage_tasks(config, os.path.join(workdir, "tasks"))
  assert sizes["test"] == 8 and sizes["il"] + sizes["iter1"] + sizes["iter2"] == 22
  assert openwebvoyager.held_out(config, workdir)
  path = os.path.join(workdir, "tasks", "iter2.jsonl")
  write_tasks(path, read_tasks(path) + read_tasks(os.path.join(workdir, "tasks", "test.jsonl"))[:1])
  assert not openwebvoyager.held_out(config, workdir)


def test_query_sets_wrap_around_with_distinct_ids():
  """A set larger than the split (the 8-task test split evaluated 20 times) repeats queries under new ids, so
  the store keeps every episode; each query appears 2 or 3 times."""
  tasks = [_task(i) for i in range(8)]
  test = disjoint_sets(tasks, {"test": 20}, seed=1)["test"]
  ids = [t.id for t in test]
  assert len(set(ids)) == 20 and sum(i.endswith("@test") for i in ids) == 8
  assert sum(i.endswith("@test.r1") for i in ids) == 8 and sum(i.endswith("@test.r2") for i in ids) == 4
  counts = {}
  for t in test:
    counts[t.intent] = counts.get(t.intent, 0) + 1
  assert sorted(counts.values()) == [2] * 4 + [3] * 4


def test_compact_tree_drops_urls_and_clips_lines():
  tree = "[1] RootWebArea 'Home' focused: True url: http://x/s/abc/shop/\n\t[2] link 'Cart' url: http://x/c\n\t[3] button 'Go'"
  assert owv_data.compact_tree(tree) == tree
  assert owv_data.compact_tree(tree, drop_urls=True) == "[1] RootWebArea 'Home' focused: True\n\t[2] link 'Cart'\n\t[3] button 'Go'"
  assert owv_data.compact_tree(tree, max_lines=2, drop_urls=True).count("\n") == 1
  fmt = owv_data.CompactOpenWebVoyager(max_tree_lines=1, drop_urls=True)
  obs = types.Observation(url="http://x", a11y_tree=tree, intent="Find it")
  assert fmt.observation_text("Find it", obs, []) == "Find it\nOBSERVATION:\n<image>\n[1] RootWebArea 'Home' focused: True"
  assert fmt.parse("Thought: t\n\nAction: Click [2]").kind == types.ActionKind.CLICK


# --------------------------------------------------------------------------- end to end, resume


def _run(workdir, *extra, wait=True):
  cmd = [sys.executable, "-m", "jaxagent.main", "--config=configs/openwebvoyager.py:smoke", f"--workdir={workdir}",
         *extra]
  env = {**os.environ, "PYTHONUNBUFFERED": "1", "XLA_FLAGS": ""}  # one CPU device, as the smoke mesh says
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  if wait:
    out, _ = proc.communicate(timeout=1500)  # generous: a shared, overloaded CPU compiles slowly
    assert proc.returncode == 0, out[-4000:]
    return out
  return proc


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_smoke_run_killed_inside_a_stage_resumes_there(tmp_path):
  workdir = str(tmp_path / "owv")
  proc = _run(workdir, wait=False)
  ckpt = os.path.join(workdir, "il", "train", "checkpoints", "2")
  deadline = time.monotonic() + 1200
  while not os.path.isdir(ckpt) and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert os.path.exists(os.path.join(workdir, "il", "data", "DONE")), "killed before il/train checkpointed"
  assert not os.path.exists(os.path.join(workdir, "il", "train", "DONE"))
  episodes_before = len(open(os.path.join(workdir, "il", "data", "store", "episodes.jsonl")).readlines()) \
      if os.path.exists(os.path.join(workdir, "il", "data", "store", "episodes.jsonl")) else None

  out = _run(workdir)
  assert "[owv] tasks: done already, skipped" in out and "[owv] il/data: done already, skipped" in out
  assert "[owv] il/train ..." in out
  # The train loop resumed from its step-2 checkpoint: steps 1–2 were logged once, step 3 once.
  steps = [json.loads(l)["step"] for l in open(os.path.join(workdir, "il", "train", "metrics.jsonl"))
           if '"loss"' in l]
  assert sorted(set(steps)) == steps and steps[-1] == 3, steps
  if episodes_before is not None:
    assert len(open(os.path.join(workdir, "il", "data", "store", "episodes.jsonl")).readlines()) == episodes_before

  results = json.load(open(os.path.join(workdir, "results.json")))
  rows = results["per_iteration"]
  assert [r["stage"] for r in rows] == ["il", "iter1"]
  assert all(0.0 <= r["test_success_rate"] <= 1.0 and r["episodes"] == 2 for r in rows)
  assert rows[1]["train_samples"] >= 1 and results["teacher_success"] == 1.0
  explore = json.load(open(os.path.join(workdir, "iter1", "explore", "DONE")))
  assert explore["tasks"] == 2 and 2 <= explore["episodes"] <= 4
  assert explore["mean_attempts"] <= 2
  samples = json.load(open(os.path.join(workdir, "il", "data", "samples.json")))
  assert samples and samples[0]["conversations"][0]["value"].count("<image>") == 1
  assert all(len(s["images"]) <= 3 for s in samples)
  assert "stage times" in out and "iter1/train" in out

  again = _run(workdir)  # everything done: nothing reruns, same results
  assert again.count("done already") == 7
  assert json.load(open(os.path.join(workdir, "results.json"))) == results

  # `jaxagent.evaluate --policy <the IL actor>` prompts it as the recipe's evaluation does (its agent.json: the
  # compact tree, history images, parse rule), on the same episodes, with the same verdicts.
  config = acting.workdir_config(workdir)
  config.eval.miniwob = ""
  with pytest.MonkeyPatch.context() as monkeypatch:
    acting.assert_cli_acts_as_the_recipe(
        monkeypatch, tmp_path, config, lambda c, out: openwebvoyager.stage_eval(c, workdir, out, 0), "test",
        os.path.join(workdir, "il", "train"), read_tasks(os.path.join(workdir, "tasks", "test.jsonl")))


def test_released_folders_convert_finished_tasks_only(tmp_path):
  from PIL import Image
  root = tmp_path / "results"
  for name, finished in (("taskShop--2", True), ("taskShop--10", True), ("taskShop--3", False)):
    d = root / name
    d.mkdir(parents=True)
    user1 = {"role": "user", "content": [{"type": "text", "text": "Now given a task: Find the lamp.  Please "
                                                                   "interact with https://shop and get the answer."}]}
    user2 = {"role": "user", "content": [{"type": "text", "text": "Observation: please analyze the tree"}]}
    msgs = [{"role": "system", "content": "sys"}, user1, {"role": "assistant", "content": "Thought: a\n\nAction: Click [3]"},
            user2, {"role": "assistant", "content": "Thought: b\n\nAction: ANSWER; $5"}]
    (d / "interact_messages.json").write_text(json.dumps(msgs))
    for t in (1, 2):
      (d / f"accessibility_tree{t}.txt").write_text(f"[1] RootWebArea 'page {t}'")
      Image.new("RGB", (8, 8), (t * 40, 0, 0)).save(d / f"screenshot{t}.png")
    (d / "agent.log").write_text("INFO - finish!!" if finished else "INFO - step 1")
  out = tmp_path / "il" / "il.json"
  out.parent.mkdir()
  sys.path.insert(0, ROOT)
  from data_tools import owv_convert
  assert owv_convert.main(["released", "--root", str(root), "--out", str(out)]) == {
      "tasks": 2, "unfinished_skipped": 1, "samples": 4}
  from jaxagent.data import conversation
  items = conversation.load_conversations(str(out))
  assert [x["id"] for x in items] == ["Shop--00002--r00--step01", "Shop--00002--r00--step02",
                                      "Shop--00010--r00--step01", "Shop--00010--r00--step02"]
  assert items[0]["conversations"][0]["value"] == "Find the lamp.\nOBSERVATION:\n<image>\n[1] RootWebArea 'page 1'"
  assert items[1]["conversations"][2]["value"] == "OBSERVATION:\n<image>\n[1] RootWebArea 'page 2'"
  assert all(os.path.exists(p) for x in items for p in x["images"]) and len(items[1]["images"]) == 2


@pytest.mark.slow
def test_on_the_benchmark_il_comes_from_train_a_exploration_from_train_c_and_test_is_the_headline(tmp_path):
  """`tasks.suite=bench` (web profile): the IL queries from `train_a`, each iteration's from `train_c`, every
  held-out headline intent once as `test`, the negative control written beside them; no test intent trains."""
  from configs import openwebvoyager as owv_config  # pylint: disable=g-import-not-at-top
  config = owv_config.get_config("")
  config.tasks.update(suite="bench", templates="cart,order", level=2)
  config.il.queries, config.explore.queries, config.iterations = 5, 3, 2
  counts = openwebvoyager.stage_tasks(config, str(tmp_path))
  split = {name: read_tasks(os.path.join(tmp_path, f"{name}.jsonl"))
           for name in ("il", "iter1", "iter2", "train_a", "train_c", "test", "control")}
  intents = {name: {t.meta["intent_id"] for t in ts} for name, ts in split.items()}
  assert counts["il"] == 5 and counts["iter1"] == counts["iter2"] == 3
  assert intents["il"] <= intents["train_a"] and intents["iter1"] | intents["iter2"] <= intents["train_c"]
  assert not intents["iter1"] & intents["iter2"]  # one shuffle, cut in order
  assert not intents["test"] & (intents["il"] | intents["iter1"] | intents["iter2"])
  assert len(split["test"]) == len(intents["test"]) and {t.meta["family"] for t in split["test"]} == {"cart"}
  assert {t.meta["family"] for t in split["control"]} == {"order"}
  assert all(t.meta["perturb"]["level"] == 2 for t in split["test"])


@pytest.mark.slow
@pytest.mark.long
def test_the_bench_tree_shows_every_element_the_expert_acts_on_that_a_tree_lists():
  """On the benchmark's web pages the bench variant's tree shows every element the expert acts on that the full
  accessibility tree lists at all; the default's 16-line cut hides some (on 10 headline intents in Chromium)."""
  from configs import openwebvoyager as owv_config  # pylint: disable=g-import-not-at-top
  from data_tools import observability  # pylint: disable=g-import-not-at-top
  config = owv_config.get_config("bench")
  config.env.workers = 2
  total = observability.measure(config, episodes=10)["total"]
  assert total["intents"] == total["expert_successes"] == 10
  assert total["shown"] == total["element_steps"] - total.get("not_in_full_observation", 0) > 0
  config.observation.max_tree_lines = owv_config.get_config().observation.max_tree_lines
  assert observability.measure(config, episodes=10)["total"]["shown"] < total["shown"]
