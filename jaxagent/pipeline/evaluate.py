"""One evaluation for every recipe and the evaluation CLI: every actor on the same episodes, in one pool.

`evaluate_actors` plays each actor (a trained actor's directory, loaded as it acts, or any `types.Policy`) on the
same held-out episodes at one temperature, writes each one's trajectories to `out/<name>/`, its success rate to
TensorBoard (`eval/<name>_success_rate`), and returns the summaries `write_results` saves and `report.policy_table`
prints.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxagent import types
from jaxagent.judges.evaluators import ProgrammaticJudge
from jaxagent.pipeline import distributed, report
from jaxagent.pipeline.policy import agent_format, load_actor
from jaxagent.pipeline.provenance import with_provenance
from jaxagent.pipeline.rollout import Rollouts
from jaxagent.pipeline.stages import write_json
from jaxagent.pipeline.tasks import errored_count, success_rate
from jaxagent.rl.collector import Job
from jaxagent.train.metrics import MetricWriter

JudgeFor = Callable[[str], types.Judge | None]  # the episodes' store directory -> their judge


def summary(trajs: Sequence[types.Trajectory], temperature: float) -> dict[str, Any]:
  """Success rate over the episodes that ran, with its 95 % Wilson interval; episodes, errored, mean steps."""
  ran = [t for t in trajs if t.status != "errored"]
  return {"success_rate": success_rate(trajs), "episodes": len(ran), "temperature": float(temperature),
          "mean_steps": float(np.mean([len(t.steps) for t in ran])) if ran else 0.0,
          "errored": errored_count(trajs), "ci95": report.summary(trajs)["ci95"]}


def evaluate_actors(config, actors: Mapping[str, str | types.Policy], tasks: Sequence[types.Task], out: str, *,
                    env_spec: dict, judge: types.Judge | JudgeFor | None = None, gamma: float = 1.0,
                    early_stop=None, temperature: float | Mapping[str, float] | None = None,
                    seed: int | None = None,
                    extra: Callable[[str, types.Policy, list[types.Trajectory]], dict] | None = None
                    ) -> dict[str, dict]:
  """Every actor in `actors` (name → model directory or policy) on `tasks`, at `temperature` (default
  `config.eval.temperature`; a mapping gives each actor its own) with sampling seed `seed` (default
  `config.eval.seed`), judged by `judge` (default the programmatic judge; a callable gets the store directory),
  each episode ending by `early_stop` (default the actor's format's own rule, `AgentFormat.early_stop`). All
  actors' episodes are one scheduling over the pool (`rl.collector.collect_jobs`): the next actor, loaded when its
  first episode starts, takes the workers the last one's final episodes leave free. Returns name → `summary`, each
  episode's outcome and strata (`report.outcomes`: what pairs policies and seeds later) and `extra(name, policy,
  trajectories)`; a restarted evaluation keeps the episodes already stored."""
  temperature = config.eval.temperature if temperature is None else temperature
  temperature_of = lambda name: float(temperature[name] if isinstance(temperature, Mapping) else temperature)
  seed = int(config.eval.seed if seed is None else seed)
  stats: dict[str, Any] = {}  # each loaded policy's counters (no weights: those go when its episodes end)
  kept: dict[str, types.Policy] = {}  # the policies `extra` reads after the run

  def loader(name: str, actor: str | types.Policy) -> Callable[[], types.Policy]:
    def load() -> types.Policy:
      policy = load_actor(config, actor, temperature_of(name), seed) if isinstance(actor, str) else actor
      stats[name] = getattr(policy, "stats", None)
      if extra is not None:
        kept[name] = policy
      return policy
    return load

  jobs = []
  for name, actor in actors.items():
    fmt = agent_format(actor) if isinstance(actor, str) else getattr(actor, "fmt", None)
    stop = early_stop if early_stop is not None else getattr(fmt, "early_stop", None)
    judged_by = judge(os.path.join(out, name)) if callable(judge) and not hasattr(judge, "evaluate") else judge
    jobs.append(Job(loader(name, actor), tasks, store=os.path.join(out, name), gamma=gamma,
                    judge=judged_by or ProgrammaticJudge(), policy_name=name, keep_screenshots=False,
                    early_stop=stop))
  results, writer = {}, MetricWriter(out)
  try:
    with Rollouts(env_spec, config.env, bool(config.train.progress_bar)) as pool:
      for name, job, trajs in zip(actors, jobs, pool.run_jobs(jobs)):
        results[name] = {**summary(trajs, temperature_of(name)), **report.outcomes(trajs)}
        if isinstance(stats.get(name), Mapping):  # a model's rows whose prompt did not fit (an empty reply each)
          results[name]["too_long_prompts"] = int(stats[name].get("too_long", 0))
        if extra is not None:
          results[name].update(extra(name, kept.pop(name, None) or job.policy(), trajs))
        writer.write_scalars(0, {f"eval/{name}_success_rate": results[name]["success_rate"]})
  finally:
    writer.close()
  return results


def evaluate_control(config, actors: Mapping[str, str | types.Policy], workdir: str, out: str, **kwargs) -> dict:
  """On the benchmark (`tasks.suite=bench`), `actors` on its negative control's held-out intents, each once
  (`evaluate_actors` with `kwargs`), as `{"control": {name: summary}}`: a family no method should move, reported
  beside the headline. `{}` otherwise."""
  from jaxagent.pipeline.tasks import control_episodes  # pylint: disable=g-import-not-at-top
  tasks = control_episodes(config, workdir)
  if not tasks:
    return {}
  return {"control": evaluate_actors(config, actors, tasks, os.path.join(out, "control"), **kwargs)}


def write_results(path: str, results: Mapping[str, Any]) -> dict:
  """`results` with where they came from (`provenance`), written to `path` by process 0."""
  results = with_provenance(dict(results))
  if distributed.is_main():
    write_json(path, results)
  return results
