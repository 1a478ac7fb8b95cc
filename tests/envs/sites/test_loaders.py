"""WebVoyager JSONL and WebArena config loaders: into `Task`, with errors that name line and field."""

import json

import pytest

from jaxagent.envs.sites import TaskFileError, load_webarena, load_webvoyager


def test_webvoyager_jsonl_and_reference_answers(tmp_path):
  path = tmp_path / "WebVoyager_data.jsonl"
  rows = [{"web_name": "Allrecipes", "id": "Allrecipes--0", "ques": "Find a vegan lasagna recipe.",
           "web": "https://www.allrecipes.com/"},
          {"web_name": "GitHub", "id": "GitHub--3", "ques": "How many stars does jax have?",
           "web": "https://github.com/", "domain": "Info"}]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  refs = tmp_path / "reference_answer.json"
  refs.write_text(json.dumps({"GitHub": {"notice": "", "answers": [{"id": 3, "type": "golden", "ans": "30k"}]}}))
  tasks = load_webvoyager(str(path), str(refs))
  assert [t.id for t in tasks] == ["Allrecipes--0", "GitHub--3"]
  assert tasks[0].intent == "Find a vegan lasagna recipe." and tasks[0].start_url == "https://www.allrecipes.com/"
  assert tasks[0].site == "web" and tasks[0].max_steps == 15 and tasks[0].evaluator == {}
  assert tasks[1].evaluator == {"kind": "string_match", "must_include": ["30k"]}
  assert tasks[1].meta == {"web_name": "GitHub", "domain": "Info"}


def test_webvoyager_missing_field_is_named(tmp_path):
  path = tmp_path / "t.jsonl"
  path.write_text(json.dumps({"web_name": "A", "id": "A--0", "ques": "q", "web": "https://a.com/"}) + "\n" +
                  json.dumps({"web_name": "A", "id": "A--1", "web": "https://a.com/"}) + "\n")
  with pytest.raises(TaskFileError, match=r"t.jsonl:2: field 'ques' is missing"):
    load_webvoyager(str(path))


WEBARENA = {"sites": ["shopping"], "task_id": 21, "require_login": True,
            "storage_state": "./.auth/shopping_state.json", "start_url": "__SHOPPING__", "geolocation": None,
            "intent_template": "List the customer names who complain about {{product}}",
            "instantiation_dict": {"product": "the ear cups"}, "intent": "List the customers who complain",
            "require_reset": False,
            "eval": {"eval_types": ["string_match", "url_match"],
                     "reference_answers": {"must_include": ["Catso", "Dibbins"]},
                     "reference_url": "__SHOPPING__/review/", "program_html": [], "string_note": ""},
            "intent_template_id": 222}


def test_webarena_config(tmp_path):
  path = tmp_path / "test.raw.json"
  path.write_text(json.dumps([WEBARENA]))
  [task] = load_webarena(str(path), {"__SHOPPING__": "http://localhost:7770"})
  assert task.id == "webarena.21" and task.start_url == "http://localhost:7770" and task.max_steps == 30
  assert task.evaluator == {"kind": "all", "checks": [
      {"kind": "string_match", "must_include": ["Catso", "Dibbins"]},
      {"kind": "url_match", "url": "http://localhost:7770/review/", "url_note": "GOLD in PRED"}]}
  assert task.template == "222" and task.meta["storage_state"] == "./.auth/shopping_state.json"


def test_webarena_errors_name_the_field(tmp_path):
  path = tmp_path / "c.json"
  path.write_text(json.dumps(WEBARENA))
  with pytest.raises(TaskFileError, match=r"'start_url' uses __SHOPPING__"):
    load_webarena(str(path), {})
  path.write_text(json.dumps({**WEBARENA, "eval": {"eval_types": ["vibes"]}}))
  with pytest.raises(TaskFileError, match=r"c.json\[0\]: field 'eval.eval_types' has 'vibes'"):
    load_webarena(str(path), {"__SHOPPING__": "http://x"})
