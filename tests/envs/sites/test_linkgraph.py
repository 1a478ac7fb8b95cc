"""The sites as an in-process link graph: the same pages as the HTTP server, the expert at every level, the random
policy's floor, and the same perturbations for two different policies in one episode."""

import collections
import dataclasses
import random

import httpx
import pytest

from jaxagent.envs.sites import bench, linkgraph, pages, server
from jaxagent.judges.evaluators import ProgrammaticJudge


def judged(ep):
  return ProgrammaticJudge(fetch_state=lambda _: ep.state).evaluate(ep.task, ep.trajectory).success


# one profile at the hardest level in the README's command; the others over their ~200 intents in the long lane
@pytest.mark.parametrize("profile,level", [pytest.param("web", 0, marks=pytest.mark.long), ("device", 2),
                                           pytest.param("text", 1, marks=pytest.mark.long)])
@pytest.mark.slow
def test_the_expert_solves_every_headline_intent(profile, level):
  env = linkgraph.LinkEnv(0)
  failures = collections.Counter()
  head = bench.headline(bench.generate(0, profile, level, splits=bench.HEADLINE))
  for task in head:
    if judged(linkgraph.run(env, linkgraph.LinkExpert(), task, seed=0)) != 1.0:
      failures[task.meta["family"]] += 1
  assert not failures, failures


@pytest.mark.slow
def test_a_random_policy_stays_at_the_floor_on_tiers_2_and_3():
  env = linkgraph.LinkEnv(0)
  suite = bench.generate(0, "device", 2, splits=("train_c",))["train_c"]
  rng = random.Random(0)
  by_tier = collections.defaultdict(list)
  for task in rng.sample([t for t in suite if t.meta["tier"] >= 2], 400):
    by_tier[task.meta["tier"]].append(judged(linkgraph.run(env, linkgraph.RandomLinkPolicy(), task, seed=1)))
  for tier, outcomes in by_tier.items():
    assert sum(outcomes) / len(outcomes) <= 0.02, (tier, sum(outcomes), len(outcomes))


def test_the_in_process_pages_are_the_servers_bytes():
  """The expert's whole episode (a level-2 `buy`: GETs, form posts, a pop-up or failure where drawn) replayed
  against the real HTTP server, same session and perturbation: the same HTML at every step."""
  task = next(t for t in bench.generate(0, "web", 2, splits=("test_comb",))["test_comb"]
              if t.meta["family"] == "buy")
  task = dataclasses.replace(task, meta={**task.meta, "perturb": {**task.meta["perturb"], "seed": 3}})
  env = linkgraph.LinkEnv(0)
  seen = []

  class Recording(linkgraph.LinkExpert):
    def act(self, env, acts, rng):
      act = super().act(env, acts, rng)
      seen.append((env.html, act, dict(env.typed)))
      return act

  ep = linkgraph.run(env, Recording(), task, seed=0)
  assert judged(ep) == 1.0
  with server.SiteServer(port=0) as s:
    server.start_episode(s.base_url, linkgraph.SESSION, server.perturbation_of(task))
    client = httpx.Client(base_url=s.base_url, follow_redirects=True)
    html = client.get(task.start_url.replace("__SITES__", linkgraph.ROOT)).text
    typed = {}
    for expected, act, typed_before in seen:
      assert html == expected
      if act.kind == "link":
        html = client.get(linkgraph.ROOT + act.target).text
      elif act.kind == "search":
        html = client.get(linkgraph.ROOT + act.target, params={"q": act.text}).text
      elif act.kind in ("type", "choose"):
        typed = {**typed_before, act.target: act.text}
      elif act.kind == "submit":
        form = pages.parse(html).forms[act.form]
        values = {f.name: typed.get(f.name, f.value) for f in form.fields
                  if f.name and (f.type != "radio" or typed.get(f.name, f.value if f.checked else None) == f.value)}
        html = client.post(linkgraph.ROOT + act.target, data=values).text
        typed = {}
      elif act.kind == "back":
        raise AssertionError("the expert went back in this episode; replay BACK too")
    assert server.fetch_state(s.base_url, linkgraph.SESSION)["orders"] == ep.state["orders"]


@pytest.mark.slow
def test_two_policies_meet_the_same_perturbations_in_one_episode():
  """What a policy meets at its n-th request or page view depends on the episode, not on the policy: the expert
  and a noisy policy (other actions, other pages) see failures at the same request numbers, the pop-up at the same
  view and the same layout."""
  tasks = [t for t in bench.generate(0, "web", 2, splits=("test_comb",))["test_comb"]
           if t.meta["family"] in ("filter", "lookup")][:24]
  env = linkgraph.LinkEnv(0)
  compared = collections.Counter()

  def meets(policy, task):
    seen = {"failed": {}, "popup": {}, "layout": set()}

    class Watch(type(policy)):
      def act(self, env, acts, rng):
        st = env.state
        seen["failed"][st.page_gets] = bool(pages.select(env.page, "#retry"))
        seen["popup"][st.page_views] = st.popup_open
        if env.url.startswith("/shop/c/") and not st.popup_open and not pages.select(env.page, "#retry"):
          seen["layout"].add((bool(pages.select(env.page, "div.sort-list")),
                              bool(pages.select(env.page, "nav.cats[style]"))))
        return super().act(env, acts, rng)

    watch = Watch.__new__(Watch)
    watch.__dict__.update(policy.__dict__)
    linkgraph.run(env, watch, task, seed=7)
    return seen

  for task in tasks:
    a = meets(linkgraph.LinkExpert(), task)
    b = meets(linkgraph.NoisyLinkPolicy(epsilon=0.6, shortcut=1.0), task)
    common = set(a["failed"]) & set(b["failed"])
    assert all(a["failed"][k] == b["failed"][k] for k in common), task.id
    compared["failed"] += sum(a["failed"][k] for k in common)
    first = [min((k for k, up in m["popup"].items() if up), default=None) for m in (a, b)]
    reach = min(max(a["popup"]), max(b["popup"]))
    if any(f is not None and f <= reach for f in first):  # both got as far as the pop-up's view
      assert first[0] == first[1], task.id
      compared["popup"] += 1
    if a["layout"] and b["layout"]:
      assert a["layout"] == b["layout"], task.id
      compared["layout"] += 1
  assert compared["failed"] and compared["popup"] and compared["layout"]  # the comparison was not vacuous


@pytest.mark.slow
def test_noisy_policy_mix_is_controllable():
  """`repair` clicks a wrong sibling (another brand, sort or colour) that the expert's next action repairs;
  `shortcut` takes the deal whenever it is offered."""
  env = linkgraph.LinkEnv(0)
  level0 = [t for t in bench.generate(0, "web", 0, splits=("train_c",))["train_c"]
            if t.meta["family"] == "filter" and t.meta["params"]["order"]][:30]
  pairs = successes = 0
  for k, task in enumerate(level0):
    ep = linkgraph.run(env, linkgraph.NoisyLinkPolicy(epsilon=0, stop_prob=0, shortcut=0, repair=0.3), task, seed=k)
    targets = [a.target for _, a in ep.steps if a.kind == "link"]
    pairs += sum(linkgraph._siblings(linkgraph.Act("link", b), [linkgraph.Act("link", a)]) != []  # pylint: disable=protected-access
                 for a, b in zip(targets, targets[1:]))
    successes += judged(ep) == 1.0
  assert pairs >= 10 and successes >= 27  # wrong steps, repaired within the cap
  level2 = [t for t in bench.generate(0, "web", 2, splits=("train_c",))["train_c"] if t.meta["family"] == "filter"][:40]
  deals = 0
  for task in level2:
    ep = linkgraph.run(env, linkgraph.NoisyLinkPolicy(epsilon=0, stop_prob=0, shortcut=1.0), task, seed=0)
    took = any(a.target == "/shop/deal" for _, a in ep.steps)
    assert took == server.perturbation_of(task).has_deal, task.id
    deals += took
  assert deals >= 5
  with pytest.raises(ValueError, match="repair"):
    linkgraph.NoisyLinkPolicy(repair=2)
