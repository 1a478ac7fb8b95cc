"""Copy augmentation: demonstrations replayed with the strings they type or answer swapped for made-up ones, in the
instruction, the pages and the replies alike.

A held-out intent names a product, a thread or a message no demonstration named, so a policy must copy it from the
instruction. A model trained from scratch on a few hundred demonstrations recalls their strings instead
(docs/results/webrl.md#bench-cut); the seeds' pretrained models copy already. Each copy of an episode keeps its
element ids, its actions and the page around the swapped strings, so only copying reproduces its replies. A
departure from the seeds (they train on the demonstrations as recorded), off by default.
"""

from __future__ import annotations

import random
import re
from typing import Callable, Iterable, Sequence

from jaxagent import types
from jaxagent.data.conversation import text_sample

_TOKEN = re.compile(r"\w+|\W+")


def vocabulary(texts: Iterable[str]) -> list[str]:
  """The alphabetic words of `texts`, lower case, sorted (what made-up strings are drawn from)."""
  return sorted({w.lower() for text in texts for w in re.findall(r"\b[^\W\d_]+\b", text)})


def surrogate(text: str, words: Sequence[str], rng: random.Random) -> str:
  """A made-up string shaped as `text`: each alphabetic word another word of `words` with its capitalisation,
  each word with digits the same pattern of random letters and digits, everything else kept."""
  out = []
  for token in _TOKEN.findall(text):
    if not token[0].isalnum() and token[0] != "_":
      out.append(token)
    elif any(c.isdigit() for c in token) or len(words) < 2:
      out.append("".join(rng.choice("0123456789") if c.isdigit() else
                         (rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") if c.isupper() else
                          rng.choice("abcdefghijklmnopqrstuvwxyz")) if c.isalpha() else c for c in token))
    else:
      word = rng.choice([w for w in words if w != token.lower()] or words)
      out.append(word.upper() if token.isupper() and len(token) > 1 else
                 word.capitalize() if token[0].isupper() else word)
  return "".join(out)


def swapped(traj: types.Trajectory, words: Sequence[str], rng: random.Random) -> dict[str, str]:
  """{string: its surrogate} for the strings the episode types or answers (`Task.meta["texts"]`: copied from the
  intent, or read from a page for an answer)."""
  return {t: surrogate(t, words, rng) for t in dict.fromkeys(traj.task.meta.get("texts") or []) if t}


def replacer(swaps: dict[str, str]) -> Callable[[str], str]:
  """A function that replaces every string of `swaps` in a text by its surrogate, the longest first, in one pass."""
  if not swaps:
    return lambda text: text
  pattern = re.compile("|".join(re.escape(s) for s in sorted(swaps, key=len, reverse=True)))
  return lambda text: pattern.sub(lambda m: swaps[m.group(0)], text)


def copies(trajs: Sequence[types.Trajectory], n: int, seed: int) -> list[dict]:
  """`n` swapped copies of each of `trajs` (an episode that types or answers no string gives none), as text
  samples `<task id>-copy<k>-<step>` in the order of `conversation.step_samples`."""
  words = vocabulary(text for t in trajs for text in t.task.meta.get("texts") or [])
  rng = random.Random(seed)
  out = []
  for k in range(n):
    for t in trajs:
      swaps = swapped(t, words, rng)
      if not swaps:
        continue
      swap = replacer(swaps)
      out.extend(text_sample(f"{t.task.id}-copy{k}-{s.step}", swap(s.obs_text), swap(s.action_text))
                 for s in t.steps if s.obs_text and s.action_text)
  return out
