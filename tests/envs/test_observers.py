"""Observers: WebVoyager's element list and set-of-marks rules, OpenWebVoyager's a11y tree, WebRL's HTML."""

import textwrap

import numpy as np
import pytest

from jaxagent.envs.browser import BrowserEnv
from jaxagent.envs.miniwob import serve_directory
from jaxagent.envs.observers import a11y, html, screenshot, som
from jaxagent.types import Task

# ---------------------------------------------------------------- WebVoyager's textual element list (pure)


def _rec(tag, text="", type_=None, aria=None):
  return {"tag": tag, "text": text, "type": type_, "ariaLabel": aria, "rects": [[0, 0, 10, 10]]}


def test_element_text_follows_webvoyager_rules():
  records = [
      _rec("button", "Search"),
      _rec("input", "", "text", "Query"),  # empty text input -> its aria-label
      _rec("input", "", "checkbox"),  # empty, not a text input -> omitted (but keeps its index)
      _rec("a", "Home"),
      _rec("a", "Docs", aria="Documentation"),  # differing aria-label appended
      _rec("div", "x" * 200),  # 200+ chars -> omitted
      _rec("button", "", "submit"),  # empty submit button without aria-label
      _rec("li", '<img alt="" src="a.png">'),  # holds an <img ... src= -> omitted
      _rec("textarea", "", None, "Notes"),
  ]
  assert som.format_element_text(records) == "\t".join([
      '[0]: <button> "Search";', '[1]: <input> "Query";', '[3]: "Home";', '[4]: "Docs", "Documentation";',
      '[6]: <button> "";', '[8]: <textarea> "Notes";'])


# ----------------------------------------------------------------- OpenWebVoyager's a11y tree (pure)


def _node(node_id, role, name, children=(), backend=None, props=()):
  return {"nodeId": node_id, "role": {"value": role}, "name": {"value": name}, "childIds": list(children),
          "backendDOMNodeId": backend, "properties": [{"name": k, "value": {"value": v}} for k, v in props]}


def test_a11y_tree_numbering_drops_and_format():
  nodes = [
      _node("r", "RootWebArea", "Shop", ["n1", "n2", "n3", "n4", "n5"], backend=1, props=[("focusable", True)]),
      _node("n1", "generic", "", ["n6"], backend=2),  # empty name: dropped, child promoted (same depth)
      _node("n6", "button", "Buy now", ["n7"], backend=3, props=[("focusable", True), ("expanded", False)]),
      _node("n7", "StaticText", "Buy", [], backend=4),  # substring of parent's name: dropped
      _node("n2", "gridcell", "cell", [], backend=5),  # gridcell: dropped
      _node("n3", "link", "Offscreen", [], backend=6),  # out of view: removed
      _node("n4", "link", "Half", [], backend=7),  # 50% in view < 0.8: removed
      _node("n5", "heading", "Deals", ["n8"], backend=8),
      _node("n8", "link", "Deal 1", [], backend=9),
  ]
  bounds = {2: [0, 0, 100, 50], 3: [10, 10, 80, 30], 4: [12, 12, 20, 10], 5: [0, 60, 10, 10],
            6: [0, 2000, 50, 20], 7: [0, 760, 100, 16], 8: [0, 100, 200, 30], 9: [0, 140, 60, 20]}
  text, info = a11y.build_tree(nodes, bounds, viewport=(1024, 768))
  assert text == "\n".join([
      "[1] RootWebArea 'Shop'",
      "\t[2] button 'Buy now' expanded: False",
      "\t[3] heading 'Deals'",
      "\t\t[4] link 'Deal 1'",
  ])
  assert info[2] == {"union_bound": [10, 10, 80, 30], "text": "button 'Buy now' expanded: False", "backend_id": 3,
                     "role": "button", "name": "Buy now"}
  assert list(info) == [1, 2, 3, 4]


def test_a11y_keep_unnamed_roles_is_opt_in():
  nodes = [_node("r", "RootWebArea", "R", ["t"], backend=1), _node("t", "textbox", "", [], backend=2)]
  bounds = {2: [0, 0, 100, 20]}
  assert a11y.build_tree(nodes, bounds, (1024, 768))[0] == "[1] RootWebArea 'R'"
  assert a11y.build_tree(nodes, bounds, (1024, 768), keep_unnamed=("textbox",))[0] == (
      "[1] RootWebArea 'R'\n\t[2] textbox ''")


def test_a11y_viewport_ratio_threshold_is_inclusive_at_point_eight():
  assert a11y.viewport_ratio([0, 0, 100, 100], (100, 80)) == pytest.approx(0.8)
  nodes = [_node("r", "RootWebArea", "R", ["a"], backend=1), _node("a", "link", "A", [], backend=2)]
  assert "link 'A'" in a11y.build_tree(nodes, {2: [0, 0, 100, 100]}, (100, 80))[0]
  assert "link 'A'" not in a11y.build_tree(nodes, {2: [0, 0, 100, 100]}, (100, 79))[0]


def test_a11y_tree_stops_after_300_nodes():
  kids = [f"k{i}" for i in range(500)]
  nodes = [_node("r", "RootWebArea", "R", kids, backend=0)]
  nodes += [_node(k, "link", f"link {i}", [], backend=i + 1) for i, k in enumerate(kids)]
  bounds = {i + 1: [0, 0, 10, 10] for i in range(500)}
  text, info = a11y.build_tree(nodes, bounds, (1024, 768))
  assert len(info) == 301 and len(text.split("\n")) == 301  # the original checks `> 300` before each child


def test_clean_tree_keeps_longer_of_repeated_lines():
  tree = "[1] RootWebArea 'R'\n\t[2] StaticText 'Price'\n\t[3] StaticText 'Price: $5'\n\t[4] link 'Buy'"
  assert a11y.clean_tree(tree) == "[1] RootWebArea 'R'\n\t[3] StaticText 'Price: $5'\n\t[4] link 'Buy'"


# ------------------------------------------------------------------------------- on a real Chromium page

PAGE = """
<html><head><title>Obs</title></head><body style="margin:0;font:16px sans-serif">
<button id="outer" style="position:absolute;left:10px;top:10px;width:150px;height:40px"><span>Inner span</span></button>
<ul style="position:absolute;left:10px;top:70px;margin:0;padding:0;list-style:none">
  <li style="width:200px;height:30px"><a href="#x" style="display:block;height:30px">Link in li</a></li>
</ul>
<div onclick="1" style="position:absolute;left:10px;top:120px;width:3px;height:3px"></div>
<button id="covered" style="position:absolute;left:10px;top:150px;width:100px;height:30px">Covered</button>
<div style="position:absolute;left:0;top:145px;width:200px;height:40px;background:#eee"></div>
<button style="display:none">Hidden</button>
<input type="text" placeholder="Name" style="position:absolute;left:10px;top:200px;width:150px;height:30px">
<p style="position:absolute;left:10px;top:250px">Just text here</p>
</body></html>"""


@pytest.fixture(scope="module")
def page_env(tmp_path_factory):
  root = tmp_path_factory.mktemp("obs_site")
  (root / "obs.html").write_text(textwrap.dedent(PAGE))
  url = serve_directory(root) + "obs.html"
  env = BrowserEnv(profile="web", observation="som")
  env.reset(Task(id="o", intent="", site="fixture", start_url=url))
  yield env
  env.close()


@pytest.mark.browser
@pytest.mark.slow
def test_som_keeps_innermost_visible_candidates(page_env):
  elements = som.to_elements(som.mark(page_env.page, draw=False))
  texts = [(e.tag, e.text) for e in elements]
  assert ("button", "Inner span") in texts  # span inside a button: only the button
  assert ("a", "Link in li") in texts and not any(t == "li" for t, _ in texts)  # li containing a link: the link
  assert not any(t == "Covered" for _, t in texts)  # elementFromPoint hits the overlay: not visible
  assert not any(t == "Hidden" for _, t in texts)
  assert not any(e.tag == "div" for e in elements)  # 9 px² < 20 px²
  assert ("input", "") in texts
  button = next(e for e in elements if e.tag == "button")
  assert button.bbox == (10, 10, 150, 40) and button.center == (85, 30)


@pytest.mark.browser
def test_som_labels_are_drawn_on_the_screenshot_then_removed(page_env):
  page = page_env.page
  plain = screenshot.capture(page)
  som.mark(page, draw=True)
  marked = screenshot.capture(page)
  assert page.evaluate("document.querySelectorAll('div[style*=dashed]').length") == 3
  som.clear(page)
  assert page.evaluate("document.querySelectorAll('div[style*=dashed]').length") == 0
  assert np.array_equal(screenshot.capture(page), plain)
  # The label of element 0 (black box, white index) sits at the button's top-left corner.
  diff = np.abs(marked.astype(int) - plain.astype(int)).sum(-1)
  assert diff[10:30, 10:40].sum() > 0 and diff[400:, 400:].sum() == 0
  assert (marked[12:26, 12:30] < 40).all(-1).mean() > 0.3  # mostly black label background


@pytest.mark.browser
def test_a11y_from_cdp_on_a_real_page(page_env):
  text, info = a11y.observe(page_env.page, page_env._cdp_session())
  lines = text.split("\n")
  assert lines[0] == f"[1] RootWebArea 'Obs' focused: True url: {page_env.page.url}"
  assert "\t[2] button 'Inner span'" in lines and any("textbox 'Name'" in l for l in lines)
  assert not any("Hidden" in l for l in lines)
  node = next(n for n in info.values() if n["name"] == "Inner span" and n["role"] == "button")
  assert node["union_bound"] == [10, 10, 150, 40]


@pytest.mark.browser
def test_simplified_html_marks_interactive_elements(page_env):
  text, elements = html.simplify(page_env.page)
  by_tag = {}
  for e in elements:
    by_tag.setdefault(e.tag, e)
  assert set(by_tag) >= {"button", "a", "input"}
  b = by_tag["button"]
  assert f'<button id="{b.index}" data-bbox="10,10,150,40"> Inner span </button>' in text
  assert f'<input id="{by_tag["input"].index}" type="text" placeholder="Name" data-bbox="10,200,150,30">' in text
  assert "Just text here" in text and "Hidden" not in text and text.startswith("<html data-bbox=")
  assert [e.index for e in elements] == list(range(len(elements)))
  assert html.live_bbox(page_env.page, b.index) == [10, 10, 150, 40]
  assert page_env.page.get_attribute("#outer", "data-label-id") == str(b.index)


@pytest.mark.browser
def test_screenshot_resize(page_env):
  img = screenshot.capture(page_env.page, size=(512, 384))
  assert img.shape == (384, 512, 3) and img.dtype == np.uint8
