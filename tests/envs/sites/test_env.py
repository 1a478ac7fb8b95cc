"""`SiteEnv` episodes in one kept browser context: each starts on a new session of the site server, so nothing
of the last episode's cart, orders or interstitial shows in the next."""

import pytest

from jaxagent.envs.sites import bench, expert, server
from jaxagent.envs.sites import env as env_lib
from jaxagent.judges import evaluators

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site():
  with server.SiteServer() as s:
    yield s.base_url


@pytest.mark.slow
def test_an_episode_after_a_purchase_starts_on_an_empty_cart_with_no_orders(site):
  task = next(t for t in bench.tasks_for("web/test_iid@2/buy") if t.meta["perturb"].get("level"))
  policy = expert.ScriptedExpert("webrl")
  with env_lib.SiteEnv(profile="web", observation="html", oracle_targets=True, base_url=site) as env:
    traj = expert.run_episode(env, policy, task)
    assert evaluators.evaluate(task, traj).success == 1.0
    first = env.bound_task.meta["session"]
    assert server.fetch_state(site, first)["orders"]  # the purchase is on the server
    context = env._context
    env.reset(task)
    assert env._context is context  # kept: the isolation comes from the new tab and the new session
    second = env.bound_task.meta["session"]
    assert second != first and len(env._context.pages) == 1
    state = server.fetch_state(site, second)
    assert not state["orders"] and not state["cart"]
    env.page.goto(f"{site}/s/{second}/shop/cart")
    assert "Your cart is empty" in env.page.inner_text("body")
