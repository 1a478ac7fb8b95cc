"""The README's test command, the multi-process lane and the long lane (`scripts/test.sh --lane`): which tests each
selects, and CI running all three, the README's first."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


MODULES = ("tests/test_main.py", "tests/data_tools/test_bench_check.py")


def _collected(*args):
  out = subprocess.run(["bash", "scripts/test.sh", *args, "--collect-only", "-n", "0", *MODULES],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return {line.split("::")[1] for line in out.stdout.splitlines() if line.startswith(MODULES)}


@pytest.mark.slow
def test_each_lane_selects_its_tests_and_ci_runs_them_all():
  main, every = _collected(), _collected("--lane", "all")
  multiprocess, long = _collected("--lane", "multiprocess"), _collected("--lane", "long")
  assert multiprocess == {"test_a_process_compiling_past_gloos_30_s_is_waited_for"}
  assert long == {"test_tabular_margins_hold_at_level_2"}
  assert _collected("--lane", "multiprocess,long") == multiprocess | long
  assert main and not main & (multiprocess | long) and main | multiprocess | long == every
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    commands = [line.strip() for line in f if line.strip().startswith(("bash", "exec"))]
  assert commands == ["bash scripts/setup.sh test", "bash scripts/test.sh",
                      "exec bash scripts/test.sh --lane multiprocess,long"]
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    assert "bash scripts/setup.sh test && bash scripts/test.sh\n" in f.read()  # the README's test command
  bad = subprocess.run(["bash", "scripts/test.sh", "--lane", "nightly"], cwd=ROOT, capture_output=True, text=True)
  assert bad.returncode == 2 and "choose main, multiprocess, long" in bad.stderr
