"""A probe's scores: what the pre-training recipe's probes stage and `data_tools/paired_probes.py` count."""

from __future__ import annotations

import re

from jaxagent import agents

# a reply's string, up to the next straight quote: WebRL's argument or message, the phone's typed text
_SAID = re.compile(r'(?:argument|message)="([^"]*)|"typed_text": "([^"]*)')


def probe_format(probe: dict):
  """The agent format a probe is asked in (its `format`; WebRL's for probes written before there were others)."""
  return agents.get_format(probe.get("format", "webrl"))


def probe_group(probe: dict) -> str:
  """The group a probe's scores are reported in: its skill, prefixed by its format where that is not WebRL's."""
  fmt = probe.get("format", "webrl")
  return probe["skill"] if fmt == "webrl" else f"{fmt}/{probe['skill']}"


def probe_scores(fmt, probe: dict, reply: str) -> dict[str, float]:
  """One probe's scores (1.0 right, 0.0 wrong): grounding where it names an element (the reply's id is that
  element's), copy where it asks for a string (the reply's typed or answered string is that one), and run_on there
  too (1.0: the reply's `argument` or `message` begins with the string asked and goes on past it, a copy that does
  not stop), exact always (the reply is the corpus's, character for character)."""
  action, out = fmt.parse(reply), {}
  if probe["element"]:
    out["grounding"] = float(action.element is not None and str(action.element) == probe["element"])
  if probe["text"]:
    out["copy"] = float(action.text == probe["text"])
    said = _SAID.search(reply)  # the reply's text, not the parse: a copy that runs on often breaks the call's syntax
    said = (said.group(1) or said.group(2) or "") if said else ""
    out["run_on"] = float(len(said) > len(probe["text"]) and said.startswith(probe["text"]))
  out["exact"] = float(reply.strip() == probe["conversations"][1]["value"].strip())
  return out
