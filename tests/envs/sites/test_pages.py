"""`links.parse` and `links.select` on real pages rendered in-process by the sites' handlers, so a change to the
markup that breaks the link graph or an oracle's selector fails here, not in an expensive episode."""

from __future__ import annotations


import pytest

from jaxagent.envs.sites import catalog, forum, layout, phone, shop
from jaxagent.envs.sites import pages as links  # the name the assertions read best with
from jaxagent.envs.sites import state as state_lib


@pytest.fixture(scope="module")
def world():
  return catalog.build_world(0)


def render(world, handler, path: str, query: dict[str, str] | None = None) -> str:
  ctx = layout.Ctx(world=world, state=state_lib.SessionState(), session="t", root="/s/t", path=path,
                   query=query or {}, form={})
  out = handler(ctx)
  assert isinstance(out, str), out
  return out


@pytest.fixture(scope="module")
def audio(world):
  return links.parse(render(world, shop.handle, "c/audio"))


@pytest.fixture(scope="module")
def product(world):
  return links.parse(render(world, shop.handle, "p/1"))


def test_category_page_links(world, audio):
  assert audio.title == "Audio | Shoply"
  nav = links.select(audio, "nav.cats a")
  assert len(nav) == len(catalog.CATEGORIES) == 8
  assert {audio.link_of(n).href for n in nav} == {f"/s/t/shop/c/{c}" for c in catalog.CATEGORIES}
  brands = {p.brand for p in world.products if p.category == "audio"}
  assert {link.text for link in audio.links if "filter-brand" in link.node.classes} == brands
  assert [n.text for n in links.select(audio, "a.filter-brand[href*='brand=Acorn']")] == ["Acorn"]
  sorts = [link for link in audio.links if "sort=" in link.href]
  assert len(sorts) == 4  # the current sort (relevance) is a span, not a link
  assert {link.text for link in sorts} == {label for key, label in shop.SORTS.items() if key != "relevance"}
  assert len(links.select(audio, "a[href*='sort=rating']")) == 1
  assert "box-sizing" not in audio.text and "Audio | Shoply" not in audio.text  # no <style> or <title> in text


def test_hrefs_are_entity_decoded_on_a_filtered_page(world):
  page = links.parse(render(world, shop.handle, "c/audio", {"brand": "Acorn"}))
  sorts = [link.href for link in page.links if "sort=" in link.href]
  assert "/s/t/shop/c/audio?brand=Acorn&sort=rating" in sorts
  assert not any("&amp;" in link.href for link in page.links)


def test_cookie_consent_and_search_forms(audio):
  (accept,) = links.select(audio, "#cookie-accept")
  consent = audio.form_of(accept)
  assert consent.method == "POST" and consent.action == "/s/t/shop/consent"
  nxt = consent.field("next")
  assert nxt.type == "hidden" and nxt.value == "/s/t/shop/c/audio"
  assert list(consent.buttons) == [accept] and consent.buttons[0].text == "Accept cookies"
  assert accept.attrs["type"] == "submit"
  (q,) = links.select(audio, "#q")
  search = audio.form_of(q)
  assert search.method == "GET" and search.action == "/s/t/shop/search"
  assert [f.name for f in search.fields] == ["q"] and search.fields[0].type == "search"
  assert search.fields[0].node is q
  assert links.select(audio, "form[method=post] button") == [accept]


def test_select_matches_and_misses(audio):
  (audio_link,) = links.select(audio, "nav.cats a[href$='/shop/c/audio']")
  assert audio_link.text == "Audio" and audio.link_of(audio_link).ancestors[-1].classes == ("cats",)
  assert links.select(audio, "#no-such-id") == []
  assert links.select(audio, "#q, #cookie-accept") == links.select(audio, "#cookie-accept,#q")  # document order
  assert [n.id for n in links.select(audio, "#cookie-accept, #q")] == ["q", "cookie-accept"]
  assert links.select(audio, "header > form > #q") == links.select(audio, "header #q")
  assert links.select(audio, "body > #q") == []  # `>` is the child combinator, not any descendant
  assert links.select(audio, 'a.filter-brand[href*="brand=Acorn"]') == links.select(audio, "a[href*=brand=Acorn]")


def test_product_page_add_to_cart(world, product):
  p = world.product(1)
  (button,) = links.select(product, "#add-to-cart")
  form = product.form_of(button)
  assert form.method == "POST" and form.action == "/s/t/shop/cart/add"
  fields = {f.name: f for f in form.fields}
  assert {name: (f.type, f.value) for name, f in fields.items()} == {
      "product_id": ("hidden", "1"), "colour": ("hidden", p.colours[0]), "size": ("hidden", ""),
      "qty": ("hidden", "1")}
  assert form.buttons[0] is button and form.buttons[0].text == "Add to cart"
  assert p.price in product.text and p.name in product.text and product.title == f"{p.name} | Shoply"
  other = next(c for c in p.colours if c != p.colours[0])
  (chip,) = links.select(product, f"a.opt-colour[href*='colour={other}']")
  assert product.link_of(chip).href == f"/s/t/shop/p/1?colour={other}"
  assert links.select(product, f"a[href$='/shop/p/1?colour={other}']") == [chip]


def test_forum_thread_author_link(world):
  page = links.parse(render(world, forum.handle, "t/1"))
  author = world.thread(1).author
  (node,) = links.select(page, f"#post-1 a[href$='/forum/u/{author}']")
  assert node.text == author and page.link_of(node).href == f"/s/t/forum/u/{author}"
  reply = page.form_of(links.select(page, "#reply-submit")[0])
  assert reply.method == "POST" and reply.action == "/s/t/forum/t/1/reply"
  assert [(f.name, f.type, f.id) for f in reply.fields] == [("body", "textarea", "reply-body")]
  board = links.parse(render(world, forum.handle, ""))
  assert len(links.select(board, "td>a")) == len(links.select(board, "td > a")) == len(catalog.BOARDS)


def test_phone_launcher_apps(world):
  ctx = layout.Ctx(world=world, state=state_lib.SessionState(), session="t", root="/s/t", path="", query={},
                   form={})
  page = links.parse(phone.launcher(ctx))
  for key in ("shop", "forum", "settings"):
    (node,) = links.select(page, f"#app-{key}")
    assert page.link_of(node).href == f"/s/t/{key}/"
  assert len(page.links) == 3
  (icon,) = links.select(page, "#app-forum span.icon")
  assert page.link_of(icon).node.id == "app-forum"  # a span inside the link resolves to the link


@pytest.mark.parametrize("selector,part", [("a:hover", ":hover"), ("h1 + p", "+"), ("h1 ~ p", "~"),
                                           ("a::before", "::before"), ("div:not(.x) a", ":not(.x)")])
def test_unsupported_selectors_raise(audio, selector, part):
  with pytest.raises(ValueError) as e:
    links.select(audio, selector)
  assert repr(selector) in str(e.value) and repr(part) in str(e.value)


@pytest.mark.parametrize("selector", ["", "a,", "> a", "a >", "[href", "a!"])
def test_malformed_selectors_raise(audio, selector):
  with pytest.raises(ValueError):
    links.select(audio, selector)


def test_entities_and_tolerant_markup():
  page = links.parse("<html><head><title>T &amp; U</title><style>p{color:red}</style></head><body>"
                     "<ul><li>a<li>b</ul><p>one<p>two<div id=d>x</div></span><input id=i><span id=s>y</span>"
                     "<a href='/x?a=1&amp;b=2' class='k m'>Tom &amp; Jerry&#x27;s</a><br/>z"
                     "<form method=dialog><select name=s><option value=1>one<option selected>two</select>"
                     "<input type=checkbox name=c checked><input type=submit name=g value=Go></form></body></html>")
  assert page.title == "T & U"
  assert page.text == "a b one two x y Tom & Jerry's z one two"
  (link,) = page.links
  assert link.href == "/x?a=1&b=2" and link.text == "Tom & Jerry's" and link.node.classes == ("k", "m")
  assert links.select(page, "a[class~=m]") == [link.node] and links.select(page, "a[class~='k m']") == []
  assert len(links.select(page, "li")) == 2 and links.select(page, "li li") == []  # unclosed <li>
  assert len(links.select(page, "p")) == 2 and links.select(page, "p p, p div") == []  # unclosed <p>
  assert links.select(page, "input span") == [] and links.select(page, "body > #s")  # void elements never open
  (form,) = page.forms
  assert form.method == "GET" and form.action == ""
  assert [(f.name, f.type, f.value, f.checked) for f in form.fields] == [("s", "select", "two", False),
                                                                         ("c", "checkbox", "", True)]
  assert [(b.attrs["name"], b.attrs["value"], b.attrs["type"]) for b in form.buttons] == [("g", "Go", "submit")]


