"""`data_tools/curriculum_draws.py`: the two generators' draws from the same failures, counted."""

from data_tools import curriculum_draws


def test_variations_keep_the_failed_families_and_mutations_move_along_the_tiers():
  got = curriculum_draws.draws("text", failed=24, seed=3)
  assert sum(got["failed"]["families"].values()) == 24
  assert got["variations"]["families"] == got["failed"]["families"]  # each its failed task's template
  mutated = got["mutations"]
  assert sum(mutated["families"].values()) == sum(mutated["kinds"].values()) == 24
  assert set(mutated["kinds"]) <= {"change", "add", "subgoal", "variation"}
  for move, n in mutated["kind_tier_change"].items():
    kind, change = move.split()
    assert n > 0 and (int(change) >= 0 if kind == "subgoal" else True)  # a subgoal never lowers the tier
