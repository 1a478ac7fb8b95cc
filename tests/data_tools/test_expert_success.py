"""`data_tools/expert_success.py`: the expert's success rate from spawned workers, each with its own server and
browser, from a task file as the command line takes it."""

import json

import pytest

from data_tools import expert_success
from jaxagent.envs.sites import tasks

pytestmark = pytest.mark.browser


@pytest.mark.slow
def test_success_rate_from_a_task_file(tmp_path, capsys):
  suite = tasks.generate(seed=0)["test"]
  chosen = [next(t for t in suite if t.profile == "text" and t.template == template)
            for template in ("forum_author", "settings_toggle")]
  task_file = tmp_path / "tasks.jsonl"
  task_file.write_text("".join(json.dumps(t.to_json()) + "\n" for t in chosen))
  out = tmp_path / "result.json"
  assert expert_success.main(["--profile", "text", "--format", "openwebvoyager", "--tasks", str(task_file),
                              "--workers", "1", "--json", str(out)]) == 0
  result = json.loads(out.read_text())
  assert (result["tasks"], result["successes"], result["failures"]) == (2, 2.0, [])
  assert result["by_template"] == {"forum_author": 1.0, "settings_toggle": 1.0}
  assert json.loads(capsys.readouterr().out)["success_rate"] == 1.0
