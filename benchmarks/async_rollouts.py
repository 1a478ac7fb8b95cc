"""Asynchronous against synchronous collection on DigiRL's online phase, same run, same machine.

Both runs start from the same finished `tasks` and `il` stages (built once here) and run DigiRL's online phase
(`mode=online`: rounds of rollouts of the current actor on train tasks → V^inst and V^step → actor) for the same
rounds and episodes, each in a fresh process (same compilation work): once with `online.max_lag=0` (the code's
alternation) and once with `online.max_lag=1` (round i collected with actor i-1 while actor i trains;
`pipeline/async_collect.py`). Reported per run: wall
time of the online phase, end-to-end episodes/s and learner steps/s (critic + actor optimizer steps), the time the
learner waited for rollouts, the collector's own time, and the training time; then async / sync.

  python benchmarks/async_rollouts.py --json /tmp/async_rollouts.json [--rounds 3] [--episodes 16]

On a 2-core machine the collector (Chromium, the policy's forward passes) and the learner (XLA) share the cores,
so overlap helps only as far as each leaves them idle: each run records the machine's busy fraction over all
cores (the hardware limit: a synchronous run already near 1.0 leaves async nothing to fill), and the JSON's
`where_the_time_goes` says how much collection was hidden and how much each side slowed down.
The machine's load average is recorded beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

_HERE = os.path.dirname(os.path.abspath(__file__))


def _config(rounds: int, episodes: int, max_lag: int, smoke: bool):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("digirl_config", os.path.join(_HERE, "..", "configs", "digirl.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("smoke" if smoke else None)
  config.mode = "online"
  config.online.update(iterations=rounds, episodes=episodes, max_lag=max_lag)
  config.train.progress_bar = False
  return config


def _learner_steps(config) -> int:
  per_round = int(config.online.actor.train.steps)
  if config.algorithm == "digirl":
    per_round += int(config.online.traj_critic.train.steps) + int(config.online.critic.train.steps)
  return per_round * int(config.online.iterations)


def run_online(config, base: str, workdir: str) -> dict:
  """DigiRL's online phase in `workdir`, started from `base`'s finished tasks and IL stages."""
  from jaxagent.pipeline.stages import read_json  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import digirl  # pylint: disable=g-import-not-at-top
  for stage in ("tasks", "il"):
    shutil.copytree(os.path.join(base, stage), os.path.join(workdir, stage))
  cpu0, t0 = psutil.cpu_times(), time.monotonic()
  summary = digirl.stage_online(config, workdir, os.path.join(workdir, "online"))
  wall, cpu1 = time.monotonic() - t0, psutil.cpu_times()
  busy = sum(getattr(cpu1, f) - getattr(cpu0, f) for f in ("user", "nice", "system", "irq", "softirq"))
  times = read_json(os.path.join(workdir, "online", "timings.json"))
  waited = sum(v for k, v in times.items() if k.endswith("_rollouts"))
  trained = sum(v for k, v in times.items() if not k.endswith("_rollouts"))
  collected = [read_json(os.path.join(workdir, "online", f"iter{i}_rollouts", "DONE"))
               for i in range(int(config.online.iterations))]
  episodes = int(config.online.iterations) * int(config.online.episodes)
  steps = _learner_steps(config)
  return {"max_lag": int(config.online.max_lag), "wall_s": wall, "episodes": episodes, "learner_steps": steps,
          "episodes_per_s": episodes / wall, "learner_steps_per_s": steps / wall,
          "learner_waited_for_rollouts_s": waited, "training_s": trained,
          "collector_s": sum(c.get("collect_s", 0.0) for c in collected),
          "lags": [c.get("lag", 0) for c in collected],
          "machine_cpu_busy_fraction": busy / (wall * psutil.cpu_count()),  # every process, all cores
          "rollout_success": [h["rollout_success"] for h in summary["iterations"]]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", required=True, help="where to write the results")
  parser.add_argument("--rounds", type=int, default=3, help="online rounds (config.online.iterations)")
  parser.add_argument("--episodes", type=int, default=16, help="episodes a round (the code's 16)")
  parser.add_argument("--smoke", action="store_true", help="the smoke config's model and stage sizes (a check)")
  parser.add_argument("--workdir", default="", help="keep the runs here (default: a temporary directory)")
  parser.add_argument("--variant", type=int, default=-1, help=argparse.SUPPRESS)  # internal: one run's max_lag
  parser.add_argument("--base", default="", help=argparse.SUPPRESS)  # internal: the finished tasks and IL stages
  args = parser.parse_args()
  if args.variant >= 0:
    result = run_online(_config(args.rounds, args.episodes, args.variant, args.smoke), args.base, args.workdir)
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(result, f)
    return

  from jaxagent.pipeline import device  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.stages import Stages  # pylint: disable=g-import-not-at-top

  root = args.workdir or tempfile.mkdtemp(prefix="async_rollouts_")
  base = os.path.join(root, "base")
  config = _config(args.rounds, args.episodes, 0, args.smoke)
  stages = Stages(base, "bench", config)
  t0 = time.monotonic()
  stages.run("tasks", lambda out: device.stage_tasks(config, out))
  stages.run("il", lambda out: device.stage_il(config, base, out, float(config.gamma)))
  setup_s = time.monotonic() - t0

  runs = {}
  for name, lag in (("sync", 0), ("async", 1)):  # each in a fresh process: neither inherits the other's compiles
    workdir = os.path.join(root, name)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"[bench] {name}: online phase with max_lag={lag} ...", flush=True)
    out = os.path.join(root, f"{name}.json")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--json", out, "--rounds", str(args.rounds),
                    "--episodes", str(args.episodes), "--variant", str(lag), "--base", base, "--workdir", workdir]
                   + (["--smoke"] if args.smoke else []), check=True)
    with open(out, encoding="utf-8") as f:
      runs[name] = json.load(f)
    print(f"[bench] {name}: {json.dumps(runs[name])}", flush=True)
  sync, asyn = runs["sync"], runs["async"]
  result = {
      "benchmark": "async_rollouts", "recipe": "digirl (mode=online)", "rounds": args.rounds,
      "episodes_per_round": args.episodes, "smoke": args.smoke, "setup_s": setup_s, "runs": runs,
      "speedup_episodes_per_s": asyn["episodes_per_s"] / sync["episodes_per_s"],
      "speedup_learner_steps_per_s": asyn["learner_steps_per_s"] / sync["learner_steps_per_s"],
      "where_the_time_goes": {
          "sync_collect_plus_train_s": sync["learner_waited_for_rollouts_s"] + sync["training_s"],
          "async_hidden_collect_s": asyn["collector_s"] - asyn["learner_waited_for_rollouts_s"],
          "async_collector_slowdown": asyn["collector_s"] / max(sync["collector_s"], 1e-9),
          "async_training_slowdown": asyn["training_s"] / max(sync["training_s"], 1e-9)},
      "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "python": platform.python_version()},
  }
  with open(args.json, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"async / sync: episodes/s x{result['speedup_episodes_per_s']:.2f}, learner steps/s "
        f"x{result['speedup_learner_steps_per_s']:.2f} (sync {sync['wall_s']:.0f} s, async {asyn['wall_s']:.0f} s; "
        f"collector hid {result['where_the_time_goes']['async_hidden_collect_s']:.0f} s behind training)")
  if not args.workdir:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  main()
