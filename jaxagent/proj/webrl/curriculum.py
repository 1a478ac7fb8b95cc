"""WebRL's self-evolving curriculum (§3.10; `scripts/gen_task.py`): each phase's tasks come from the previous
phase's failures.

The original asks GPT-4o for new tasks "in the same domain, more diverse, of similar difficulty" from up to 10
failed ones per site, and gives them no evaluator (the ORM rewards them). `variations` is the offline generator:
for each failed task, a task of the same template family with other parameters (another category, order,
product, thread), drawn from the train pool, so each comes with its evaluator and the ORM's agreement with the
programmatic judge can be measured on every phase. `critic.in_band` is `filter_by_critic`: a task passes when
either critic head's success probability on its round-0 prompt (the intent over the site's start page) lies in
[0.05, 0.75]; gen_task.py defines it but its `__main__` does not call it (`curriculum.critic_filter`).

`OpenAIGenerator` is gen_task.py's generator over any OpenAI-compatible endpoint (`curriculum.generator=openai`):
its prompt verbatim, per site `turns` requests of min(`seeds`, |failed|) failed intents, temperature 1, top_p 1,
tasks read with its regex. Its tasks have no evaluator (`evaluator == {}`: the programmatic judge leaves them
unjudged, the ORM gives their reward) and must be kept apart from the test intents by the caller
(`drop_intents`). `candidates` and `critic_passed` make a phase's tasks from these on the run's files.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import re
from typing import Any, Callable, Sequence

from jaxagent import openai_client, types
from jaxagent.agents import webrl as fmt
from jaxagent.pipeline import distributed
from jaxagent.pipeline import tasks as tasks_lib
from jaxagent.pipeline.config import names
from jaxagent.pipeline.stages import read_json, write_json
from jaxagent.proj.webrl import critic

log = logging.getLogger(__name__)


def _variants(seed_task: types.Task | None, by_template: dict[str, list[types.Task]], pool: Sequence[types.Task]
              ) -> list[types.Task]:
  """The pool tasks of `seed_task`'s template with another intent; the whole pool when there are none."""
  options = [t for t in by_template.get(seed_task.template, []) if t.intent != seed_task.intent] \
      if seed_task is not None else []
  return options or list(pool)


def _by_template(pool: Sequence[types.Task]) -> dict[str, list[types.Task]]:
  by_template: dict[str, list[types.Task]] = {}
  for t in pool:
    by_template.setdefault(t.template, []).append(t)
  return by_template


def _pick_fresh(rng: random.Random, options: Sequence[types.Task], drawn: set[str]) -> types.Task:
  """A random one of `options`, among those whose intent is not in `drawn` while there are any; drawn then."""
  pick = rng.choice([t for t in options if t.intent not in drawn] or options)
  drawn.add(pick.intent)
  return pick


def variations(failed: Sequence[types.Task], pool: Sequence[types.Task], n: int, seed: int, tag: str
               ) -> list[types.Task]:
  """`n` tasks: the failed tasks in a seeded order, cycled, each replaced by a pool task of its template whose
  intent differs from it (a random one, preferring intents not drawn yet in this call); with no failure (or no
  such pool task) a random pool task. Ids `<pool id>@<tag><k>`."""
  rng = random.Random(seed)
  seeds = list(failed)
  rng.shuffle(seeds)
  by_template, drawn = _by_template(pool), set()
  out = []
  for k in range(int(n)):
    pick = _pick_fresh(rng, _variants(seeds[k % len(seeds)] if seeds else None, by_template, pool), drawn)
    out.append(dataclasses.replace(pick, id=f"{pick.id}@{tag}{k}"))
  return out


# Mutations of a benchmark task along its tier axis. A family's `SUBGOAL_OF` are the families one subgoal above it
# (docs/benchmark.md: buy = lookup's listing and product + cart's options + checkout; cross = a product's value
# carried into a reply), each sharing some of its parameters.
MUTATIONS = ("change", "add", "subgoal")
SUBGOAL_OF = {"filter": ("lookup",), "lookup": ("buy",), "cart": ("buy", "cross"), "thread": ("reply",),
              "reply": ("cross",)}


def _mutants(seed: types.Task, by_family: dict[str, list[types.Task]], kinds: Sequence[str]
             ) -> dict[str, list[types.Task]]:
  """The pool tasks one mutation away from `seed`, by kind: `change`, its family with one constraint set to
  another value; `add`, its family with one more constraint (a parameter empty in `seed` set, the others kept);
  `subgoal`, a family one subgoal above it, keeping as many of the shared parameters as any such task keeps."""
  params = seed.meta["params"]
  empty = lambda v: v in ("", None)
  out = {"change": [], "add": []}
  for t in by_family.get(seed.meta.get("family", ""), []):
    other = t.meta["params"]
    diff = [k for k, v in params.items() if other.get(k, v) != v] if other.keys() == params.keys() else []
    if len(diff) == 1 and not empty(other[diff[0]]):  # a constraint dropped is neither
      out["add" if empty(params[diff[0]]) else "change"].append(t)
  above = [t for f in SUBGOAL_OF.get(seed.meta.get("family", ""), ()) for t in by_family.get(f, [])]
  kept = [sum(t.meta["params"].get(k, object()) == v for k, v in params.items()) for t in above]
  out["subgoal"] = [t for t, n in zip(above, kept) if n == max(kept)]
  return {k: v for k, v in out.items() if v and k in kinds}


def mutations(failed: Sequence[types.Task], pool: Sequence[types.Task], n: int, seed: int, tag: str,
              kinds: Sequence[str] = MUTATIONS) -> tuple[list[types.Task], dict[str, int]]:
  """`n` tasks that mutate the failed benchmark tasks along the tier axis (the failed tasks in a seeded order,
  cycled): for each, a kind drawn among those with a pool task one such mutation away (`_mutants`), then one of
  its tasks, preferring intents not drawn yet in this call. A failed task without benchmark parameters (a template
  suite's) gets a `variations` draw. Each task's `meta["mutation"]` names its kind and the intent it came from;
  also returned: how many tasks of each kind."""
  rng = random.Random(seed)
  seeds = list(failed)
  rng.shuffle(seeds)
  by_family: dict[str, list[types.Task]] = {}
  for t in pool:
    if t.meta.get("params") is not None:
      by_family.setdefault(t.meta.get("family", ""), []).append(t)
  steps = [_mutants(s, by_family, kinds) if "params" in s.meta else {} for s in seeds[:int(n)]]  # once each
  by_template, drawn = _by_template(pool), set()
  out, counts = [], {}
  for k in range(int(n)):
    seed_task, found = (seeds[k % len(seeds)], steps[k % len(seeds)]) if seeds else (None, {})
    kind = rng.choice(sorted(found)) if found else "variation"
    if found:
      pick = _pick_fresh(rng, found[kind], drawn)
      pick = dataclasses.replace(pick, meta={**pick.meta, "mutation": {
          "kind": kind, "from": seed_task.meta.get("intent_id", seed_task.id)}})
    else:
      pick = _pick_fresh(rng, _variants(seed_task, by_template, pool), drawn)
    counts[kind] = counts.get(kind, 0) + 1
    out.append(dataclasses.replace(pick, id=f"{pick.id}@{tag}{k}"))
  return out, counts


def round0_prompt(intent: str, start_html: str) -> str:
  """The critic filter's input: the task's first prompt over its site's start page (`filter_by_critic`)."""
  return fmt.webrl_prompt(intent, [], start_html)


# ----------------------------------------------------------------------------- gen_task.py's LLM generator

# THUDM/WebRL:scripts/gen_task.py `PROMPT`, byte for byte (the trailing space after "#Created Task#." included).
TASK_PROMPT = (
    "You are a smart task creator for a website intelligent assistant. Your goal is to generate clear and "
    "practical tasks that the assistant can assist people with when they use {web} in their daily lives. "
    "These tasks should encompass a wide range of possible instructions and questions that may arise when "
    "using {web} website.\n"
    "\n"
    "Your need to draw inspiration from the #Given Task# to create new tasks. These new tasks should "
    "belong to the same domain as the #Given Task# but be more diverse. The difficulty level of the "
    "#Created Task# should be similar to that of the #Given Task#. The #Created Task# must be reasonable, "
    "understandable and realistic. \u2018#Given Task#\u2019, \u2018#Created Task#\u2019, \u2018given task\u2019 "
    "and \u2018created task\u2019 are not allowed to appear in #Created Task#. \n"
    "\n"
    "**Guidelines:**\n"
    "- **Format each task** clearly using backticks (`) for each command description.\n"
    "- Use a variety of phrasing styles to avoid repetitive expressions.\n"
    "- Use variable names that match those in the provided task examples, such as place names, usernames, "
    "and product names. Avoid inventing entirely new variable names.\n"
    "- Maintain the same or similar difficulty level as the #Given Task#. Tasks can be slightly more or "
    "less challenging but should stay within a reasonable range.\n"
    "\n"
    "#Given Task#\n"
    "{task_examples}\n"
    "\n"
    "#Created Task#\n")
TASK_PATTERN = re.compile(r"`([^`]+)`")  # gen_task.py's `re.findall` over the reply
GENERATED = "generated_by"  # Task.meta key of a generated task: the generator's name


def task_prompt(site: str, intents: Sequence[str]) -> str:
  """gen_task.py's request: the seed intents as backticked bullets under `#Given Task#`."""
  examples = "".join(f"- `{intent.strip()}`\n" for intent in intents).strip()
  return TASK_PROMPT.format(web=site, task_examples=examples)


def extract_tasks(reply: str) -> list[str]:
  return TASK_PATTERN.findall(reply)


def generated_task(source: types.Task, intent: str, task_id: str, generator: str) -> types.Task:
  """A written intent on `source`'s site and start page, with no evaluator (WebRL's dummy `eval`: the ORM
  rewards it) and no oracle."""
  meta = {k: v for k, v in source.meta.items() if k != "part"}  # not one of the train split's halves
  return dataclasses.replace(source, id=task_id, intent=intent, evaluator={}, oracle=None, template="",
                             meta={**meta, GENERATED: generator, "seed_task": source.id})


def generate(failed: Sequence[types.Task], complete: Callable[[str], str], turns: int, seeds: int, seed: int,
             tag: str, generator: str = "llm") -> tuple[list[types.Task], int]:
  """gen_task.py's `__main__`: the failed tasks grouped by site (first-seen order); per site `turns` requests,
  each with min(`seeds`, |site's failures|) of them drawn without replacement; every backticked text of the
  reply is a task (duplicates kept, as there). Returns (tasks with ids `gen-<site>@<tag><k>`, requests that got
  no reply: `complete` raised `CompletionUnavailable`, the turn gives no task)."""
  rng = random.Random(seed)
  by_site: dict[str, list[types.Task]] = {}
  for t in failed:
    by_site.setdefault(t.site, []).append(t)
  out, lost = [], 0
  for site, tasks in by_site.items():
    num = min(int(seeds), len(tasks))
    for _ in range(int(turns)):
      picked = rng.sample(tasks, num)
      try:
        reply = complete(task_prompt(site, [t.intent for t in picked]))
      except openai_client.CompletionUnavailable as e:
        log.warning("curriculum: no tasks for %s this turn (%s)", site, e)
        lost += 1
        continue
      for intent in extract_tasks(reply):
        out.append(generated_task(picked[0], intent, f"gen-{site}@{tag}{len(out)}", generator))
  return out, lost


@dataclasses.dataclass
class GeneratorConfig:
  """`config.curriculum.openai`. No key here: `api_key_env` names the variable that holds it."""

  base_url: str = ""
  model: str = "gpt-4o-2024-05-13"
  turns: int = 2  # requests per site
  seeds: int = 10  # failed intents per request (fewer when the site has fewer)
  api_key_env: str = "OPENAI_API_KEY"
  max_tokens: int = 4096  # gen_task.py sends none: gpt-4o-2024-05-13's own cap

  @classmethod
  def from_config(cls, cfg: Any) -> "GeneratorConfig":
    return openai_client.config_from(cls, cfg, "config.curriculum.openai")


class OpenAIGenerator:
  """gen_task.py's generator over `openai_client.OpenAIClient` (its retries, accounting, key lookup): one user
  message, temperature 1, top_p 1, no seed and no cache (two turns with the same seeds must ask twice)."""

  def __init__(self, config: GeneratorConfig | Any, client: Any = None):
    self.config = config if isinstance(config, GeneratorConfig) else GeneratorConfig.from_config(config)
    c = self.config
    self._api = openai_client.OpenAIClient(
        openai_client.ClientConfig(base_url=c.base_url, model=c.model, api_key_env=c.api_key_env,
                                   max_tokens=int(c.max_tokens), temperature=1.0, top_p=1.0, seed=None),
        client=client, owner="curriculum.openai")

  @property
  def stats(self) -> openai_client.UsageStats:
    return self._api.stats

  def generate(self, failed: Sequence[types.Task], seed: int, tag: str) -> tuple[list[types.Task], int]:
    complete = lambda prompt: self._api.complete([{"role": "user", "content": prompt}])  # noqa: E731
    return generate(failed, complete, self.config.turns, self.config.seeds, seed, tag, f"openai:{self.config.model}")


def _norm(intent: str) -> str:
  return " ".join(intent.split()).casefold()


def drop_intents(tasks: Sequence[types.Task], intents: Sequence[str]) -> tuple[list[types.Task], int]:
  """`tasks` less those whose intent is one of `intents` (case and spacing aside), and how many were dropped:
  the evaluation's intents appear in no training task."""
  banned = {_norm(i) for i in intents}
  kept = [t for t in tasks if _norm(t.intent) not in banned]
  return kept, len(tasks) - len(kept)


# ----------------------------------------------------------------------------------- a phase's tasks


def _previous_failures(workdir: str, t: int) -> list[types.Task]:
  """The tasks phase t's curriculum starts from: π_0's failed ORM rollouts, then phase t−1's failures."""
  if t == 1:
    return tasks_lib.read_tasks(os.path.join(workdir, "orm", "failed.jsonl"))
  return tasks_lib.read_tasks(os.path.join(workdir, f"phase{t - 1}", "labels", "failed.jsonl"))


def candidates(config, workdir: str, t: int, n: int, out: str) -> tuple[list[types.Task], dict]:
  """Phase t's candidate tasks from phase t−1's failures, and their summary: `n` variations of the failed tasks'
  templates within the `curriculum.split` pool, or (`curriculum.generator=openai`) what the LLM writes from them
  (from that pool when nothing
  failed), less those whose intent is a test intent, shuffled. Process 0 asks the LLM once; its tasks are kept
  in `out/generated.jsonl` (a resumed stage asks no more; none kept: a rerun asks again) and read by every
  process."""
  pool = tasks_lib.suite(workdir, config.curriculum.split)
  failed = _previous_failures(workdir, t)
  info = {"failed_seeds": len(failed)}
  if config.curriculum.generator == "mutations":
    kinds = names(config.curriculum.kinds)
    found, counts = mutations(failed, pool, n, int(config.seed) + 100 + t, f"p{t}.", kinds)
    return found, {**info, "candidates": len(found), "mutations": counts}
  if config.curriculum.generator != "openai":
    found = variations(failed, pool, n, int(config.seed) + 100 + t, f"p{t}.")
    return found, {**info, "candidates": len(found)}
  path, stats_path = os.path.join(out, "generated.jsonl"), os.path.join(out, "generated.json")
  if distributed.is_main() and not os.path.exists(path):
    generator = OpenAIGenerator(config.curriculum.openai)
    written, lost = generator.generate(failed or pool, int(config.seed) + 100 + t, f"p{t}.")
    kept, dropped = drop_intents(written, [x.intent for x in tasks_lib.suite(workdir, "test")])
    random.Random(int(config.seed) + 200 + t).shuffle(kept)  # `n` and the filter cut sites evenly
    stats = generator.stats
    write_json(stats_path, {"generated": len(written), "test_intent_drops": dropped, "turns_without_reply": lost,
                            "requests": stats.requests, "prompt_tokens": stats.prompt_tokens,
                            "completion_tokens": stats.completion_tokens})
    if kept:
      tasks_lib.write_tasks(path, kept)
  distributed.barrier(f"webrl/phase{t}: generated tasks")
  found = tasks_lib.read_tasks(path) if os.path.exists(path) else []
  if not found:
    raise RuntimeError(f"curriculum.generator=openai wrote no usable task ({read_json(stats_path)}); check "
                       f"{config.curriculum.openai.base_url} and ${config.curriculum.openai.api_key_env}")
  return found, {**info, **read_json(stats_path), "candidates": len(found)}


def critic_passed(config, workdir: str, t: int, tasks: Sequence[types.Task], cache: str) -> list[types.Task]:
  """`filter_by_critic` with phase t−1's critic: the tasks whose round-0 prompt either head scores within
  [`curriculum.low`, `curriculum.high`] (trunk features cached in `cache`)."""
  pages = critic.start_pages(workdir)
  prompts = [round0_prompt(c.intent, pages.get(c.site, "")) for c in tasks]
  feats = critic.features(config, workdir, prompts, cache)
  band = critic.in_band(*critic.head_probs(critic.previous(config, workdir, t, feats.shape[-1]), feats),
                        (float(config.curriculum.low), float(config.curriculum.high)))
  return [c for c, ok in zip(tasks, band) if ok]
