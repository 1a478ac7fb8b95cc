"""A served page as WebRL's simplified HTML without a browser: `js/html.js` run over the parsed document.

The bundled sites have no scripts, and what `html.js` reads from layout reduces, on their stylesheet
(`layout.CSS`), to rules that need no layout engine:
- hidden: `display:none` only by the user-agent stylesheet (`hidden`, `<input type=hidden>`, `<head>`...);
- a pointer cursor: `a[href]`, `button` and `.btn` set it, and every other element inherits its parent's;
- sized (a box of non-zero width and height): a form control, an image, an element with rendered text, one the
  stylesheet gives padding or a border, a list item with a marker; an empty `<a>` and an `<option>` of a closed
  `<select>` are not.
The one field that needs a layout engine is `data-bbox` (each element's box in the viewport): the page here
carries none, which is why the text backend serves agent formats whose prompt drops it (WebRL's `compact`
HTML) and why its actions name elements, never points. `tests/envs/sites/test_text_env.py` holds this to
Chromium's output byte for byte on every page type of every site at every perturbation level.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from selectolax.lexbor import LexborHTMLParser, LexborNode

from jaxagent.types import Element

KEEP_ATTRS = ("title", "value", "type", "placeholder", "selected", "checked", "data-value", "data-text",
              "data-testid", "data-label", "data-status", "aria-label", "name", "href")
SKIP = {"script", "style", "noscript", "template", "meta", "link", "head", "title"}
STRUCTURAL = {"html", "body", "img", "h1", "h2", "h3", "h4", "h5", "h6", "p", "li", "ul", "ol", "table", "tr", "td",
              "th", "form", "label", "nav", "header", "footer", "main", "section", "article", "dialog"}
INTERACTIVE_TAGS = {"a", "button", "input", "select", "textarea", "option", "summary"}
INTERACTIVE_ROLES = {"button", "link", "checkbox", "radio", "tab", "menuitem", "option", "switch", "combobox",
                     "textbox", "searchbox", "slider", "treeitem"}
REPLACED = {"input", "button", "select", "textarea", "img", "iframe", "video", "canvas", "svg"}
# Elements the sites' stylesheet gives padding, a border or a size (any one makes an empty box non-zero).
BOXED_CLASSES = {"card", "post", "notice", "error", "btn", "icon", "cur"}
BOXED_TAGS = {"header", "main", "footer", "aside", "th", "td", "button"}
BOXED_IN = {"pager": {"a", "span"}, "chips": {"a", "span"}}
# Block-level boxes: innerText puts a line break around them (collapsed to a space below).
BLOCKS = {"html", "body", "div", "p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "table", "tr", "form",
          "nav", "header", "footer", "main", "section", "article", "aside", "dialog", "label"}
CELLS = {"td", "th"}
FLEX_CLASSES = {"app", "icon", "layout", "pager", "grid", "apps", "cats"}  # their children are blockified
# JavaScript's \s: what `replace(/\s+/g, ' ')` and `trim()` treat as white space.
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff" + "".join(map(chr, range(0x2000, 0x200b)))
_SPACES = re.compile(f"[{re.escape(_JS_SPACE)}]+")


def _js_trim(s: str) -> str:
  return s.strip(_JS_SPACE)


def _collapse(s: str) -> str:
  return _js_trim(_SPACES.sub(" ", s))


def _js_slice(s: str, n: int) -> str:
  """`s.slice(0, n)` as JavaScript counts: UTF-16 code units."""
  if len(s) <= n // 2 or all(ord(c) < 0x10000 for c in s):
    return s[:n]
  return s.encode("utf-16-le", "surrogatepass")[:2 * n].decode("utf-16-le", "ignore")


def _esc(s: str) -> str:
  return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _attr(node: LexborNode, name: str) -> str | None:
  attrs = node.attributes
  if name not in attrs:
    return None
  value = attrs[name]
  return "" if value is None else value


def _text(node: LexborNode) -> str:
  """A text node's text, or all the text under an element."""
  return (node.text_content if node.tag == "-text" else node.text(deep=True)) or ""


def _classes(node: LexborNode) -> set[str]:
  return set((_attr(node, "class") or "").split())


def _is_hidden(node: LexborNode) -> bool:
  """`display: none` by the user-agent stylesheet (the sites' own hide nothing)."""
  tag = node.tag
  if tag in SKIP or _attr(node, "hidden") is not None:
    return True
  if tag == "input" and (_attr(node, "type") or "").lower() == "hidden":
    return True
  return tag == "dialog" and _attr(node, "open") is None


def _own_pointer(node: LexborNode) -> bool:
  tag = node.tag
  return (tag == "a" and _attr(node, "href") is not None) or tag == "button" or "btn" in _classes(node)


@dataclasses.dataclass
class Controls:
  """What a page's controls hold now (what the user typed, ticked or chose), by node order."""

  values: dict[int, str] = dataclasses.field(default_factory=dict)  # control (by DOM order) -> value
  checked: dict[int, bool] = dataclasses.field(default_factory=dict)
  selected: dict[int, int] = dataclasses.field(default_factory=dict)  # select -> index of its selected option


def option_text(option: LexborNode) -> str:
  """`option.text`: its text, ASCII white space stripped and collapsed."""
  return re.sub(r"[\t\n\f\r ]+", " ", _text(option)).strip("\t\n\f\r ")


def option_value(option: LexborNode) -> str:
  value = _attr(option, "value")
  return value if value is not None else option_text(option)


def options_of(select: LexborNode) -> list[LexborNode]:
  return [n for n in select.traverse() if n.tag == "option"]


def default_selected(select: LexborNode) -> int:
  """The option a single `<select>` shows before any choice: the last with `selected`, else the first."""
  opts = options_of(select)
  marked = [i for i, o in enumerate(opts) if _attr(o, "selected") is not None]
  return marked[-1] if marked else (0 if opts else -1)


class Page:
  """A parsed page and the live state of its controls; `simplify` renders it as `html.js` does.

  Nodes are addressed by their position in document order (`order`), stable for the page's lifetime."""

  def __init__(self, html: str):
    self.tree = LexborHTMLParser(html)
    self.nodes: list[LexborNode] = [n for n in self.tree.root.traverse() if n.tag != "-text"]
    self._order = {n.mem_id: i for i, n in enumerate(self.nodes)}
    self.live = Controls()
    self.labelled: dict[int, int] = {}  # html id -> node order, at the last `simplify`

  def order(self, node: LexborNode) -> int:
    return self._order[node.mem_id]

  @property
  def title(self) -> str:
    node = self.tree.css_first("title")
    return _collapse(_text(node)) if node is not None else ""

  # ---------------------------------------------------------------------------------- control state

  def value(self, node: LexborNode) -> str:
    """The `value` property: what is typed (inputs, textareas) or chosen (selects), else the default."""
    i, tag = self.order(node), node.tag
    if tag == "select":
      opts = options_of(node)
      k = self.live.selected.get(i, default_selected(node))
      return option_value(opts[k]) if 0 <= k < len(opts) else ""
    if i in self.live.values:
      return self.live.values[i]
    if tag == "textarea":
      return _text(node)
    if tag == "option":
      return option_value(node)
    if tag == "input":
      value = _attr(node, "value")
      if value is None and (_attr(node, "type") or "").lower() in ("checkbox", "radio"):
        return "on"
      return value or ""
    return _attr(node, "value") or ""

  def checked(self, node: LexborNode) -> bool:
    return self.live.checked.get(self.order(node), _attr(node, "checked") is not None)

  def selected(self, option: LexborNode) -> bool:
    select = next((p for p in _ancestors(option) if p.tag == "select"), None)
    if select is None:
      return _attr(option, "selected") is not None
    k = self.live.selected.get(self.order(select), default_selected(select))
    opts = options_of(select)
    return 0 <= k < len(opts) and opts[k].mem_id == option.mem_id

  # ---------------------------------------------------------------------------------------- render

  def simplify(self, max_text: int = 200) -> tuple[str, list[Element]]:
    """`(html, elements)` as `js/html.js` returns them, less `data-bbox`; element ids are remembered for
    actions (`node_of`)."""
    elements: list[Element | None] = []
    self.labelled = {}
    sized = self._sized

    def emit(node: LexborNode, parent_pointer: bool) -> str:
      tag = node.tag
      if tag == "-text":
        t = _collapse(_text(node))
        if len(t) > max_text:
          t = _js_slice(t, max_text) + "..."
        return _esc(t)
      if tag.startswith(("-", "_", "!")) or _is_hidden(node):
        return ""
      pointer = _own_pointer(node) or parent_pointer
      is_sized = sized.get(node.mem_id, False)
      index = None
      if is_sized and self._interactive(node, pointer, parent_pointer):
        index = len(elements)
        elements.append(None)  # the slot is taken before the children's, so ids follow document order
      kids = options_of(node) if tag == "select" else node.iter(include_text=True)
      inner = [s for s in (emit(child, pointer) for child in kids) if s]
      attrs = self._attrs(node, max_text)
      if tag == "img" and _attr(node, "alt") and _attr(node, "title") is None:
        attrs.append(f'title="{_esc(_attr(node, "alt"))}"')
      own_text = any(c.tag == "-text" and _js_trim(_text(c)) for c in node.iter(include_text=True))
      keep = (index is not None or (tag in STRUCTURAL and (inner or attrs or tag in ("html", "body")))
              or (own_text and attrs))
      if index is not None:
        pairs = dict((a.partition("=")[0], a.partition("=")[2][1:-1]) for a in attrs)
        text = _js_slice(_collapse(self._inner_text(node)) or _js_trim(self.value(node)), 200)
        elements[index] = Element(index=index, tag=tag, text=text, role=_attr(node, "role") or "", attrs=pairs)
        self.labelled[index] = self.order(node)
      if not keep:
        return " ".join(inner)
      if not is_sized and not inner:
        return ""
      head = " ".join([tag] + ([f'id="{index}"'] if index is not None else []) + attrs)
      return f"<{head}> {' '.join(inner)} </{tag}>"

    html = emit(self.tree.root, False)
    return html, elements

  @functools.cached_property
  def _sized(self) -> dict[int, bool]:
    """Whether each element's box has a non-zero width and height (see the module doc), by `mem_id`: the page's
    structure decides it, not what its controls hold, so once per page."""
    out: dict[int, bool] = {}

    def visit(node: LexborNode) -> bool:
      tag = node.tag
      if tag == "-text":
        return bool(_js_trim(_text(node)))
      if tag.startswith(("-", "_", "!")) or _is_hidden(node):
        return False
      kids = [visit(c) for c in node.iter(include_text=True)]
      if tag == "option":
        result = False  # an option of a closed select has no box
      else:
        result = tag in REPLACED or tag in ("html", "body") or any(kids) or self._boxed(node)
      out[node.mem_id] = result
      return result

    visit(self.tree.root)
    return out

  def _interactive(self, node: LexborNode, pointer: bool, parent_pointer: bool) -> bool:
    tag = node.tag
    if tag in INTERACTIVE_TAGS:
      return not (tag == "input" and (_attr(node, "type") or "").lower() == "hidden")
    role = _attr(node, "role")
    if role and role in INTERACTIVE_ROLES:
      return True
    if _attr(node, "onclick") is not None:
      return True
    editable = _attr(node, "contenteditable")
    if editable is not None and editable.lower() in ("", "true"):
      return True
    return pointer and not parent_pointer

  @staticmethod
  def _boxed(node: LexborNode) -> bool:
    tag, classes = node.tag, _classes(node)
    if tag in BOXED_TAGS or classes & BOXED_CLASSES:
      return True
    if tag == "li":  # a list item's marker is a line of its own, but `aside ul` has none
      return not any(p.tag == "aside" for p in _ancestors(node))
    for p in _ancestors(node):
      for cls, tags in BOXED_IN.items():
        if tag in tags and cls in _classes(p):
          return True
    return tag == "nav" and "cats" in classes

  def _attrs(self, node: LexborNode, max_text: int) -> list[str]:
    out = []
    tag = node.tag
    for a in KEEP_ATTRS:
      if a == "value" and tag in ("input", "select", "textarea", "option", "progress", "meter", "output", "data",
                                  "param"):
        v = self.value(node)
      else:
        v = _attr(node, a)
      if a == "checked" and tag == "input" and self.checked(node):
        v = "true"
      if a == "selected" and tag == "option" and self.selected(node):
        v = "true"
      if v:
        out.append(f'{a}="{_esc(_js_slice(v, max_text))}"')
    return out

  def _inner_text(self, node: LexborNode) -> str:
    """`innerText` to within white space (the caller collapses it): rendered text, blocks and cells apart."""
    if node.tag == "-text":
      return _text(node)
    if _is_hidden(node) or node.tag in ("textarea", "input"):
      return ""
    if node.tag == "select":  # its options' texts, one a line
      return " " + " ".join(option_text(o) for o in options_of(node)) + " "
    parts = [self._inner_text(c) for c in node.iter(include_text=True)]
    parent = node.parent
    flex_item = parent is not None and (parent.tag == "header" or _classes(parent) & FLEX_CLASSES)
    sep = " " if node.tag in BLOCKS or node.tag in CELLS or flex_item else ""
    return sep + "".join(parts) + sep

  def target(self, selector: str) -> dict | None:
    """What `SiteEnv` reports for an oracle selector: its first rendered match (no box: there is no layout),
    and `element`, the html id an action names it by: its own, a descendant's, else an ancestor's."""
    sized = self._sized
    by_order = {order: index for index, order in self.labelled.items()}
    for node in self.tree.css(selector):
      if not sized.get(node.mem_id):
        continue
      candidates = [node, *(n for n in node.traverse() if n.tag != "-text"), *_ancestors(node)]
      element = next((by_order[self.order(n)] for n in candidates if self.order(n) in by_order), None)
      return {"bbox": [0, 0, 0, 0], "in_view": True, "covered": False, "tag": node.tag,
              "text": _js_slice(_js_trim(_collapse(self._inner_text(node)) or self.value(node)), 100),
              "element": element}
    return None

  def node_of(self, index: int) -> LexborNode | None:
    """The element labelled `index` at the last `simplify`, None if there was none."""
    order = self.labelled.get(index)
    return self.nodes[order] if order is not None else None


def _ancestors(node: LexborNode):
  p = node.parent
  while p is not None:
    yield p
    p = p.parent
