"""The sites benchmark: eight task families in tiers, splits by parameter tuple, seeded perturbations.

Each family is a template whose parameters (category, brand, colour, order, product, thread, person...) multiply
into hundreds or thousands of intents; an intent is its parameter tuple. Splits are fixed by the tuple, never by
draw order, so they are disjoint in intents:

  train_a / train_b / train_c   demonstrations / offline, behaviour and ORM data / online rounds and curricula
  test_iid                      intents of the train splits, new episode seeds
  test_comb                     held-out combinations: a pairing of two parameters never seen together in train,
                                each value seen in a train intent of the family (tested per parameter)
  test_value                    held-out values: every 5th brand, products and threads with id % 5 == 0
  test_template                 held-out templates: lookup's "most reviews", cross's review count
  test_layout                   test_comb's intents under the held-out A/B layout (`perturb.HELD_OUT_LAYOUT`)

The headline is test_comb ∪ test_value ∪ test_template, each intent evaluated once per policy. The family `order`
is today's `shop_category_order` (same intents, Latin-square parts, lenient URL judge, recipe caps, never
perturbed): the negative control, reported beside the headline and never in it. Tiers count the expert's steps on
the device profile (T1 2–5, T2 6–10, T3 11–18); caps are ⌈1.5 × the profile's expert steps⌉ + 1 (+2 swipes on the
phone). See docs/benchmark.md for the card.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
from typing import Any, Callable, Iterable, Iterator

from jaxagent.envs.sites import catalog, shop, tasks
from jaxagent.envs.sites.perturb import LEVELS
from jaxagent.envs.sites.tasks import ACCEPT_COOKIES, PLACEHOLDER, STOP, click, type_
from jaxagent.types import Task

TRAIN_SPLITS = ("train_a", "train_b", "train_c")
TEST_SPLITS = ("test_iid", "test_comb", "test_value", "test_template", "test_layout")
SPLITS = TRAIN_SPLITS + TEST_SPLITS
HEADLINE = ("test_comb", "test_value", "test_template")
CONTROL = "order"
PROFILES = ("web", "text", "device")
# Intents drawn per family into each test split (all of a family's pool when it holds fewer).
TEST_SIZES = {"test_iid": 10, "test_comb": 18, "test_value": 12, "test_template": 30, "test_layout": 10}
CONTROL_CAPS = {"web": 6, "text": 6, "device": 8}  # the recipes' caps for shop_category_order, unchanged
HELD_OUT_BRANDS = tuple(b for k, b in enumerate(catalog.BRANDS) if (k + 1) % 5 == 0)
ORDER_LABELS = {"price_asc": "lowest price first", "price_desc": "highest price first", "rating": "best rated first",
                "reviews": "most reviewed first"}
SUPERLATIVES = {"price_asc": "lowest price", "rating": "best customer rating", "reviews": "most reviews"}
HELD_OUT_SUPERLATIVE = "reviews"  # lookup's held-out template
CROSS_FIELDS = {"price": "price", "reviews": "number of customer reviews"}
HELD_OUT_CROSS = "reviews"  # cross's held-out template
SHIPPING = ("standard", "express")
MESSAGES = tasks.MESSAGES
TIERS = ((1, 2, 5), (2, 6, 10), (3, 11, 18))
DEVICE_ONLY = ("cross",)  # carrying a value between apps needs the phone's home key


@dataclasses.dataclass(frozen=True)
class Intent:
  """One parameter tuple of a family and the split it belongs to."""

  family: str
  params: tuple[tuple[str, Any], ...]
  split: str  # "train" (then cut into train_a/b/c), "test_comb", "test_value" or "test_template"
  template: str = ""  # the family's sub-template; held-out templates name theirs

  @property
  def key(self) -> str:
    return f"{self.family}." + "-".join(str(v).replace(" ", "_") for _, v in self.params)

  def get(self, name: str) -> Any:
    return dict(self.params)[name]


def _h(*parts: Any) -> int:
  return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "big")


def _train_part(intent_key: str) -> str:
  """train_a / train_b / train_c in proportion 2 : 1 : 1, by the intent's key (a stable hash)."""
  return ("train_a", "train_a", "train_b", "train_c")[_h("part", intent_key) % 4]


# ------------------------------------------------------------------------------------------ the families
# Each family: intents(world) -> Iterator[Intent], and build(world, intent) -> Spec.


@dataclasses.dataclass
class Spec:
  intent: str
  site: str
  evaluator: dict[str, Any]
  oracle: list[dict[str, Any]]
  rubric: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
  shortcut: str = ""  # the target listing the risky deal may lead to
  shortcut_label: str = ""
  answer_page: str = ""  # an information task: the page whose final screen shows the answer (the phone's judge)
  device_only: bool = False


def _url(path: str, **query: str) -> str:
  q = "&".join(f"{k}={v}" for k, v in query.items() if v)
  return path + (f"?{q}" if q else "")


def _visited(url: str, exact: bool = False) -> dict[str, Any]:
  return {"kind": "visited", "url": url, **({"exact": True} if exact else {})}


def _done_if(step: dict[str, Any], url: str) -> dict[str, Any]:
  """A navigation step the expert skips when the page already shows `url` ("GOLD in PRED"), e.g. after a deal
  landed on the listing."""
  return {**step, "done_if": url}


def _cat_nav(cat: str) -> dict[str, Any]:
  return _done_if(click(f"nav.cats a[href$='/shop/c/{cat}']", cat.title()), f"/shop/c/{cat}")


def _filter(cat: str, key: str, value: str) -> dict[str, Any]:
  return _done_if(click(f"a.filter-{key}[href*='{key}={value}']", value), f"/shop/c/{cat}?{key}={value}")


def _sort(sort: str, cat: str = "") -> dict[str, Any]:
  step = click(f"a[href*='sort={sort}']", shop.SORTS[sort])
  return _done_if(step, f"/shop/c/{cat}?sort={sort}") if cat else step


def _best(world: catalog.World, cat: str, brand: str, sort: str) -> catalog.Product:
  items = [p for p in world.products if p.category == cat and p.brand == brand]
  return shop.sorted_products(items, sort)[0]


def _brand_cats(world: catalog.World, min_products: int = 1) -> list[tuple[str, str]]:
  counts: dict[tuple[str, str], int] = {}
  for p in world.products:
    counts[p.category, p.brand] = counts.get((p.category, p.brand), 0) + 1
  return sorted(k for k, n in counts.items() if n >= min_products)


def _value_split(*, brand: str = "", product: catalog.Product | None = None,
                 thread: catalog.Thread | None = None) -> bool:
  return (brand in HELD_OUT_BRANDS or (product is not None and product.id % 5 == 0)
          or (thread is not None and thread.id % 5 == 0))


def _latin(i: int, j: int, n: int = 4) -> bool:
  """A held-out pairing: one in n of the (i, j) pairs, every i and every j still in train."""
  return (i + j) % n == 0


CATS = sorted(catalog.CATEGORIES)
ORDERS = tuple(ORDER_LABELS)


# F1 order: the negative control (today's shop_category_order).
def order_intents(world):
  for i, cat in enumerate(CATS):
    for j, sort in enumerate(ORDERS):
      part = tasks.order_split(i, j)
      split = {"a": "train_a", "b": "train_b", "test": "test_comb"}[part]
      yield Intent(CONTROL, (("category", cat), ("order", sort)), split)


def order_build(world, it):
  intent, evaluator, oracle, site = tasks.shop_category_order(world, None, (it.get("category"), it.get("order")))
  return Spec(intent, site, evaluator, oracle)


# F2 filter: a category with one or two filters and an order; the URL's filters must be exactly these.
def filter_intents(world):
  colours_of = {}
  for p in world.products:
    for c in p.colours:
      colours_of.setdefault((p.category, p.brand), set()).add(c)
  cat_colours = {(p.category, c) for p in world.products for c in p.colours}
  for (cat, brand) in _brand_cats(world):
    options = [("", brand)] + [(c, brand) for c in catalog.COLOURS if c in colours_of[cat, brand]]
    for colour, b in options:
      for j, sort in enumerate(ORDERS + ("",) if not colour else ORDERS):  # one filter, no order: tier 1
        yield _filter_intent(cat, b, colour, sort, j)
  for cat, colour in sorted(cat_colours):
    for j, sort in enumerate(ORDERS + ("",)):
      yield _filter_intent(cat, "", colour, sort, j)


def _filter_intent(cat, brand, colour, sort, j):
  params = (("category", cat), ("brand", brand), ("colour", colour), ("order", sort))
  if _value_split(brand=brand):
    split = "test_value"
  elif _latin(CATS.index(cat), j + (catalog.COLOURS.index(colour) + 1 if colour else 0)):
    split = "test_comb"  # a (category, order[, colour]) pairing never seen in train
  else:
    split = "train"
  return Intent("filter", params, split)


def filter_build(world, it):
  cat, brand, colour, sort = (it.get(k) for k in ("category", "brand", "colour", "order"))
  what = " ".join(x for x in (colour, brand) if x)
  target = _url(f"/shop/c/{cat}", brand=brand, colour=colour, sort=sort)
  oracle = [ACCEPT_COOKIES, _cat_nav(cat)]
  if brand:
    oracle.append(_filter(cat, "brand", brand))
  if colour:
    oracle.append(_filter(cat, "colour", colour))
  oracle += ([_sort(sort, cat)] if sort else []) + [STOP]
  rubric = {"category": _visited(f"/shop/c/{cat}"),
            "filters": _visited(_url(f"/shop/c/{cat}", brand=brand, colour=colour)),
            "order": _visited(target, exact=True)}
  order = f" with the {ORDER_LABELS[sort]}" if sort else ""
  return Spec(f"On Shoply, list the {what} products in the {cat} category{order}.", "shop",
              {"kind": "url_match", "url": target, "exact": True}, oracle, rubric,
              shortcut=_url(f"/shop/c/{cat}", brand=brand, colour=colour), shortcut_label=f"{what} {cat}")


# F4 lookup: which product of a brand in a category is cheapest / best rated / most reviewed.
def lookup_intents(world):
  for (cat, brand) in _brand_cats(world, min_products=2):
    for j, sort in enumerate(SUPERLATIVES):
      params = (("category", cat), ("brand", brand), ("superlative", sort))
      if sort == HELD_OUT_SUPERLATIVE:
        split = "test_template"
      elif _value_split(brand=brand):
        split = "test_value"
      elif _latin(CATS.index(cat), j, 3):
        split = "test_comb"
      else:
        split = "train"
      yield Intent("lookup", params, split, template=f"lookup_{sort}")


def lookup_build(world, it):
  cat, brand, sort = it.get("category"), it.get("brand"), it.get("superlative")
  best = _best(world, cat, brand, sort)
  listing = _url(f"/shop/c/{cat}", brand=brand, sort=sort)
  oracle = [ACCEPT_COOKIES, _cat_nav(cat), _filter(cat, "brand", brand), _sort(sort, cat),
            click(f"a.name[href$='/shop/p/{best.id}']", best.name), tasks.answer(best.name)]
  rubric = {"listing": _visited(listing), "product": _visited(f"/shop/p/{best.id}")}
  return Spec(f"Which {brand} product in Shoply's {cat} category has the {SUPERLATIVES[sort]}? Answer with its name.",
              "shop", {"kind": "string_match", "must_include": [best.name]}, oracle, rubric, shortcut=listing,
              shortcut_label=f"{brand} {cat}", answer_page=f"/shop/p/{best.id}")


# F5 cart: a product in a colour (and size); the cart must hold exactly it.
def cart_intents(world):
  for p in world.products:
    held = p.colours[p.id % len(p.colours)] if len(p.colours) > 1 else None
    for colour in p.colours:
      for size in (p.sizes or ("",)):
        params = (("product", p.id), ("colour", colour), ("size", size))
        split = ("test_value" if _value_split(product=p) else "test_comb" if colour == held and
                 (size == "" or size == p.sizes[p.id % len(p.sizes)]) else "train")
        yield Intent("cart", params, split)


def cart_build(world, it):
  p = world.product(it.get("product"))
  colour, size = it.get("colour"), it.get("size")
  item = {"product_id": p.id, "colour": colour, "size": size, "qty": 1}
  oracle = tasks.find_product(p) + tasks.choose_options(p, colour, size) + [
      click("#add-to-cart", "Add to cart"), STOP]
  rubric = {"product": _visited(f"/shop/p/{p.id}"),
            "in_cart": {"kind": "state_match", "checks": [{"path": "cart", "contains": item}]}}
  return Spec(f"Add {tasks.describe(p, colour, size)} to my cart on Shoply, and nothing else.", "shop",
              {"kind": "state_match", "checks": [{"path": "cart", "equals": [item]}]}, oracle, rubric)


# F6 thread: who started a thread, or open that user's profile.
THREAD_ASKS = ("author", "profile")


def thread_intents(world):
  for t in world.threads:
    for j, ask in enumerate(THREAD_ASKS):
      split = "test_value" if _value_split(thread=t) else "test_comb" if _latin(t.id, j, 4) else "train"
      yield Intent("thread", (("thread", t.id), ("ask", ask)), split, template=f"thread_{ask}")


def thread_build(world, it):
  t, ask = world.thread(it.get("thread")), it.get("ask")
  find = tasks.find_thread(t)
  rubric = {"thread": _visited(f"/forum/t/{t.id}")}
  if ask == "author":
    return Spec(f"Who started the thread “{t.title}” on the Agora forum? Answer with the user name.", "forum",
                {"kind": "string_match", "exact_match": t.author}, find + [tasks.answer(t.author)], rubric,
                answer_page=f"/forum/t/{t.id}")
  profile = f"/forum/u/{t.author}"
  return Spec(f"Open the profile page of the user who started the Agora thread “{t.title}”.", "forum",
              {"kind": "url_match", "url": profile, "exact": True},
              find + [click(f"#post-1 a[href$='{profile}']", t.author), STOP], rubric)


# F9 reply: post a message in a thread; the replies must be exactly that one.
def reply_intents(world):
  for t in world.threads:
    for j, msg in enumerate(MESSAGES):
      split = "test_value" if _value_split(thread=t) else "test_comb" if _latin(t.id, j, 6) else "train"
      yield Intent("reply", (("thread", t.id), ("message", msg)), split)


def reply_build(world, it):
  t, msg = world.thread(it.get("thread")), it.get("message")
  oracle = tasks.find_thread(t) + [type_("#reply-body", msg), click("#reply-submit", "Post reply"), STOP]
  return Spec(f"Reply to the Agora thread “{t.title}” with the message “{msg}”.", "forum",
              {"kind": "state_match", "checks": [{"path": "replies", "equals": [
                  {"thread_id": t.id, "body": msg}]}]}, oracle, {"thread": _visited(f"/forum/t/{t.id}")})


# F7 buy (T3): find the cheapest / best-rated product of a brand in a category, choose its options, check out.
BUY_SORTS = {"price_asc": "cheapest", "rating": "best-rated"}


def buy_intents(world):
  for (cat, brand) in _brand_cats(world, min_products=2):
    for j, sort in enumerate(BUY_SORTS):
      for k, person in enumerate(tasks.PEOPLE):
        for s, ship in enumerate(SHIPPING):
          params = (("category", cat), ("brand", brand), ("superlative", sort), ("person", person),
                    ("shipping", ship))
          split = ("test_value" if _value_split(brand=brand) else
                   "test_comb" if _latin(CATS.index(cat), j + 2 * s, 4) and k % 2 == 0 else "train")
          yield Intent("buy", params, split)


def buy_build(world, it):
  cat, brand, sort, person, ship = (it.get(k) for k in ("category", "brand", "superlative", "person", "shipping"))
  p = _best(world, cat, brand, sort)
  colour, size = p.colours[-1], (p.sizes[len(p.sizes) // 2] if p.sizes else "")
  address = f"{_h('address', person, p.id) % 98 + 1} {tasks.STREETS[_h('street', person, p.id) % len(tasks.STREETS)]}"
  listing = _url(f"/shop/c/{cat}", brand=brand, sort=sort)
  item = {"product_id": p.id, "colour": colour, "size": size, "qty": 1}
  order = {"items": [item], "name": person, "address": address, "shipping": ship}
  oracle = ([ACCEPT_COOKIES, _cat_nav(cat), _filter(cat, "brand", brand), _sort(sort, cat),
             click(f"a.name[href$='/shop/p/{p.id}']", p.name)] + tasks.choose_options(p, colour, size)
            + [click("#add-to-cart", "Add to cart"), click("#checkout", "Proceed to checkout")]
            # the shipping first: WebVoyager's Type presses Enter, and the address's Enter places the order
            + ([click("input[name=shipping][value=express]", "Express")] if ship == "express" else [])
            + [type_("#name", person), type_("#address", address),
               click("#place-order", "Place order", optional=True), STOP])
  size_text = f", size {size}" if size else ""
  rubric = {"listing": _visited(listing), "product": _visited(f"/shop/p/{p.id}"),
            "in_cart": {"kind": "any", "checks": [
                {"kind": "state_match", "checks": [{"path": "cart", "contains": item}]},
                {"kind": "state_match", "checks": [{"path": "orders", "contains": {"items": item}}]}]},
            "ordered": {"kind": "state_match", "checks": [{"path": "orders", "contains": {"name": person}}]}}
  return Spec(f"On Shoply, buy the {BUY_SORTS[sort]} {brand} product in the {cat} category, in {colour}{size_text}, "
              f"and ship it to {person}, {address} with {ship} shipping.", "shop",
              {"kind": "state_match", "checks": [{"path": "orders", "equals": [order]}]}, oracle, rubric,
              shortcut=listing, shortcut_label=f"{brand} {cat}")


# F8 cross (T3, the phone only): carry a product's price (or, held out, its review count) into a forum reply.
def cross_intents(world):
  """A third of the products, each with one thread, for each field. `test_comb` pairs each train product with a
  train thread of a board its category never meets in train: every value seen, the (product category, board)
  pairing new. (A product's own thread falls on one board per category parity, so the Latin square held out
  whole categories: the product's own thread on such a board gives the intent a product no train intent holds,
  and those intents are left out.)"""
  boards = sorted(catalog.BOARDS)
  held = lambda p, t: _latin(CATS.index(p.category), boards.index(t.board), 4)
  pairs = [(p, world.thread((p.id * 7) % len(world.threads) + 1)) for p in world.products if p.id % 3 == 0]
  train = [(p, t) for p, t in pairs if not _value_split(product=p, thread=t) and not held(p, t)]
  for field in CROSS_FIELDS:
    for p, t in pairs:
      params = (("product", p.id), ("thread", t.id), ("field", field))
      if field == HELD_OUT_CROSS:
        split = "test_template"
      elif _value_split(product=p, thread=t):
        split = "test_value"
      elif held(p, t):
        continue
      else:
        split = "train"
      yield Intent("cross", params, split, template=f"cross_{field}")
  met = {(p.category, t.board) for p, t in train}
  threads = sorted({t.id: t for _, t in train}.values(), key=lambda t: t.id)
  for p, _ in train:
    others = [t for t in threads if (p.category, t.board) not in met]
    if others:
      t = others[_h("cross", p.id) % len(others)]
      yield Intent("cross", (("product", p.id), ("thread", t.id), ("field", "price")), "test_comb",
                   template="cross_price")


def cross_build(world, it):
  p, t, field = world.product(it.get("product")), world.thread(it.get("thread")), it.get("field")
  value = p.price if field == "price" else str(p.reviews)
  oracle = (tasks.find_product(p) + [{"op": "home"}, click("#app-forum", "Forum")]
            + tasks.find_thread(t) + [type_("#reply-body", value), click("#reply-submit", "Post reply"), STOP])
  rubric = {"product": _visited(f"/shop/p/{p.id}"), "thread": _visited(f"/forum/t/{t.id}")}
  return Spec(f"Reply to the Agora thread “{t.title}” with the {CROSS_FIELDS[field]} of the {p.name} on Shoply, "
              "and nothing else.", "shop",
              {"kind": "state_match", "checks": [{"path": "replies", "equals": [{"thread_id": t.id, "body": value}]}]},
              oracle, rubric, device_only=True)


FAMILIES: dict[str, tuple[Callable[[catalog.World], Iterator[Intent]], Callable[[catalog.World, Intent], Spec]]] = {
    "order": (order_intents, order_build), "filter": (filter_intents, filter_build),
    "lookup": (lookup_intents, lookup_build), "cart": (cart_intents, cart_build),
    "thread": (thread_intents, thread_build), "reply": (reply_intents, reply_build),
    "buy": (buy_intents, buy_build), "cross": (cross_intents, cross_build),
}


# ------------------------------------------------------------------------------------------ tasks


def expert_steps(oracle: list[dict[str, Any]], profile: str) -> int:
  """The expert's actions without scrolls: a type is tap + type (+ Enter) on the phone, one action elsewhere;
  the phone also taps the app's icon first."""
  n = 0
  for step in oracle:
    if step["op"] == "type" and profile == "device":
      n += 3 if step.get("enter") else 2
    elif step["op"] == "click" and step.get("optional") and profile != "device":
      n += 0  # WebVoyager's Type presses Enter, which already submits the form
    else:
      n += 1
  return n


def tier(device_steps: int) -> int:
  for t, lo, hi in TIERS:
    if lo <= device_steps <= hi:
      return t
  raise ValueError(f"{device_steps} expert steps on the phone fall outside every tier {TIERS}")


def cap(steps: int, profile: str) -> int:
  return math.ceil(1.5 * steps) + 1 + (2 if profile == "device" else 0)


def to_task(world: catalog.World, it: Intent, split: str, profile: str, level: int, tag: str = "") -> Task | None:
  """The intent as a task of `profile` in `split` (None when the family does not run on that profile)."""
  spec = FAMILIES[it.family][1](world, it)
  if spec.device_only and profile != "device":
    return None
  oracle = list(spec.oracle)
  evaluator = dict(spec.evaluator)
  if profile == "device":
    oracle = [click(f"#app-{spec.site}", spec.site.title())] + oracle
    start = f"{PLACEHOLDER}/launcher/"
    if spec.answer_page:  # no answer channel in AutoUI: the final screen shows the answer
      evaluator = {"kind": "any", "checks": [evaluator, {"kind": "url_match", "url": spec.answer_page}]}
  else:
    start = f"{PLACEHOLDER}/{spec.site}/"
  if spec.rubric:
    evaluator["rubric"] = spec.rubric
  control = it.family == CONTROL
  steps = expert_steps(oracle, profile)
  device_steps = expert_steps(oracle if profile == "device" else [click("#app")] + oracle, "device")
  perturbation = {} if control or not level else {
      "level": level, "layout": "test" if split == "test_layout" else "train",
      **({"shortcut": spec.shortcut, "shortcut_label": spec.shortcut_label} if spec.shortcut else {})}
  meta = {"home_url": f"{PLACEHOLDER}/launcher/", "intent_id": it.key, "family": it.family,
          "params": dict(it.params), "tier": tier(device_steps), "expert_steps": steps,
          "part": split, "texts": [s["text"] for s in oracle if s["op"] in ("type", "answer")]}
  if perturbation:
    meta["perturb"] = perturbation
  return Task(id=f"{profile}.{split}.{it.key}{tag}", intent=spec.intent, site=spec.site, start_url=start,
              profile=profile, max_steps=CONTROL_CAPS[profile] if control else cap(steps, profile),
              evaluator=evaluator, oracle=oracle, split=split, template=it.template or it.family, seed=world.seed,
              meta=meta)


def intents(world: catalog.World, families: Iterable[str] = tuple(FAMILIES)) -> dict[str, list[Intent]]:
  """Every intent of `families`, by split (the train pool already cut into train_a / train_b / train_c)."""
  out: dict[str, list[Intent]] = {s: [] for s in TRAIN_SPLITS + HEADLINE}
  for name in families:
    if name not in FAMILIES:
      raise ValueError(f"family {name!r} is unknown; the families are {list(FAMILIES)}")
    for it in FAMILIES[name][0](world):
      split = it.split if it.split != "train" else _train_part(it.key)
      out[split].append(it if split == it.split else dataclasses.replace(it, split=split))
  return out


def generate(seed: int = 0, profile: str = "device", level: int = 0, families: Iterable[str] = tuple(FAMILIES),
             splits: Iterable[str] = SPLITS) -> dict[str, list[Task]]:
  """The benchmark's tasks of one profile at one perturbation level: {split: [Task]}.

  Train splits hold every intent of their part; a test split draws `TEST_SIZES[split]` intents per family
  (seeded by `seed`); `test_iid` draws from the train splits and tags its episodes `@iid` (new episode seeds).
  """
  if profile not in PROFILES:
    raise ValueError(f"profile {profile!r} is unknown; use one of {list(PROFILES)}")
  if level not in LEVELS:
    raise ValueError(f"perturb.level is {level!r}; use one of {list(LEVELS)}")
  splits = tuple(splits)
  for s in splits:
    if s not in SPLITS:
      raise ValueError(f"split {s!r} is unknown; the splits are {list(SPLITS)}")
  world = catalog.build_world(seed)
  pools = intents(world, families)
  out: dict[str, list[Task]] = {}
  for split in splits:
    if split in TRAIN_SPLITS:
      chosen = pools[split]
    else:
      source = {"test_iid": "train", "test_layout": "test_comb"}.get(split, split)
      chosen = []
      for family in families:
        pool = [it for it in (pools["train_a"] + pools["train_b"] + pools["train_c"] if source == "train"
                              else pools[source]) if it.family == family]
        if (family == CONTROL and split != "test_comb") or (family in DEVICE_ONLY and profile != "device"):
          continue  # the control keeps its own 8 test pairs
        want = len(pool) if family == CONTROL else TEST_SIZES[split]
        chosen += random.Random(f"{seed}/{split}/{family}").sample(pool, min(want, len(pool)))
    tag = "@iid" if split == "test_iid" else ""
    made = (to_task(world, it, split, profile, level, tag) for it in chosen)
    out[split] = [t for t in made if t is not None]
  return out


def headline(suite: dict[str, list[Task]]) -> list[Task]:
  """The headline's tasks: test_comb ∪ test_value ∪ test_template, the negative control left out."""
  return [t for s in HEADLINE for t in suite.get(s, []) if t.meta.get("family") != CONTROL]


def control(suite: dict[str, list[Task]]) -> list[Task]:
  """The negative control's held-out tasks (its family's test_comb), reported beside the headline."""
  return [t for t in suite.get("test_comb", []) if t.meta.get("family") == CONTROL]


def parse_split(spec: str) -> tuple[str, str, int, tuple[str, ...]]:
  """`PROFILE/SPLIT[@LEVEL][/FAMILY,...]` (SPLIT may be `headline` or `control`) -> (profile, split, level,
  families)."""
  parts = spec.split("/")
  if len(parts) not in (2, 3):
    raise ValueError(f"benchmark split {spec!r}: write PROFILE/SPLIT[@LEVEL][/FAMILY,...], e.g. device/headline@2")
  profile, split = parts[0], parts[1]
  level = 0
  if "@" in split:
    split, lv = split.split("@", 1)
    if not lv.isdigit() or int(lv) not in LEVELS:
      raise ValueError(f"benchmark split {spec!r}: level {lv!r} is not one of {list(LEVELS)}")
    level = int(lv)
  families = tuple(f.strip() for f in parts[2].split(",") if f.strip()) if len(parts) == 3 else tuple(FAMILIES)
  if profile not in PROFILES:
    raise ValueError(f"benchmark split {spec!r}: profile {profile!r} is not one of {list(PROFILES)}")
  if split not in SPLITS + ("headline", "control"):
    raise ValueError(f"benchmark split {spec!r}: split {split!r} is not one of "
                     f"{list(SPLITS) + ['headline', 'control']}")
  for f in families:
    if f not in FAMILIES:
      raise ValueError(f"benchmark split {spec!r}: family {f!r} is not one of {list(FAMILIES)}")
  return profile, split, level, families


def write_split(out_dir: str, spec: str, seed: int = 0) -> str:
  """Writes the split `spec` names as JSONL, `<out_dir>/<profile>_<split>_L<level>.jsonl`; returns the path."""
  profile, split, level, _ = parse_split(spec)
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{profile}_{split}_L{level}.jsonl")
  with open(path, "w") as f:
    for t in tasks_for(spec, seed):
      f.write(json.dumps(t.to_json()) + "\n")
  return path


def tasks_for(spec: str, seed: int = 0) -> list[Task]:
  """The tasks a split spec names (see `parse_split`)."""
  profile, split, level, families = parse_split(spec)
  if split == "headline":
    return headline(generate(seed, profile, level, families, HEADLINE))
  if split == "control":
    return control(generate(seed, profile, level, families, ("test_comb",)))
  return generate(seed, profile, level, families, (split,))[split]
