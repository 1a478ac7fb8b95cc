"""Filtered BC, DigiRL's baseline (`reference/algorithms.md` §4.7–4.8; the code's `train_algorithm: filteredbc`):
`configs/digirl.py` with `algorithm=filtered_bc`. The actor imitates every step of the top-10 % trajectories by
reward (`filterbc_buffer`: the successes, or everything when fewer than 10 % succeed), offline and then online.

  python -m jaxagent.main --config=configs/filtered_bc.py --workdir=/tmp/filtered_bc

Reports the IL actor, Filtered BC offline and Filtered BC off2on on the held-out test episodes. Every key and
variant of configs/digirl.py applies (`configs/filtered_bc.py:smoke`, `--config.mode=offline`, ...).
"""

from __future__ import annotations

import importlib.util
import os

_spec = importlib.util.spec_from_file_location("_digirl_config", os.path.join(os.path.dirname(__file__), "digirl.py"))
_digirl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_digirl)
VARIANTS = _digirl.VARIANTS


def get_config(arg=None):
  c = _digirl.get_config(arg)
  c.algorithm = "filtered_bc"
  return c
