"""A served page as the actions it offers: its links and forms, and a small CSS selector matcher over them.

The sites' pages are server-rendered HTML with no scripts, so what a page lets an agent do is in its markup: `<a
href>` links, and forms with their fields and buttons. `parse` reads them (tolerant of unquoted attributes and
unclosed `<p>`/`<li>`); `select` resolves the selectors the task oracles use (`#id`, `tag.class`,
`[attr op value]`, descendant and child combinators, selector lists), so an oracle step can be executed without a
browser.
"""

from __future__ import annotations

import dataclasses
import html.parser
import re
from typing import Any

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
# A block element starting inside an open <p> closes it, as browsers do (a <p> holds phrasing content only).
BLOCK = {"address", "article", "aside", "blockquote", "div", "dl", "fieldset", "footer", "form", "h1", "h2", "h3",
         "h4", "h5", "h6", "header", "hr", "main", "nav", "ol", "p", "pre", "section", "table", "ul"}
SKIP_TEXT = {"style", "script", "title", "head"}
FIELD_TAGS = ("input", "textarea", "select")


@dataclasses.dataclass(eq=False)
class Node:
  tag: str
  attrs: dict[str, str]
  parent: "Node | None" = dataclasses.field(default=None, repr=False)
  text: str = ""
  index: int = -1  # document order

  @property
  def id(self) -> str:
    return self.attrs.get("id", "")

  @property
  def classes(self) -> tuple[str, ...]:
    return tuple(self.attrs.get("class", "").split())

  def ancestors(self):
    node = self.parent
    while node is not None:
      yield node
      node = node.parent


@dataclasses.dataclass(frozen=True)
class Link:
  node: Node
  href: str
  text: str

  @property
  def ancestors(self) -> tuple[Node, ...]:
    """Outermost first."""
    return tuple(reversed(list(self.node.ancestors())))[1:]


@dataclasses.dataclass(frozen=True)
class Field:
  node: Node
  name: str
  type: str  # input type ("text" by default), "textarea" or "select"
  value: str
  checked: bool
  tag: str

  @property
  def id(self) -> str:
    return self.node.id


@dataclasses.dataclass(frozen=True)
class Form:
  node: Node
  method: str  # GET | POST
  action: str
  fields: tuple[Field, ...]
  buttons: tuple[Node, ...]

  def field(self, name: str) -> Field | None:
    return next((f for f in self.fields if f.name == name), None)


@dataclasses.dataclass
class Page:
  title: str
  links: tuple[Link, ...]
  forms: tuple[Form, ...]
  text: str
  nodes: list[Node]

  def link_of(self, node: Node) -> Link | None:
    """The link `node` is, or is inside (a span in a launcher icon)."""
    return _enclosing(node, self.links)

  def form_of(self, node: Node) -> Form | None:
    """The form `node` is, or is inside (a button, a field)."""
    return _enclosing(node, self.forms)


def _enclosing(node: Node, owners):
  by_node = {id(o.node): o for o in owners}
  return next((by_node[id(n)] for n in (node, *node.ancestors()) if id(n) in by_node), None)


class _Parser(html.parser.HTMLParser):
  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.root = Node("#document", {})
    self.stack = [self.root]
    self.nodes: list[Node] = []
    self.title, self.text = [], []
    self.skip = 0

  def handle_starttag(self, tag, attrs):
    node = Node(tag, {k: (v if v is not None else "") for k, v in attrs}, self.stack[-1], index=len(self.nodes))
    self.nodes.append(node)
    if tag in BLOCK and any(n.tag == "p" for n in self.stack):
      while self.stack[-1].tag != "p":
        self._pop()
      self._pop()
      node.parent = self.stack[-1]
    elif tag in ("li", "option") and self.stack[-1].tag == tag:
      self._pop()
      node.parent = self.stack[-1]
    if tag in VOID:
      return
    self.stack.append(node)
    if tag in SKIP_TEXT:
      self.skip += 1

  def handle_startendtag(self, tag, attrs):
    self.handle_starttag(tag, attrs)
    if tag not in VOID:
      self.handle_endtag(tag)

  def _pop(self):
    if self.stack.pop().tag in SKIP_TEXT:
      self.skip -= 1

  def handle_endtag(self, tag):
    for k in range(len(self.stack) - 1, 0, -1):
      if self.stack[k].tag == tag:
        while len(self.stack) > k:
          self._pop()
        return

  def handle_data(self, data):
    if self.stack[-1].tag == "title":
      self.title.append(data)
    if self.skip:
      return
    self.text.append(data)
    for node in self.stack[1:]:
      node.text += " " + data


def _collapse(s: str) -> str:
  return " ".join(s.split())


def _is_button(node: Node) -> bool:
  return node.tag == "input" and node.attrs.get("type", "").lower() in ("submit", "image", "reset", "button")


def _field(node: Node, nodes: list[Node]) -> Field:
  kind = node.attrs.get("type", "text").lower() if node.tag == "input" else node.tag
  if node.tag == "select":  # the selected option, else the first
    options = [n for n in nodes if n.tag == "option" and node in n.ancestors()]
    chosen = next((o for o in options if "selected" in o.attrs), options[0] if options else None)
    value = "" if chosen is None else chosen.attrs.get("value", chosen.text)
  else:
    value = node.attrs.get("value", node.text if node.tag == "textarea" else "")
  return Field(node, node.attrs.get("name", ""), kind, value, "checked" in node.attrs, node.tag)


def parse(page_html: str) -> Page:
  p = _Parser()
  p.feed(page_html)
  p.close()
  for node in p.nodes:
    node.text = _collapse(node.text)
  links = tuple(Link(n, n.attrs["href"], n.text) for n in p.nodes if n.tag == "a" and "href" in n.attrs)
  forms = []
  for n in p.nodes:
    if n.tag != "form":
      continue
    inside = [m for m in p.nodes if n in m.ancestors()]
    fields = tuple(_field(m, p.nodes) for m in inside if m.tag in FIELD_TAGS and not _is_button(m))
    buttons = tuple(m for m in inside if m.tag == "button" or _is_button(m))
    method = "POST" if n.attrs.get("method", "").lower() == "post" else "GET"  # as browsers: anything else
    forms.append(Form(n, method, n.attrs.get("action", ""), fields, buttons))
  return Page(_collapse("".join(p.title)), links, tuple(forms), _collapse(" ".join(p.text)), p.nodes)


# ----------------------------------------------------------------------------------------------- selectors

_COMPOUND = re.compile(r"""([a-zA-Z][\w-]*|\*)?((?:\#[\w-]+|\.[\w-]+|\[\s*[\w-]+\s*(?:[\^$*~]?=\s*(?:'[^']*'|"[^"]*"|[^\]\s]+)\s*)?\])*)$""")
_PART = re.compile(r"""\#([\w-]+)|\.([\w-]+)|\[\s*([\w-]+)\s*(?:([\^$*~]?=)\s*('[^']*'|"[^"]*"|[^\]\s]+)\s*)?\]""")


def _compile(selector: str) -> list[list[tuple[str, Any]]]:
  """A selector list as [[(combinator, test), ...], ...], rightmost compound last."""
  out = []
  for sel in selector.split(","):
    sel = re.sub(r"\s*>\s*", " > ", sel.strip())
    if not sel:
      raise ValueError(f"selector {selector!r}: an empty selector in the list")
    chain, comb = [], " "
    tokens = re.findall(r"(?:[^\s\[>]+|\[[^\]]*\]?)+|>", sel)
    if tokens[0] == ">" or tokens[-1] == ">":
      raise ValueError(f"selector {selector!r}: a '>' with nothing on one side")
    for token in tokens:
      if token == ">":
        comb = ">"
        continue
      m = _COMPOUND.match(token)
      if not m or not token:
        bad = next((token[k:] for k in range(len(token)) if token[k] in ":+~!" or token[k:].startswith("[")
                    and not _COMPOUND.match(token[:k] + token[k:].split("]")[0] + "]")), token)
        bad = token if token in "+~" else bad
        raise ValueError(f"selector {selector!r}: {bad!r} is not supported (use tags, #id, .class, "
                         "[attr op value], descendant or > combinators)")
      tag, rest = m.group(1), m.group(2) or ""
      parts = [p.groups() for p in _PART.finditer(rest)]
      chain.append((comb, (tag if tag != "*" else None, parts)))
      comb = " "
    out.append(chain)
  return out


def _matches(node: Node, test) -> bool:
  tag, parts = test
  if tag and node.tag != tag.lower():
    return False
  for ident, cls, attr, op, value in parts:
    if ident and node.id != ident:
      return False
    if cls and cls not in node.classes:
      return False
    if attr:
      if attr not in node.attrs:
        return False
      if op:
        have, want = node.attrs[attr], value.strip("'\"")
        ok = {"=": have == want, "^=": have.startswith(want), "$=": have.endswith(want), "*=": want in have,
              "~=": want in have.split()}[op]
        if not ok:
          return False
  return True


def _chain_matches(node: Node, chain) -> bool:
  comb, test = chain[-1]
  if not _matches(node, test):
    return False
  if len(chain) == 1:
    return True
  if comb == ">":
    return node.parent is not None and _chain_matches(node.parent, chain[:-1])
  return any(_chain_matches(a, chain[:-1]) for a in node.ancestors())


def select(page: Page, selector: str) -> list[Node]:
  """The nodes `selector` matches, in document order."""
  chains = _compile(selector)
  return [n for n in page.nodes if any(_chain_matches(n, c) for c in chains)]
