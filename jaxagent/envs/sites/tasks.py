"""Task suites for the bundled sites, generated from templates and a seed, and their validation.

Each template turns one entity (a product, a thread, a setting) into a `Task` with an intent, a
programmatic evaluator (string / URL / server-state match, see `jaxagent/judges/evaluators.py`) and an oracle:
the solution as semantic steps the scripted expert executes in any agent format:

  {"op": "click", "selector": "a[href$='/shop/p/12']", "text": "..."}   # a link, button or field
  {"op": "type", "selector": "#q", "text": "lamp", "enter": true}        # focus the field, type, maybe Enter
  {"op": "answer", "text": "$12.99"}                                      # ends the episode with an answer
  {"op": "stop"}                                                          # ends it without one (state/URL tasks)

Splits: products and threads whose id is a multiple of 5 (and the settings in TEST_SETTINGS) appear only in
test tasks, every other entity only in train tasks; sort tasks split their (category, sort order) pairs so that
test pairs combine parts seen apart in train; the `shop_cheapest` template family appears only in test
(held out for generalisation). Every profile gets the same instances: `web` and `text` start on the site,
`device` starts on the phone's launcher and opens the app first.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
from typing import Any, Callable, Iterable

from jaxagent.envs.sites import catalog, phone, shop
from jaxagent.envs.sites.perturb import Perturbation
from jaxagent.envs.sites.state import DEFAULT_SETTINGS
from jaxagent.envs.sites.urls import PLACEHOLDER, check_site
from jaxagent.types import Task

PROFILES = ("web", "text", "device")
ORACLE_OPS = {"click": ("selector",), "type": ("selector", "text"), "answer": ("text",), "stop": (), "home": ()}
EVALUATOR_KINDS = ("string_match", "url_match", "visited", "state_match", "program_html", "all", "any")
HELD_OUT_TEMPLATES = ("shop_cheapest",)
TEST_SETTINGS = ("notifications", "location")
PEOPLE = ("Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth",
          "Frances Allen", "John Backus", "Radia Perlman", "Ken Thompson")
STREETS = ("Maple Street", "Harbour Road", "Station Lane", "Mill Way", "Orchard Close", "Bridge Street")
# No ", " in typed text: AutoUI's parser splits its decision on ", " (`reference/algorithms.md` §4.3).
MESSAGES = ("Thanks for sharing this!", "Great write-up and very helpful.", "I had the same problem last year.",
            "Could you post an update later?", "This matches my experience.", "Bookmarking this for later.")
SORT_KEYS = ("price_asc", "price_desc", "rating")
ORDER_KEYS = SORT_KEYS + ("reviews",)  # shop_category_order: four orders, so a category can be shown in three
MAX_STEPS = {"web": 15, "text": 15, "device": 20}  # WebVoyager's 15 (§1.2); AitW Web Shopping's 20 (§4.1)


def _split_of(entity_id: int) -> str:
  return "test" if entity_id % 5 == 0 else "train"


def _pair_split(i: int, j: int) -> str:
  """A compositional split of (category i, sort j) pairs: every category and every sort order appears in train,
  one pairing per category only in test (a third of the pairs), so solving test needs the two parts combined."""
  return "test" if (i + j) % 3 == 0 else "train"


def _pair_part(i: int, j: int) -> str:
  """shop_category_sort's train pairs in two parts: each category once in each (with a different sort), each
  sort in both."""
  return "a" if (i + j) % 3 == 1 else "b"


def order_split(i: int, j: int) -> str:
  """shop_category_order's (category i, order j) pairs in a 4-fold Latin square: one pairing per category in
  test, one in the train part "b", two in "a", every order in each; a recipe can demonstrate part a (where each
  category comes with two orders, so the order must be read from the intent), collect offline data on part b and
  evaluate on test, whose intents are in neither."""
  return {0: "test", 1: "b"}.get((i + j) % 4, "a")


def _site_url(site: str) -> str:
  return f"{PLACEHOLDER}/{site}/"


# ------------------------------------------------------------------------------------------ oracle steps


def click(selector: str, text: str = "", optional: bool = False) -> dict[str, Any]:
  """`optional`: skip the click when its target is gone (WebVoyager's Type presses Enter, which may already
  have submitted the form this click would submit)."""
  return {"op": "click", "selector": selector, **({"text": text} if text else {}),
          **({"optional": True} if optional else {})}


def type_(selector: str, text: str, enter: bool = False) -> dict[str, Any]:
  return {"op": "type", "selector": selector, "text": text, "enter": enter}


def answer(text: str) -> dict[str, Any]:
  return {"op": "answer", "text": text}


STOP = {"op": "stop"}
ACCEPT_COOKIES = click("#cookie-accept", "Accept cookies")


def find_product(p: catalog.Product) -> list[dict[str, Any]]:
  return [ACCEPT_COOKIES, type_("#q", p.name, enter=True), click(f"a[href$='/shop/p/{p.id}']", p.name)]


def find_thread(t: catalog.Thread) -> list[dict[str, Any]]:
  return [type_("#q", t.title, enter=True), click(f"a[href$='/forum/t/{t.id}']", t.title)]


def choose_options(p: catalog.Product, colour: str, size: str) -> list[dict[str, Any]]:
  steps = []
  if colour != p.colours[0]:
    steps.append(click(f"a.opt-colour[href*='colour={colour}']", colour))
  if size:
    steps.append(click(f"a.opt-size[href*='size={size}']", size))
  return steps


def _options(rng: random.Random, p: catalog.Product) -> tuple[str, str]:
  return rng.choice(p.colours), (rng.choice(p.sizes) if p.sizes else "")


def describe(p: catalog.Product, colour: str, size: str) -> str:
  return f"the {p.name} in {colour}" + (f", size {size}" if size else "")


# ------------------------------------------------------------------------------------------ templates
# A template maps (world, rng, entity) to (intent, evaluator, oracle, site); `ENTITIES` lists its entities.


def _shows(check: dict[str, Any], page: str) -> dict[str, Any]:
  """An information task's evaluator: the answer, or (for agents with no answer channel, like AitW's, whose judge
  reads the final screen) ending on `page`, the page that shows it. Non-device profiles keep the answer only."""
  return {"kind": "any", "checks": [check, {"kind": "url_match", "url": page}], "answer_only": check}


def shop_price(w, rng, p):
  return (f"What is the price of the {p.name} on Shoply?",
          _shows({"kind": "string_match", "must_include": [p.price]}, f"/shop/p/{p.id}"),
          find_product(p) + [answer(p.price)], "shop")


def shop_reviews(w, rng, p):
  return (f"How many customer reviews does the {p.name} have on Shoply?",
          _shows({"kind": "string_match", "exact_match": str(p.reviews)}, f"/shop/p/{p.id}"),
          find_product(p) + [answer(str(p.reviews))], "shop")


def shop_category_sort(w, rng, entity):
  cat, sort = entity
  label = {"price_asc": "price from low to high", "price_desc": "price from high to low",
           "rating": "customer rating"}[sort]
  return (f"On Shoply, show the {cat} category sorted by {label}.",
          {"kind": "url_match", "url": f"/shop/c/{cat}?sort={sort}"},
          [ACCEPT_COOKIES, click(f"nav.cats a[href$='/shop/c/{cat}']", cat.title()),
           click(f"a[href*='sort={sort}']", shop.SORTS[sort]), STOP], "shop")


def shop_category_order(w, rng, entity):
  cat, sort = entity
  label = {"price_asc": "lowest price first", "price_desc": "highest price first", "rating": "best rated first",
           "reviews": "most reviewed first"}[sort]
  return (f"On Shoply, list the {cat} category with the {label}.",
          {"kind": "url_match", "url": f"/shop/c/{cat}?sort={sort}"},
          [ACCEPT_COOKIES, click(f"nav.cats a[href$='/shop/c/{cat}']", cat.title()),
           click(f"a[href*='sort={sort}']", shop.SORTS[sort]), STOP], "shop")


def shop_brand_filter(w, rng, entity):
  cat, brand = entity
  return (f"On Shoply, list the {brand} products in the {cat} category, best rated first.",
          {"kind": "url_match", "url": f"/shop/c/{cat}?brand={brand}&sort=rating"},
          [ACCEPT_COOKIES, click(f"nav.cats a[href$='/shop/c/{cat}']", cat.title()),
           click(f"a.filter-brand[href*='brand={brand}']", brand),
           click("a[href*='sort=rating']", shop.SORTS["rating"]), STOP], "shop")


def shop_add_to_cart(w, rng, p):
  colour, size = _options(rng, p)
  return (f"Add {describe(p, colour, size)} to my cart on Shoply.",
          {"kind": "state_match", "checks": [{"path": "cart", "contains": {"product_id": p.id, "colour": colour,
                                                                            "size": size}}]},
          find_product(p) + choose_options(p, colour, size) + [click("#add-to-cart", "Add to cart"), STOP], "shop")


def shop_buy(w, rng, p):
  colour, size = _options(rng, p)
  name = rng.choice(PEOPLE)
  address = f"{rng.randint(1, 99)} {rng.choice(STREETS)}"
  order = {"name": name, "address": address, "items": {"product_id": p.id, "colour": colour, "size": size}}
  return (f"Buy {describe(p, colour, size)} on Shoply and ship it to {name}, {address}.",
          {"kind": "state_match", "checks": [{"path": "orders", "contains": order}]},
          find_product(p) + choose_options(p, colour, size) + [
              click("#add-to-cart", "Add to cart"), click("#checkout", "Proceed to checkout"),
              type_("#name", name), type_("#address", address), click("#place-order", "Place order", optional=True), STOP],
          "shop")


def shop_cheapest(w, rng, entity):
  cat, brand = entity
  items = [p for p in w.products if p.category == cat and p.brand == brand]
  best = min(items, key=lambda p: (p.price_cents, p.id))
  return (f"Which {brand} product in Shoply's {cat} category has the lowest price? Answer with its name.",
          _shows({"kind": "string_match", "must_include": [best.name]},
                 f"/shop/c/{cat}?brand={brand}&sort=price_asc"),
          [ACCEPT_COOKIES, click(f"nav.cats a[href$='/shop/c/{cat}']", cat.title()),
           click(f"a.filter-brand[href*='brand={brand}']", brand),
           click("a[href*='sort=price_asc']", shop.SORTS["price_asc"]), answer(best.name)], "shop")


def forum_author(w, rng, t):
  return (f"Who started the thread “{t.title}” on the Agora forum? Answer with the user name.",
          _shows({"kind": "string_match", "exact_match": t.author}, f"/forum/t/{t.id}"),
          find_thread(t) + [answer(t.author)], "forum")


def forum_replies(w, rng, t):
  return (f"How many replies does the thread “{t.title}” on the Agora forum have?",
          _shows({"kind": "string_match", "exact_match": str(t.replies)}, f"/forum/t/{t.id}"),
          find_thread(t) + [answer(str(t.replies))], "forum")


def forum_location(w, rng, t):
  loc = w.users[t.author].location
  return (f"In which city does the user who started the Agora thread “{t.title}” live?",
          _shows({"kind": "string_match", "must_include": [loc]}, f"/forum/u/{t.author}"),
          find_thread(t) + [click(f"#post-1 a[href$='/forum/u/{t.author}']", t.author), answer(loc)], "forum")


def forum_profile(w, rng, t):
  return (f"Open the profile page of the user who started the Agora thread “{t.title}”.",
          {"kind": "url_match", "url": f"/forum/u/{t.author}"},
          find_thread(t) + [click(f"#post-1 a[href$='/forum/u/{t.author}']", t.author), STOP], "forum")


def forum_reply(w, rng, t):
  msg = rng.choice(MESSAGES)
  return (f"Reply to the Agora thread “{t.title}” with the message “{msg}”.",
          {"kind": "state_match", "checks": [{"path": "replies", "contains": {"thread_id": t.id, "body": msg}}]},
          find_thread(t) + [type_("#reply-body", msg), click("#reply-submit", "Post reply"), STOP], "forum")


def settings_toggle(w, rng, key):
  on = not DEFAULT_SETTINGS[key]
  label = phone.SETTING_LABELS[key]
  return (f"Turn {'on' if on else 'off'} {label} in Settings.",
          {"kind": "state_match", "checks": [{"path": f"settings.{key}", "equals": on}]},
          [click(f"#toggle-{key}", f"Turn {'on' if on else 'off'}"), STOP], "settings")


Template = Callable[[catalog.World, random.Random, Any], tuple[str, dict, list, str]]


def _entities(world: catalog.World) -> dict[str, tuple[Template, list[tuple[Any, str]]]]:
  """template name -> (template, [(entity, split)])."""
  products = [(p, _split_of(p.id)) for p in world.products]
  threads = [(t, _split_of(t.id)) for t in world.threads]
  cats = sorted(catalog.CATEGORIES)
  sorts = [((c, s), _pair_split(i, j)) for i, c in enumerate(cats) for j, s in enumerate(SORT_KEYS)]
  orders = [((c, s), "test" if order_split(i, j) == "test" else "train") for i, c in enumerate(cats)
            for j, s in enumerate(ORDER_KEYS)]
  brand_cats = [((c, b), _split_of(catalog.BRANDS.index(b) + 1)) for c in cats for b in sorted(
      {p.brand for p in world.products if p.category == c})]
  settings = [(k, "test" if k in TEST_SETTINGS else "train") for k in phone.SETTING_LABELS]
  return {
      "shop_price": (shop_price, products), "shop_reviews": (shop_reviews, products),
      "shop_category_sort": (shop_category_sort, sorts), "shop_category_order": (shop_category_order, orders),
      "shop_brand_filter": (shop_brand_filter, brand_cats),
      "shop_add_to_cart": (shop_add_to_cart, products), "shop_buy": (shop_buy, products),
      "shop_cheapest": (shop_cheapest, [(e, "test") for e, _ in brand_cats]),
      "forum_author": (forum_author, threads), "forum_replies": (forum_replies, threads),
      "forum_location": (forum_location, threads), "forum_profile": (forum_profile, threads),
      "forum_reply": (forum_reply, threads), "settings_toggle": (settings_toggle, settings),
  }


# How many tasks of each template a split gets per profile (capped by the entities available).
MIX = {"shop_price": 170, "shop_reviews": 120, "shop_category_sort": 32, "shop_category_order": 32,
       "shop_brand_filter": 90,
       "shop_add_to_cart": 170, "shop_buy": 150, "shop_cheapest": 60, "forum_author": 120, "forum_replies": 90,
       "forum_location": 90, "forum_profile": 90, "forum_reply": 120, "settings_toggle": 5}
TEST_FRACTION = 0.25


def _for_profile(task_id: str, profile: str, intent: str, evaluator: dict, oracle: list, site: str, split: str,
                 template: str, seed: int, part: str) -> Task:
  if profile == "device":
    start, oracle = _site_url("launcher"), [click(f"#app-{site}", site.title())] + oracle
  else:
    start = _site_url(site)
  if evaluator.get("kind") == "any":
    evaluator = {k: v for k, v in evaluator.items() if k != "answer_only"} if profile == "device" else \
        evaluator["answer_only"]
  return Task(id=task_id, intent=intent, site=site, start_url=start, profile=profile, max_steps=MAX_STEPS[profile],
              evaluator=evaluator, oracle=oracle, split=split, template=template, seed=seed,
              meta={"home_url": _site_url("launcher"), "part": part})


def _part(template: str, entity, k: int) -> str:
  """Which half of its split a task falls in (`Task.meta["part"]`, "a" | "b"): the Latin-square fold for the
  (category, sort) pairs, alternation in draw order for the other families."""
  if template == "shop_category_sort":
    cat, sort = entity
    return _pair_part(sorted(catalog.CATEGORIES).index(cat), SORT_KEYS.index(sort))
  if template == "shop_category_order":
    cat, sort = entity
    return order_split(sorted(catalog.CATEGORIES).index(cat), ORDER_KEYS.index(sort))
  return "a" if k % 2 == 0 else "b"


def generate(seed: int = 0, profiles: Iterable[str] = PROFILES) -> dict[str, list[Task]]:
  """All tasks of the suite for `seed`: {"train": [...], "test": [...]}, each across `profiles`."""
  world = catalog.build_world(seed)
  out: dict[str, list[Task]] = {"train": [], "test": []}
  for name, (template, entities) in _entities(world).items():
    rng = random.Random(f"{seed}-{name}")
    for split in ("train", "test"):
      pool = [e for e, s in entities if s == split]
      want = MIX[name] if split == "train" else max(1, round(MIX[name] * TEST_FRACTION))
      if name in HELD_OUT_TEMPLATES:
        want = MIX[name] if split == "test" else 0
      chosen = rng.sample(pool, min(want, len(pool)))
      for k, entity in enumerate(chosen):
        intent, evaluator, oracle, site = template(world, rng, entity)
        part = _part(name, entity, k)
        for profile in profiles:
          out[split].append(_for_profile(f"{profile}.{split}.{name}.{k}", profile, intent, evaluator, oracle,
                                         site, split, name, seed, part))
  return out


def select(seed: int, profile: str, templates: str = "", max_steps: int | None = None) -> dict[str, list[Task]]:
  """One profile's suites restricted to the comma-separated template families (all when empty), each task's
  `max_steps` capped: how recipes pick their tasks. A selection that leaves a split empty is an error naming
  the families to choose from."""
  families = {f.strip() for f in str(templates).split(",") if f.strip()}
  out = {}
  for split, tasks in generate(int(seed), profiles=(profile,)).items():
    chosen = [t for t in tasks if not families or t.template in families]
    if max_steps is not None:
      chosen = [dataclasses.replace(t, max_steps=min(t.max_steps, int(max_steps))) for t in chosen]
    if not chosen:
      raise ValueError(f"config.tasks.templates={templates!r} selects no {split} task; choose among "
                       f"{sorted({t.template for t in tasks})}")
    out[split] = chosen
  return out


def suite_summary(tasks: list[Task]) -> dict[str, dict[str, int]]:
  """{profile: {template: count}} for the README."""
  table: dict[str, dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
  for t in tasks:
    table[t.profile][t.template] += 1
  return {p: dict(sorted(c.items())) for p, c in sorted(table.items())}


def write_suite(out_dir: str, seed: int = 0, suite: dict[str, list[Task]] | None = None) -> dict[str, str]:
  """Writes `<out_dir>/<profile>_<split>.jsonl` per profile and split (of `suite`, default `generate(seed)`);
  returns {name: path}."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {}
  for split, tasks in (suite or generate(seed)).items():
    for profile in PROFILES:
      path = os.path.join(out_dir, f"{profile}_{split}.jsonl")
      with open(path, "w") as f:
        for t in tasks:
          if t.profile == profile:
            f.write(json.dumps(t.to_json()) + "\n")
      paths[f"{profile}_{split}"] = path
  return paths


# ------------------------------------------------------------------------------------------ validation


class TaskFileError(ValueError):
  """A task file is malformed; the message names the file, the line and the field."""


def validate(task: Task) -> None:
  """Raises ValueError naming the bad field and how to fix it."""
  for name in ("id", "intent", "site", "start_url"):
    value = getattr(task, name)
    if not isinstance(value, str) or not value:
      raise ValueError(f"field {name!r} must be a non-empty string, got {value!r}")
  if task.profile not in PROFILES:
    raise ValueError(f"field 'profile' is {task.profile!r}; use one of {list(PROFILES)}")
  if not isinstance(task.max_steps, int) or task.max_steps < 1:
    raise ValueError(f"field 'max_steps' must be a positive integer, got {task.max_steps!r}")
  if not isinstance(task.evaluator, dict):
    raise ValueError(f"field 'evaluator' must be an object like {{'kind': 'string_match', ...}}, got "
                     f"{type(task.evaluator).__name__}")
  if task.evaluator and task.evaluator.get("kind") not in EVALUATOR_KINDS:
    raise ValueError(f"field 'evaluator.kind' is {task.evaluator.get('kind')!r}; use one of {list(EVALUATOR_KINDS)}")
  if task.oracle is not None:
    if not isinstance(task.oracle, list):
      raise ValueError("field 'oracle' must be a list of steps or null")
    for k, step in enumerate(task.oracle):
      op = step.get("op") if isinstance(step, dict) else None
      if op not in ORACLE_OPS:
        raise ValueError(f"field 'oracle[{k}].op' is {op!r}; use one of {list(ORACLE_OPS)}")
      for req in ORACLE_OPS[op]:
        if not isinstance(step.get(req), str):
          raise ValueError(f"field 'oracle[{k}].{req}' (a string) is missing from the {op!r} step")
  if task.meta.get("perturb"):
    try:
      Perturbation.from_json({k: v for k, v in task.meta["perturb"].items() if k != "episode"})
    except (TypeError, ValueError, AttributeError) as e:
      raise ValueError(f"field 'meta.perturb' {task.meta['perturb']!r}: {e}") from None
  check_site(task)


def parse_task(d: Any) -> Task:
  if not isinstance(d, dict):
    raise ValueError(f"a task must be a JSON object, got {type(d).__name__}")
  missing = [f for f in ("id", "intent", "site", "start_url") if f not in d]
  if missing:
    raise ValueError(f"field {missing[0]!r} is missing")
  task = Task.from_json(d)
  validate(task)
  return task


def load_tasks(path: str) -> list[Task]:
  """Reads a jaxagent task JSONL file; a bad line raises `TaskFileError` with its number and field."""
  tasks, seen = [], set()
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        task = parse_task(json.loads(line))
      except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise TaskFileError(f"{path}:{lineno}: {e}") from None
      if task.id in seen:
        raise TaskFileError(f"{path}:{lineno}: field 'id' {task.id!r} repeats an earlier task's id")
      seen.add(task.id)
      tasks.append(task)
  return tasks
