"""A static HTML page of one stored trajectory: each step's screenshot, prompt and action, and (Digi-Q) its
candidate actions ranked by Q with Q − V — the seeds' Gradio viewers (`vis/view_trajs.py`,
`vis/view_actions.py`, `reference/algorithms.md` §5.9) as one self-contained file (images inlined).

  python data_tools/view_trajectory.py --store DIR/store --index 0 --out traj.html \
      [--scores DIR/critic/scores.npz]

`scores.npz` (written by the Digi-Q critic stage) holds `rows` [M, 2] (trajectory index, step index), `q`
[M, N, 2] and `v` [M, 2] (both heads).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxagent.proj.digiq.viewer import render_html, scores_for  # noqa: E402  pylint: disable=g-import-not-at-top


def main(argv=None) -> None:
  from jaxagent.data.store import TrajectoryStore  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--store", required=True)
  p.add_argument("--index", type=int, default=0)
  p.add_argument("--scores", default="")
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  store = TrajectoryStore(a.store)
  if not 0 <= a.index < len(store):
    sys.exit(f"--index {a.index}: the store holds {len(store)} trajectories")
  scores = scores_for(dict(np.load(a.scores)), a.index) if a.scores else None
  with open(a.out, "w", encoding="utf-8") as f:
    f.write(render_html(store.read(a.index), store.load_image, scores))
  print(a.out)


if __name__ == "__main__":
  main()
