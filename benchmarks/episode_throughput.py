"""Episodes on the bundled sites: today's path (a new Chromium context per episode) against a kept context and
against the browser-free text backend, in the same run.

Workload, identical for every side: the scripted expert (WebRL's simplified HTML in the desktop window without
screenshots, the `text` profile its recipe uses; AutoUI taps on the phone) plays the same benchmark episodes (`bench:<profile>/test_comb@2`, perturbation level 2: pop-ups,
failed pages, shuffles), collected through `pipeline.rollout` with the programmatic judge, as a recipe collects.
Reported per profile, backend and worker count: episodes/s, steps/s and success; and each backend's reset
latency in one env (median of `--resets`). The ratio is against `chromium-fresh` measured in the same run. The
text backend serves simplified-HTML agents only, so the phone has no text row.

  python benchmarks/episode_throughput.py --json /tmp/episodes.json

The machine's load average is recorded before and after: on a shared 2-core box the figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import ml_collections

from jaxagent.envs import registry
from jaxagent.envs.sites import bench, expert, server
from jaxagent.judges.evaluators import ProgrammaticJudge
from jaxagent.pipeline.rollout import BROWSERS, rollout

# env profile -> (agent format, observation the expert acts through, the benchmark profile the tasks come from):
# WebRL's desktop window without screenshots (as its recipe runs), and the phone
PROFILES = {"text": ("webrl", "html", "web"), "device": ("autoui", "som", "device")}
# backend -> (config.env.browser, extra env options)
BACKENDS = {"chromium-fresh": ("chromium", {"fresh_context": True}),
            "chromium": ("chromium", {}),
            "text": ("text", {})}


def spec_for(profile: str, backend: str, base_url: str) -> dict:
  browser, options = BACKENDS[backend]
  _, observation, _ = PROFILES[profile]
  extra = {"som_draw": False} if profile == "device" else {}
  return {"kind": BROWSERS[browser], "profile": profile, "observation": observation, "base_url": base_url,
          "oracle_targets": True, **extra, **options}


def episodes(profile: str, n: int):
  tasks = bench.tasks_for(f"{PROFILES[profile][2]}/test_comb@2")
  step = max(1, len(tasks) // n)
  return tasks[::step][:n]  # every family, the same episodes for every side


def bench_rollout(profile: str, backend: str, workers: int, n: int, base_url: str) -> dict:
  env_cfg = ml_collections.ConfigDict({"workers": workers, "step_timeout": 120.0, "reset_timeout": 120.0,
                                       "errored_retries": 2})
  tasks = episodes(profile, n)
  policy = expert.ScriptedExpert(PROFILES[profile][0])
  with tempfile.TemporaryDirectory() as store:
    rollout(spec_for(profile, backend, base_url), env_cfg, policy, tasks[:workers], os.path.join(store, "warm"),
            judge=ProgrammaticJudge(), name="warm")  # browsers launched and pages compiled: not part of the figure
    t0 = time.perf_counter()
    trajs = rollout(spec_for(profile, backend, base_url), env_cfg, policy, tasks, os.path.join(store, "run"), name=backend,
                    judge=ProgrammaticJudge())
    wall = time.perf_counter() - t0
  steps = sum(len(t.steps) for t in trajs)
  return {"profile": profile, "backend": backend, "workers": workers, "episodes": len(trajs), "steps": steps,
          "wall_s": round(wall, 2), "episodes_per_s": round(len(trajs) / wall, 3),
          "steps_per_s": round(steps / wall, 2), "success": sum(t.success for t in trajs) / len(trajs)}


def bench_reset(profile: str, backend: str, resets: int, base_url: str) -> float:
  """Median seconds of `env.reset(task)` in one env (after a first reset that launches the browser)."""
  tasks = episodes(profile, resets + 1)
  env = registry.make_env(spec_for(profile, backend, base_url))
  try:
    env.reset(tasks[0])
    times = []
    for task in tasks[1:]:
      t0 = time.perf_counter()
      env.reset(task)
      times.append(time.perf_counter() - t0)
  finally:
    env.close()
  return statistics.median(times)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--episodes", type=int, default=24)
  p.add_argument("--resets", type=int, default=15)
  p.add_argument("--workers", default="1,4")
  p.add_argument("--profiles", default="text,device")
  p.add_argument("--json", default="")
  args = p.parse_args()
  base_url = server.ensure_server(0)
  load_before = os.getloadavg()
  rows, resets = [], {}
  for profile in args.profiles.split(","):
    backends = [b for b in BACKENDS if not (b == "text" and PROFILES[profile][1] != "html")]
    for backend in backends:
      resets[f"{profile}/{backend}"] = round(bench_reset(profile, backend, args.resets, base_url), 4)
      print(f"{profile:7s} {backend:15s} reset {resets[f'{profile}/{backend}'] * 1000:7.1f} ms", flush=True)
    for workers in [int(w) for w in args.workers.split(",")]:
      base = None
      for backend in backends:
        row = bench_rollout(profile, backend, workers, args.episodes, base_url)
        base = base or row["episodes_per_s"]
        row["ratio_vs_chromium_fresh"] = round(row["episodes_per_s"] / base, 2)
        row["reset_ratio_vs_chromium_fresh"] = round(resets[f"{profile}/chromium-fresh"] /
                                                     resets[f"{profile}/{backend}"], 2)
        rows.append(row)
        print(f"{profile:7s} {backend:15s} workers {workers}: {row['episodes_per_s']:6.2f} episodes/s "
              f"({row['steps_per_s']:6.1f} steps/s, success {row['success']:.2f}) "
              f"{row['ratio_vs_chromium_fresh']:5.2f}x today's path", flush=True)
  out = {"rows": rows, "reset_median_s": resets, "load_before": load_before, "load_after": os.getloadavg(),
         "cpus": os.cpu_count(), "machine": platform.platform(), "episodes": args.episodes}
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  print(json.dumps({"load_before": load_before, "load_after": out["load_after"]}))


if __name__ == "__main__":
  main()
