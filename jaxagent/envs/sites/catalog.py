"""The bundled sites' content, generated deterministically from one seed.

Everything the sites show (products, forum threads, users) comes from `build_world(seed)`, so a task
generated against seed 0 finds the same price on the same page in every process and on every machine.
The world is read-only; what an episode changes (cart, orders, replies, settings) lives in `state.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import random

CATEGORIES = {
    "lighting": ("Table Lamp", "Floor Lamp", "Desk Lamp", "Pendant Light", "LED Strip", "Night Light"),
    "kitchen": ("Kettle", "Toaster", "Blender", "Coffee Grinder", "Chef Knife", "Frying Pan"),
    "audio": ("Headphones", "Earbuds", "Bluetooth Speaker", "Soundbar", "Turntable", "Microphone"),
    "outdoor": ("Tent", "Sleeping Bag", "Hiking Backpack", "Camping Stove", "Trekking Poles", "Headlamp"),
    "apparel": ("Rain Jacket", "Hoodie", "Running Shoes", "Wool Socks", "Beanie", "Fleece Vest"),
    "office": ("Office Chair", "Standing Desk", "Monitor Arm", "Notebook", "Fountain Pen", "Desk Organizer"),
    "fitness": ("Yoga Mat", "Dumbbell Set", "Jump Rope", "Foam Roller", "Kettlebell", "Resistance Bands"),
    "home": ("Throw Blanket", "Bath Towel", "Wall Clock", "Storage Basket", "Scented Candle", "Cushion"),
}
BRANDS = ("Lumina", "Nordvik", "Acorn", "Brightwell", "Cobalt", "Everpeak", "Fenwick", "Halcyon", "Ironbark",
          "Juniper", "Kestrel", "Meridian", "Northstar", "Orla", "Pinewood", "Quillon", "Redfern", "Solace",
          "Tamarack", "Vantage")
ADJECTIVES = ("Classic", "Compact", "Deluxe", "Ultra", "Pro", "Eco", "Smart", "Vintage", "Slim", "Urban", "Alpine",
              "Studio", "Essential", "Premium", "Travel")
COLOURS = ("black", "white", "grey", "red", "blue", "green", "yellow", "brown")
SIZES_APPAREL = ("XS", "S", "M", "L", "XL")
SIZES_GENERIC = ("small", "medium", "large")
N_PRODUCTS = 1200

BOARDS = {
    "hardware": "Hardware and gadgets",
    "cooking": "Cooking and recipes",
    "travel": "Travel stories and tips",
    "fitness": "Training and fitness",
    "books": "Books and reading",
    "gardening": "Gardening",
}
TOPICS = {
    "hardware": ("mechanical keyboards", "laptop batteries", "home servers", "USB-C hubs", "e-readers",
                 "noise cancelling", "3D printers", "smart plugs"),
    "cooking": ("sourdough starters", "cast iron care", "knife sharpening", "meal prep", "fermented hot sauce",
                "ramen broth", "pizza ovens", "spice blends"),
    "travel": ("night trains", "hostel etiquette", "packing light", "travel insurance", "island hopping",
               "mountain huts", "city passes", "jet lag"),
    "fitness": ("marathon training", "rest days", "home workouts", "stretching routines", "protein intake",
                "cycling cadence", "climbing grades", "swim technique"),
    "books": ("slow fantasy", "translated fiction", "audiobooks", "library apps", "book clubs", "poetry",
              "classic mysteries", "reading goals"),
    "gardening": ("tomato blight", "compost bins", "balcony herbs", "seed swaps", "pruning roses",
                  "raised beds", "rain barrels", "houseplant pests"),
}
TITLE_PATTERNS = ("Questions about {t}", "My experience with {t}", "Beginner guide to {t}", "Is {t} worth it?",
                  "Thoughts on {t} this year", "Help with {t}", "Best advice for {t}", "Mistakes I made with {t}")
FIRST = ("alex", "bea", "cyrus", "dana", "eli", "fatima", "gus", "hana", "ivo", "jun", "kira", "leo", "mina",
         "nils", "omar", "pia", "quinn", "rosa", "sami", "tariq", "uma", "vera", "wen", "yara", "zane")
SENTENCES = ("I have been looking into this for a while now.", "Any recommendations are welcome.",
             "It worked much better than I expected.", "The second attempt went a lot smoother.",
             "I would not do it the same way again.", "Curious what everyone else thinks.",
             "Sharing in case it helps someone.", "The cheaper option was fine for me.",
             "Took about two weeks to see a difference.", "Happy to answer questions.")
N_THREADS = 480


@dataclasses.dataclass(frozen=True)
class Product:
  id: int
  name: str
  brand: str
  category: str
  kind: str
  price_cents: int
  rating: float  # 1.0 .. 5.0, one decimal
  reviews: int
  colours: tuple[str, ...]
  sizes: tuple[str, ...]
  stock: int
  description: str

  @property
  def price(self) -> str:
    return f"${self.price_cents // 100}.{self.price_cents % 100:02d}"


@dataclasses.dataclass(frozen=True)
class Post:
  author: str
  body: str
  day: int  # days since the forum opened


@dataclasses.dataclass(frozen=True)
class Thread:
  id: int
  board: str
  title: str
  author: str
  posts: tuple[Post, ...]  # posts[0] is the opening post
  views: int

  @property
  def replies(self) -> int:
    return len(self.posts) - 1


@dataclasses.dataclass(frozen=True)
class User:
  name: str
  joined_day: int
  location: str


@dataclasses.dataclass(frozen=True)
class World:
  seed: int
  products: tuple[Product, ...]
  threads: tuple[Thread, ...]
  users: dict[str, User]

  def product(self, pid: int) -> Product | None:
    return self.products[pid - 1] if 1 <= pid <= len(self.products) else None

  def thread(self, tid: int) -> Thread | None:
    return self.threads[tid - 1] if 1 <= tid <= len(self.threads) else None


def _products(rng: random.Random) -> tuple[Product, ...]:
  products, names = [], set()
  cats = sorted(CATEGORIES)
  while len(products) < N_PRODUCTS:
    pid = len(products) + 1
    cat = cats[pid % len(cats)]
    kind = rng.choice(CATEGORIES[cat])
    brand, adj = rng.choice(BRANDS), rng.choice(ADJECTIVES)
    name = f"{brand} {adj} {kind} {rng.choice('ABCDEFGHKMRSTX')}{rng.randint(10, 99)}"
    if name in names:
      continue
    names.add(name)
    colours = tuple(sorted(rng.sample(COLOURS, rng.randint(1, 4)), key=COLOURS.index))
    sizes = SIZES_APPAREL if cat == "apparel" else (SIZES_GENERIC if rng.random() < 0.4 else ())
    price = rng.randint(5, 400) * 100 + rng.choice((0, 49, 95, 99))
    rating = round(rng.uniform(2.0, 5.0), 1)
    products.append(Product(
        id=pid, name=name, brand=brand, category=cat, kind=kind, price_cents=price, rating=rating,
        reviews=rng.randint(0, 2500), colours=colours, sizes=sizes, stock=rng.randint(0, 60),
        description=(f"The {name} is a {adj.lower()} {kind.lower()} by {brand}. "
                     f"Available in {', '.join(colours)}.")))
  return tuple(products)


def _users(rng: random.Random) -> dict[str, User]:
  cities = ("Lisbon", "Oslo", "Nairobi", "Osaka", "Quito", "Tallinn", "Perth", "Montreal", "Seville", "Hanoi")
  users = {}
  for first in FIRST:
    for suffix in ("", "_k", "99"):
      name = first + suffix
      users[name] = User(name=name, joined_day=rng.randint(1, 900), location=rng.choice(cities))
  return users


def _threads(rng: random.Random, users: dict[str, User]) -> tuple[Thread, ...]:
  names = sorted(users)
  threads, titles = [], set()
  boards = sorted(BOARDS)
  while len(threads) < N_THREADS:
    board = boards[len(threads) % len(boards)]
    title = rng.choice(TITLE_PATTERNS).format(t=rng.choice(TOPICS[board]))
    if title in titles:  # titles are unique so a task can name a thread by its title
      title = f"{title} (part {sum(t.startswith(title) for t in titles) + 2})"
      if title in titles:
        continue
    titles.add(title)
    day = rng.randint(1, 900)
    posts = []
    for k in range(rng.randint(1, 9)):
      body = " ".join(rng.sample(SENTENCES, rng.randint(1, 3)))
      posts.append(Post(author=rng.choice(names), body=body, day=day + k))
    threads.append(Thread(id=len(threads) + 1, board=board, title=title, author=posts[0].author,
                          posts=tuple(posts), views=rng.randint(10, 9000)))
  return tuple(threads)


@functools.lru_cache(maxsize=4)
def build_world(seed: int = 0) -> World:
  """The sites' whole content for `seed` (cached: every request and task generator shares one)."""
  rng = random.Random(f"jaxagent-sites-{seed}")
  products = _products(rng)
  users = _users(rng)
  threads = _threads(rng, users)
  return World(seed=seed, products=products, threads=threads, users=users)


def search_products(world: World, query: str) -> list[Product]:
  """Keyword search ranked as a small shop would: exact name, then name-token overlap, then rating."""
  q = query.strip().lower()
  terms = [t for t in q.split() if t]
  if not terms:
    return []
  scored = []
  for p in world.products:
    name = p.name.lower()
    hay = f"{name} {p.category} {p.kind.lower()} {' '.join(p.colours)}"
    hits = sum(t in hay for t in terms)
    if not hits:
      continue
    name_hits = sum(t in name.split() for t in terms)
    scored.append(((name == q, q in name, name_hits, hits, p.rating, -p.id), p))
  scored.sort(key=lambda s: s[0], reverse=True)
  return [p for _, p in scored]


def search_threads(world: World, query: str) -> list[Thread]:
  q = query.strip().lower()
  terms = q.split()
  if not terms:
    return []
  scored = []
  for t in world.threads:
    title = t.title.lower()
    hits = sum(w in title for w in terms)
    if hits:
      scored.append(((title == q, q in title, hits, -t.id), t))
  scored.sort(key=lambda s: s[0], reverse=True)
  return [t for _, t in scored]
