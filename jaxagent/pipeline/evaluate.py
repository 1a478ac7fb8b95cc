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
from jaxagent.pipeline.policy import load_actor
from jaxagent.pipeline.provenance import with_provenance
from jaxagent.pipeline.rollout import Rollouts
from jaxagent.pipeline.stages import write_json
from jaxagent.pipeline.tasks import errored_count, success_rate
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
                    early_stop=None, temperature: float | None = None, seed: int | None = None,
                    extra: Callable[[str, types.Policy, list[types.Trajectory]], dict] | None = None
                    ) -> dict[str, dict]:
  """Every actor in `actors` (name → model directory or policy) on `tasks`, at `temperature` (default
  `config.eval.temperature`) with sampling seed `seed` (default `config.eval.seed`), judged by `judge` (default
  the programmatic judge; a callable gets the store directory), each episode ending by `early_stop` (default the
  actor's format's own rule, `AgentFormat.early_stop`). Returns name → `summary`, each episode's outcome and strata
  (`report.outcomes`: what pairs policies and seeds later) and `extra(name, policy, trajectories)`; a restarted
  evaluation keeps the episodes already stored."""
  temperature = float(config.eval.temperature if temperature is None else temperature)
  seed = int(config.eval.seed if seed is None else seed)
  results, writer = {}, MetricWriter(out)
  try:
    with Rollouts(env_spec, config.env, bool(config.train.progress_bar)) as pool:
      for name, actor in actors.items():
        store = os.path.join(out, name)
        policy = load_actor(config, actor, temperature, seed) if isinstance(actor, str) else actor
        judged_by = judge(store) if callable(judge) and not hasattr(judge, "evaluate") else judge
        stop = early_stop if early_stop is not None else getattr(getattr(policy, "fmt", None), "early_stop", None)
        trajs = pool.run(policy, tasks, store, judge=judged_by or ProgrammaticJudge(), name=name, gamma=gamma,
                         early_stop=stop)
        results[name] = {**summary(trajs, temperature), **report.outcomes(trajs)}
        stats = getattr(policy, "stats", None)
        if isinstance(stats, Mapping):  # a model's rows whose prompt did not fit (an empty reply each)
          results[name]["too_long_prompts"] = int(stats.get("too_long", 0))
        if extra is not None:
          results[name].update(extra(name, policy, trajs))
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
