"""SYNTHETIC OpenWebVoyager-format conversations, so the IL recipe's default runs with no download.

This is not expert data: it is a generator of small, learnable browsing episodes (search a made-up site, open a
result, read a price) written in exactly the format OpenWebVoyager trains on (`reference/algorithms.md`
§2.2–2.3): per step one sample `{"id", "images", "conversations"}`, user turns
`"{task}\\nOBSERVATION:\\n<image>\\n{acc_tree}"` with the history compressed to ≤3 screenshots, assistant turns
`"Thought: ...\\n\\nAction: ..."` in the WebVoyager action grammar. Screenshots are rendered with PIL.
Real demonstrations (the scripted expert on the bundled sites) come in the same format through
`config.data.path`.
"""

from __future__ import annotations

import json
import os
import random
from typing import Iterator

SITES = ("ShopLocal", "GreenGrocer", "BookNook", "GadgetHub", "HomeGoods")
ITEMS = ("red kettle", "oak table", "blue lamp", "paper towels", "coffee beans", "desk chair", "garden hose",
         "wool socks", "phone charger", "rice cooker", "yoga mat", "tea cups", "sun hat", "bike helmet",
         "soup bowl", "notebook", "water bottle", "alarm clock", "towel set", "hand soap")
CATEGORIES = ("Kitchen", "Home", "Outdoor", "Office", "Clothing", "Electronics")
_COLORS = {"ShopLocal": (52, 101, 164), "GreenGrocer": (78, 154, 6), "BookNook": (117, 80, 123),
           "GadgetHub": (206, 92, 0), "HomeGoods": (164, 0, 0)}


def _tree(title: str, elements: list[tuple[str, str]]) -> str:
  """An accessibility tree in the WebVoyager a11y-mode shape: `[id] role 'name'`, one per line."""
  lines = [f"[0] RootWebArea '{title}'"]
  lines += [f"\t[{i}] {role} '{name}'" for i, (role, name) in enumerate(elements, 1)]
  return "\n".join(lines)


def _episode(rng: random.Random) -> dict:
  """One task and its steps: [(page title, elements, thought, action)]."""
  site, item = rng.choice(SITES), rng.choice(ITEMS)
  price = f"${rng.randint(2, 199)}.{rng.randint(0, 99):02d}"
  nav = [("link", "Home")] + [("link", c) for c in rng.sample(CATEGORIES, 3)]
  home = nav + [("textbox", f"Search {site}"), ("button", "Search")]
  search_id = len(nav) + 1
  others = rng.sample([i for i in ITEMS if i != item], rng.randint(2, 5))
  results = others + [item]
  rng.shuffle(results)
  steps = [(f"{site} - Home", home, f"I need to find {item} on {site}. I will type it into the search box.",
            f"Type [{search_id}]; {item}")]
  visible = 3
  if results.index(item) >= visible:
    shown = nav + [("link", r) for r in results[:visible]]
    steps.append((f"Search results - {site}", shown,
                  f"The results visible so far do not include {item}. I will scroll down to see more.",
                  "Scroll [WINDOW]; down"))
    results = results[visible:]
  page = nav + [("link", r) for r in results]
  steps.append((f"Search results - {site}", page,
                f"The result '{item}' is listed. I will click it to see its details.",
                f"Click [{len(nav) + 1 + results.index(item)}]"))
  product = nav + [("heading", item.title()), ("StaticText", f"Price: {price}"),
                   ("button", "Add to cart")]
  steps.append((f"{item.title()} - {site}", product,
                f"The product page shows the price of {item}: {price}.", f"ANSWER; {price}"))
  return {"task": f"What is the price of the {item} on {site}?", "site": site, "steps": steps}


def _user_turn(prefix: str, tree: str, age: int) -> str:
  """The OpenWebVoyager user turn for a step `age` steps before the current one (§2.2 history compression)."""
  if age == 0:
    return f"{prefix}OBSERVATION:\n<image>\n{tree}"
  if age <= 2:
    return f"{prefix}OBSERVATION: <image> (accessibility tree omitted)."
  return f"{prefix}OBSERVATION: screenshot omitted, accessibility tree omitted."


def _samples(episode: dict, flag: str) -> Iterator[dict]:
  """One sample per step, each carrying the compressed history up to that step (§2.3)."""
  steps = episode["steps"]
  for t in range(len(steps)):
    conv, images = [], []
    for j in range(t + 1):
      prefix = episode["task"] + "\n" if j == 0 else ""
      conv.append({"from": "human", "value": _user_turn(prefix, _tree(steps[j][0], steps[j][1]), t - j)})
      conv.append({"from": "gpt", "value": f"Thought: {steps[j][2]}\n\nAction: {steps[j][3]}"})
      if t - j <= 2:
        images.append(f"{flag}--step{j + 1:02d}.png")
    yield {"id": f"{flag}--step{t + 1:02d}", "images": images, "conversations": conv}


def render_screenshot(title: str, elements: list[tuple[str, str]], site: str, size=(320, 240)):
  """A PIL image of the page: a coloured header with the title, then each element as a labelled box."""
  from PIL import Image, ImageDraw  # pylint: disable=g-import-not-at-top
  img = Image.new("RGB", size, (255, 255, 255))
  draw = ImageDraw.Draw(img)
  draw.rectangle([0, 0, size[0], 24], fill=_COLORS.get(site, (60, 60, 60)))
  draw.text((6, 6), title, fill=(255, 255, 255))
  y = 30
  for i, (role, name) in enumerate(elements, 1):
    fill = {"button": (230, 230, 250), "textbox": (250, 250, 230)}.get(role, (255, 255, 255))
    draw.rectangle([6, y, size[0] - 6, y + 16], outline=(120, 120, 120), fill=fill)
    draw.text((10, y + 3), f"{i} {name}", fill=(0, 0, 200) if role == "link" else (0, 0, 0))
    y += 20
    if y > size[1] - 20:
      break
  return img


def generate(out_dir: str, num_episodes: int = 64, seed: int = 0, image_size=(320, 240)) -> str:
  """Writes `<out_dir>/conversations.json` (OWV format) and its screenshots; returns the JSON path."""
  os.makedirs(out_dir, exist_ok=True)
  rng = random.Random(seed)
  samples = []
  for e in range(num_episodes):
    episode = _episode(rng)
    flag = f"synthetic-{episode['site']}--r{e:03d}"
    for j, (title, elements, _, _) in enumerate(episode["steps"]):
      render_screenshot(title, elements, episode["site"], image_size).save(
          os.path.join(out_dir, f"{flag}--step{j + 1:02d}.png"))
    samples.extend(_samples(episode, flag))
  path = os.path.join(out_dir, "conversations.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(samples, f, indent=1)
  return path


def corpus(num_episodes: int = 400, seed: int = 12345) -> list[str]:
  """Text for training the default tokenizer: synthetic turns plus the WebVoyager action grammar."""
  rng = random.Random(seed)
  texts = []
  for e in range(num_episodes):
    for sample in _samples(_episode(rng), f"c{e}"):
      texts.extend(t["value"] for t in sample["conversations"][-2:])
  texts += ["Click [12]", "Type [3]; hello world", "Scroll [WINDOW]; up", "Scroll [5]; down", "Wait", "GoBack",
            "Restart", "Google", "ANSWER; 42", "User: Assistant: Thought: Action: OBSERVATION:",
            "The action you have chosen cannot be executed. Please double-check if you have selected the correct "
            "element or used correct action format. Then provide the revised Thought and Action.",
            "Format ERROR: Both 'Thought' and 'Action' should be included in your reply."]
  return texts
