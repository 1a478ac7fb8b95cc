"""A staged recipe under `launch.local`: DigiRL's smoke run as 2 processes × 4 CPU devices gives what 1 process ×
8 devices gives: the same episodes in every store (each rolled out once, by one process, into its shard), the same
per-episode outcomes, the same training losses and the same `results.json`.

The rollouts sample at temperature 0: at T > 0 the sampler's random stream is per process and per batch (the
engine draws one key per call), so the same episode would draw other tokens when another process, or the same
process with other episodes beside it in the batch, runs it.
"""

import json
import os
import shutil
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import rollout
from jaxagent.pipeline.stages import DONE
from jaxagent.proj.grpo.learner import token_batch
from jaxagent.recipes import digirl
from jaxagent.serving.checkpoint import load_policy

# Its own lane (`scripts/test.sh --lane multiprocess`, run by CI after the README's test command): each test
# trains whole recipes twice, as 2 processes and as 1, ~8 of the README command's ~20 minutes on 2 cores.
pytestmark = pytest.mark.multiprocess

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


def _run_both(one, two, config="digirl.py:smoke", extra=DIGIRL_ARGS) -> list[str]:
  """The recipe as 2 processes × 4 devices into `two`, then as 1 × 8 into `one`; the 2-process run's output.

  One after the other: a process that waits at the first collective gives up if its peer is not there within
  Gloo's 30 s, and a run beside it on the 2 cores made one process's compile that much slower than its peer's in
  a CI run (then process 1 compiled what process 0 loaded from the cache: docs/results/README.md#test-suite)."""
  outputs = []
  for processes, devices, workdir in ((2, 4, two), (1, 8, one)):
    proc, lines = _launch(processes, devices, workdir, config, extra)
    assert proc.wait(timeout=1500) == 0, "".join(lines[-200:])
    outputs.append(lines)
  return outputs[0]


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
  return one, two, _run_both(one, two)


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
  _run_both(one, two, config, extra)
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


# GRPO's smoke run with updates large enough that one round moves the sampled tokens' log-probs well past 1e-4.
GRPO_ARGS = ("--config.grpo.optim.lr=3e-3", "--config.grpo.optim.warmup_steps=0")


def _rescored(model_dir, steps, temperature, step=None):
  """log π(sampled token) of `steps`' replies under the policy saved in `model_dir` (at checkpoint `step`)."""
  model = load_policy(model_dir, step=step).model
  rows = [{"prompt_ids": s.prompt_ids, "reply_ids": s.reply_ids, "logprobs": s.reply_logprobs, "advantage": 1.0}
          for s in steps]
  batch = token_batch(rows, max(len(r["prompt_ids"]) + len(r["reply_ids"]) for r in rows), 0)
  logits = np.asarray(model(batch["input_ids"], attention_mask=batch["attention_mask"]), np.float32)
  logp = np.asarray(jax.nn.log_softmax(logits / temperature, -1))
  got = np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
  mask = batch["loss_mask"] > 0
  return got[mask], batch["behaviour_logp"][mask]


@pytest.mark.slow
def test_grpo_processes_share_each_update_and_act_with_the_learners_weights(tmp_path):
  """GRPO under `jax.distributed`, 2 processes × 1 device against 1 × 2: round 1's rollouts (the one-process run's,
  replayed) train the same model, each process feeding its half of every minibatch (the global batch is the
  configured one, not one per process); round 2 is sampled afresh by both processes with the weights the learner
  gathered onto their hosts: its stored sampling-time log-probs equal a re-scoring by round 1's checkpoint."""
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  proc, lines = _launch(1, 2, one, "grpo.py:smoke", GRPO_ARGS)
  assert proc.wait(timeout=1500) == 0, "".join(lines[-200:])
  shutil.copytree(one, two)
  for path in ("grpo/actor", "grpo/rounds/round2", "eval", "grpo/DONE", "grpo/rounds.json", "results.json"):
    (shutil.rmtree if os.path.isdir(os.path.join(two, path)) else os.remove)(os.path.join(two, path))
  proc, lines = _launch(2, 1, two, "grpo.py:smoke", GRPO_ARGS)
  assert proc.wait(timeout=1500) == 0, "".join(lines[-200:])

  ref, got = _read(os.path.join(one, "grpo", "rounds.json")), _read(os.path.join(two, "grpo", "rounds.json"))
  assert ref[0]["updates"] > 0 and ref[0]["batch_rows"] == 4  # smoke's grpo.train.batch_size
  assert _close(got[0], ref[0]), (got[0], ref[0])  # the same loss, KL, clip fraction and global batch
  for a, b in zip(jax.tree.leaves(load_policy(os.path.join(one, "grpo", "actor"), step=1).model),
                  jax.tree.leaves(load_policy(os.path.join(two, "grpo", "actor"), step=1).model)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)

  round2 = os.path.join(two, "grpo", "rounds", "round2")
  assert rollout.shards(round2) == ["shard0", "shard1"]
  steps = [s for t in rollout.episodes(TrajectoryStore(round2)) for s in t.steps if s.reply_ids]
  assert steps
  after_round1, sampled = _rescored(os.path.join(two, "grpo", "actor"), steps, 1.0, step=1)
  np.testing.assert_allclose(sampled, after_round1, atol=1e-4)
  start, _ = _rescored(os.path.join(two, "il"), steps, 1.0)
  assert np.max(np.abs(start - sampled)) > 1e-3  # the check tells the start's weights from round 1's
  assert _read(os.path.join(two, "results.json"))["il"] == _read(os.path.join(one, "results.json"))["il"]
