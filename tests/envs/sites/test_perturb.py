"""Seeded per-episode perturbations: applied by the server, a pure function of the episode, level 0 unchanged."""

import dataclasses
import re

import httpx
import pytest

from jaxagent.envs.sites import app, catalog, perturb, server
from jaxagent.envs.sites import state as state_lib

WORLD = catalog.build_world(0)


def fetch(state, url, method="GET", form=None):
  """One in-process request as the server would serve it; follows a redirect."""
  site, _, rest = url.lstrip("/").partition("/")
  path, _, query = rest.partition("?")
  q = dict(p.split("=", 1) for p in query.split("&") if p)
  reply = app.respond(WORLD, state, "t", site, path, q, form or {}, method)
  if reply.location:
    return fetch(state, reply.location[len("/s/t"):])
  return reply


def episode(level=1, seed=0, **kw):
  return state_lib.SessionState(perturbation=perturb.Perturbation(level=level, seed=seed, **kw))


def test_level_zero_is_todays_site():
  plain, zero = state_lib.SessionState(), episode(level=0, seed=123)
  for url in ("/shop/", "/shop/c/audio?sort=rating", "/shop/p/3", "/forum/t/2", "/launcher/"):
    assert fetch(plain, url).html == fetch(zero, url).html


def test_an_episode_is_a_pure_function_of_its_seed_and_actions():
  urls = ["/shop/", "/shop/c/audio", "/shop/c/audio?brand=Acorn", "/shop/p/9", "/shop/c/kitchen?sort=rating"]
  for seed in range(20):
    a, b = episode(2, seed, shortcut="/shop/c/audio"), episode(2, seed, shortcut="/shop/c/audio")
    assert [fetch(a, u).html for u in urls] == [fetch(b, u).html for u in urls]


def test_layouts_and_shuffles_vary_across_episodes_and_the_held_out_layout_only_in_test():
  variants = {episode(1, s).perturbation.layout_variant for s in range(200)}
  assert variants == set(perturb.TRAIN_LAYOUTS)
  assert episode(1, 5, layout="test").perturbation.layout_variant == perturb.HELD_OUT_LAYOUT
  navs = {re.search(r"<nav class=cats[^>]*>(.*?)</nav>", fetch(episode(1, s), "/shop/c/audio").html).group(1)
          for s in range(10)}
  assert len(navs) > 1  # the category order is shuffled
  sizes = {fetch(episode(1, s), "/shop/c/audio").html.count("class=card") for s in range(30)}
  assert sizes == {12, 24}


def test_popup_covers_one_page_view_until_closed():
  seeds = [s for s in range(200) if perturb.Perturbation(1, s).popup_view]
  assert 0.15 < len(seeds) / 200 < 0.35
  st = episode(1, seeds[0])
  view = st.perturbation.popup_view
  pages = [fetch(st, "/shop/c/audio") for _ in range(view)]
  assert "id=popup-close" in pages[-1].html and all("id=popup-close" not in p.html for p in pages[:-1])
  assert "id=popup-close" in fetch(st, "/shop/p/3").html  # stays until closed
  closed = fetch(st, "/shop/__popup__/close", "POST", {"next": "/s/t/shop/p/3"})
  assert "id=popup-close" not in closed.html and "add-to-cart" in closed.html


def test_transient_failures_only_at_level_two_never_on_the_first_request():
  for level, expect in ((1, False), (2, True)):
    failed = 0
    for s in range(40):
      st = episode(level, s)
      first = fetch(st, "/shop/")
      assert "id=retry" not in first.html
      failed += sum("id=retry" in fetch(st, "/shop/c/audio").html for _ in range(10))
    assert (failed > 0) == expect
    if expect:
      assert 0.04 < failed / 400 < 0.2


def test_the_risky_deal_reaches_the_target_with_its_probability():
  outcomes = []
  for s in range(300):
    st = episode(2, s, shortcut="/shop/c/audio?brand=Acorn", shortcut_label="Acorn audio")
    home = fetch(st, "/shop/").html
    if "id=deal" not in home:
      continue
    assert "Acorn audio" in home
    outcomes.append("This deal has expired" not in fetch(st, "/shop/deal").html)
  assert 100 < len(outcomes) < 200
  assert 0.2 < sum(outcomes) / len(outcomes) < 0.4
  assert fetch(episode(1, 0, shortcut="/shop/c/audio"), "/shop/deal").status == 404  # no deal below level 2


def test_bad_perturbations_are_refused_naming_the_field():
  with pytest.raises(ValueError, match="perturb.level"):
    perturb.Perturbation(level=3)
  with pytest.raises(ValueError, match="layout"):
    perturb.Perturbation(level=1, layout="holdout")
  with pytest.raises(ValueError, match="unknown"):
    perturb.Perturbation.from_json({"level": 1, "popups": 2})


def test_the_http_server_applies_an_episodes_perturbations():
  with server.SiteServer(port=0) as s:
    seed = next(k for k in range(200) if perturb.Perturbation(1, k).popup_view == 2)
    task = dataclasses.replace(_task(), id="x", meta={"perturb": {"level": 1, "seed": seed}})
    bound = server.episode_task(task, base_url=s.base_url)
    first = httpx.get(bound.start_url)
    second = httpx.get(bound.start_url)
    assert "popup-close" not in first.text and "popup-close" in second.text
    assert second.headers["cache-control"] == "no-store"
    state = server.fetch_state(s.base_url, bound.meta["session"])
    assert state["perturbation"]["seed"] == seed and state["popup_open"] is True
    r = httpx.post(f"{s.base_url}/__episode__/{bound.meta['session']}", json={"level": 7})
    assert r.status_code == 400 and "perturb.level" in r.text


def test_episode_seed_follows_the_task_id():
  task = _task()
  a = server.perturbation_of(dataclasses.replace(task, id="t@eval0", meta={"perturb": {"level": 2}}))
  b = server.perturbation_of(dataclasses.replace(task, id="t@eval0", meta={"perturb": {"level": 2}}))
  c = server.perturbation_of(dataclasses.replace(task, id="t@eval1", meta={"perturb": {"level": 2}}))
  assert a == b and a.seed != c.seed
  assert server.perturbation_of(task) is perturb.NONE


def _task():
  from jaxagent.types import Task  # noqa: PLC0415
  return Task(id="t", intent="look", site="shop", start_url="__SITES__/shop/c/audio")
