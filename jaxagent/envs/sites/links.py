"""A served page as the actions it offers (links, forms, buttons), and a small CSS selector matcher over it.

The bundled sites are server-rendered HTML without scripts, so everything an agent can do on a page is in its
markup. `parse` reads that markup with the standard library's tolerant tokenizer (unquoted attributes, void
elements, unclosed `<p>`/`<li>`) so the sites can be explored as a link graph without a browser; `select` resolves
the CSS selectors that task oracles name their targets by, so an oracle step runs on the parsed page.
"""

from __future__ import annotations

import dataclasses
import functools
import html.parser
import re
from typing import Iterable

# -------------------------------------------------------------------------------------------------- the page

VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                  "track", "wbr"})
SKIP_TEXT = frozenset({"head", "title", "style", "script", "template", "noscript"})  # never visible text
# Phrasing tags do not separate words ("<b>x</b>y" reads "xy"); every other tag does, since the sites lay out
# links and spans as flex or inline-block items that a reader sees apart.
INLINE = frozenset({"b", "strong", "i", "em", "u", "s", "small", "mark", "abbr", "code", "kbd", "sub", "sup", "q"})
BUTTON_INPUTS = frozenset({"submit", "image", "reset", "button"})  # inputs that are buttons, not fields
# An open <p> is closed by these start tags (the HTML rule a browser applies; the sites put forms in <p>).
CLOSES_P = frozenset({"address", "article", "aside", "blockquote", "details", "div", "dl", "fieldset", "figure",
                      "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "main", "menu", "nav",
                      "ol", "p", "pre", "section", "table", "ul"})
# start tag -> (open tags it implicitly closes, tags that bound the search for them)
AUTO_CLOSE = {
    "li": (frozenset({"li"}), frozenset({"ul", "ol", "menu"})),
    "dt": (frozenset({"dt", "dd"}), frozenset({"dl"})),
    "dd": (frozenset({"dt", "dd"}), frozenset({"dl"})),
    "option": (frozenset({"option"}), frozenset({"select", "datalist", "optgroup"})),
    "optgroup": (frozenset({"optgroup", "option"}), frozenset({"select"})),
    "tr": (frozenset({"tr", "td", "th"}), frozenset({"table", "thead", "tbody", "tfoot"})),
    "td": (frozenset({"td", "th"}), frozenset({"tr", "table"})),
    "th": (frozenset({"td", "th"}), frozenset({"tr", "table"})),
    **{t: (frozenset({"thead", "tbody", "tfoot", "tr", "td", "th"}), frozenset({"table"}))
       for t in ("thead", "tbody", "tfoot")},
    **{t: (frozenset({"p"}), frozenset({"button", "table", "td", "th", "caption", "template", "object", "html"}))
       for t in CLOSES_P},
}
_WS = re.compile(r"[ \t\n\r\f]+")  # HTML collapses ASCII whitespace only (a no-break space stays)


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
  """One element. Compared by identity: two identical `<li>` are still two places to click."""

  tag: str
  id: str
  classes: tuple[str, ...]
  attrs: dict[str, str]  # lower-case names; a bare attribute (`checked`) has the value ""
  text: str  # visible text inside, whitespace collapsed

  def __repr__(self) -> str:
    ident = f"#{self.id}" if self.id else ""
    return f"<{self.tag}{ident}{''.join('.' + c for c in self.classes)}>"


@dataclasses.dataclass(frozen=True)
class Link:
  node: Node
  href: str  # as written (entities decoded), not resolved against the page's URL
  text: str
  ancestors: tuple[Node, ...]  # outermost (<html>) first, the parent last


@dataclasses.dataclass(frozen=True)
class Field:
  """An input (not a button), textarea or select; `type` is the input's type, or "textarea" / "select"."""

  name: str
  type: str
  value: str  # a select's chosen option (the first one when none is `selected`)
  id: str
  checked: bool
  tag: str
  node: Node | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Button:
  """A `<button>` or an `<input type=submit|image|reset|button>` (its text is then its value)."""

  node: Node
  name: str
  value: str
  text: str
  type: str  # "submit" unless the markup says otherwise
  ancestors: tuple[Node, ...]


@dataclasses.dataclass(frozen=True)
class Form:
  node: Node
  method: str  # GET | POST
  action: str  # "" submits to the page's own URL
  fields: tuple[Field, ...]
  buttons: tuple[Button, ...]
  ancestors: tuple[Node, ...]

  def field(self, name: str) -> Field | None:
    return next((f for f in self.fields if f.name == name), None)


@dataclasses.dataclass
class Page:
  title: str
  links: tuple[Link, ...]
  forms: tuple[Form, ...]
  text: str  # the body's visible text, whitespace collapsed
  nodes: list[tuple[Node, tuple[Node, ...]]] = dataclasses.field(repr=False)  # every element, document order

  def __post_init__(self):
    self._ancestors = {node: anc for node, anc in self.nodes}
    self._links = {link.node: link for link in self.links}
    self._forms = {form.node: form for form in self.forms}
    self._buttons = {b.node: b for form in self.forms for b in form.buttons}
    self._fields = {f.node: f for form in self.forms for f in form.fields if f.node is not None}

  def ancestors_of(self, node: Node) -> tuple[Node, ...]:
    return self._ancestors[node]

  def _nearest(self, node: Node, table: dict):
    if node in table:
      return table[node]
    return next((table[a] for a in reversed(self._ancestors.get(node, ())) if a in table), None)

  def link_of(self, node: Node) -> Link | None:
    """The link `node` is, or is inside (a selector may name a span within the `<a>`)."""
    return self._nearest(node, self._links)

  def form_of(self, node: Node) -> Form | None:
    """The form `node` is, or is inside (its button, a field, a label)."""
    return self._nearest(node, self._forms)

  def button_of(self, node: Node) -> Button | None:
    return self._nearest(node, self._buttons)

  def field_of(self, node: Node) -> Field | None:
    return self._fields.get(node)


class _El:
  """An element while parsing: its text is known only once it closes, and a `Node` is frozen."""

  __slots__ = ("tag", "attrs", "parent", "skip", "start", "start_all", "end", "end_all", "node", "form", "select")

  def __init__(self, tag: str, attrs: dict[str, str], parent: _El | None, skip: bool, start: int, start_all: int):
    self.tag, self.attrs, self.parent, self.skip = tag, attrs, parent, skip
    self.start, self.start_all, self.end, self.end_all = start, start_all, -1, -1
    self.node: Node | None = None
    # the nearest enclosing <form> and <select>, inherited so the fields' form is known without a search
    self.form = None if parent is None else (parent if parent.tag == "form" else parent.form)
    self.select = None if parent is None else (parent if parent.tag == "select" else parent.select)


class _Parser(html.parser.HTMLParser):
  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.els: list[_El] = []
    self.stack: list[_El] = []
    self.visible: list[str] = []  # text a reader sees
    self.all: list[str] = []  # all text, for the nodes inside <title>, <style>...

  def _boundary(self) -> None:
    self.visible.append(" ")
    self.all.append(" ")

  def _close(self, k: int) -> None:
    for el in self.stack[k:]:
      el.end, el.end_all = len(self.visible), len(self.all)
    del self.stack[k:]

  def _auto_close(self, tag: str) -> None:
    rule = AUTO_CLOSE.get(tag)
    if rule is None:
      return
    closes, bounds = rule
    for k in range(len(self.stack) - 1, -1, -1):
      t = self.stack[k].tag
      if t in closes:
        self._close(k)
        return
      if t in bounds:
        return

  def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    self._auto_close(tag)
    values: dict[str, str] = {}
    for k, v in attrs:
      values.setdefault(k, v if v is not None else "")  # a repeated attribute: the first one counts (HTML)
    parent = self.stack[-1] if self.stack else None
    skip = tag in SKIP_TEXT or "hidden" in values or (parent is not None and parent.skip)
    if tag not in INLINE:
      self._boundary()
    el = _El(tag, values, parent, skip, len(self.visible), len(self.all))
    self.els.append(el)
    if tag in VOID:
      el.end, el.end_all = el.start, el.start_all
    else:
      self.stack.append(el)

  def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    self.handle_starttag(tag, attrs)  # `<div/>` opens a div in HTML; only void elements close at once

  def handle_endtag(self, tag: str) -> None:
    for k in range(len(self.stack) - 1, -1, -1):
      if self.stack[k].tag == tag:
        self._close(k)
        break  # a stray end tag closes nothing
    if tag not in INLINE:
      self._boundary()

  def handle_data(self, data: str) -> None:
    self.all.append(data)
    if not (self.stack and self.stack[-1].skip):
      self.visible.append(data)


def _collapse(s: str) -> str:
  return _WS.sub(" ", s).strip()


def _field(node: Node, options: Iterable[Node], raw_text: str) -> Field:
  a = node.attrs
  if node.tag == "textarea":
    kind, value = "textarea", raw_text.removeprefix("\n")  # a leading newline is dropped, as browsers do
  elif node.tag == "select":
    opts = list(options)
    chosen = next((o for o in opts if "selected" in o.attrs), opts[0] if opts else None)
    kind, value = "select", "" if chosen is None else chosen.attrs.get("value", chosen.text)
  else:
    kind, value = a.get("type", "text").lower() or "text", a.get("value", "")
  return Field(a.get("name", ""), kind, value, node.id, "checked" in a, node.tag, node)


def parse(page_html: str) -> Page:
  """The page's links, forms and visible text, and every element in document order."""
  p = _Parser()
  p.feed(page_html)
  p.close()
  p._close(0)
  nodes: list[tuple[Node, tuple[Node, ...]]] = []
  ancestors: dict[int, tuple[Node, ...]] = {}  # keyed by id(_El)
  raw: dict[Node, str] = {}  # a textarea's text as written
  for el in p.els:
    chunks = p.all[el.start_all:el.end_all] if el.skip else p.visible[el.start:el.end]
    text = "".join(chunks)
    a = el.attrs
    node = el.node = Node(el.tag, a.get("id", ""), tuple(a.get("class", "").split()), a, _collapse(text))
    if el.tag == "textarea":
      raw[node] = "".join(p.all[el.start_all:el.end_all])
    anc = () if el.parent is None else ancestors[id(el.parent)] + (el.parent.node,)
    ancestors[id(el)] = anc
    nodes.append((node, anc))

  links = tuple(Link(n, n.attrs["href"], n.text, anc) for n, anc in nodes if n.tag == "a" and "href" in n.attrs)
  members: dict[Node, list[tuple[Node, tuple[Node, ...]]]] = {}  # form -> the elements inside it
  options: dict[Node, list[Node]] = {}  # select -> its options
  for el, (n, anc) in zip(p.els, nodes):
    if el.form is not None:
      members.setdefault(el.form.node, []).append((n, anc))
    if n.tag == "option" and el.select is not None:
      options.setdefault(el.select.node, []).append(n)
  forms = []
  for n, anc in nodes:
    if n.tag != "form":
      continue
    fields, buttons = [], []
    for m, m_anc in members.get(n, ()):
      input_type = m.attrs.get("type", "text").lower()
      if m.tag == "button":
        buttons.append(Button(m, m.attrs.get("name", ""), m.attrs.get("value", ""), m.text,
                              m.attrs.get("type", "submit").lower() or "submit", m_anc))
      elif m.tag == "input" and input_type in BUTTON_INPUTS:
        value = m.attrs.get("value", "")
        buttons.append(Button(m, m.attrs.get("name", ""), value, _collapse(value), input_type, m_anc))
      elif m.tag in ("input", "textarea", "select"):
        fields.append(_field(m, options.get(m, ()), raw.get(m, "")))
    method = "POST" if n.attrs.get("method", "").strip().lower() == "post" else "GET"
    forms.append(Form(n, method, n.attrs.get("action", ""), tuple(fields), tuple(buttons), anc))

  title = next((n.text for n, _ in nodes if n.tag == "title"), "")
  return Page(title, links, tuple(forms), _collapse("".join(p.visible)), nodes)


# ------------------------------------------------------------------------------------------------ selectors

_TAG = re.compile(r"\*|[A-Za-z][\w-]*")
_NAME = re.compile(r"(?:[\w-]|[^\x00-\x7f])+")  # an id or class as HTML allows it ("post-1", "1")
_ATTR = re.compile(r"""\[\s*([A-Za-z_][\w-]*)\s*(?:([~^$*|]?=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s\]'"]+)"""
                   r"""\s*([iIsS])?\s*)?\]""")
_PSEUDO = re.compile(r"::?[\w-]*(?:\([^)]*\))?")
# Attribute values HTML compares case-insensitively (`form[method=post]` matches method=POST).
_ICASE_ATTRS = frozenset({"method", "type", "enctype", "rel", "target", "media", "lang", "dir", "charset",
                          "hreflang", "checked", "disabled", "selected", "multiple", "readonly", "accept"})
_SPACE = " \t\n\r\f"


@dataclasses.dataclass(frozen=True)
class _Attr:
  name: str
  op: str  # "" (present) | = | ^= | $= | *= | ~= | |=
  value: str
  icase: bool


@dataclasses.dataclass(frozen=True)
class _Compound:
  tag: str | None  # None: any
  ids: tuple[str, ...]
  classes: tuple[str, ...]
  attrs: tuple[_Attr, ...]


_Chain = tuple[tuple[str, _Compound], ...]  # (combinator to the previous compound: "" | " " | ">", compound)


def _unsupported(selector: str, part: str, why: str) -> ValueError:
  return ValueError(f"CSS selector {selector!r}: {part!r} is not supported ({why}); supported: tag, *, #id, .class, "
                    "[attr] and [attr OP v] with OP one of = ^= $= *= ~= |=, the descendant (space) and child (>) "
                    "combinators, and lists joined by ','")


def _compound(selector: str, i: int) -> tuple[_Compound, int]:
  s, start = selector, i
  tag = None
  m = _TAG.match(s, i)
  if m:
    tag, i = (None if m.group() == "*" else m.group().lower()), m.end()
  ids, classes, attrs = [], [], []
  while i < len(s):
    c = s[i]
    if c in "#.":
      m = _NAME.match(s, i + 1)
      if not m:
        raise _unsupported(selector, s[i:i + 2], f"expected a name after {c!r}")
      (ids if c == "#" else classes).append(m.group())
      i = m.end()
    elif c == "[":
      m = _ATTR.match(s, i)
      if not m:
        end = s.find("]", i)
        raise _unsupported(selector, s[i:end + 1 if end >= 0 else len(s)], "an attribute test it cannot read")
      name, op, value, flag = m.groups()
      if value and value[0] in "'\"":
        value = re.sub(r"\\(.)", r"\1", value[1:-1])
      icase = flag in ("i", "I") or (flag is None and name.lower() in _ICASE_ATTRS)
      attrs.append(_Attr(name.lower(), op or "", value or "", icase))
      i = m.end()
    elif c in _SPACE or c in ",>+~":
      break
    elif c == ":":
      raise _unsupported(selector, _PSEUDO.match(s, i).group(), "pseudo-classes and pseudo-elements")
    else:
      raise _unsupported(selector, s[i:], f"unexpected {c!r}")
  if i == start:
    raise _unsupported(selector, s[i:], "expected a tag, #id, .class or [attribute]")
  return _Compound(tag, tuple(ids), tuple(classes), tuple(attrs)), i


@functools.lru_cache(maxsize=1024)
def _compile(selector: str) -> tuple[_Chain, ...]:
  """A selector list as chains of compounds (leftmost first); oracles reuse selectors, so this is cached."""
  s, i, n = selector, 0, len(selector)
  chains: list[_Chain] = []
  chain: list[tuple[str, _Compound]] = []
  comb = ""
  while True:
    while i < n and s[i] in _SPACE:
      i += 1
    if i >= n or s[i] == ",":
      if not chain or comb == ">":
        raise ValueError(f"CSS selector {selector!r}: an empty selector or a combinator with nothing after it")
      chains.append(tuple(chain))
      chain, comb = [], ""
      if i >= n:
        return tuple(chains)
      i += 1
      continue
    if s[i] == ">":
      if not chain or comb == ">":
        raise ValueError(f"CSS selector {selector!r}: '>' needs a compound selector on both sides")
      comb, i = ">", i + 1
      continue
    if s[i] in "+~":
      raise _unsupported(selector, s[i], "sibling combinators")
    compound, i = _compound(s, i)
    chain.append(((comb or " ") if chain else "", compound))
    comb = ""


def _attr_ok(test: _Attr, node: Node) -> bool:
  have = node.attrs.get(test.name)
  if have is None:
    return False
  if not test.op:
    return True
  want = test.value
  if test.icase:
    have, want = have.lower(), want.lower()
  if test.op == "=":
    return have == want
  if test.op == "~=":
    return bool(want) and not any(c in _SPACE for c in want) and want in have.split()
  if test.op == "|=":
    return have == want or have.startswith(want + "-")
  if not want:  # [a^=''] and friends match nothing (CSS)
    return False
  if test.op == "^=":
    return have.startswith(want)
  if test.op == "$=":
    return have.endswith(want)
  return want in have  # *=


def _matches(c: _Compound, node: Node) -> bool:
  return ((c.tag is None or node.tag == c.tag) and all(node.id == i for i in c.ids)
          and all(k in node.classes for k in c.classes) and all(_attr_ok(a, node) for a in c.attrs))


def _up(chain: _Chain, k: int, anc: tuple[Node, ...], end: int) -> bool:
  """Whether chain[:k] matches among anc[:end], chain[k] having matched the element just below anc[end - 1]."""
  if k == 0:
    return True
  comb, target = chain[k][0], chain[k - 1][1]
  if comb == ">":
    return end > 0 and _matches(target, anc[end - 1]) and _up(chain, k - 1, anc, end - 1)
  return any(_matches(target, anc[j]) and _up(chain, k - 1, anc, j) for j in range(end - 1, -1, -1))


def select(page: Page, selector: str) -> list[Node]:
  """The nodes `selector` matches, in document order; `ValueError` for syntax beyond what the oracles use."""
  chains = _compile(selector)
  return [node for node, anc in page.nodes
          if any(_matches(ch[-1][1], node) and _up(ch, len(ch) - 1, anc, len(anc)) for ch in chains)]
