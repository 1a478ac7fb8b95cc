"""The scripted expert through real Chromium in every profile and agent format, judged by the evaluators;
the noisy expert; and 8 pooled environments on one site server keeping separate state."""

import re

import pytest

from jaxagent.envs.pool import EnvPool
from jaxagent.envs.sites import env as env_lib
from jaxagent.envs.sites import expert, server, tasks
from jaxagent.judges import evaluators
from jaxagent.rl.collector import collect

pytestmark = pytest.mark.browser

# Between them: state changes through forms, information and navigation tasks, the phone. WebRL (simplified HTML)
# is exercised by the 8-env pool test below, which solves 8 cart tasks with it.
CASES = [
    ("web", "webvoyager", ("shop_buy", "forum_author")),
    ("text", "openwebvoyager", ("forum_reply", "shop_brand_filter")),
    ("device", "autoui", ("shop_add_to_cart", "forum_location")),
]


@pytest.fixture(scope="module")
def site():
  with server.SiteServer() as s:
    yield s.base_url


@pytest.fixture(scope="module")
def test_suite():
  return tasks.generate(seed=0)["test"]


def _pick(suite, profile, template):
  return next(t for t in suite if t.profile == profile and t.template == template)


@pytest.mark.slow
@pytest.mark.parametrize("profile, format_name, templates", CASES, ids=[f"{p}-{f}" for p, f, _ in CASES])
def test_expert_solves_sample_tasks(site, test_suite, profile, format_name, templates):
  policy = expert.ScriptedExpert(format_name)
  with env_lib.SiteEnv(profile=profile, observation=expert.FORMAT_OBSERVATION[format_name], oracle_targets=True,
                       base_url=site) as env:
    for template in templates:
      task = _pick(test_suite, profile, template)
      traj = expert.run_episode(env, policy, task)
      verdict = evaluators.evaluate(task, traj)
      assert verdict.success == 1.0, (task.id, verdict.reason, [s.action_text for s in traj.steps])
      # the texts are the format's own: they parse back to the actions that were executed
      for s in traj.steps:
        assert policy.fmt.parse(s.action_text) == s.action
      if format_name == "autoui":
        assert all(re.match(r"Action Plan: \[[A-Z_]+\] ; Action Decision: ", s.action_text) for s in traj.steps)
        assert any('"action_type": "DUAL_POINT"' in s.action_text for s in traj.steps)


@pytest.mark.slow
def test_noisy_expert_rates_follow_its_parameters(site, test_suite):
  task = _pick(test_suite, "web", "forum_author")
  with env_lib.SiteEnv(profile="web", observation="som", oracle_targets=True, base_url=site) as env:
    stopper = expert.NoisyExpert("webvoyager", epsilon=0.0, stop_prob=1.0)
    traj = expert.run_episode(env, stopper, task)
    assert len(traj.steps) == 2 and traj.answer == "I am not sure."  # stops right after its first action
    assert evaluators.evaluate(task, traj).success == 0.0
    # random actions are drawn from the seed: the same seed replays the same episode
    a, b = ([s.action_text for s in expert.run_episode(env, expert.NoisyExpert("webvoyager", 0.5, 0.0, seed=3), task,
                                                       max_steps=4).steps] for _ in range(2))
    assert a == b and any("something else" in t for t in a)


def test_expert_needs_oracle_observations():
  from jaxagent.types import Observation
  with pytest.raises(ValueError, match="oracle_targets=True"):
    expert.ScriptedExpert("webvoyager").act([Observation()], [[]])
  with pytest.raises(ValueError, match="format_name"):
    expert.ScriptedExpert("gpt5")


@pytest.mark.slow
def test_eight_pooled_envs_on_one_server_keep_separate_state(site, test_suite):
  """8 subprocess browsers add 8 different products to their carts on the SAME server at the same time."""
  chosen = [t for t in test_suite if t.profile == "text" and t.template == "shop_add_to_cart"][:8]
  assert len({t.evaluator["checks"][0]["contains"]["product_id"] for t in chosen}) == 8
  policy = expert.ScriptedExpert("webrl")
  spec = {"kind": "jaxagent.envs.sites.env:SiteEnv", "profile": "text", "observation": "html",
          "oracle_targets": True, "base_url": site}
  with EnvPool(spec, num_workers=8, step_timeout=120, reset_timeout=120) as pool:
    trajs = collect(pool, policy, policy.fmt.parse, chosen, judge=evaluators.ProgrammaticJudge(), progress=False)
  sessions = {t.steps[-1].info["session"] for t in trajs}
  assert len(sessions) == 8
  for task, traj in zip(chosen, trajs):
    assert traj.success == 1.0, (task.id, traj.verdict_reason)
    assert all(re.fullmatch(r"# Note: .+\n(do|exit)\(.+\)", s.action_text) for s in traj.steps)
    state = server.fetch_state(site, traj.steps[-1].info["session"])
    want = task.evaluator["checks"][0]["contains"]
    assert [(i["product_id"], i["colour"], i["size"]) for i in state["cart"]] == [
        (want["product_id"], want["colour"], want["size"])]


def test_site_env_rejects_an_unknown_site_before_starting_chromium():
  from jaxagent.types import Task
  env = env_lib.SiteEnv(profile="web")
  for bad in (Task(id="a", intent="x", site="bank", start_url="__SITES__/bank/"),
              Task(id="b", intent="x", site="bank", start_url="http://127.0.0.1:1/"),
              Task(id="c", intent="x", site="shop", start_url="http://127.0.0.1:1/shop/")):
    with pytest.raises(ValueError, match="field '(site|start_url)'"):
      env.reset(bad)
  assert env.browser_pid is None and not env.alive()
  env.close()
