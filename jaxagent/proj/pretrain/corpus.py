"""The pre-training corpus: skills on the bundled sites' pages, never their tasks.

Pages come from worlds the benchmark never evaluates (`catalog.build_world(seed)` for seeds in the config's
pre-training range), reached by a noisy walk through the link graph (`envs.sites.linkgraph`, train layouts only)
from the start pages of those worlds' tasks. On each page a few single-step skill queries are written in the
format a recipe acts in (WebRL's prompt over the compact simplified HTML, with 0-2 earlier rounds of history), and
the reply is the action that answers it (a training conversation asks several on one page, `page_sample`):

  click   "Click the link "X"." / "Open "X"."            -> do(action="Click", element="<id of X>")
  type    'Type "S" into the "F" field.'                   -> do(action="Type", argument="S", element="<id of F>")
  search  'Search for "S".'                                -> do(action="Search", argument="S", element="<box>")
  read    'What is the price of "P"?' (price / rating / reviews / author) -> exit(message="<value on the page>")
  say     'Answer with "S".'                               -> exit(message="S")

each reply opening with the comment line the scripted expert writes before that action (`# Note: I will click
"X".`, `# Note: I will type "S" into the field.`, `# Note: The task is complete.`: `envs.sites.expert.intention`),
as every demonstration a recipe imitates does; the earlier rounds' actions in the prompt carry one too.

Each query quotes in one of the styles `QUOTES` (straight "X", curly “X”, or a name left bare: `Open Acorn.`), so
that a look-up does not hang on one quoting convention; a string to copy is always quoted (curly where the style is
bare), as a bare one would not say where it ends.

S is drawn at random (words from nonsense syllables, codes, numbers), so only copying it from the instruction
predicts it; X and P are elements of the page (never a held-out brand of the benchmark, `bench.HELD_OUT_BRANDS`),
named uniquely on it. No benchmark intent, demonstration or evaluated world enters: the queries are generic
skills and the worlds are disjoint from evaluation's (checked by `check_worlds`).

`formats` (the config's `corpus.format`): the corpus in WebRL's format (above) and/or the phone's text format
(`autoui_text`: AutoUI's prompt over the phone's page as text, cut as the recipe cuts it, with the last decision as
`Previous Actions` and the query as `Goal: ...</s>`), on pages of the phone profile's walks (the launcher, its
apps). Its replies are the phone expert's decisions: a tap names the element's id (`"touch_point": "id=N"`); a
field is tapped, then typed into once `Previous Actions` shows that tap (`TYPE` with the string as `typed_text`),
then a search is entered once they show the `TYPE`; AutoUI answers no text, so `read` and `say` are WebRL's only.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from typing import Iterator

from jaxagent.agents import autoui, autoui_text
from jaxagent.agents.webrl import WebRL, compact_html, webrl_prompt
from jaxagent.envs.sites import bench, expert, linkgraph, textpage
from jaxagent.types import Action, ActionKind

SKILLS = ("click", "mention", "type", "search", "read", "say")
QUOTES = {"straight": ('"', '"'), "curly": ("\u201c", "\u201d"), "bare": ("", "")}
FORMATS = ("webrl", "autoui_text")
# what each format can ask: AutoUI's phone answers no text, so read and say are WebRL's
FORMAT_SKILLS = {"webrl": SKILLS, "autoui_text": ("click", "mention", "type", "search")}
PROFILES = {"webrl": "text", "autoui_text": "device"}  # the benchmark profile whose worlds' pages each reads
# World seeds the benchmark and the recipes evaluate on are the global seeds (0, 1, 2, ...); pre-training and
# its probes keep to seeds at or above this.
FIRST_PRETRAIN_WORLD = 1000
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "pe", "qua", "sh", "tr", "el", "on", "ar", "is",
              "um", "ex", "br", "ch", "ly", "po", "fa", "gi", "do", "be", "xu", "wy", "ja", "ho")
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_FORMAT = WebRL()
_PHONE = autoui_text.AutoUIText()
_ELEMENT = re.compile(r'<(a|button|input|textarea|select)\b id="(\d+)"[^>]*>([^<]*)<')
_LISTING = re.compile(r'<a id="(\d+)"> ([^<]+?) </a> (\$[\d,]+\.\d\d) (\d\.\d) / 5 · (\d+) reviews')
_LABEL = re.compile(r'<label> ([^<]{1,60}?) </label> <(?:textarea|input)\b id="(\d+)"')
_PLACEHOLDER = re.compile(r'<(?:input|textarea)\b id="(\d+)"[^>]*placeholder="([^"]+)"')


@dataclasses.dataclass(frozen=True)
class Example:
  """One skill query on one page: the prompt the policy reads, the reply it should write, and what to check."""

  skill: str
  prompt: str
  reply: str
  element: str = ""  # the id the reply names (click / type / search)
  text: str = ""  # the string the reply types or answers
  style: str = "straight"  # how the query quotes (`QUOTES`)
  format: str = "webrl"  # the agent format of prompt and reply (`FORMATS`)

  def sample(self, sample_id: str) -> dict:
    return {"id": sample_id, "images": [], "conversations": [{"from": "human", "value": self.prompt},
                                                             {"from": "gpt", "value": self.reply}]}


def check_worlds(name: str, first: int, count: int) -> None:
  """A range of world seeds pre-training may use: at or above `FIRST_PRETRAIN_WORLD`, where no evaluation goes."""
  if first < FIRST_PRETRAIN_WORLD or count < 1:
    raise ValueError(f"config.{name}: worlds {first}..{first + count - 1} must start at or above "
                     f"{FIRST_PRETRAIN_WORLD} (the benchmark's evaluation worlds are the global seeds below it) and "
                     f"hold at least one; set --config.{name}.first={FIRST_PRETRAIN_WORLD}")


def random_string(rng: random.Random) -> str:
  """A string no model can guess: nonsense words, a code, a number, or a short phrase of them."""
  word = lambda: "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
  kind = rng.random()
  if kind < 0.4:
    return " ".join(word() for _ in range(rng.randint(1, 4)))
  if kind < 0.6:
    return word().capitalize() + " " + word()
  if kind < 0.8:
    return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(2, 3))) + "-" + str(rng.randint(10, 9999))
  return str(rng.randint(1, 99999))


def _held_out(text: str) -> bool:
  return any(b in text for b in bench.HELD_OUT_BRANDS)


def _unique_elements(html: str) -> dict[str, tuple[str, str]]:
  """{text: (tag, id)} of the page's interactive elements whose text names exactly one of them."""
  seen: dict[str, list[tuple[str, str]]] = {}
  for tag, eid, text in _ELEMENT.findall(html):
    text = text.strip()
    if text and len(text) <= 60:
      seen.setdefault(text, []).append((tag, eid))
  return {t: v[0] for t, v in seen.items() if len(v) == 1 and not _held_out(t)}


def _fields(html: str) -> dict[str, str]:
  """{name: id} of the page's text fields, named by their label or placeholder."""
  out = {}
  for name, eid in _LABEL.findall(html):
    out.setdefault(name.strip(), eid)
  for eid, name in _PLACEHOLDER.findall(html):
    out.setdefault(name.strip(), eid)
  return out


def _quoting(style: str):
  """(wrap a name, wrap a string to copy) in a quoting style."""
  (a, b), (c, d) = QUOTES[style], QUOTES[style if style != "bare" else "curly"]
  return (lambda x: f"{a}{x}{b}"), (lambda x: f"{c}{x}{d}")


def _click(rng, html, style):
  names = _unique_elements(html)
  if not names:
    return None
  text = rng.choice(sorted(names))
  tag, eid = names[text]
  what = {"a": "link", "button": "button"}.get(tag, "element")
  q, _ = _quoting(style)
  query = rng.choice((f"Click the {what} {q(text)}.", f"Open {q(text)}.", f"Select the {what} labelled {q(text)}.",
                      f"Follow the {q(text)} {what}."))
  return query, Action(ActionKind.CLICK, element=int(eid)), eid, "", expert.intention("click", text)


def _type(rng, html, style):
  fields = _fields(html)
  if not fields:
    return None
  name = rng.choice(sorted(fields))
  s = random_string(rng)
  q, c = _quoting(style)
  query = rng.choice((f"Type {c(s)} into the {q(name)} field.", f"Enter {c(s)} in {q(name)}.",
                      f"Fill {q(name)} with {c(s)}."))
  return query, Action(ActionKind.TYPE, element=int(fields[name]), text=s), fields[name], s, expert.intention("type", s)


def _search(rng, html, style):
  box = re.search(r'<input id="(\d+)" type="search"', html)
  if box is None:
    return None
  s = random_string(rng)
  _, c = _quoting(style)
  query = rng.choice((f"Search for {c(s)}.", f"Look up {c(s)} with the search box.", f"Find {c(s)}."))
  action = Action(ActionKind.TYPE, element=int(box.group(1)), text=s, enter=True)
  return query, action, box.group(1), s, expert.intention("type", s)


def _read(rng, html, style):
  rows = [r for r in _LISTING.findall(html) if not _held_out(r[1])]
  names = [r[1] for r in rows]
  rows = [r for r in rows if names.count(r[1]) == 1]
  if not rows:
    return None
  _, name, price, rating, reviews = rng.choice(rows)
  field, value = rng.choice((("price", price), ("rating", rating), ("number of reviews", reviews)))
  q, _ = _quoting(style)
  query = rng.choice((f"What is the {field} of {q(name)}?", f"Tell me the {field} of {q(name)}."))
  return query, Action(ActionKind.ANSWER, text=value), "", value, expert.FINISHED


def _say(rng, html, style):
  del html
  s = random_string(rng)
  _, c = _quoting(style)
  query = rng.choice((f"Answer with {c(s)}.", f"Reply {c(s)} and stop.", f"Finish with the message {c(s)}."))
  return query, Action(ActionKind.ANSWER, text=s), "", s, expert.FINISHED


_OPENERS = ("I am after", "Please get me", "Take me to", "Show me", "I need", "Go with", "Help me with",
            "I would like", "Point me to", "Bring up")
_JOINS = (", ", " and ", " plus ", " with ", " in ", " for ", " then ")
_ENDINGS = ("", " please", " today", " for me", " now")


def _absent_name(rng, html: str) -> str:
  """A made-up name no element of the page holds."""
  while True:
    name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
    name = name.capitalize() if rng.random() < 0.5 else name
    if name.lower() not in html.lower():
      return name


def _mention(rng, html, style, first=True):
  """Click the one element of the page that the instruction mentions and no earlier round clicked. The instruction
  is a sentence naming 1-4 things (the target; with `first`, 0-2 elements of the page that the history's rounds
  clicked; 0-2 names no element holds), a one-word name lowercased half the time: how a task names the several
  things it wants, of which the page shows some and the agent has done some. Returns, with the query, the rounds
  the history must hold ((name, id) pairs) and the name it must not."""
  names = _unique_elements(html)
  within = lambda a, b: re.search(r"(?<!\w)" + re.escape(a.lower()) + r"(?!\w)", b.lower()) is not None
  # names no other element's name is part of (`Redfern` in `Redfern Studio Pendant Light T21`), so one answers
  links = sorted(t for t, (tag, _) in names.items() if tag in ("a", "button")
                 and not any(o != t and within(o, t) for o in names))
  if not links:
    return None
  target = rng.choice(links)
  others = [t for t in links if not within(target, t) and not within(t, target)]
  done = rng.sample(others, min(len(others), rng.choice((0, 1, 1, 2)))) if first else []
  mentioned = [target, *done, *(_absent_name(rng, html) for _ in range(rng.choice((0, 1, 1, 2))))]
  rng.shuffle(mentioned)
  q, _ = _quoting(style)
  said = [q(n.lower() if " " not in n and rng.random() < 0.5 else n) for n in mentioned]
  sentence = said[0] + "".join(rng.choice(_JOINS) + n for n in said[1:])
  query = f"{rng.choice(_OPENERS)} {sentence}{rng.choice(_ENDINGS)}."
  eid = names[target][1]
  return (query, Action(ActionKind.CLICK, element=int(eid)), eid, "", expert.intention("click", target),
          ([(d, names[d][1]) for d in done], target))


_MAKERS = {"click": _click, "mention": _mention, "type": _type, "search": _search, "read": _read, "say": _say}


def _query(rng: random.Random, html: str, skills: tuple[str, ...], quotes: tuple[str, ...] = ("straight",),
           first: bool = True):
  """One skill query on the page: (query, reply, element id, string, skill, style, (the earlier rounds' clicks it
  needs as (name, id) pairs, the name they must not click))), or None when the drawn skill has nothing to act on
  here. `first`: the query opens the prompt, whose history can hold those clicks (a follow-up turn has none)."""
  skill, style = rng.choice(skills), rng.choice(quotes)
  made = _MAKERS[skill](rng, html, style, first) if skill == "mention" else _MAKERS[skill](rng, html, style)
  if made is None:
    return None
  query, action, eid, text, thought, *done = made
  return query, _reply(action, thought), eid, text, skill, style, done[0] if done else ((), "")


def _reply(action: Action, thought: str) -> str:
  """The reply as a demonstration writes it: the expert's note, then the call."""
  return _FORMAT.render(action, expert.webrl_note(thought))


def _history(rng: random.Random, html: str, rounds=((), "")) -> list[str]:
  """0-2 earlier rounds' replies: clicks on elements named as this page names them; `rounds` ((name, id) pairs,
  a name): those clicks among them, in a random order, and none on that name."""
  clicked, avoid = rounds
  names = sorted(_unique_elements(html).items())
  picks = [(text, eid) for text, (_, eid) in (rng.choice(names) for _ in range(rng.choice((0, 0, 1, 2))))] if names \
      else []
  picks = [(text, eid) for text, eid in picks if text != avoid] + list(clicked)
  if clicked:
    rng.shuffle(picks)
  return [_reply(Action(ActionKind.CLICK, element=int(eid)), expert.intention("click", text)) for text, eid in picks]


def _phone_previous(rng: random.Random, html: str, avoid: str) -> list[str]:
  """The last decision a phone query's prompt shows when it is not part of the query's own steps: none (half the
  time), a tap on another element of the page, or BACK."""
  draw = rng.random()
  if draw < 0.5:
    return []
  ids = sorted({eid for _, eid in _unique_elements(html).values()} - {avoid})
  if draw < 0.85 and ids:
    return [autoui_text.element_tap(int(rng.choice(ids)))]
  return [autoui.to_autoui(Action(ActionKind.BACK))]


def _phone_query(rng: random.Random, html: str, skills: tuple[str, ...], quotes: tuple[str, ...]):
  """One skill query on a phone page as the phone's expert acts on it: (goal, the last decision before it, reply,
  element id, string, skill, style), or None. A type or search is one of its steps, drawn: the tap on the field
  (after no decision or another one), the `TYPE` (after that tap), the search's `PRESS_ENTER` (after the `TYPE`)."""
  skill, style = rng.choice(skills), rng.choice(quotes)
  # a mention's earlier clicks would not show (the prompt holds the last decision only): it names none
  made = _MAKERS[skill](rng, html, style, False) if skill == "mention" else _MAKERS[skill](rng, html, style)
  if made is None:
    return None
  query, action, eid, text = made[:4]
  tap = Action(ActionKind.CLICK, element=action.element)
  if action.kind == ActionKind.CLICK:
    return query, _phone_previous(rng, html, eid), _PHONE.render(tap), eid, "", skill, style
  step = rng.randrange(3 if action.enter else 2)
  if step == 0:
    return query, _phone_previous(rng, html, eid), _PHONE.render(tap), eid, "", skill, style
  if step == 1:
    return (query, [autoui_text.history_text(tap)], _PHONE.render(Action(ActionKind.TYPE, text=text)), "", text,
            skill, style)
  return (query, [autoui_text.history_text(Action(ActionKind.TYPE, text=text))],
          _PHONE.render(Action(ActionKind.KEY, key="Enter")), "", "", skill, style)


def format_skills(fmt: str, skills: tuple[str, ...]) -> tuple[str, ...]:
  """The skills of `skills` (repeats kept) that format `fmt` can ask."""
  return tuple(s for s in skills if s in FORMAT_SKILLS[fmt])


def page_examples(rng: random.Random, html: str, skills: tuple[str, ...], per_page: int,
                  max_prompt_chars: int, quotes: tuple[str, ...] = tuple(QUOTES), fmt: str = "webrl",
                  page_chars: int = autoui_text.MAX_PAGE_CHARS) -> list[Example]:
  """Up to `per_page` single queries on one page (its compact simplified HTML), each in WebRL's prompt with 0-2
  earlier rounds, or the phone's (`fmt`, the page cut at `page_chars`): the probes' form, exactly what a recipe's
  policy reads."""
  out = []
  if fmt == "autoui_text":
    html = html[:page_chars]
    for _ in range(per_page):
      made = _phone_query(rng, html, format_skills(fmt, skills), quotes)
      if made is not None:
        query, previous, reply, eid, text, skill, style = made
        out.append(Example(skill, autoui_text.screen_prompt(query, html, previous), reply, eid, text, style, fmt))
    return out
  for _ in range(per_page):
    made = _query(rng, html, skills, quotes)
    if made is not None:
      query, reply, eid, text, skill, style, rounds = made
      out.append(Example(skill, webrl_prompt(query, _history(rng, html, rounds), html, max_prompt_chars), reply, eid,
                         text, style))
  return out


def page_sample(rng: random.Random, html: str, skills: tuple[str, ...], max_prompt_chars: int,
                sample_chars: int, sample_id: str, quotes: tuple[str, ...] = tuple(QUOTES), fmt: str = "webrl",
                page_chars: int = autoui_text.MAX_PAGE_CHARS) -> dict | None:
  """A training conversation on one page: the first query in WebRL's prompt (the format recipes act in), then
  follow-up turns `Task Instruction: <query>` on the same page until the conversation holds about `sample_chars`
  characters: many supervised replies for one read of a long page. In the phone's format (`fmt`) the first turn is
  AutoUI's prompt over the page cut at `page_chars`, a follow-up its part after the page (`Previous Actions: ...
  Goal: <query></s>`)."""
  if fmt == "autoui_text":
    html, skills = html[:page_chars], format_skills(fmt, skills)
    first = _phone_query(rng, html, skills, quotes)
    opening = None if first is None else (autoui_text.screen_prompt(first[0], html, first[1]), first[2])

    def follow_up():  # (human turn, reply, the characters it counts for)
      made = _phone_query(rng, html, skills, quotes)
      if made is None:
        return None
      turn = autoui_text.goal_text(made[0], made[1])
      return turn, made[2], len(turn) + len(made[2]) + 40
  else:
    first = _query(rng, html, skills, quotes)
    opening = None if first is None else (webrl_prompt(first[0], _history(rng, html, first[6]), html,
                                                       max_prompt_chars), first[1])

    def follow_up():
      made = _query(rng, html, skills, quotes, first=False)
      return None if made is None else (f"Task Instruction: {made[0]}", made[1], len(made[0]) + len(made[1]) + 40)
  if opening is None:
    return None
  turns = [{"from": "human", "value": opening[0]}, {"from": "gpt", "value": opening[1]}]
  follow_up_chars = sample_chars - len(opening[0])
  used, tries = 0, 0
  while used < follow_up_chars and tries < 4 * max(1, follow_up_chars // 40):
    tries += 1
    made = follow_up()
    if made is not None:
      turns += [{"from": "human", "value": made[0]}, {"from": "gpt", "value": made[1]}]
      used += made[2]
  return {"id": sample_id, "images": [], "conversations": turns}


def pages(first_world: int, num_worlds: int, walks_per_world: int, walk_steps: int, seed,
          profile: str = "text") -> Iterator[str]:
  """Compact simplified HTML of the pages a noisy walk meets in worlds `first_world`.. (level 1 perturbations,
  train layouts), from the start of that world's train tasks of `profile` (the phone's: its launcher)."""
  rng = random.Random(seed)
  for world in range(first_world, first_world + num_worlds):
    tasks = bench.generate(world, profile, 1, splits=("train_c",))["train_c"]
    env, policy = linkgraph.LinkEnv(world), linkgraph.NoisyLinkPolicy(epsilon=0.5)
    for task in rng.sample(tasks, min(walks_per_world, len(tasks))):
      env.reset(task)
      policy.begin(env)
      for _ in range(walk_steps):
        yield compact_html(textpage.Page(env.html).simplify()[0])
        env.step(policy.act(env, env.actions(), rng))
        if env.done:
          break


def _walks(formats: tuple[str, ...], walks_per_world: int, seed: int):
  """(format, walks a world, the walks' seed) for each format of `formats`, the walks shared by its repeats."""
  for fmt in dict.fromkeys(formats):
    if fmt not in FORMATS:
      raise ValueError(f"corpus format {fmt!r} is unknown; use one or more of {FORMATS}")
    walks = walks_per_world if len(formats) == 1 else max(1, round(walks_per_world * formats.count(fmt) / len(formats)))
    yield fmt, walks, seed if fmt == "webrl" else f"{seed}/{fmt}"  # WebRL's walks: a WebRL-only corpus's


def examples(first_world: int, num_worlds: int, *, walks_per_world: int, walk_steps: int, per_page: int,
             skills: tuple[str, ...] = SKILLS, max_prompt_chars: int = 15872, seed: int = 0,
             quotes: tuple[str, ...] = tuple(QUOTES), formats: tuple[str, ...] = ("webrl",),
             page_chars: int = autoui_text.MAX_PAGE_CHARS) -> list[Example]:
  """Single queries (the probes' form) over worlds `first_world` .. `first_world + num_worlds - 1`, in each of
  `formats` on its profile's pages (`walks_per_world` shared among them as they are repeated)."""
  rng = random.Random(f"examples/{seed}")
  out = []
  for fmt, walks, walk_seed in _walks(tuple(formats), walks_per_world, seed):
    for html in pages(first_world, num_worlds, walks, walk_steps, walk_seed, PROFILES[fmt]):
      out += page_examples(rng, html, skills, per_page, max_prompt_chars, quotes, fmt, page_chars)
  return out


def window(rng: random.Random, html: str, chars: int) -> str:
  """A stretch of about `chars` characters of the page, from one tag to the end of another: the short pages of
  the warm-up, on which a small model learns to look a name up and copy a string far sooner than on whole pages."""
  if len(html) <= chars:
    return html
  starts = [m.start() for m in re.finditer(r"<(?!/)", html[:len(html) - chars // 2])]
  start = rng.choice(starts) if starts else 0
  piece = html[start:start + chars]
  end = piece.rfind(">")
  return piece[:end + 1] if end > 0 else piece


def samples(first_world: int, num_worlds: int, *, walks_per_world: int, walk_steps: int, sample_chars: int,
            skills: tuple[str, ...] = SKILLS, max_prompt_chars: int = 15872, seed: int = 0,
            window_chars: int = 0, windows_per_page: int = 0, window_sample_chars: int = 0,
            quotes: tuple[str, ...] = tuple(QUOTES), formats: tuple[str, ...] = ("webrl",),
            page_chars: int = autoui_text.MAX_PAGE_CHARS) -> tuple[list[dict], list[dict]]:
  """(the training conversations on whole pages (`page_sample`, one a page), those on `windows_per_page` windows
  of `window_chars` characters of each page, each up to about `window_sample_chars` characters) over worlds
  `first_world` ..., in each of `formats` (as `examples`; the phone's ids start `phone-`)."""
  rng = random.Random(f"samples/{seed}")
  by_format = []
  for fmt, walks, walk_seed in _walks(tuple(formats), walks_per_world, seed):
    whole, parts = [], []
    by_format.append((whole, parts))
    prefix = "" if fmt == "webrl" else "phone-"
    for k, html in enumerate(pages(first_world, num_worlds, walks, walk_steps, walk_seed, PROFILES[fmt])):
      if fmt == "autoui_text":
        html = html[:page_chars]  # its windows too are of what the phone's prompt shows
      made = page_sample(rng, html, skills, max_prompt_chars, sample_chars, f"{prefix}page-{k}", quotes, fmt,
                         page_chars)
      if made is not None:
        whole.append(made)
      for j in range(windows_per_page if window_chars > 0 else 0):
        made = page_sample(rng, window(rng, html, window_chars), skills, max_prompt_chars, window_sample_chars,
                           f"{prefix}window-{k}-{j}", quotes, fmt, page_chars)
        if made is not None:
          parts.append(made)
  return _interleave([w for w, _ in by_format]), _interleave([p for _, p in by_format])


def _interleave(lists: list[list[dict]]) -> list[dict]:
  """The formats' samples taken in turn, so that any prefix of the corpus (the tokenizer's sample) holds each."""
  return [x for group in itertools.zip_longest(*lists) for x in group if x is not None]
