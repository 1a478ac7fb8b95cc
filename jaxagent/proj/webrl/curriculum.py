"""WebRL's self-evolving curriculum (§3.10; `scripts/gen_task.py`): each phase's tasks come from the previous
phase's failures.

The original asks GPT-4o for new tasks "in the same domain, more diverse, of similar difficulty" from up to 10
failed ones per site, and gives them no evaluator (the ORM rewards them). `variations` is the offline generator:
for each failed task, a task of the same template family with other parameters (another category, order,
product, thread), drawn from the train pool, so each comes with its evaluator and the ORM's agreement with the
programmatic judge can be measured on every phase. `critic.in_band` is `filter_by_critic`: a task passes when
either critic head's success probability on its round-0 prompt (the intent over the site's start page) lies in
[0.05, 0.75]; gen_task.py defines it but its `__main__` does not call it (`curriculum.critic_filter`).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from jaxagent import types
from jaxagent.agents import webrl as fmt


def variations(failed: Sequence[types.Task], pool: Sequence[types.Task], n: int, seed: int, tag: str
               ) -> list[types.Task]:
  """`n` tasks: the failed tasks in a seeded order, cycled, each replaced by a pool task of its template whose
  intent differs from it (a random one, preferring intents not drawn yet in this call); with no failure (or no
  such pool task) a random pool task. Ids `<pool id>@<tag><k>`."""
  rng = random.Random(seed)
  seeds = list(failed)
  rng.shuffle(seeds)
  by_template: dict[str, list[types.Task]] = {}
  for t in pool:
    by_template.setdefault(t.template, []).append(t)
  drawn: set[str] = set()
  out = []
  for k in range(int(n)):
    seed_task = seeds[k % len(seeds)] if seeds else None
    options = [t for t in by_template.get(seed_task.template, []) if t.intent != seed_task.intent] \
        if seed_task is not None else []
    options = options or list(pool)
    fresh = [t for t in options if t.intent not in drawn]
    pick = rng.choice(fresh or options)
    drawn.add(pick.intent)
    out.append(dataclasses.replace(pick, id=f"{pick.id}@{tag}{k}"))
  return out


def round0_prompt(intent: str, start_html: str) -> str:
  """The critic filter's input: the task's first prompt over its site's start page (`filter_by_critic`)."""
  return fmt.webrl_prompt(intent, [], start_html)
