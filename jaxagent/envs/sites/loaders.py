"""Readers for the seeds' task files, into the same `Task` type as the bundled suites.

- WebVoyager JSONL (`reference/algorithms.md` §1.1): `{"web_name", "id", "ques", "web"}` per line, plus the
  Mind2Web variant's `domain`/`subdomain`/`website` keys; reference answers (`reference_answer.json`) become a
  `string_match` evaluator (`fuzzy_match` for "possible" answers, which need a judge).
- WebArena / WebArena-Lite configs (§3.1): one JSON object or a list of them; `__SHOPPING__`-style start URL
  placeholders are expanded from `site_urls`, and `eval` becomes the matching evaluator spec.

Every error names the file, the line (or list index) and the field.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jaxagent.envs.sites.tasks import TaskFileError, validate
from jaxagent.types import Task

WEBVOYAGER_FIELDS = ("web_name", "id", "ques", "web")
WEBARENA_PLACEHOLDER = re.compile(r"__[A-Z_]+__")


def _require(d: dict, fields, where: str) -> None:
  if not isinstance(d, dict):
    raise TaskFileError(f"{where}: a task must be a JSON object, got {type(d).__name__}")
  for f in fields:
    if f not in d:
      raise TaskFileError(f"{where}: field {f!r} is missing (this format needs {list(fields)})")


def load_webvoyager(path: str, reference_answers: str | None = None, max_steps: int = 15) -> list[Task]:
  """WebVoyager / OpenWebVoyager task JSONL; `reference_answers` is the optional `reference_answer.json`."""
  answers: dict[str, dict[str, Any]] = {}
  if reference_answers:
    with open(reference_answers) as f:
      for site, block in json.load(f).items():
        for a in block.get("answers", []):
          answers[f"{site}--{a['id']}"] = a
  tasks = []
  with open(path) as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{lineno}"
      try:
        d = json.loads(line)
      except json.JSONDecodeError as e:
        raise TaskFileError(f"{where}: not valid JSON ({e})") from None
      _require(d, WEBVOYAGER_FIELDS, where)
      for f_ in WEBVOYAGER_FIELDS:
        if not isinstance(d[f_], str) or not d[f_]:
          raise TaskFileError(f"{where}: field {f_!r} must be a non-empty string, got {d[f_]!r}")
      evaluator = {}
      ref = answers.get(d["id"])
      if ref is not None:
        key = "must_include" if ref.get("type") == "golden" else "fuzzy_match"
        evaluator = {"kind": "string_match", key: [ref["ans"]]}
      meta = {k: v for k, v in d.items() if k not in ("id", "ques", "web")}
      task = Task(id=d["id"], intent=d["ques"], site="web", start_url=d["web"], max_steps=max_steps,
                  evaluator=evaluator, split="test", template=d["web_name"], meta=meta)
      try:
        validate(task)
      except ValueError as e:
        raise TaskFileError(f"{where}: {e}") from None
      tasks.append(task)
  return tasks


def webarena_evaluator(ev: dict[str, Any], where: str) -> dict[str, Any]:
  """WebArena's `eval` block -> our evaluator spec (`EvaluatorComb` multiplies, so does `all`)."""
  if not isinstance(ev, dict) or not isinstance(ev.get("eval_types"), list):
    raise TaskFileError(f"{where}: field 'eval.eval_types' must be a list such as ['string_match']")
  checks = []
  for kind in ev["eval_types"]:
    if kind == "string_match":
      refs = ev.get("reference_answers") or {}
      if not isinstance(refs, dict) or not refs:
        raise TaskFileError(f"{where}: field 'eval.reference_answers' must name exact_match, must_include or "
                            "fuzzy_match for a string_match task")
      checks.append({"kind": "string_match", **refs})
    elif kind == "url_match":
      if not isinstance(ev.get("reference_url"), str):
        raise TaskFileError(f"{where}: field 'eval.reference_url' (a string) is needed for url_match")
      checks.append({"kind": "url_match", "url": ev["reference_url"],
                     "url_note": ev.get("url_note", "GOLD in PRED")})
    elif kind == "program_html":
      checks.append({"kind": "program_html", "program_html": ev.get("program_html", [])})
    else:
      raise TaskFileError(f"{where}: field 'eval.eval_types' has {kind!r}; WebArena knows string_match, "
                          "url_match and program_html")
  return checks[0] if len(checks) == 1 else {"kind": "all", "checks": checks}


def load_webarena(path: str, site_urls: dict[str, str], max_steps: int = 30) -> list[Task]:
  """WebArena(-Lite) config(s) -> tasks on the live web at `site_urls` (e.g. {"__SHOPPING__": "http://..."}).

  `program_html` checks are kept in the spec; the evaluators report them as unjudged (they need WebArena's
  page locators), so such tasks are judged by the LLM judge or the ORM instead.
  """
  with open(path) as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      raise TaskFileError(f"{path}: not valid JSON ({e})") from None
  configs = data if isinstance(data, list) else [data]
  tasks = []
  for k, d in enumerate(configs):
    where = f"{path}[{k}]"
    _require(d, ("task_id", "intent", "start_url", "eval"), where)
    start = d["start_url"]

    def expand(url: str, field: str) -> str:
      for ph in WEBARENA_PLACEHOLDER.findall(url):
        if ph not in site_urls:
          raise TaskFileError(f"{where}: field {field!r} uses {ph}; pass site_urls={{{ph!r}: 'http://...'}}")
        url = url.replace(ph, site_urls[ph].rstrip("/"))
      return url

    start = " |AND| ".join(expand(u.strip(), "start_url") for u in start.split("|AND|"))
    evaluator = webarena_evaluator(d["eval"], where)
    for check in evaluator.get("checks", [evaluator]):
      if check["kind"] == "url_match":
        check["url"] = " |OR| ".join(expand(u.strip(), "eval.reference_url") for u in check["url"].split("|OR|"))
    meta = {"sites": d.get("sites", []), "require_login": d.get("require_login", False),
            "storage_state": d.get("storage_state"), "require_reset": d.get("require_reset", False),
            "intent_template_id": d.get("intent_template_id"), "instantiation_dict": d.get("instantiation_dict", {})}
    task = Task(id=f"webarena.{d['task_id']}", intent=d["intent"], site="web", start_url=start.split(" |AND| ")[0],
                max_steps=max_steps, evaluator=evaluator, split="test",
                template=str(d.get("intent_template_id", "")), meta=meta)
    try:
      validate(task)
    except ValueError as e:
      raise TaskFileError(f"{where}: {e}") from None
    tasks.append(task)
  return tasks
