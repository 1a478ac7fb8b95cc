"""WebRL's curriculum (`proj/webrl/curriculum.py`): the offline variations, and gen_task.py's LLM generator against a
real local OpenAI-compatible server (the judge tests' peer)."""

import dataclasses
import hashlib
import os
import re

import numpy as np
import pytest

from jaxagent import types
from jaxagent.proj.webrl import curriculum

JUDGES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "judges")
KEY_ENV = "JAXAGENT_TEST_GEN_KEY"


def _task(tid, template, intent):
  return types.Task(id=tid, intent=intent, site="shop", start_url="http://127.0.0.1/shop", template=template,
                    evaluator={"kind": "string_match", "exact_match": tid})


def _pool(sizes=None):
  sizes = sizes or {"A": 5, "B": 3}
  return [_task(f"{t}{i}", t, f"{t.lower()} intent {i}") for t, n in sizes.items() for i in range(n)]


def _source(pool, out_task):
  by_id = {t.id: t for t in pool}
  base, _, suffix = out_task.id.partition("@")
  return by_id[base], suffix


def test_variations_are_other_intents_of_the_failed_tasks_template():
  pool = _pool()
  a0 = pool[0]
  out = curriculum.variations([a0], pool, 4, seed=0, tag="p1-")
  assert len(out) == 4
  assert all(t.template == "A" and t.intent != a0.intent for t in out)
  # four other A intents exist, so no intent is drawn twice
  assert sorted(t.intent for t in out) == ["a intent 1", "a intent 2", "a intent 3", "a intent 4"]


def test_variations_prefer_fresh_intents_then_repeat():
  pool = _pool()
  out = curriculum.variations([pool[0]], pool, 6, seed=1, tag="x")
  first = [t.intent for t in out[:4]]
  assert len(set(first)) == 4  # fresh ones first
  assert all(t.intent in first for t in out[4:])  # then the already drawn ones
  assert all(t.intent != pool[0].intent for t in out)


def test_variations_cycle_the_failed_tasks_in_a_seeded_order():
  pool = _pool()
  a0, b0 = pool[0], pool[5]
  out = curriculum.variations([a0, b0], pool, 6, seed=3, tag="t")
  templates = [t.template for t in out]
  assert sorted(templates[:2]) == ["A", "B"]
  assert templates == templates[:2] * 3
  for t in out:
    assert t.intent != (a0 if t.template == "A" else b0).intent
  # 4 other A intents for 3 A draws, 2 other B intents for 3 B draws: all A fresh, both B ones used
  assert len({t.intent for t in out if t.template == "A"}) == 3
  assert {t.intent for t in out if t.template == "B"} == {"b intent 1", "b intent 2"}


def test_variation_ids_name_their_pool_task_and_the_rest_is_the_pool_task():
  pool = _pool()
  out = curriculum.variations([pool[1], pool[6]], pool, 5, seed=0, tag="ph2-")
  assert len({t.id for t in out}) == 5
  for k, t in enumerate(out):
    src, suffix = _source(pool, t)
    assert suffix == f"ph2-{k}"
    assert t.id == f"{src.id}@ph2-{k}"
    assert dataclasses.replace(t, id=src.id) == src  # same intent, evaluator, template ...


def test_a_template_with_no_other_intent_falls_back_to_the_pool():
  pool = _pool({"A": 3, "C": 1}) + [_task("C0bis", "C", "c intent 0")]  # C's tasks all share one intent
  out = curriculum.variations([pool[3]], pool, 4, seed=0, tag="f")
  ids = {t.id for t in pool}
  assert all(_source(pool, t)[0].id in ids for t in out)
  assert len({t.intent for t in out}) == 4  # the whole pool's 4 intents, fresh first


def test_no_failures_draw_pool_tasks():
  pool = _pool()
  out = curriculum.variations([], pool, 8, seed=0, tag="n")
  assert len(out) == 8
  assert all(_source(pool, t)[0] in pool for t in out)
  assert len({t.intent for t in out}) == 8  # 8 distinct intents in the pool, all fresh
  assert curriculum.variations([], pool, 0, seed=0, tag="n") == []


def test_variations_are_deterministic_by_seed():
  pool = _pool({"A": 40, "B": 40})
  failed = [pool[0], pool[1], pool[40], pool[41], pool[42]]
  first = curriculum.variations(failed, pool, 20, seed=7, tag="s")
  again = curriculum.variations(failed, pool, 20, seed=7, tag="s")
  other = curriculum.variations(failed, pool, 20, seed=8, tag="s")
  assert [t.id for t in first] == [t.id for t in again]
  assert [t.id for t in first] != [t.id for t in other]


def test_round0_prompt_is_filter_by_critics_f_string():
  task, html = "Find the cheapest mug", '<html><a id="1">Mugs</a></html>'
  expected = (f"Task Instruction: {task}\n\nRound 0\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
              f"{html}\n\n<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n")
  assert curriculum.round0_prompt(task, html) == expected


# ------------------------------------------------------------------------------- the LLM generator

# sha256 of THUDM/WebRL:scripts/gen_task.py's PROMPT (commit fa8439e), the text between its triple quotes
GEN_TASK_PROMPT_SHA256 = "2c482a64efdc8b113b02e22cc74b850aea72a453bd7afacb63320147807791cb"


@pytest.fixture
def peer(monkeypatch):
  monkeypatch.syspath_prepend(JUDGES)
  import openai_peer  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(KEY_ENV, "sk-test")
  with openai_peer.Peer() as p:
    yield p


def _generator(peer, **kw):
  return curriculum.OpenAIGenerator(dict(base_url=peer.base_url, api_key_env=KEY_ENV, **kw))


def _forum(i):
  return types.Task(id=f"F{i}", intent=f"forum intent {i}", site="forum", start_url="http://127.0.0.1/forum",
                    template="F", evaluator={"kind": "string_match", "exact_match": "x"}, meta={"part": "a"})


def test_the_prompt_is_gen_tasks_byte_for_byte():
  assert hashlib.sha256(curriculum.TASK_PROMPT.encode()).hexdigest() == GEN_TASK_PROMPT_SHA256
  prompt = curriculum.task_prompt("shop", [" a intent 1 ", "b {intent} 2"])
  assert prompt.endswith("#Given Task#\n- `a intent 1`\n- `b {intent} 2`\n\n#Created Task#\n")
  assert "when they use shop in their daily lives" in prompt and "using shop website." in prompt


def test_a_reply_with_three_backticked_tasks_gives_three_tasks():
  reply = ("Sure! Here are new tasks:\n\n1. `Find the cheapest mug`\n2. `Show reviews of \"Blue Kettle\"`\n"
           "- `List the 3 newest orders`\nNo backticks here.")
  assert curriculum.extract_tasks(reply) == ["Find the cheapest mug", 'Show reviews of "Blue Kettle"',
                                             "List the 3 newest orders"]
  assert curriculum.extract_tasks("no tasks") == []


def test_two_turns_per_site_with_up_to_10_backticked_seeds_over_http(peer):
  failed = _pool({"A": 8, "B": 4}) + [_forum(i) for i in range(3)]
  gen = _generator(peer)
  tasks, lost = gen.generate(failed, seed=0, tag="p1.")
  bodies = peer.state.bodies
  assert lost == 0 and len(bodies) == 4 and gen.stats.requests == 4
  by_intent = {t.intent: t for t in failed}
  for body, site, n in zip(bodies, ["shop", "shop", "forum", "forum"], [10, 10, 3, 3]):
    assert body["model"] == "gpt-4o-2024-05-13"
    assert (body["temperature"], body["top_p"]) == (1.0, 1.0)
    assert [m["role"] for m in body["messages"]] == ["user"]
    prompt = body["messages"][0]["content"]
    seeds = re.findall(r"^- `([^`]+)`$", prompt, flags=re.M)
    assert len(seeds) == len(set(seeds)) == n and all(by_intent[i].site == site for i in seeds)
    assert prompt == curriculum.TASK_PROMPT.format(web=site, task_examples="\n".join(f"- `{i}`" for i in seeds))
  assert bodies[0]["messages"] != bodies[1]["messages"]  # each turn draws its own seeds
  assert len(tasks) == 12 and len({t.id for t in tasks}) == 12  # 3 tasks a reply
  assert [t.site for t in tasks] == ["shop"] * 6 + ["forum"] * 6
  by_id = {t.id: t for t in failed}
  for t in tasks:  # on the site and start page of a seed, without evaluator
    source = by_id[t.meta["seed_task"]]
    assert (t.site, t.start_url, t.profile) == (source.site, source.start_url, source.profile)
    assert t.evaluator == {} and t.oracle is None and t.template == "" and curriculum.GENERATED in t.meta
    assert "part" not in t.meta and t.meta["generated_by"] == "openai:gpt-4o-2024-05-13"
  assert "Show the newest forum items" in [t.intent for t in tasks]


def test_a_turn_without_a_reply_gives_no_tasks(monkeypatch):
  monkeypatch.syspath_prepend(JUDGES)
  import openai_peer  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(KEY_ENV, "sk-test")
  with openai_peer.Peer(openai_peer.PeerState(fault_rate=1.0, faults=["500"])) as p:
    gen = curriculum.OpenAIGenerator(dict(base_url=p.base_url, api_key_env=KEY_ENV, turns=1))
    gen._api.config.max_retries = 0  # pylint: disable=protected-access
    tasks, lost = gen.generate(_pool({"A": 2}), seed=0, tag="x")
  assert tasks == [] and lost == 1 and gen.stats.failures == {"5xx": 1}


def test_drop_intents_ignores_case_and_spacing():
  tasks = [_task("x", "A", "Show  the newest shop items"), _task("y", "A", "keep me")]
  kept, dropped = curriculum.drop_intents(tasks, ["show the newest SHOP items "])
  assert [t.id for t in kept] == ["y"] and dropped == 1


def test_the_recipe_drops_test_intents_and_asks_once(peer, tmp_path):
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import webrl  # pylint: disable=g-import-not-at-top
  train = _pool()
  test = [_task("T0", "A", "Show the newest shop items"), _task("T1", "A", "a intent 9")]
  tasks_lib.write_tasks(str(tmp_path / "tasks" / "train.jsonl"), train)
  tasks_lib.write_tasks(str(tmp_path / "tasks" / "test.jsonl"), test)
  tasks_lib.write_tasks(str(tmp_path / "orm" / "failed.jsonl"), train[:3])
  config = webrl_config.get_config()
  config.curriculum.generator = "openai"
  config.curriculum.openai.update(base_url=peer.base_url, api_key_env=KEY_ENV)
  webrl.check_config(config)
  out = tmp_path / "phase1" / "curriculum"
  out.mkdir(parents=True)
  candidates, info = curriculum.candidates(config, str(tmp_path), 1, 96, str(out))
  assert len(peer.state.bodies) == 2  # one site, two turns
  # each reply's second task is the test intent "Show the newest shop items": dropped twice, counted
  assert (info["generated"], info["test_intent_drops"], info["candidates"]) == (6, 2, 4) == (6, 2, len(candidates))
  assert info["failed_seeds"] == 3 and info["turns_without_reply"] == 0
  assert not {c.intent for c in candidates} & {t.intent for t in test}
  assert all(c.evaluator == {} and c.site == "shop" for c in candidates)
  again, _ = curriculum.candidates(config, str(tmp_path), 1, 96, str(out))  # a resumed stage
  assert len(peer.state.bodies) == 2 and [c.id for c in again] == [c.id for c in candidates]


def test_generated_tasks_are_unjudged_and_the_orm_agreement_skips_them():
  from jaxagent.judges.evaluators import ProgrammaticJudge  # pylint: disable=g-import-not-at-top
  from jaxagent.proj.webrl import orm  # pylint: disable=g-import-not-at-top
  source = _pool()[0]
  made = curriculum.generated_task(source, "Find a mug", "gen-shop@p1.0", "openai:m")
  traj = types.Trajectory(made, answer="a mug")
  assert ProgrammaticJudge().evaluate(made, traj).success is None
  judged = orm.agreement(np.array([0.9, 0.9, 0.1]), [None, 1.0, 0.0])
  assert judged["episodes"] == 2 and judged["agreement"] == 1.0


def test_the_config_refuses_openai_without_base_url_before_any_work(tmp_path):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  from jaxagent import main  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.config import ConfigError, validate  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import webrl  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config()
  webrl.check_config(config)  # variations: the openai block is not read
  config.curriculum.generator = "openai"
  validate(config, webrl.CHOICES, {})
  with pytest.raises(ConfigError, match=r"config\.curriculum\.openai\.base_url is required"):
    webrl.check_config(config)
  workdir = tmp_path / "never-created"  # `jaxagent.main` calls check_config before any stage
  flags.FLAGS(["jaxagent.main", f"--config={webrl_config.__file__}", f"--workdir={workdir}"])
  try:
    flags.FLAGS.config.curriculum.generator = "openai"
    with pytest.raises(SystemExit, match=r"FATAL config error: config\.curriculum\.openai\.base_url is required"):
      main.main([])
  finally:
    flags.FLAGS.unparse_flags()
  assert not workdir.exists()
  config.curriculum.openai.base_url = "http://127.0.0.1:9/v1"
  webrl.check_config(config)
  config.curriculum.openai.turns = 0
  with pytest.raises(ConfigError, match=r"config\.curriculum\.openai\.turns=0"):
    webrl.check_config(config)
  config.curriculum.openai.turns = 2
  config.reward = "judge"
  with pytest.raises(ConfigError, match=r"config\.reward='judge'"):
    webrl.check_config(config)
  config.curriculum.generator = "gpt4o"
  with pytest.raises(ConfigError, match=r"config\.curriculum\.generator='gpt4o'"):
    validate(config, webrl.CHOICES, {})


# ------------------------------------------------------------------- mutations along the benchmark's tier axis


@pytest.fixture(scope="module")
def bench_pool():
  from jaxagent.envs.sites import bench  # pylint: disable=g-import-not-at-top
  return bench.generate(0, "text", 2, splits=("train_a", "train_c"))


def _params(task):
  return task.meta["params"]


def _one_step(seed, got):
  """The kind of mutation `got` is of `seed`, read off their parameters alone (None: none of them)."""
  a, b = _params(seed), _params(got)
  if got.meta["family"] == seed.meta["family"] and a.keys() == b.keys():
    diff = [k for k in a if a[k] != b[k]]
    if len(diff) == 1 and b[diff[0]] != "":
      return "add" if a[diff[0]] == "" else "change"
  if got.meta["family"] in curriculum.SUBGOAL_OF.get(seed.meta["family"], ()):
    return "subgoal"
  return None


@pytest.mark.slow
def test_mutations_are_one_step_along_the_tier_axis_of_each_failed_task(bench_pool):
  pool = bench_pool["train_c"]
  lookups = {(_params(t)["category"], _params(t)["brand"]) for t in pool if t.meta["family"] == "lookup"}
  seed = next(t for t in bench_pool["train_a"] if t.meta["family"] == "filter" and not _params(t)["colour"]
              and (_params(t)["category"], _params(t)["brand"]) in lookups)  # a colour to add, a lookup above
  out, counts = curriculum.mutations([seed], pool, 30, seed=0, tag="p1.")
  assert len(out) == 30 and sum(counts.values()) == 30
  assert set(counts) == {"change", "add", "subgoal"}  # all three kinds exist for it and each was drawn
  for task in out:
    kind = task.meta["mutation"]["kind"]
    assert task.meta["mutation"]["from"] == seed.meta["intent_id"]
    assert _one_step(seed, task) == kind, (kind, _params(seed), task.meta["family"], _params(task))
    assert task.id.startswith(f"{task.id.partition('@')[0]}@p1.") and task.evaluator
    if kind == "subgoal":  # a lookup of the same category and brand
      assert task.meta["family"] == "lookup"
      assert all(_params(task)[k] == _params(seed)[k] for k in ("category", "brand"))
  by_kind = curriculum._mutants(seed, {f: [t for t in pool if t.meta["family"] == f] for f in ("filter", "lookup")},
                                curriculum.MUTATIONS)
  for kind, options in by_kind.items():  # fresh intents first: each kind's draws repeat none until all are drawn
    drawn = [t.intent for t in out if t.meta["mutation"]["kind"] == kind]
    assert len(set(drawn)) == min(len(drawn), len({t.intent for t in options})), kind


def test_mutation_kinds_are_chosen_by_the_config_and_a_seed_without_a_step_gets_a_variation(bench_pool):
  pool = bench_pool["train_c"]
  cart = next(t for t in bench_pool["train_a"] if t.meta["family"] == "cart")
  out, counts = curriculum.mutations([cart], pool, 12, seed=1, tag="x", kinds=("subgoal",))
  assert counts == {"subgoal": 12}
  assert {t.meta["family"] for t in out} <= {"buy", "cross"}
  cross = [t for t in out if t.meta["family"] == "cross"]
  assert all(_params(t)["product"] == _params(cart)["product"] for t in cross)  # its shared parameter kept
  buy = next(t for t in bench_pool["train_a"] if t.meta["family"] == "buy")  # nothing sits above a purchase
  out, counts = curriculum.mutations([buy], pool, 3, seed=1, tag="x", kinds=("subgoal",))
  assert counts == {"variation": 3} and all(t.template == buy.template and "mutation" not in t.meta for t in out)
  templated = _pool()  # a template suite's tasks carry no benchmark parameters: `variations`' draw
  out, counts = curriculum.mutations([templated[0]], templated, 4, seed=0, tag="p1-")
  assert counts == {"variation": 4}
  assert sorted(t.intent for t in out) == ["a intent 1", "a intent 2", "a intent 3", "a intent 4"]
  assert all(_source(templated, t)[1] == f"p1-{k}" for k, t in enumerate(out))


def test_mutations_are_deterministic_by_seed(bench_pool):
  pool = bench_pool["train_c"]
  failed = bench_pool["train_a"][::400][:6]
  first, _ = curriculum.mutations(failed, pool, 10, seed=5, tag="t")
  again, _ = curriculum.mutations(failed, pool, 10, seed=5, tag="t")
  other, _ = curriculum.mutations(failed, pool, 10, seed=6, tag="t")
  assert [t.id for t in first] == [t.id for t in again] != [t.id for t in other]


def test_the_recipe_draws_mutations_from_its_pool_and_refuses_an_unknown_kind(bench_pool, tmp_path):
  from configs import webrl as webrl_config  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.config import ConfigError, validate  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import webrl  # pylint: disable=g-import-not-at-top
  config = webrl_config.get_config("bench")
  assert config.curriculum.generator == "mutations"
  validate(config, webrl.CHOICES, webrl.LISTS)
  tasks_lib.write_tasks(str(tmp_path / "tasks" / "train_c.jsonl"), bench_pool["train_c"])
  tasks_lib.write_tasks(str(tmp_path / "orm" / "failed.jsonl"), bench_pool["train_a"][::500])
  found, info = curriculum.candidates(config, str(tmp_path), 1, 20, str(tmp_path))
  assert len(found) == info["candidates"] == sum(info["mutations"].values()) == 20
  pool_ids = {t.id for t in bench_pool["train_c"]}
  assert all(t.id.partition("@")[0] in pool_ids for t in found)
  config.curriculum.kinds = "change,grow"
  with pytest.raises(ConfigError, match=r"config\.curriculum\.kinds='change,grow'"):
    validate(config, webrl.CHOICES, webrl.LISTS)
