"""OpenWebVoyager imitation data from either source, in the OWV conversation format (`reference/algorithms.md` §2.3):

  python data_tools/owv_convert.py released --root RESULTS_DIR --out il.json
      OpenWebVoyager's / WebVoyager-4o's result folders (`task*/interact_messages.json`, `accessibility_tree{i}.txt`,
      `screenshot{i}.png`, `agent.log`); finished tasks only (`INFO - finish!!`), images copied to `images/`.
  python data_tools/owv_convert.py store --store STORE_DIR --out OUT_DIR
      the successful trajectories of a `TrajectoryStore` (e.g. `<owv workdir>/iter1/explore/store`) →
      `OUT_DIR/samples.json` + `OUT_DIR/images/`.

Either output trains with `configs/il.py` (`--config.data.path=...`) or as OpenWebVoyager's IL data
(`configs/openwebvoyager.py`, `--config.teacher.kind=released --config.teacher.released_dir=RESULTS_DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> dict:
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from jaxagent.data.store import TrajectoryStore  # pylint: disable=g-import-not-at-top
  from jaxagent.proj.owv import data as owv_data  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="cmd", required=True)
  rel = sub.add_parser("released")
  rel.add_argument("--root", required=True)
  rel.add_argument("--out", required=True)
  st = sub.add_parser("store")
  st.add_argument("--store", required=True)
  st.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  if args.cmd == "released":
    summary = owv_data.convert_released(args.root, args.out)
  else:
    if not os.path.isdir(args.store):
      parser.error(f"--store {args.store!r} is not a directory")
    os.makedirs(args.out, exist_ok=True)
    summary = owv_data.successful_samples(TrajectoryStore(args.store), args.out)
  print(json.dumps(summary))
  return summary


if __name__ == "__main__":
  main()
