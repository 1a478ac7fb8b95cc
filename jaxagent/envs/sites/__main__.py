"""Command line: `python -m jaxagent.envs.sites serve --port 8080` | `tasks --out DIR [--seed 0]
[--bench PROFILE/SPLIT[@LEVEL][/FAMILIES] ...]`.

`tasks` writes today's suites, or with `--bench` the benchmark's splits (`bench.py`; SPLIT may be `headline` or
`control`), one file each: `DIR/<profile>_<split>_L<level>.jsonl`.

Running the scripted expert needs the judges and the collector, which sit above the environments, so its success
rate and its demonstrations are tools of their own: `data_tools/expert_success.py`, `data_tools/site_demos.py`.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxagent.envs.sites import bench, server, tasks


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jaxagent.envs.sites", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  serve = sub.add_parser("serve", help="serve the bundled sites until interrupted")
  serve.add_argument("--port", type=int, default=8080, help="0 picks a free port")
  serve.add_argument("--host", default="127.0.0.1")
  serve.add_argument("--seed", type=int, default=0)
  gen = sub.add_parser("tasks", help="write the task suites as JSONL")
  gen.add_argument("--out", required=True, help="output directory")
  gen.add_argument("--seed", type=int, default=0)
  gen.add_argument("--bench", action="append", default=[], metavar="PROFILE/SPLIT[@LEVEL][/FAMILIES]",
                   help="a benchmark split to write (repeatable), e.g. device/headline@2 or web/train_a")
  args = parser.parse_args(argv)

  if args.command == "serve":
    s = server.SiteServer(port=args.port, host=args.host, seed=args.seed).start()
    print(f"serving the bundled sites on {s.base_url}  (try {s.base_url}/s/demo/launcher/)", flush=True)
    s.serve_forever()
    return 0
  if args.bench:
    paths = {}
    for spec in args.bench:
      try:
        profile, split, level, _ = bench.parse_split(spec)
      except ValueError as e:
        parser.error(str(e))
      paths[spec] = bench.write_split(args.out, spec, args.seed)
  else:
    paths = tasks.write_suite(args.out, seed=args.seed)
  counts = {name: sum(1 for _ in open(path)) for name, path in paths.items()}
  print(json.dumps({"out": args.out, "seed": args.seed, "tasks": counts}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
