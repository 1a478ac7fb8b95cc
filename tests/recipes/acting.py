"""The check that `jaxagent.evaluate --policy <actor dir>` acts as the recipe's own evaluation does: both play the
same episodes with one worker while every prompt the model is given is recorded; the prompts must be the same
bytes in the same order (the per-episode session id, a random hex token in some URLs, aside), and each episode
must end with the same verdict."""

from __future__ import annotations

import copy
import json
import os
import re

import ml_collections

from jaxagent import evaluate as evaluate_cli
from jaxagent.data.store import TrajectoryStore
from jaxagent.pipeline import rollout, tasks as tasks_lib
from jaxagent.pipeline.policy import ModelPolicy

_SESSION = re.compile(r"\b[0-9a-f]{16}\b")


def workdir_config(workdir: str) -> ml_collections.ConfigDict:
  with open(os.path.join(workdir, "config.json")) as f:
    return ml_collections.ConfigDict(json.load(f))


def recipe_evaluation_of(monkeypatch, recipe, name: str, workdir: str):
  """The recipe's own `stage_eval`, playing only its actor `name` and writing no results file (the run's own
  results stay as they are)."""
  evaluate_actors = recipe.evaluate_actors
  monkeypatch.setattr(recipe, "evaluate_actors",
                      lambda config, actors, *args, **kwargs: evaluate_actors(config, {name: actors[name]}, *args,
                                                                              **kwargs))
  monkeypatch.setattr(recipe, "write_results", lambda path, results: results)
  return lambda config, out: recipe.stage_eval(config, workdir, out)


def _record_prompts(monkeypatch) -> list[str]:
  prompts: list[str] = []
  generate = ModelPolicy.generate

  def spy(self, rows, temperature=None):
    prompts.extend(_SESSION.sub("<session>", p if isinstance(p, str) else json.dumps(p, default=str))
                   for p, _ in rows)
    return generate(self, rows, temperature)

  monkeypatch.setattr(ModelPolicy, "generate", spy)
  return prompts


def _verdicts(store_dir: str) -> dict[str, float | None]:
  return {t.task.id: t.success for t in rollout.episodes(TrajectoryStore(store_dir))}


def assert_cli_acts_as_the_recipe(monkeypatch, tmp_path, config, recipe_eval, recipe_store: str, actor_dir: str,
                                  episodes) -> dict[str, float | None]:
  """`recipe_eval(config, out)` runs the recipe's evaluation of the actor in `actor_dir` into `out` (its episodes
  in `out/<recipe_store>`); then the CLI plays `episodes` with the same temperature, token budget, sampling seed
  and browser. Returns the verdicts."""
  config = copy.deepcopy(config)
  config.env.workers = 1  # one row per sampler call on both sides, in the same order
  prompts = _record_prompts(monkeypatch)
  recipe_out = str(tmp_path / "recipe_eval")
  recipe_eval(config, recipe_out)
  by_recipe = list(prompts)
  prompts.clear()
  path = str(tmp_path / "episodes.jsonl")
  tasks_lib.write_tasks(path, episodes)
  cli_out = str(tmp_path / "cli_eval")
  evaluate_cli.main(["--policy", actor_dir, "--suite", f"file:{path}", "--out", cli_out, "--workers", "1",
                     "--temperature", str(config.eval.temperature), "--seeds", str(config.eval.seed),
                     "--max-tokens", str(config.sampling.max_tokens), "--max-batch", str(config.sampling.max_batch),
                     "--browser", str(config.env.get("browser", "chromium"))])
  assert by_recipe, "the recipe's evaluation prompted the model with nothing"
  assert prompts == by_recipe
  recipe_verdicts = _verdicts(os.path.join(recipe_out, recipe_store))
  assert recipe_verdicts == _verdicts(os.path.join(cli_out, f"seed{config.eval.seed}", "episodes"))
  assert set(recipe_verdicts) == {t.id for t in episodes}
  return recipe_verdicts
