"""A staged recipe under `launch.local`: DigiRL's smoke run as 2 processes × 4 CPU devices gives what 1 process ×
8 devices gives: the same episodes in every store (each rolled out once, by one process, into its shard), the same
per-episode outcomes, the same training losses and the same `results.json`.

The rollouts sample at temperature 0: at T > 0 the sampler's random stream is per process and per batch (the
engine draws one key per call), so the same episode would draw other tokens when another process, or the same
process with other episodes beside it in the batch, runs it.
"""

import json
import os
import subprocess
import sys
import threading

import pytest

from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import rollout
from jaxagent.pipeline.stages import DONE
from jaxagent.recipes import digirl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Every training stage's global batch is 8, which splits over 8 devices however they are spread over processes.
BATCHES = ("il", "traj_critic", "critic", "actor", "online.traj_critic", "online.critic", "online.actor")
STORES = ("il/demos", "offline_data/store", "online/iter0_rollouts/store", "eval/il", "eval/filtered_bc",
          "eval/digirl_offline", "eval/digirl_off2on")
TRAININGS = ("il", "critics/traj_critic", "critics/step_critic", "filtered_bc", "digirl_offline",
             "online/iter0_critics/traj_critic", "online/iter0_critics/step_critic", "online/iter0_actor")


DIGIRL_ARGS = (*(f"--config.{block}.train.batch_size=8" for block in BATCHES),
               *(f"--config.{block}.temperature=0" for block in ("offline", "online", "eval")))
# The other staged recipes, checked the same way: (config, overrides, stores, trainings, shared JSON files).
RECIPES = {
    "webrl": ("webrl.py:smoke",
              (*(f"--config.{b}.train.batch_size=8" for b in ("sft", "orm", "critic", "actor")),
               "--config.orm.temperature=0", "--config.rollout.temperature=0"),  # WebRL evaluates at T 0 already
              ("sft/demos", "orm/store", "orm/near_misses", "phase1/rollouts/store", "phase2/rollouts/store",
               "eval/sft", "eval/phase1", "eval/phase2"),
              ("sft", "orm/model", "phase1/critic", "phase1/actor", "phase2/critic", "phase2/actor"),
              ("results.json", "orm_agreement.json")),
    # Digi-Q's candidates (T 1.2) are sampled by process 0 alone and its representations by every process over
    # all states, so only the sharded rollouts need T 0.
    "digiq": ("digiq.py:smoke",
              (*(f"--config.{b}.train.batch_size=8" for b in ("il", "representation", "critic", "actor")),
               "--config.behaviour.temperature=0", "--config.eval.temperature=0"),
              ("il/demos", "behaviour/store", "candidates/store", "eval/behaviour", "eval/il_actor",
               "eval/digiq_actor", "eval/filtered_bc_actor"),
              ("il", "representation/model", "critic", "actor", "filtered_bc"),
              ("results.json",)),
}

def _launch(num_processes, devices_per_process, workdir, config="digirl.py:smoke", extra=DIGIRL_ARGS):
  args = [f"--config={ROOT}/configs/{config}", f"--workdir={workdir}", *extra]
  cmd = [sys.executable, "-m", "launch.local", f"--num_processes={num_processes}",
         f"--devices_per_process={devices_per_process}", "--", *args]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
  return proc, lines


def _outcomes(workdir, store):
  return [(t.task.id, t.success, t.status, [s.action_text for s in t.steps])
          for t in rollout.episodes(TrajectoryStore(os.path.join(workdir, store)))]


def _losses(workdir, training):
  """(step, loss) of a training stage; None for a stage that had nothing to train on (DigiRL's actor when no
  step passes its filter)."""
  path = os.path.join(workdir, training, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return [(row["step"], row["loss"]) for row in map(json.loads, f) if "loss" in row]


def _close(got, ref, rel=1e-4) -> bool:
  """`got` == `ref` with every float within `rel` (summaries hold means over collective computations); wall
  times (keys ending `_s`) are left out."""
  if isinstance(ref, dict):
    return (isinstance(got, dict) and got.keys() == ref.keys()
            and all(_close(got[k], ref[k], rel) for k in ref if not k.endswith("_s")))
  if isinstance(ref, list):
    return isinstance(got, list) and len(got) == len(ref) and all(_close(g, r, rel) for g, r in zip(got, ref))
  if isinstance(ref, float) and isinstance(got, float):
    return got == pytest.approx(ref, rel=rel, abs=1e-6)
  return got == ref


def _read(path, workdir=""):
  """The JSON at `path` less its provenance, the run's workdir in it (e.g. a summary's actor directory) written
  `<workdir>`."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  data = json.loads(text.replace(workdir, "<workdir>") if workdir else text)
  if isinstance(data, dict):
    data.pop("provenance", None)  # where it ran: the process count differs by design
  return data


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  one, two = (str(tmp_path_factory.mktemp(name)) for name in ("one", "two"))
  launched = [_launch(1, 8, one), _launch(2, 4, two)]  # side by side: the two cores are mostly compiling
  for proc, lines in launched:
    assert proc.wait(timeout=1500) == 0, "".join(lines[-200:])
  return one, two, launched[1][1]


@pytest.mark.slow
def test_each_process_rolls_out_its_share_into_its_own_shard(runs):
  one, two, _ = runs
  for store in STORES:
    expected = rollout.stored_ids(TrajectoryStore(os.path.join(one, store)))
    assert rollout.shards(os.path.join(two, store)) == ["shard0", "shard1"], store
    assert not os.path.exists(os.path.join(two, store, "episodes.jsonl")), store
    order = rollout.read_order(os.path.join(two, store))
    for k in (0, 1):
      shard = TrajectoryStore(rollout.shard_dir(os.path.join(two, store), k))
      ids = [shard.read_json(i)["task"]["id"] for i in range(len(shard))]
      assert sorted(ids) == sorted(order[k::2]), (store, k)  # task i on process i % 2, each episode once
    assert set(order) == expected, store


@pytest.mark.slow
def test_two_processes_store_the_same_episodes_with_the_same_outcomes(runs):
  one, two, _ = runs
  for store in STORES:
    assert _outcomes(two, store) == _outcomes(one, store), store


@pytest.mark.slow
def test_two_processes_train_the_same_models(runs):
  one, two, _ = runs
  trained = 0
  for training in TRAININGS:
    ref, got = _losses(one, training), _losses(two, training)
    assert (got is None) == (ref is None), training
    if ref is None:
      continue
    trained += 1
    assert ref and [s for s, _ in got] == [s for s, _ in ref], training
    assert [l for _, l in got] == pytest.approx([l for _, l in ref], rel=1e-4, abs=1e-5), training
  assert trained >= 5  # the IL actor and both critics' offline and online trainings at least


@pytest.mark.slow
def test_two_processes_report_the_same_results_and_write_each_marker_once(runs):
  one, two, lines = runs
  with open(os.path.join(two, "results.json"), encoding="utf-8") as f:
    assert json.load(f)["provenance"]["machine"]["process_count"] == 2
  assert _read(os.path.join(two, "results.json")) == _read(os.path.join(one, "results.json"))
  stages = [*digirl.STAGES, *(f"online/iter0_{part}" for part in ("rollouts", "critics", "actor"))]
  for stage in stages:
    assert _close(_read(os.path.join(two, stage, DONE), two), _read(os.path.join(one, stage, DONE), one)), stage
    for p in (0, 1):  # every process ran every stage once, none skipped one the other ran
      tag = "digirl/online" if stage.startswith("online/") else "digirl"
      started = f"[{tag}] {stage.split('/')[-1]} ..."
      # within the process's lines, not as a whole line: a native log line of that process (Gloo's, written in
      # more than one piece) can take ours into its own
      assert sum(line.startswith(f"[p{p}] ") and started in line for line in lines) == 1, (stage, p)
  assert set(_read(os.path.join(two, "timings.json"))) == set(digirl.STAGES)
  leftovers = [os.path.join(d, f) for d, _, files in os.walk(two) for f in files if ".tmp" in f]
  assert not leftovers  # no half-written file of a process that lost a race


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_other_recipes_two_processes_match_one(recipe, tmp_path):
  """WebRL's smoke run (SFT, ORM, two phases, eval) and Digi-Q's (IL, behaviour, candidates, representation,
  critic, actors, eval) as 2 × 4 and 1 × 8: the same episodes and outcomes in every store (candidates included),
  the same losses of every training, the same results."""
  config, extra, stores, trainings, shared = RECIPES[recipe]
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  launched = [_launch(1, 8, one, config, extra), _launch(2, 4, two, config, extra)]
  for proc, lines in launched:
    assert proc.wait(timeout=1500) == 0, "".join(lines[-200:])
  for store in stores:
    assert _outcomes(two, store) == _outcomes(one, store) != [], store
    steps = [s for t in rollout.episodes(TrajectoryStore(os.path.join(one, store))) for s in t.steps]
    assert [s.candidates for s in steps] == [s.candidates for t in rollout.episodes(TrajectoryStore(
        os.path.join(two, store))) for s in t.steps], store
  for training in trainings:
    ref, got = _losses(one, training), _losses(two, training)
    assert ref and [s for s, _ in got] == [s for s, _ in ref], training
    assert [l for _, l in got] == pytest.approx([l for _, l in ref], rel=1e-4, abs=1e-5), training
  for name in shared:
    assert _close(_read(os.path.join(two, name)), _read(os.path.join(one, name))), name
