"""Seeded per-episode perturbations of the bundled sites, applied by the server so every observer sees them.

An episode's perturbations are a pure function of its `Perturbation` (level, seed, layout, shortcut) and of what
the agent did (which page view, which request): two policies that take the same actions in the same episode see
the same pages, which is what a paired comparison needs. The seed comes from the episode's task id
(`episode_seed`), so an evaluation episode is the same for every policy evaluated on it.

Levels (`perturb.level`):
  0  today's sites, nothing perturbed;
  1  P1 an interstitial pop-up on one page view of a quarter of the episodes; P2 an A/B layout of the shop's
     category bar and sort control (3 × 3 variants, one combination held out for the `test_layout` split);
     P3 shuffled category, brand and colour lists and a page size of 12 or 24;
  2  level 1 plus P4 transient "Something went wrong" pages (10 % of page requests after the first) and P5 a
     risky "Deal for you" shortcut on the shop's home page (half the episodes that have a target listing): it
     reaches the target with probability 0.3, else an expired-deal page.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Any, Sequence

LEVELS = (0, 1, 2)
POPUP_P = 0.25  # episodes with an interstitial (AitW's ads and rate-the-app prompts)
POPUP_VIEWS = (2, 3, 4)  # the page view it covers (the first view is the start page: resets stay clean)
CORNERS = ("top-left", "top-right", "bottom-left", "bottom-right")
NAV_VARIANTS = ("top", "bottom", "side")  # where the category bar sits
SORT_VARIANTS = ("chips", "below", "list")  # how the sort control looks and where
HELD_OUT_LAYOUT = (2, 2)  # (nav, sort): shown only in `test_layout` episodes
TRAIN_LAYOUTS = tuple((n, s) for n in range(3) for s in range(3) if (n, s) != HELD_OUT_LAYOUT)
PAGE_SIZES = (12, 24)
FAIL_P = 0.1  # transient failures per page request after the first
DEAL_P = 0.5  # episodes with a shortcut banner (when the task names a target listing)
DEAL_WORKS_P = 0.3  # the shortcut reaches the target


def episode_seed(task_id: str, episode: int = 0) -> int:
  """A 31-bit seed from an episode's task id (the `@<tag><k>` suffix of drawn episodes included) and index."""
  digest = hashlib.sha256(f"{task_id}#{episode}".encode()).digest()
  return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclasses.dataclass(frozen=True)
class Perturbation:
  level: int = 0
  seed: int = 0
  layout: str = "train"  # "train": one of TRAIN_LAYOUTS; "test": HELD_OUT_LAYOUT
  shortcut: str = ""  # site-relative URL of the task's target listing, e.g. "/shop/c/audio?brand=Acorn"
  shortcut_label: str = ""  # what the banner says it leads to

  def __post_init__(self):
    if self.level not in LEVELS:
      raise ValueError(f"perturb.level is {self.level!r}; use one of {list(LEVELS)}")
    if self.layout not in ("train", "test"):
      raise ValueError(f"perturb.layout is {self.layout!r}; use 'train' or 'test' (the held-out layout)")
    if self.shortcut and not self.shortcut.startswith("/shop/"):
      raise ValueError(f"perturb.shortcut {self.shortcut!r} must be a shop URL relative to the session, "
                       "e.g. '/shop/c/audio?sort=rating'")

  @classmethod
  def from_json(cls, d: dict[str, Any] | None) -> "Perturbation":
    d = dict(d or {})
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(f"perturbation fields {unknown} are unknown; use level, seed, layout, shortcut, shortcut_label")
    return cls(**d)

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def rng(self, *salt: Any) -> random.Random:
    return random.Random(f"{self.seed}/" + "/".join(map(str, salt)))

  # ------------------------------------------------------------------------------------------ level 1

  @property
  def popup_view(self) -> int:
    """The page view the interstitial covers; 0 when this episode has none."""
    if self.level < 1:
      return 0
    r = self.rng("popup")
    return r.choice(POPUP_VIEWS) if r.random() < POPUP_P else 0

  @property
  def popup_corner(self) -> str:
    return self.rng("corner").choice(CORNERS)

  @property
  def layout_variant(self) -> tuple[int, int]:
    """(nav, sort) variant indices; (0, 0) is today's layout."""
    if self.level < 1:
      return (0, 0)
    return HELD_OUT_LAYOUT if self.layout == "test" else self.rng("layout").choice(TRAIN_LAYOUTS)

  @property
  def page_size(self) -> int:
    return self.rng("page_size").choice(PAGE_SIZES) if self.level >= 1 else PAGE_SIZES[0]

  def shuffled(self, items: Sequence[Any], what: str) -> list[Any]:
    items = list(items)
    if self.level >= 1:
      self.rng("shuffle", what).shuffle(items)
    return items

  # ------------------------------------------------------------------------------------------ level 2

  def fails(self, request: int) -> bool:
    """Whether page request number `request` (1-based, per episode) fails transiently; never the first."""
    return self.level >= 2 and request > 1 and self.rng("fail", request).random() < FAIL_P

  @property
  def has_deal(self) -> bool:
    return self.level >= 2 and bool(self.shortcut) and self.rng("deal").random() < DEAL_P

  @property
  def deal_works(self) -> bool:
    return self.rng("deal_outcome").random() < DEAL_WORKS_P


NONE = Perturbation()
