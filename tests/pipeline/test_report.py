"""The closing table every recipe prints."""

from jaxagent.pipeline import report

RESULTS = {"sft": {"success_rate": 0.0, "episodes": 100, "temperature": 0.0, "mean_steps": 4.62},
           "a_long_policy_name": {"success_rate": 0.125, "episodes": 96, "temperature": 1.0, "mean_steps": 4.0}}


def test_policy_table_lists_each_policy_with_its_rate_episodes_temperature_and_steps():
  lines = report.policy_table(RESULTS).split("\n")
  assert lines[0].split() == ["policy", "success", "episodes", "temperature", "mean", "steps"]
  assert lines[1].split() == ["sft", "0.0%", "100", "0.00", "4.62"]
  assert lines[2].split() == ["a_long_policy_name", "12.5%", "96", "1.00", "4.00"]
  assert len({line.index("%") for line in lines[1:]}) == 1  # the columns line up whatever the names' lengths


def test_policy_table_keeps_the_order_and_subset_asked_for():
  lines = report.policy_table(RESULTS, ["a_long_policy_name"]).split("\n")
  assert len(lines) == 2 and lines[1].startswith("a_long_policy_name")
