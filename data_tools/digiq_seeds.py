"""Re-run the Digi-Q critic → actor → evaluation on a finished run's data with other seeds (and controls).

One run of the default gives one Digi-Q actor figure, and that figure swings by 10+ points with the critic's and
the actor's seeds (docs/results/digiq.md). This re-uses a workdir's data stages (tasks … representation, linked, not
copied) and, for every seed, trains the critic and the Best-of-N actor again into `<out>/seed<N>/` with
`config.seed = N`, then evaluates only the new actor on the same test episodes. `--control demos` trains the
actor stage on the demonstrations alone instead (the same steps and learning rate, no Best-of-N state): the
baseline that says whether the critic's selections add anything to more imitation. `--control filtered_bc`
replaces the Best-of-N states with every step of the successful behaviour trajectories (the paper's Filtered BC
baseline, §5.8), keeping the demonstrations in the mix as the Digi-Q actor does: whether the critic picks better
training states than the reward alone.

  python data_tools/digiq_seeds.py --workdir /tmp/digiq --out /tmp/digiq_seeds --seeds 0,1,2
  python data_tools/digiq_seeds.py --workdir /tmp/digiq --out /tmp/digiq_demos --seeds 0,1,2 --control demos
  python data_tools/digiq_seeds.py --workdir /tmp/digiq --out /tmp/digiq_fbc --seeds 0,1,2 --control filtered_bc
  python data_tools/digiq_seeds.py ... --config.critic.advantage_estimation=bellman   # any config override

Each seed's directory is resumable like the pipeline (finished stages are skipped); the table and
`<out>/results.json` give every seed's success rate and the mean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxagent.pipeline import device  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxagent.pipeline.finetune import finetune  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxagent.pipeline.evaluate import evaluate_actors  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxagent.pipeline.stages import Stages  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxagent.pipeline.tasks import test_episodes  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxagent.recipes import digiq  # noqa: E402  pylint: disable=g-import-not-at-top

DATA_STAGES = ("tasks", "il", "behaviour", "candidates", "representation")


def link_data(workdir: str, seed_dir: str) -> None:
  """`seed_dir/<stage>` → `workdir/<stage>` for the data stages, which must be finished."""
  os.makedirs(seed_dir, exist_ok=True)
  for stage in DATA_STAGES:
    if not Stages(workdir, "digiq").is_done(stage):
      raise SystemExit(f"digiq_seeds: {workdir} has not finished the {stage!r} stage; run the pipeline first")
    link = os.path.join(seed_dir, stage)
    if not os.path.lexists(link):
      os.symlink(os.path.abspath(os.path.join(workdir, stage)), link)


def run_seed(config, workdir: str, seed_dir: str, control: str) -> dict:
  """Critic and actor (or the demonstrations-only actor) with `config.seed`, then the actor's evaluation."""
  link_data(workdir, seed_dir)
  stages = Stages(seed_dir, "digiq_seeds")
  summary = {}
  if control == "filtered_bc":
    summary["actor"] = stages.run("actor", lambda out: digiq.stage_filtered_bc(config, seed_dir, out))
  elif control == "demos":
    def demos_actor(out):
      items = [dict(it, weight=float(config.actor.il_weight)) for it in device.demo_samples(seed_dir)]
      finetune(digiq.actor_config(config), out, items, agent=device.actor_format(config),
               init_from=os.path.join(seed_dir, "il"))
      return {"il_samples": len(items)}
    summary["actor"] = stages.run("actor", demos_actor)
  else:
    summary["critic"] = stages.run("critic", lambda out: digiq.stage_critic(config, seed_dir, out))
    summary["actor"] = stages.run("actor", lambda out: digiq.stage_actor(config, seed_dir, out))
  actor_dir = os.path.join(seed_dir, "actor")
  model_dir = actor_dir if os.path.isdir(os.path.join(actor_dir, "checkpoints")) else os.path.join(seed_dir, "il")
  summary["eval"] = stages.run("eval", lambda out: evaluate_actors(
      config, {"actor": model_dir}, test_episodes(config, seed_dir), out, env_spec=device.env_spec(config),
      gamma=float(config.critic.gamma))["actor"])
  return summary


def load_config(spec: str, overrides: Sequence[str], seed: int):
  """`spec` (path[:variant]) with `--config.a.b=value` overrides cast to each field's type, and `seed`."""
  from jaxagent.main import load_config_file  # pylint: disable=g-import-not-at-top
  config = load_config_file(spec, overrides)
  config.seed = seed
  return config


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="a Digi-Q workdir whose data stages are finished")
  parser.add_argument("--out", required=True, help="where the seeds' critic, actor and evaluation go")
  parser.add_argument("--seeds", default="0,1,2", help="comma-separated config.seed values")
  parser.add_argument("--control", choices=("none", "demos", "filtered_bc"), default="none",
                      help="demos: fine-tune the actor on the demonstrations alone (no Best-of-N state); "
                           "filtered_bc: on the successful behaviour trajectories' steps instead of Best-of-N's "
                           "(plus the demonstrations when actor.il_weight > 0), the paper's Filtered BC baseline")
  parser.add_argument("--config", default=os.path.join("configs", "digiq.py"), help="the config file (+ :variant)")
  args, overrides = parser.parse_known_args(argv)
  results = {}
  for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
    config = load_config(args.config, overrides, seed)
    summary = run_seed(config, args.workdir, os.path.join(args.out, f"seed{seed}"), args.control)
    results[seed] = summary
    print(f"[digiq_seeds] seed {seed}: digiq_actor {summary['eval']['success_rate']:.1%}", flush=True)
  rates = [r["eval"]["success_rate"] for r in results.values()]
  report = {"control": args.control, "overrides": overrides, "seeds": {str(k): v for k, v in results.items()},
            "mean_success_rate": float(np.mean(rates)) if rates else None}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  print("seed  success")
  for seed, r in results.items():
    print(f"{seed:4d}  {r['eval']['success_rate']:7.1%}")
  if rates:
    print(f"mean  {np.mean(rates):7.1%}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
