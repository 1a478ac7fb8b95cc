"""The entry point: override typos name the nearest valid keys; the resolved config lands in the workdir."""

import json
import os
import subprocess
import sys

import pytest
from absl import app

from jaxagent import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IL = os.path.join(ROOT, "configs", "il.py")


def test_typo_in_override_names_nearest_keys():
  with pytest.raises(app.UsageError, match=r"did you mean --config\.optim\.lr"):
    main.check_overrides([f"--config={IL}", "--config.optim.lr_typo=1"])
  with pytest.raises(app.UsageError, match=r"--config\.train\.steps"):
    main.check_overrides([f"--config={IL}:smoke", "--config.train.stpes=3"])


def test_valid_overrides_pass():
  main.check_overrides([f"--config={IL}:smoke", "--config.optim.lr=0.1", "--config.data.seq_len=64"])


def test_flat_keys_cover_nested_blocks():
  keys = main.flat_keys(main.load_config_file(f"{IL}:smoke"))
  assert {"optim.lr", "data.path", "mesh.fsdp", "profile.start_step"} <= set(keys)


def test_cli_rejects_typo_and_writes_nothing(tmp_path):
  workdir = tmp_path / "w"
  proc = subprocess.run([sys.executable, "-m", "jaxagent.main", f"--config={IL}:smoke", f"--workdir={workdir}",
                         "--config.optim.lr_typo=1"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "did you mean --config.optim.lr" in proc.stderr
  assert not workdir.exists()


def test_unknown_recipe_names_the_registered_ones():
  from jaxagent import recipes
  with pytest.raises(ValueError, match="choose one of"):
    recipes.get("nope")


_COORDINATOR_PROBE = """
import psutil, sys
from jaxagent.main import init_distributed
init_distributed()
port = int(sys.argv[1])
print(sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp")
              if c.status == psutil.CONN_LISTEN and c.laddr.port == port}))
"""


def test_the_jax_coordinator_listens_on_the_address_it_is_given_not_every_interface():
  import socket
  import subprocess
  import sys
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "1",
         "JAX_PROCESS_ID": "0", "JAX_PLATFORMS": "cpu"}
  env.pop("JAXAGENT_COORDINATOR_BIND", None)
  out = subprocess.run([sys.executable, "-c", _COORDINATOR_PROBE, str(port)], env=env, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  import ast
  import ipaddress
  ips = [ipaddress.ip_address(ip) for ip in ast.literal_eval(out.stdout.strip().splitlines()[-1])]
  assert ips and all((getattr(ip, "ipv4_mapped", None) or ip).is_loopback for ip in ips), ips  # not [::] / 0.0.0.0
