"""The SLURM and TPU VM launchers, run by bash with fake `srun` / `gcloud` on PATH that record the command they
were given; that command's flags must then parse as `jaxagent.main` parses them."""

import os
import shlex
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = [f"--config={ROOT}/configs/il.py:smoke", "--workdir=/tmp/never-written", "--config.optim.lr=0.01"]
_PARSE = """
import sys
from absl import flags
from jaxagent import main
main._parse_flags(["jaxagent.main", *sys.argv[1:]])
print(flags.FLAGS.config.distributed, flags.FLAGS.config.optim.lr)
"""


def _fake(bin_dir, name, log):
  path = bin_dir / name
  path.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {log}\n')
  path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _main_args(argv):
  """The arguments after `python -m jaxagent.main` in a recorded command."""
  i = argv.index("jaxagent.main")
  return argv[i + 1:]


def _parses(args):
  out = subprocess.run([sys.executable, "-c", _PARSE, *args], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  return out.stdout.split()


@pytest.mark.parametrize("script", ["slurm.sbatch", "tpu_vm.sh"])
def test_launcher_command_lines_parse_with_distributed_on(tmp_path, script):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "argv"
  _fake(bin_dir, "srun", log)
  _fake(bin_dir, "gcloud", log)
  env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
  extra = ["my-tpu", "us-central2-b"] if script == "tpu_vm.sh" else []
  subprocess.run(["bash", os.path.join(ROOT, "launch", script), *extra, *ARGS], env=env, check=True, timeout=60)
  argv = log.read_text().splitlines()
  if script == "tpu_vm.sh":  # the command runs on the workers through ssh: one string
    command = next(a for a in argv if a.startswith("--command=")).split("=", 1)[1]
    argv = shlex.split(command.split("&&", 1)[1])
  assert _parses(_main_args(argv)) == ["True", "0.01"]
