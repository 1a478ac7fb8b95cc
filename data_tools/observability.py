"""Can a recipe's policy see what it must act on? The scripted expert plays a sites-benchmark split in the recipe's
env, and every step that names an element is checked against the observation the recipe's agent format shows.

  python data_tools/observability.py --config configs/webrl.py:bench
  python data_tools/observability.py --config configs/webrl.py:bench --config.prompt_chars=2048
  python data_tools/observability.py --config configs/openwebvoyager.py:bench --config.env.workers=2 \
      --config.observation.max_tree_lines=16 --episodes 60
  python data_tools/observability.py --config configs/digirl.py:text=1 --config.tasks.suite=bench \
      --config.tasks.templates=

Per family: the steps that name an element, how many of those elements the observation shows, how many the
full page's observation does not list at all (no cut can show them), and the intents with every element shown.
An intent whose element the policy is never shown can be solved only by guessing its id. Text observations
only: WebRL's simplified HTML (the text backend), OpenWebVoyager's accessibility tree (Chromium) and the phone's
screen as text (DigiRL's `env.observation=html`, cut at `data.page_chars`).
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile

from jaxagent.envs.sites.expert import ScriptedExpert
from jaxagent.main import load_config_file
from jaxagent.pipeline import device
from jaxagent.pipeline.tasks import bench_splits, draw_episodes


def _webrl(config):
  from jaxagent.agents.webrl import current_html  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import webrl  # pylint: disable=g-import-not-at-top
  def shown(max_prompt_chars):
    fmt = webrl.WebRL(**{**webrl.format_options(config), "max_prompt_chars": max_prompt_chars})
    return lambda task, obs, history: current_html(fmt.build_prompt(task, obs, history))
  return (webrl.env_spec(config, expert=True), ScriptedExpert("webrl", **webrl.format_options(config)),
          shown(int(config.prompt_chars)), shown(10 ** 9), lambda el: f'id="{el}"')


def _openwebvoyager(config):
  from jaxagent.agents.openwebvoyager import compact_tree  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import openwebvoyager  # pylint: disable=g-import-not-at-top
  o = config.observation

  def shown(lines):
    return lambda task, obs, history: compact_tree(obs.a11y_tree or "", lines, bool(o.drop_urls))
  return (openwebvoyager.env_spec(config, oracle_targets=True), ScriptedExpert("openwebvoyager"),
          shown(int(o.max_tree_lines)), shown(0), lambda el: f"[{el}]")


def _phone(config):
  from jaxagent.agents.webrl import compact_html  # pylint: disable=g-import-not-at-top
  if config.env.get("observation") != "html":
    raise ValueError(f"config.env.observation={config.env.get('observation')!r}: the phone's text observation only "
                     "(configs/digirl.py:text=1)")
  fmt = device.actor_format(config)

  def shown(max_page_chars):
    return lambda task, obs, history: compact_html(obs.html)[:max_page_chars]
  return (device.env_spec(config, expert=True), ScriptedExpert(fmt.name, **fmt.options()),
          shown(int(config.data.page_chars)), shown(10 ** 9), lambda el: f'id="{el}"')


# recipe → (the benchmark profile it plays, what its env, expert and observation are)
RECIPES = {"webrl": ("text", _webrl), "openwebvoyager": ("web", _openwebvoyager),
           "digirl": ("device", _phone)}


def measure(config, split: str = "test", episodes: int = 0) -> dict:
  """The expert on the run's benchmark `split` (`episodes` drawn, 0 = each task once) and what the recipe's
  observation shows of the elements it acts on, per family and in total."""
  if config.recipe not in RECIPES:
    raise ValueError(f"config.recipe={config.recipe!r}: text observations only, one of {sorted(RECIPES)}")
  if config.tasks.get("suite", "sites") != "bench":
    raise ValueError("config.tasks.suite must be 'bench' (--config.tasks.suite=bench)")
  profile, parts = RECIPES[config.recipe]
  spec, expert, shown, full, mark = parts(config)
  tasks = bench_splits(config, profile)[split]
  tasks = draw_episodes(tasks, episodes, 0, "probe") if episodes else tasks
  with tempfile.TemporaryDirectory() as tmp:
    trajs = device.rollout(config, spec, expert, tasks, tmp, "scripted_expert", gamma=0.9)
  rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for t in trajs:
    row = rows[t.task.meta.get("family", "?")]
    row["intents"] += 1
    row["expert_successes"] += t.success == 1.0
    every = True
    for i, s in enumerate(t.steps):
      if s.action is None or s.action.element is None or s.observation is None:
        continue
      element = mark(s.action.element)
      row["element_steps"] += 1
      in_view = element in shown(t.task, s.observation, t.steps[:i])
      row["shown"] += in_view
      row["not_in_full_observation"] += element not in full(t.task, s.observation, t.steps[:i])
      every &= in_view
    row["intents_every_element_shown"] += every
  total = sum(rows.values(), collections.Counter())
  return {"split": split, "families": {f: dict(r) for f, r in sorted(rows.items())}, "total": dict(total)}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              epilog="Any --config.KEY=VALUE after these overrides the config, as jaxagent.main's do.")
  p.add_argument("--config", required=True, help="a recipe config, path.py[:variant]")
  p.add_argument("--split", default="test", help="the run's split: test (the headline), control, train_a, ...")
  p.add_argument("--episodes", type=int, default=0, help="drawn from the split (0 = each task once)")
  args, overrides = p.parse_known_args()
  config = load_config_file(args.config, overrides)
  result = measure(config, args.split, args.episodes)
  print(json.dumps(result, indent=1))
  t = result["total"]
  print(f"{t.get('shown', 0)} of {t.get('element_steps', 0)} element steps shown; "
        f"{t.get('intents_every_element_shown', 0)} of "
        f"{t['intents']} intents with every element shown; {t.get('not_in_full_observation', 0)} steps' elements "
        "absent from the full observation")


if __name__ == "__main__":
  main()
