"""MiniWoB++ environment throughput: jaxagent's EnvPool (1, 2, 4 workers) against BrowserGym, same run.

Workload, identical for both: MiniWoB++ `click-checkboxes` (episodes do not end until Submit, so every step
is a real transition), seeded resets, and steps that click the task's checkboxes in DOM order. Each side
returns its default full observation after every step: jaxagent a screenshot, set-of-marks elements and their
text list; BrowserGym a screenshot, DOM snapshot, accessibility tree and element properties. BrowserGym runs
as shipped (`browsergym-miniwob`, pointed at the `miniwob` package's HTML through MINIWOB_URL and at Debian's
Chromium) and, as a second reference, with its fixed waits removed (`pre_observation_delay=0`, `slow_mo=0`).

  python benchmarks/env_throughput.py --json /tmp/env_throughput.json

Installing BrowserGym: `browsergym-core` pins `playwright==1.44` while jaxagent needs >= 1.50, so install it
without deps (`pip install --no-deps browsergym-core browsergym-miniwob`) plus its other requirements
(beautifulsoup4, gymnasium, lxml<6, mcp[cli], pyparsing); it runs on Playwright 1.65 unchanged.

Targets (issue 3): per-env steps/s >= 10x BrowserGym's, reset <= 0.5 s, near-linear scaling to 2 workers.
The machine's load average is recorded beside the figures: on a shared 2-core box they move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

from jaxagent import types
from jaxagent.envs import miniwob
from jaxagent.envs.pool import EnvPool

TASK = "click-checkboxes"
DEBIAN_CHROMIUM = "/usr/bin/chromium"


def _checkboxes(obs: types.Observation) -> list[int]:
  return [e.index for e in obs.elements if e.tag == "input" and e.attrs.get("type") == "checkbox"]


def _click(element: int) -> types.Action:
  return types.Action(types.ActionKind.CLICK, element=element)


def bench_pool(num_workers: int, steps: int, resets: int) -> dict:
  """Reset latency (all slots reset together) and steps/s with every slot stepping each round."""
  tasks = [miniwob.make_task(TASK, seed=s, max_steps=steps + 5) for s in range(resets * num_workers + 1)]
  with EnvPool({"kind": "miniwob"}, num_workers=num_workers) as pool:
    t0 = time.perf_counter()
    first = pool.reset(tasks[:num_workers])  # launches the browsers: reported, not part of the latency
    launch_s = time.perf_counter() - t0
    latencies = []
    for r in range(resets):
      t0 = time.perf_counter()
      first = pool.reset(tasks[num_workers * r:num_workers * (r + 1)])
      latencies.append(time.perf_counter() - t0)
    targets = [_checkboxes(res.obs) for res in first]
    if not all(targets):
      raise RuntimeError(f"no checkbox found in the {TASK} observation: {[r.obs.element_text for r in first]}")
    t0 = time.perf_counter()
    for k in range(steps):
      out = pool.step([_click(t[k % len(t)]) for t in targets])
      if any(r.restarted or r.errored for r in out):
        raise RuntimeError(f"a worker crashed during the benchmark: {[r.errors for r in out]}")
    elapsed = time.perf_counter() - t0
  return {
      "num_workers": num_workers, "steps_per_env": steps, "first_reset_with_browser_launch_s": launch_s,
      "reset_latency_s": statistics.median(latencies), "reset_latency_mean_s": statistics.mean(latencies),
      "steps_per_s_total": num_workers * steps / elapsed, "steps_per_s_per_env": steps / elapsed,
      "step_latency_s": elapsed / steps,
  }


def bench_in_process(steps: int, resets: int) -> dict:
  """The same env without the pool: what the subprocess round trip costs."""
  env = miniwob.MiniWoBEnv()
  try:
    env.reset(miniwob.make_task(TASK, seed=0, max_steps=steps + 5))
    latencies = []
    for r in range(resets):
      t0 = time.perf_counter()
      obs = env.reset(miniwob.make_task(TASK, seed=r + 1, max_steps=steps + 5))
      latencies.append(time.perf_counter() - t0)
    targets = _checkboxes(obs)
    t0 = time.perf_counter()
    for k in range(steps):
      env.step(_click(targets[k % len(targets)]))
    elapsed = time.perf_counter() - t0
  finally:
    env.close()
  return {"reset_latency_s": statistics.median(latencies), "steps_per_s_per_env": steps / elapsed}


def _use_debian_chromium() -> None:
  """BrowserGym launches Chromium twice per reset (task page and its chat window), the chat window without
  any way to pass `executable_path`; Playwright's own browser is not installed here, so default it."""
  from playwright.sync_api._generated import BrowserType  # pylint: disable=g-import-not-at-top

  launch = BrowserType.launch
  if getattr(launch, "_jaxagent_debian", False):
    return

  def launch_debian(self, *args, **kwargs):
    kwargs.setdefault("executable_path", DEBIAN_CHROMIUM)
    return launch(self, *args, **kwargs)

  launch_debian._jaxagent_debian = True
  BrowserType.launch = launch_debian


def bench_browsergym(steps: int, resets: int, tuned: bool) -> dict:
  os.environ["MINIWOB_URL"] = miniwob.base_url() + "miniwob/"
  import browsergym.miniwob  # pylint: disable=g-import-not-at-top,unused-import  # registers the tasks
  import gymnasium as gym  # pylint: disable=g-import-not-at-top

  _use_debian_chromium()
  kwargs = {"pre_observation_delay": 0.0, "slow_mo": 0} if tuned else {}
  env = gym.make(f"browsergym/miniwob.{TASK}", **kwargs)
  try:
    latencies = []
    for r in range(resets):
      t0 = time.perf_counter()
      env.reset(seed=r + 1)
      latencies.append(time.perf_counter() - t0)
    bids = env.unwrapped.page.locator("input[type=checkbox]").evaluate_all(
        "els => els.map((e) => e.getAttribute('bid'))")
    t0 = time.perf_counter()
    for k in range(steps):
      obs, _, terminated, truncated, _ = env.step(f"click('{bids[k % len(bids)]}')")
      if obs["last_action_error"] or terminated or truncated:
        raise RuntimeError(f"BrowserGym step {k} failed: {obs['last_action_error']!r} terminated={terminated}")
    elapsed = time.perf_counter() - t0
  finally:
    env.close()
  return {"reset_latency_s": statistics.median(latencies), "steps_per_s_per_env": steps / elapsed,
          "settings": kwargs or "as shipped (pre_observation_delay=0.5 s, task slow_mo=100 ms)"}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--json", required=True, help="where to write the results")
  parser.add_argument("--steps", type=int, default=30, help="steps per env per measurement")
  parser.add_argument("--resets", type=int, default=5, help="timed resets per measurement")
  parser.add_argument("--bg-steps", type=int, default=15, help="steps per BrowserGym measurement")
  parser.add_argument("--bg-resets", type=int, default=3, help="timed resets per BrowserGym measurement")
  parser.add_argument("--pool-sizes", default="1,2,4")
  args = parser.parse_args(argv)

  result = {"task": TASK, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                      "loadavg_start": os.getloadavg()}}
  result["jaxagent_in_process"] = bench_in_process(args.steps, args.resets)
  result["jaxagent_pool"] = {}
  for n in (int(x) for x in args.pool_sizes.split(",")):
    result["jaxagent_pool"][str(n)] = r = bench_pool(n, args.steps, args.resets)
    print(f"pool {n}: {r['steps_per_s_total']:.1f} steps/s total, {r['steps_per_s_per_env']:.1f} per env, "
          f"reset {r['reset_latency_s'] * 1e3:.0f} ms", flush=True)
  for name, tuned in (("browsergym", False), ("browsergym_no_waits", True)):
    try:
      result[name] = bench_browsergym(args.bg_steps, args.bg_resets, tuned)
      print(f"{name}: {result[name]['steps_per_s_per_env']:.2f} steps/s, reset "
            f"{result[name]['reset_latency_s']:.2f} s", flush=True)
    except Exception as e:  # pylint: disable=broad-except  # say exactly why the reference could not run
      result[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
      print(f"{name} could not run: {type(e).__name__}: {e}", file=sys.stderr)

  pools = result["jaxagent_pool"]
  ours = pools.get("1", next(iter(pools.values())))
  ratios = {}
  for name in ("browsergym", "browsergym_no_waits"):
    ref = result[name]
    if "error" not in ref:
      ratios[name] = {"steps_per_s_per_env": ours["steps_per_s_per_env"] / ref["steps_per_s_per_env"],
                      "reset_speedup": ref["reset_latency_s"] / ours["reset_latency_s"]}
  scaling = {n: pools[n]["steps_per_s_total"] / pools["1"]["steps_per_s_total"] for n in pools if "1" in pools}
  result["ratios"] = ratios
  result["scaling_vs_1_worker"] = scaling
  result["targets"] = {
      "per_env_10x_browsergym": ratios.get("browsergym", {}).get("steps_per_s_per_env", 0.0) >= 10,
      "reset_under_0.5s": all(p["reset_latency_s"] <= 0.5 for p in pools.values()),
      "scaling_2_workers_near_linear(>=1.6x)": scaling.get("2", 0.0) >= 1.6,
  }
  result["machine"]["loadavg_end"] = os.getloadavg()
  with open(args.json, "w") as f:
    json.dump(result, f, indent=2, default=str)
  print(json.dumps({"ratios": ratios, "scaling_vs_1_worker": scaling, "targets": result["targets"]}, indent=2))
  return result


if __name__ == "__main__":
  main()
