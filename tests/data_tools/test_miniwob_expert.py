"""`data_tools/miniwob_expert.py`: the solvers' table from a spawned worker, and the results page it writes."""

import json

import pytest

from data_tools import miniwob_expert

pytestmark = pytest.mark.browser


@pytest.mark.slow
def test_table_json_and_page_keep_their_notes(tmp_path, capsys):
  page, rows = tmp_path / "miniwob.md", tmp_path / "rows.json"
  page.write_text(f"old table\n\n{miniwob_expert.NOTES}\nwhy some tasks are left out\n")
  assert miniwob_expert.main(["--tasks", "click-test,enter-text", "--seeds", "2", "--workers", "1",
                              "--json", str(rows), "--out", str(page)]) == 0
  result = json.loads(rows.read_text())
  assert result["qualifying"] == ["click-test", "enter-text"]
  enter = next(r for r in result["rows"] if r["task"] == "enter-text")
  assert (enter["train_success"], enter["test_success"], enter["mean_steps"], enter["test_utterances"]) == (1, 1, 2, 2)
  text = page.read_text()
  assert "| enter-text | 100% | 100% | 2.00 (2) | 2 (0) | 2 |" in text and "old table" not in text
  assert text.endswith(f"{miniwob_expert.NOTES}\nwhy some tasks are left out\n")
  assert "TRAINING_TASKS = ('click-test', 'enter-text')" in capsys.readouterr().out
