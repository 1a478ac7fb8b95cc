"""Evaluate any policy on any task suite: success with a Wilson 95 % interval per seed, the mean and spread over
seeds with a hierarchical (seeds × episodes) bootstrap interval, per family / tier / split and per-task tables,
mean steps, each episode's outcome (for pairing with another policy: `data_tools/paired_runs.py`),
`results.json` and an HTML report of the trajectories.

    python -m jaxagent.evaluate --policy W/actor --suite sites:device/test --episodes 100 --seeds 0,1,2 --out E
    python -m jaxagent.evaluate --policy expert --suite sites:web/test/shop_price,forum_author --out E
    python -m jaxagent.evaluate --policy openai --model M --base-url http://host:8000/v1 --suite miniwob:click-button
    python -m jaxagent.evaluate --policy W/il --suite file:W/tasks/test.jsonl --out E
    python -m jaxagent.evaluate --policy expert --suite bench:device/headline@2 --seeds 0,1,2 --out E

`--policy`: a checkpoint directory (a recipe stage, a training workdir, an export, a HF directory, `smollm2`;
a recipe-trained actor acts as its `agent.json` records: the format, its options, the parse rule; a `--format`
naming another format is refused),
`expert` (the bundled sites' scripted expert) or `openai` (an OpenAI-compatible server: `--base-url`,
`--model`, key from $OPENAI_API_KEY). `--suite`: `sites:PROFILE/SPLIT[/FAMILY,...]` (the bundled sites' tasks of
one profile, split and template families, generated for each seed's world), `bench:PROFILE/SPLIT[@LEVEL][/FAMILY,...]`
(the sites benchmark, `jaxagent/envs/sites/bench.py`: SPLIT may be `headline` or `control`, the negative
control's held-out intents; every intent once by default, the success and the subgoal rubric per family beside the
total), `miniwob:TASK,...` (MiniWoB++ tasks on distinct held-out instances, each once: `--episodes` spread evenly
over the tasks, global seed k taking the k-th block of each task's test seeds, so seed 0 plays the GRPO recipe's
held-out instances; `miniwob_instances`), or `file:TASKS.jsonl` (each line once, under its own id, unless
`--episodes` draws from them). Each seed draws `--episodes` episodes with its own seed (and, for the sites, its
own world); episodes already in `OUT/seed<k>/episodes` are kept, so a killed run resumes. MiniWoB++ episodes end
by the step limit, not the page's wall clock (`--page-clock` keeps it: `envs.miniwob`, "The clock").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from jaxagent import host_memory, types

# The agent format a profile's policies speak by default, and the observation each needs.
PROFILE_FORMAT = {"device": "autoui", "web": "webvoyager", "text": "webrl", "miniwob": "webvoyager"}
OBSERVATION = {"autoui": "screenshot", "webvoyager": "som", "webvoyager_text": "a11y",
               "webvoyager_actree_image": "a11y", "openwebvoyager": "a11y", "openwebvoyager_compact": "a11y",
               "webrl": "html", "autoui_text": "html"}  # autoui_text: DigiRL's phone read as text


@dataclasses.dataclass
class Suite:
  kind: str  # sites | miniwob | file
  profile: str
  split: str = "test"
  families: str = ""
  names: tuple[str, ...] = ()
  path: str = ""

  @classmethod
  def parse(cls, spec: str) -> "Suite":
    kind, _, rest = spec.partition(":")
    if kind == "sites":
      parts = rest.split("/")
      if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"--suite {spec!r}: write sites:PROFILE/SPLIT[/FAMILY,...], e.g. sites:device/test")
      return cls("sites", parts[0], parts[1], parts[2] if len(parts) == 3 else "")
    if kind == "bench":
      from jaxagent.envs.sites import bench  # pylint: disable=g-import-not-at-top
      try:
        profile = bench.parse_split(rest)[0]
      except ValueError as e:
        raise ValueError(f"--suite {spec!r}: {e}") from None
      return cls("bench", profile, split=rest)
    if kind == "miniwob":
      names = tuple(n.strip() for n in rest.split(",") if n.strip())
      if not names:
        raise ValueError(f"--suite {spec!r}: name the MiniWoB tasks, e.g. miniwob:click-button,click-link")
      return cls("miniwob", "miniwob", names=names)
    if kind == "file":
      if not os.path.isfile(rest):
        raise ValueError(f"--suite {spec!r}: {rest!r} is not a task file")
      return cls("file", "", path=rest)
    raise ValueError(f"--suite {spec!r}: start with sites:, bench:, miniwob: or file:")

  def tasks(self, seed: int, episodes: int = 0) -> list[types.Task]:
    """The suite's tasks for `seed` (for the sites, generated in world `seed`; for MiniWoB++, enough held-out
    instances for `episodes`: `miniwob_instances`)."""
    if self.kind == "sites":
      from jaxagent.envs import sites  # pylint: disable=g-import-not-at-top
      suites = sites.select(seed, self.profile, self.families)
      if self.split not in suites:
        raise ValueError(f"--suite: split {self.split!r} is not one of {sorted(suites)}")
      return suites[self.split]
    if self.kind == "bench":
      from jaxagent.envs.sites import bench  # pylint: disable=g-import-not-at-top
      return bench.tasks_for(self.split, seed)
    if self.kind == "miniwob":
      return miniwob_instances(self.names, seed, episodes)
    from jaxagent.pipeline.tasks import read_tasks  # pylint: disable=g-import-not-at-top
    return read_tasks(self.path)


def miniwob_instances(names: tuple[str, ...], seed: int, episodes: int) -> list[types.Task]:
  """Each task on ⌈episodes / tasks⌉ distinct held-out instances (`envs.miniwob.split_seeds("test", ...)`, never a
  training seed of the GRPO recipe), global seed k taking the k-th block of them, so seeds never share one."""
  from jaxagent.envs import miniwob  # pylint: disable=g-import-not-at-top
  if seed < 0:
    raise ValueError(f"--seeds {seed}: MiniWoB++'s held-out instances are numbered from seed 0; give seeds >= 0")
  per_task = max(1, -(-int(episodes) // len(names)))
  seeds = miniwob.split_seeds("test", (seed + 1) * per_task)[seed * per_task:]
  return miniwob.suite(names, seeds=seeds, split="test")


def env_spec(suite: Suite, tasks: list[types.Task], fmt: str, expert: bool, base_url: str,
             browser: str = "chromium", page_clock: bool = False) -> dict[str, Any]:
  """The pool spec: MiniWoB (the step limit ends an episode, or with `page_clock` the page's own limit too), or the
  bundled sites at `base_url` (a server of the episodes' world), rendered by `browser` (chromium | text:
  `pipeline.rollout.BROWSERS`)."""
  observation = OBSERVATION.get(fmt, "screenshot")
  profile = suite.profile or (tasks[0].profile if tasks else "web")
  if profile == "miniwob":
    return {"kind": "miniwob", "observation": "som" if expert else observation,
            "episode_max_time_ms": None if page_clock else 0}
  from jaxagent.pipeline.rollout import BROWSERS  # pylint: disable=g-import-not-at-top
  if browser == "text" and observation != "html":
    raise ValueError(f"--browser text renders WebRL's simplified HTML only; format {fmt!r} observes {observation!r} "
                     "(use --format webrl, or --browser chromium)")
  spec = {"kind": BROWSERS[browser], "profile": profile, "observation": observation, "base_url": base_url}
  if expert:
    from jaxagent.envs.sites.expert import FORMAT_OBSERVATION  # pylint: disable=g-import-not-at-top
    spec.update(observation=FORMAT_OBSERVATION[fmt], oracle_targets=True,
                **({"som_draw": False} if profile == "device" else {}))
  return spec


def world_of(suite: Suite, tasks: list[types.Task], seed: int) -> int | None:
  """The site world the episodes live in (None for MiniWoB): the seed's for a sites suite, the file's own."""
  if (suite.profile or (tasks[0].profile if tasks else "")) == "miniwob":
    return None
  return seed if suite.kind in ("sites", "bench") else _file_world(tasks)


def _file_world(tasks: list[types.Task]) -> int:
  seeds = {t.seed for t in tasks}
  if len(seeds) != 1:
    raise ValueError(f"the task file mixes worlds {sorted(seeds)}; one file per world seed (task.seed)")
  return seeds.pop()


def actor_format(args) -> str:
  """The format a checkpoint directory's actor acts in (its `agent.json`), or "" when it records none. A `--format`
  naming another is refused: the actor would read prompts it was never trained on (the same name acts with the
  recorded options, e.g. WebRL's compact HTML cut at 2,048 characters, not the format's defaults)."""
  if args.policy in ("expert", "openai") or not os.path.isdir(args.policy):
    return ""
  from jaxagent.agents import spec  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.checkpoint import workdir_of  # pylint: disable=g-import-not-at-top
  recorded = (spec.read(workdir_of(args.policy)) or {}).get("format") or ""
  if recorded and args.format and args.format != recorded:
    raise ValueError(f"--format {args.format}: {args.policy} was trained in format {recorded!r} with the options "
                     f"its {spec.AGENT_FILE} records; drop --format (or give --format {recorded}) to act as trained")
  return recorded


def load_args(args, fmt: str) -> tuple[str | None, str | None]:
  """(fmt, parse) for `pipeline.policy.load`: None and the actor's own rule where its `agent.json` records `fmt`
  (its options and parse rule apply), else `fmt` with the original's parse rule (faithful)."""
  recorded = actor_format(args) == fmt
  return (None if recorded else fmt), args.parse or (None if recorded else "faithful")


def make_policy(args, fmt: str, seed: int):
  if args.policy == "expert":
    from jaxagent.envs.sites.expert import ScriptedExpert  # pylint: disable=g-import-not-at-top
    return ScriptedExpert(fmt)
  if args.policy == "openai":
    from jaxagent.policies import OpenAIPolicy  # pylint: disable=g-import-not-at-top
    if not args.model:
      raise ValueError("--policy openai needs --model (and --base-url for a server other than OpenAI's)")
    return OpenAIPolicy({"base_url": args.base_url, "model": args.model, "agent_format": fmt,
                         "temperature": args.temperature, "max_tokens": args.max_tokens, "seed": seed})
  from jaxagent.pipeline.policy import load  # pylint: disable=g-import-not-at-top
  fmt_arg, parse = load_args(args, fmt)
  return load(args.policy, temperature=args.temperature, seed=seed, max_tokens=args.max_tokens,
              max_batch=args.max_batch, fmt=fmt_arg, parse=parse,
              prefix_cache_bytes=int(args.prefix_cache_mb * 2**20))


def evaluate(args) -> dict:
  from jaxagent.envs.sites.server import SiteServer  # pylint: disable=g-import-not-at-top
  from jaxagent.judges.evaluators import ProgrammaticJudge  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline import report  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.evaluate import evaluate_actors, write_results  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.rollout import stored_by_id  # pylint: disable=g-import-not-at-top
  from jaxagent.data.store import TrajectoryStore  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.tasks import draw_episodes  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top

  suite = Suite.parse(args.suite)
  config = ml_collections.ConfigDict({
      "env": {"workers": args.workers, "step_timeout": 60.0, "reset_timeout": 90.0, "errored_retries": 2},
      "train": {"progress_bar": True}, "eval": {"temperature": args.temperature, "seed": 0}})
  per_seed, per_episode, tables, all_trajs, by_family = {}, {}, {}, [], {}
  for seed in args.seeds:
    tasks = suite.tasks(seed, args.episodes)
    fmt = args.format or actor_format(args) or PROFILE_FORMAT.get(
        suite.profile or (tasks[0].profile if tasks else "web"), "webvoyager")
    if suite.kind == "file" and not args.episodes:  # a file of episodes (a recipe's test.jsonl) is played as is
      episodes = tasks
    else:
      episodes = draw_episodes(tasks, args.episodes or len(tasks), seed, tag=f"eval{seed}.")
    policy = make_policy(args, fmt, seed)
    print(f"seed {seed}: {len(episodes)} episodes of {len(tasks)} tasks ({args.suite}), format {fmt}", flush=True)
    world = world_of(suite, tasks, seed)
    server = None if world is None else SiteServer(seed=world).start()
    judge = ProgrammaticJudge()
    try:
      spec = env_spec(suite, tasks, fmt, args.policy == "expert", server.base_url if server else "", args.browser,
                      args.page_clock)
      extra = (lambda name, p, trajs: {"by_family": family_table(trajs, judge)}) if suite.kind == "bench" else None
      seed_dir = os.path.join(args.out, f"seed{seed}")
      result = evaluate_actors(config, {"episodes": policy}, episodes, seed_dir, env_spec=spec, judge=judge,
                               seed=seed, extra=extra)["episodes"]
    finally:
      if server is not None:
        server.stop()
    if "by_family" in result:
      by_family[seed] = result["by_family"]
    store_dir = os.path.join(seed_dir, "episodes")
    by_id = stored_by_id(TrajectoryStore(store_dir))
    trajs = [by_id[t.id] for t in episodes if t.id in by_id]
    per_seed[seed] = report.summary(trajs)
    per_episode[seed] = {"episodes": report.outcomes(trajs)}
    tables[seed] = report.per_task(trajs)
    all_trajs.append((seed, trajs, store_dir))
  headline = report.over_seeds(per_seed)
  if all(r["episodes"]["outcomes"] for r in per_episode.values()):
    headline["hierarchical"] = report.hierarchical_mean(
        {s: list(r["episodes"]["outcomes"].values()) for s, r in per_episode.items()})
  results = {"policy": args.policy, "suite": args.suite, "format": args.format or actor_format(args) or
             "profile default", "temperature": args.temperature, "episodes_per_seed": args.episodes,
             "browser": args.browser, **({"page_clock": True} if args.page_clock else {}), "seeds": {str(k): v for k, v in per_seed.items()}, "success_rate": headline,
             "per_task": {str(k): v for k, v in tables.items()},
             **({"by_family": {str(k): v for k, v in by_family.items()}} if by_family else {}),
             "outcomes": {str(s): r["episodes"]["outcomes"] for s, r in per_episode.items()}}
  if "hierarchical" in headline:
    results["by_stratum"] = report.by_stratum(per_episode, ["episodes"])
  os.makedirs(args.out, exist_ok=True)
  results = write_results(os.path.join(args.out, "results.json"), results)
  for seed, trajs, root in all_trajs:
    report.html_report(os.path.join(args.out, f"seed{seed}", "report.html"), f"{args.policy} on {args.suite}, "
                       f"seed {seed}: {100 * per_seed[seed]['success_rate']:.1f} %", trajs, root)
  print(report.table(per_seed, headline), flush=True)
  if "hierarchical" in headline:
    h = headline["hierarchical"]
    print(f"over seeds x episodes: {100 * h['mean']:.1f} % [{100 * h['ci95'][0]:.1f}, {100 * h['ci95'][1]:.1f}] "
          "(hierarchical bootstrap, 95 %)", flush=True)
  print(f"results: {os.path.join(args.out, 'results.json')}; reports: {args.out}/seed<k>/report.html", flush=True)
  return results


def family_table(trajs, judge) -> dict[str, dict]:
  """Per benchmark family (and tier): success rate, the mean share of rubric subgoals met, episodes. The rubric
  reads the server's state, so this runs while the episodes' server is up."""
  from jaxagent.judges.evaluators import rubric_score  # pylint: disable=g-import-not-at-top
  groups: dict[str, list[tuple[float, float | None]]] = {}
  for t in trajs:
    if t.status == "errored":
      continue
    score = rubric_score(judge.rubric(t.task, t))
    for key in (t.task.meta.get("family", "?"), f"tier{t.task.meta.get('tier', '?')}", "all"):
      groups.setdefault(key, []).append((float(t.success == 1.0), score))
  out = {}
  for key, rows in sorted(groups.items()):
    scores = [s for _, s in rows if s is not None]
    out[key] = {"episodes": len(rows), "success_rate": sum(s for s, _ in rows) / len(rows),
                "rubric": sum(scores) / len(scores) if scores else None}
  return out


def _seeds(text: str) -> list[int]:
  try:
    seeds = [int(s) for s in text.split(",") if s.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"--seeds {text!r}: comma-separated integers, e.g. 0,1,2") from None
  if not seeds:
    raise argparse.ArgumentTypeError("--seeds: give at least one seed")
  return seeds


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m jaxagent.evaluate", description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("--policy", required=True, help="a checkpoint directory, 'expert' or 'openai'")
  p.add_argument("--suite", required=True,
                 help="sites:PROFILE/SPLIT[/FAMILIES], bench:PROFILE/SPLIT[@LEVEL][/FAMILIES], miniwob:TASKS or file:PATH")
  p.add_argument("--episodes", type=int, default=0, help="episodes per seed, drawn from the suite's tasks "
                 "(default: each task once for bench: and file:, as the file's ids; 100 otherwise)")
  p.add_argument("--seeds", type=_seeds, default=[0], help="comma-separated global seeds (default 0)")
  p.add_argument("--out", required=True, help="output directory (stores, results.json, report.html)")
  p.add_argument("--format", default="", help="agent format (default: a trained actor's own, from its agent.json, "
                 f"with its options; another is refused; otherwise by profile: {PROFILE_FORMAT})")
  p.add_argument("--parse", default="", choices=("", "lenient", "faithful"),
                 help="how malformed replies parse (default: the actor's own rule, else faithful, the original's)")
  p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (compare at the same one)")
  p.add_argument("--max-tokens", type=int, default=128)
  p.add_argument("--max-batch", type=int, default=32)
  p.add_argument("--prefix-cache-mb", type=float, default=0.0,
                 help="a decoder's keys of recent prompts kept (MiB), so an episode's next prompt prefills only what "
                 "follows them: pays where prompts share long beginnings (a prefill 3.9x faster with 1,500 of 1,800 "
                 "tokens cached), within the spread on the text headline's (0, the default: none; "
                 "docs/results/performance.md#prefix-cache)")
  p.add_argument("--workers", type=int, default=2, help="browsers in the pool")
  p.add_argument("--browser", default="chromium", choices=("chromium", "text"),
                 help="what renders the bundled sites: Chromium, or the browser-free text backend (--format webrl)")
  p.add_argument("--page-clock", action="store_true",
                 help="MiniWoB++: keep each page's own wall-clock limit (7-30 s, then reward -1), which makes a "
                 "reward depend on the machine's speed (default: the step limit alone ends an episode)")
  p.add_argument("--base-url", default="", help="--policy openai: the server (default $OPENAI_BASE_URL)")
  p.add_argument("--model", default="", help="--policy openai: the model name")
  args = p.parse_args(argv)
  if args.episodes < 0:
    p.error(f"--episodes={args.episodes} must be ≥ 1 (or 0: each task once for bench:, 100 otherwise)")
  if args.prefix_cache_mb < 0:
    p.error(f"--prefix-cache-mb={args.prefix_cache_mb} must be ≥ 0 (0: no prefix cache)")
  try:
    suite = Suite.parse(args.suite)
  except ValueError as e:
    p.error(str(e))
  if not args.episodes and suite.kind not in ("bench", "file"):
    args.episodes = 100
  try:
    actor_format(args)  # a --format the actor was not trained in, before any work
    if suite.kind == "miniwob":
      for seed in args.seeds:
        miniwob_instances(suite.names, seed, args.episodes)
  except ValueError as e:
    p.error(str(e))
  host_memory.keep_freed_memory()  # XLA:CPU's large buffers: no fresh pages every decision
  evaluate(args)


if __name__ == "__main__":
  sys.exit(main())
