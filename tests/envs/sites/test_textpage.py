"""`textpage.Page` against `js/html.js` in Chromium on one page of the sites' shell with the cases the
simplifier treats specially: default and chosen options, a box and a radio with and without values, a text
area, hidden inputs, a link without href and an empty one, an image's alt, long and astral-plane text, entities,
white space of every kind; then the same page after typing, ticking and choosing."""

import re

import pytest

from jaxagent.envs import profiles
from jaxagent.envs.browser import DEBIAN_CHROMIUM
from jaxagent.envs.observers import html as html_obs
from jaxagent.envs.sites import catalog, layout, state, textpage

pytestmark = pytest.mark.browser

BODY = ("<h1>Edge &amp; cases</h1><p>tabs\tand\u00a0no-break\u2003spaces &lt;kept&gt; \"quoted\"</p>"
        "<p>" + "🙂 long " * 40 + "</p>"
        "<form class=stack method=post action='x'><label>Size <select name=size><option>S</option>"
        "<option value=m selected>M</option><option value=''>none</option></select></label>"
        "<select name=colour><option value=r>red</option><option value=b>blue</option></select>"
        "<input type=checkbox name=gift> <input type=checkbox name=wrap value=yes checked>"
        "<input type=radio name=ship value=std checked><input type=radio name=ship value=fast>"
        "<input type=hidden name=token value=abc><input name=plain placeholder='no type'>"
        "<textarea name=note>\nfirst line</textarea><button>Go</button><button type=button value=v>Later</button>"
        "</form><a>no href</a> <a href='y'></a> <a href='z' title='t'>   </a><ul><li></li><li title=x></li></ul>"
        "<table><tr><td></td><td>cell</td></tr></table><div hidden><a href='h'>hidden</a></div>")

FILL_JS = """() => { document.querySelector('[name=plain]').value = 'typed ' + 'x'.repeat(300);
  document.querySelector('[name=note]').value = 'a\\nb';
  document.querySelector('[name=gift]').checked = true;
  document.querySelector('[name=wrap]').checked = false;
  document.querySelector('[value=fast]').checked = true;
  document.querySelector('[name=colour]').selectedIndex = 1; }"""


def _page() -> str:
  ctx = layout.Ctx(world=catalog.build_world(0), state=state.SessionState(), session="s", root="/s/s", path="",
                   query={}, form={})
  return layout.page(ctx, site="shop", title="Edge", body=BODY)


@pytest.fixture(scope="module")
def chromium_page():
  from playwright.sync_api import sync_playwright  # pylint: disable=g-import-not-at-top
  with sync_playwright() as pw:
    browser = pw.chromium.launch(executable_path=DEBIAN_CHROMIUM, args=["--headless", "--no-sandbox"])
    page = browser.new_context(**profiles.PROFILES["web"].context_options()).new_page()
    page.set_content(_page())
    yield page
    browser.close()


def _strip_boxes(html: str) -> str:
  return re.sub(r' data-bbox="[^"]*"', "", html)


def _elements(elements) -> list:
  return [(e.index, e.tag, e.text, {k: v for k, v in e.attrs.items() if k != "data-bbox"}) for e in elements]


@pytest.mark.slow
def test_a_page_of_edge_cases_simplifies_as_in_chromium(chromium_page):
  html, elements = html_obs.simplify(chromium_page)
  page = textpage.Page(_page())
  ours, our_elements = page.simplify()
  assert ours == _strip_boxes(html)
  assert _elements(our_elements) == _elements(elements)
  assert 'value="m" selected="true"' in ours and 'checked="true"' in ours and "🙂" in ours


def test_typed_ticked_and_chosen_values_show_as_in_chromium(chromium_page):
  chromium_page.evaluate(FILL_JS)
  html, _ = html_obs.simplify(chromium_page)
  page = textpage.Page(_page())
  nodes = {n.attributes.get("name"): n for n in page.nodes if n.attributes.get("name")}
  page.live.values[page.order(nodes["plain"])] = "typed " + "x" * 300
  page.live.values[page.order(nodes["note"])] = "a\nb"
  page.live.checked[page.order(nodes["gift"])] = True
  page.live.checked[page.order(nodes["wrap"])] = False
  fast = next(n for n in page.nodes if n.attributes.get("value") == "fast")
  std = next(n for n in page.nodes if n.attributes.get("value") == "std")
  page.live.checked[page.order(fast)], page.live.checked[page.order(std)] = True, False
  page.live.selected[page.order(nodes["colour"])] = 1
  assert page.simplify()[0] == _strip_boxes(html)
