"""The site server: real uvicorn on loopback, per-session state, the state endpoint, every page renders."""

import concurrent.futures

import httpx
import pytest

from jaxagent.envs.sites import catalog, server


@pytest.fixture(scope="module")
def base_url():
  with server.SiteServer() as s:
    yield s.base_url


def test_pages_render_and_unknown_paths_404(base_url):
  world = catalog.build_world(0)
  with httpx.Client(base_url=base_url) as c:
    for path in ("/s/x/shop/", "/s/x/shop/search?q=lamp", "/s/x/shop/c/audio?sort=price_asc&colour=red",
                 "/s/x/shop/p/7", "/s/x/shop/cart", "/s/x/shop/checkout", "/s/x/shop/orders", "/s/x/forum/",
                 "/s/x/forum/b/books?page=2", "/s/x/forum/t/9", "/s/x/forum/u/alex", "/s/x/launcher/",
                 "/s/x/settings/"):
      r = c.get(path)
      assert r.status_code == 200, path
      assert "<meta name=viewport" in r.text and "<script" not in r.text, path
    assert world.product(7).name in c.get("/s/x/shop/p/7").text
    assert c.get("/s/x/shop/p/99999").status_code == 404
    assert c.get("/s/x/nosuchsite/").status_code == 404
    assert c.get("/s/bad%20id/shop/").status_code == 400


def test_search_ranks_the_exact_name_first(base_url):
  world = catalog.build_world(0)
  for pid in (1, 250, 999):
    name = world.product(pid).name
    assert catalog.search_products(world, name)[0].id == pid
  with httpx.Client(base_url=base_url) as c:
    html = c.get("/s/x/shop/search", params={"q": world.product(250).name}).text
  first = html.index("class=name href=")
  assert html[first:first + 60].split("'")[1].endswith("/shop/p/250")


def test_sort_and_filter(base_url):
  world = catalog.build_world(0)
  audio = [p for p in world.products if p.category == "audio" and "red" in p.colours]
  cheapest = min(audio, key=lambda p: (p.price_cents, p.id))
  with httpx.Client(base_url=base_url) as c:
    html = c.get("/s/x/shop/c/audio", params={"colour": "red", "sort": "price_asc"}).text
  assert f"{len(audio)} products" in html
  first_card = html.index("class=card")
  assert html.index(cheapest.name) - first_card < 200


def test_state_changes_are_per_session_and_reset(base_url):
  world = catalog.build_world(0)
  p = next(p for p in world.products if p.sizes)
  with httpx.Client(base_url=base_url) as c:
    r = c.post("/s/a/shop/cart/add", data={"product_id": p.id, "colour": p.colours[-1]})
    assert r.status_code == 303 and "err=size" in r.headers["location"]  # a size is required
    c.post("/s/a/shop/cart/add", data={"product_id": p.id, "colour": p.colours[-1], "size": p.sizes[0]})
    c.post("/s/a/shop/consent", data={"next": "/s/a/shop/"})
    assert "id=cookie-banner" not in c.get("/s/a/shop/").text
    assert "id=cookie-banner" in c.get("/s/b/shop/").text
    r = c.post("/s/a/shop/checkout", data={"name": "Ada", "address": "1 Loop Rd"})
    assert r.headers["location"] == "/s/a/shop/orders/1001"
    c.post("/s/a/forum/t/3/reply", data={"body": "thanks!"})
    c.post("/s/a/settings/toggle/wifi")
    a = server.fetch_state(base_url, "a")
    assert a["cart"] == [] and a["orders"][0]["items"] == [
        {"product_id": p.id, "colour": p.colours[-1], "size": p.sizes[0], "qty": 1}]
    assert a["replies"] == [{"thread_id": 3, "author": "you", "body": "thanks!"}]
    assert a["settings"]["wifi"] is False and a["cookie_consent"] is True
    assert "thanks!" in c.get("/s/a/forum/t/3").text and "thanks!" not in c.get("/s/b/forum/t/3").text
    b = server.fetch_state(base_url, "b")
    assert b["orders"] == [] and b["replies"] == [] and b["settings"]["wifi"] is True
    server.reset_session(base_url, "a")
    assert server.fetch_state(base_url, "a")["exists"] is False


def test_parallel_sessions_keep_separate_carts(base_url):
  world = catalog.build_world(0)
  plain = [p for p in world.products if not p.sizes][:8]

  def shop(k):
    with httpx.Client(base_url=base_url) as c:
      for _ in range(k + 1):
        c.post(f"/s/par{k}/shop/cart/add", data={"product_id": plain[k].id, "colour": ""})
    return server.fetch_state(base_url, f"par{k}")["cart"]

  with concurrent.futures.ThreadPoolExecutor(8) as ex:
    carts = list(ex.map(shop, range(8)))
  for k, cart in enumerate(carts):
    assert cart == [{"product_id": plain[k].id, "colour": plain[k].colours[0], "size": "", "qty": k + 1}]


def test_ensure_server_is_one_per_process():
  url = server.ensure_server()
  assert server.ensure_server() == url
  assert httpx.get(f"{url}/healthz").text.startswith("ok")
  with pytest.raises(ValueError, match="seed"):
    server.ensure_server(seed=1)


def test_serve_command_runs_alone():
  import re
  import subprocess
  import sys
  proc = subprocess.Popen([sys.executable, "-m", "jaxagent.envs.sites", "serve", "--port", "0"],
                          stdout=subprocess.PIPE, text=True)
  try:
    line = proc.stdout.readline()
    url = re.search(r"serving the bundled sites on (http://\S+)", line).group(1)
    assert "Shoply" in httpx.get(f"{url}/s/demo/shop/", timeout=10).text
  finally:
    proc.terminate()
    proc.wait(timeout=10)


def test_a_task_is_never_bound_to_a_server_of_another_world():
  """A world-1 task on a world-0 server would be judged against products it was not written for."""
  from jaxagent.envs import sites
  world1 = sites.select(1, "device", "shop_category_sort", 8)["train"][0]
  with server.SiteServer(seed=0) as world0_server, server.SiteServer(seed=1) as world1_server:
    with pytest.raises(ValueError, match=r"world seed 1, but the site server .* serves world seed 0"):
      server.episode_task(world1, base_url=world0_server.base_url)
    bound = server.episode_task(world1, base_url=world1_server.base_url)
    assert bound.start_url.startswith(world1_server.base_url)
