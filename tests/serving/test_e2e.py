"""End to end over real HTTP: our server running a tiny VLM, the `openai` client inside `OpenAIPolicy` acting in a
real Chromium rollout on a bundled site (WebVoyager teacher prompt, history clipped), and inside `LLMJudge`
judging the collected trajectory."""

import dataclasses

import pytest

from jaxagent.agents import webvoyager_prompts as P
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.pool import EnvPool
from jaxagent.envs.sites import server as site_server
from jaxagent.envs.sites import tasks as site_tasks
from jaxagent.judges import llm
from jaxagent.policies import OpenAIPolicy, OpenAIPolicyConfig
from jaxagent.rl.collector import collect

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def rollout(server, tmp_path_factory):
  """Two steps of a bundled-site task acted by the served model through OpenAIPolicy."""
  task = next(t for t in site_tasks.generate(seed=0)["test"] if t.profile == "web" and t.template == "forum_author")
  task = dataclasses.replace(task, max_steps=2)
  policy = OpenAIPolicy(OpenAIPolicyConfig(base_url=server.url + "/v1", model="tiny-vlm", max_tokens=16,
                                           max_attached_imgs=1, api_key_env="JAXAGENT_NO_SUCH_KEY", max_retries=1))
  sent = []
  complete = policy._completer.complete
  policy._completer.complete = lambda messages: sent.append(messages) or complete(messages)  # records, then asks
  store = TrajectoryStore(tmp_path_factory.mktemp("store"))
  before = server.batcher.stats().get("requests", 0)
  with site_server.SiteServer() as site:
    spec = {"kind": "jaxagent.envs.sites.env:SiteEnv", "profile": "web", "observation": "a11y",
            "base_url": site.base_url}
    with EnvPool(spec, num_workers=1, step_timeout=120, reset_timeout=120) as pool:
      trajs = collect(pool, policy, policy.fmt.parse, [task], store=store, progress=False, policy_name="tiny-vlm")
  return policy, trajs[0], sent, store, server.batcher.stats().get("requests", 0) - before


@pytest.mark.slow
def test_openai_policy_acts_through_our_server(rollout):
  policy, traj, sent, _, served = rollout
  assert traj.status == "truncated" and len(traj.steps) == 2, (traj.status, traj.error)
  assert served == 2 and len(sent) == 2 and policy.stats.api_calls == 2 and not policy.stats.failures
  assert policy.stats.completion_tokens > 0
  # the random model's text is the action text, parsed by the teacher's format (a Format ERROR, fed back)
  assert all(s.action_text for s in traj.steps)
  assert traj.steps[1].observation.error == P.FORMAT_ERROR or traj.steps[0].action.kind.value != "invalid"
  first, second = sent
  assert first[0] == {"role": "system", "content": P.SYSTEM_PROMPT_ACTREE_IMAGE}
  assert [p["type"] for p in first[1]["content"]] == ["text", "image"]
  assert first[1]["content"][0]["text"].startswith("Now given a task: " + traj.task.intent)
  # step 2: the first turn's screenshot is clipped away (max_attached_imgs=1), the assistant turn kept
  assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
  assert isinstance(second[1]["content"], str) and second[1]["content"].endswith(P.CLIPPED_OBS)
  assert second[2]["content"] == traj.steps[0].action_text
  assert [p["type"] for p in second[3]["content"]] == ["text", "image"]


def test_llm_judge_through_our_server(server, rollout):
  _, traj, _, store, _ = rollout
  traj.answer = "The author is alice."  # judged as if the episode had answered
  judge = llm.LLMJudge(llm.LLMJudgeConfig(base_url=server.url + "/v1", model="tiny-vlm", max_tokens=16,
                                          api_key_env="JAXAGENT_NO_SUCH_KEY", image_root=store.path, max_retries=1))
  verdict = judge.evaluate(traj.task, traj)
  assert judge.stats.api_calls == 1 and judge.stats.completion_tokens > 0 and not judge.stats.failures
  # greedy decoding: asking again gives the same reply, which parses to the same verdict
  images = [s.image_path for s in traj.steps if s.image_path][-judge.config.max_attached_imgs:]
  assert len(images) == 2
  reply = judge.complete(llm.webvoyager_messages(traj.task.intent, traj.answer, images, 3))
  assert verdict == llm.parse_webvoyager_verdict(reply)
