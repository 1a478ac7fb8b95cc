"""Where each reply's content comes from in its prompt: the attention targets of the pre-training loss.

    align, name, spans = alignment(ids, loss_mask, pieces)   # align[s] = s - j: reply token s is read off j

A reply's content is the value of its `element=`, `argument=` or `message=`, and the name or string its note quotes
(`# Note: I will click "X".`). A typed, answered or noted string is sourced at its last occurrence before it (as
text, each reply token at the token holding the same character): the query's quoted string, the page's value (of
several equal values, the one that follows the element the latest instruction names), or for a call's argument the
string its note copied a few tokens earlier. An element id is sourced at the last word of that element's text on the
page (`<a id="26"> Office </a>` -> " Office"): the position where a causal model has read both the element's id and
its name, so one attention can look the name up there and read the id. Tokens with no such source (syntax, ids of
elements without text) get no target.

`name` says where the element a reply looks up is named: at the first token of an id, that element's last word in
the reply's note if it quotes it, else in the latest instruction (`Click "Office".`, `Open Office.` -> "Office"),
however it quotes; at a value read off the page, in the latest instruction. A head that brings it to the reply is
what lets the look-up match the page's element, however far the instruction is. At a string copied from the
instruction, `name` is `align`: the same heads bring the token being copied (left free there, they would bring the
name's last word to every token of the copy).

`spans` says how long that name is: at each `name` source, the number of tokens of the element's whole text where
the note or instruction writes it out (`Candle F49` -> 3 tokens ending at `49`), else 0. A product's code is two
tokens (` F`, `49`) and sibling products share the last, so the look-up must match a name's summary, not its last
token (`targets.span_heads`).
"""

from __future__ import annotations

import bisect
import re
from typing import Sequence

import numpy as np

# a reply's values: WebRL's `element=` / `argument=` / `message=` and its note's quoted name, the phone's tapped
# element (`"touch_point": "id=N"`, its `lift_point` alike) and typed string: group 1 names WebRL's kind, its value
# in group 2; else group 3 is a note's name, 4 a tapped id, 5 a typed string
VALUE = re.compile(r'(element|argument|message)="([^"]*)"|I will (?:click|type) "([^"]*)"'
                   r'|"(?:touch|lift)_point": "id=(\d+)"|"typed_text": "([^"]+)"')
_GROUPS = {3: "note", 4: "element", 5: "argument"}  # what a value is when group 1 does not say
# an instruction, in WebRL's prompt and in a follow-up turn alike, or the phone's goal
INSTRUCTION = re.compile(r"Task Instruction: ([^\n]*)|Goal: ((?:(?!</s>)[^\n])*)")
# the last word of an element's text just before a value: `<a id="3"> Acorn Mug </a> $12.00 4.5` -> "Mug"
ELEMENT_BEFORE = re.compile(r'>[^<>]*?(\w)[^<>\w]*</\w+>[^<>"]*$')
# an element's text and the values after it, up to the next tag
ELEMENT_VALUES = re.compile(r'>[^<>]*?(\w)[^<>\w]*</a>([^<>"]+)')


class TokenText:
  """A token sequence's text with each token's first character, to map between the two."""

  def __init__(self, ids: list[int], pieces: Sequence[str]):
    self.starts, text = [], []
    n = 0
    for t in ids:
      self.starts.append(n)
      text.append(pieces[t])
      n += len(pieces[t])
    self.text = "".join(text)
    said = lambda m: 1 if m.group(1) is not None else 2
    self.instructions = [(m.end(said(m)), m.start(said(m))) for m in INSTRUCTION.finditer(self.text)]  # (end, start)

  def token_at(self, char: int) -> int:
    return bisect.bisect_right(self.starts, char) - 1


def alignment(ids: Sequence[int], loss_mask: Sequence[int],
              pieces: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(align, name, spans): align[s] = s - j for each reply token ids[s] sourced at ids[j] (j < s); name[s] = s - j
  at the first token of a looked-up id or value, ids[j] where the reply's note or the latest instruction names it
  (at a copied string, name = align); spans[j] = L at such a j where the element's whole text is written out over
  ids[j-L+1..j] (L >= 2); else 0. `pieces[t]` is token t's text (`tokenizer.decode([t])`)."""
  ids = [int(t) for t in ids]
  align, name, spans = (np.zeros(len(ids), np.int32) for _ in range(3))
  full = None
  for start, end in _runs(loss_mask):
    text, offsets = "", []
    for k in range(start, end):
      offsets.append(len(text))
      text += pieces[ids[k]]
    note = None  # the span (in `full`'s characters) of the name the reply's note quotes
    for m in VALUE.finditer(text):
      group = 2 if m.group(1) else next(g for g in (3, 4, 5) if m.group(g) is not None)
      kind = m.group(1) or _GROUPS[group]
      lo, hi = m.span(group)
      content = [start + k for k in range(end - start)
                 if offsets[k] >= lo and offsets[k] + len(pieces[ids[start + k]]) <= hi]
      if not content:
        continue
      full = full or TokenText(ids, pieces)
      span = _instruction(full, start)
      if kind == "element":
        source = _element_text_end(ids, start, [ids[k] for k in content], pieces)
        if source >= 0:
          align[content[0]] = content[0] - source
          # where the reply's note, or else the instruction, names this element, if either does
          named, where = (_named(full, note, _word(full, source)), note) if note else (-1, None)
          if named < 0:
            named, where = _named(full, span, _word(full, source)), span
          if named >= 0:
            name[content[0]] = content[0] - named
            spans[named] = _name_span(full, where, named, _element_text(full, source))
      else:
        if kind == "note":
          note = (full.starts[start] + lo, full.starts[start] + hi)
        at, named = _value_source(full, content[0], m.group(group), span)
        if at >= 0:
          for k in content:  # each token at the same character of the value's occurrence
            j = full.token_at(at + offsets[k - start] - lo)
            align[k] = k - j if j < content[0] else 0
          element = _element_before(full, at)
          if named >= 0:
            name[content[0]] = content[0] - named
            spans[named] = _name_span(full, span, named, _element_text(full, element))
          elif element < 0:  # copied from the instruction: the name heads bring the token copied
            name[content] = align[content]
  return align, name, spans


def value_links(ids: Sequence[int], pieces: Sequence[str]) -> np.ndarray:
  """links[k] = k - j at each token k of the values after an element (`</a> $12.00 4.5 / 5`), j the last word of
  that element's text; else 0: what makes a value findable by the name of the element it belongs to."""
  ids = [int(t) for t in ids]
  full, links = TokenText(ids, pieces), np.zeros(len(ids), np.int32)
  for m in ELEMENT_VALUES.finditer(full.text):
    j = full.token_at(m.start(1))
    for k in range(full.token_at(m.start(2)), full.token_at(m.end(2) - 1) + 1):
      if full.starts[k] >= m.start(2) and any(ch.isalnum() for ch in pieces[ids[k]]):
        links[k] = k - j
  return links


def _instruction(full: TokenText, upto: int) -> tuple[int, int]:
  """The characters (start, end) of the latest instruction before token `upto`; (0, 0) when there is none."""
  end = full.starts[upto] if upto < len(full.starts) else len(full.text)
  k = bisect.bisect_right(full.instructions, (end, end))
  return (full.instructions[k - 1][1], full.instructions[k - 1][0]) if k else (0, 0)


def _named(full: TokenText, span: tuple[int, int], word: str) -> int:
  """The token of the last character of `word`'s last whole-word occurrence in the characters `span`; -1: none."""
  last = None
  if word:
    for last in re.finditer(r"(?<!\w)" + re.escape(word) + r"(?!\w)", full.text[span[0]:span[1]]):
      pass
  return full.token_at(span[0] + last.end() - 1) if last else -1


def _element_text(full: TokenText, last: int) -> str:
  """The text of the element whose last word is token `last` (from the tag before it to that word's end)."""
  end = full.starts[last + 1] if last + 1 < len(full.starts) else len(full.text)
  return full.text[full.text.rfind(">", 0, full.starts[last]) + 1:end].strip()


def _name_span(full: TokenText, span: tuple[int, int], named: int, text: str) -> int:
  """The tokens of `text` written out in the characters `span` and ending in token `named`; 0 if it is not, or
  takes one token."""
  if text:
    for m in re.finditer(r"(?<!\w)" + re.escape(text), full.text[span[0]:span[1]]):
      if full.token_at(span[0] + m.end() - 1) == named:
        length = named - full.token_at(span[0] + m.start()) + 1
        return length if length >= 2 else 0
  return 0


def _element_before(full: TokenText, char: int) -> int:
  """The token of the last word of the element right before character `char` (a value after `</a>`); -1: none."""
  m = ELEMENT_BEFORE.search(full.text, max(0, char - 200), char)
  return full.token_at(m.start(1)) if m else -1


def _value_source(full: TokenText, upto: int, value: str, span: tuple[int, int]) -> tuple[int, int]:
  """(the character where a reply's string is read off before token `upto`, the token where the instruction
  `span` names the element it follows, or -1): the last occurrence of the string as a whole, or of several, the
  one after an element the instruction names; -1 when it is nowhere."""
  if not value:
    return -1, -1
  end = full.starts[upto] if upto < len(full.starts) else len(full.text)
  found = [m.start() for m in re.finditer(r"(?<!\w)" + re.escape(value) + r"(?!\w)", full.text[:end])]
  for at in reversed(found):
    element = _element_before(full, at)
    named = _named(full, span, _word(full, element)) if element >= 0 else -1
    if named >= 0:
      return at, named
  return (found[-1], -1) if found else (-1, -1)


def _word(full: TokenText, token: int) -> str:
  """The word a token's last character ends (text of the token and the word characters before it)."""
  end = full.starts[token + 1] if token + 1 < len(full.starts) else len(full.text)
  m = re.search(r"(\w+)\W*$", full.text[max(0, end - 40):end])
  return m.group(1) if m else ""


def _runs(mask: Sequence[int]):
  """(start, end) of each run of set flags."""
  s, n = 0, len(mask)
  while s < n:
    if not mask[s]:
      s += 1
      continue
    e = s
    while e < n and mask[e]:
      e += 1
    yield s, e
    s = e


def _element_text_end(ids: list[int], upto: int, tokens: list[int], pieces: Sequence[str]) -> int:
  """The last word of the element whose `id="…"` is `tokens`, before `upto`; -1 when it has none."""
  n = len(tokens)
  for j in range(upto - n, 0, -1):
    if ids[j:j + n] != tokens or not "".join(pieces[t] for t in ids[max(0, j - 4):j]).endswith('id="'):
      continue
    k, last = j + n, -1
    if k >= upto or not pieces[ids[k]].startswith('"'):
      return -1
    for k in range(k + 1, upto):
      if pieces[ids[k]].lstrip().startswith("<"):
        break
      if any(ch.isalnum() for ch in pieces[ids[k]]):
        last = k
    return last
  return -1
