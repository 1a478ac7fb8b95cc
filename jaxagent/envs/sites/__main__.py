"""Command line: `python -m jaxagent.envs.sites serve --port 8080` | `tasks --out DIR [--seed 0]` |
`expert --profile web --format webvoyager [--epsilon E --stop-prob P] [--limit N] [--json PATH]` |
`demos --out DIR [--format openwebvoyager --profile web --limit 100]`."""

from __future__ import annotations

import argparse
import json
import sys

from jaxagent.envs.sites import server, tasks


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
  ex = sub.add_parser("expert", help="measure the scripted expert's success rate through real Chromium")
  ex.add_argument("--profile", choices=tasks.PROFILES, default="web")
  ex.add_argument("--format", default="webvoyager", help="agent format: webvoyager, openwebvoyager, webrl, autoui ...")
  ex.add_argument("--split", default="test")
  ex.add_argument("--tasks", default="", help="a task JSONL file instead of the generated suite")
  ex.add_argument("--limit", type=int, default=0, help="first N tasks of a seeded shuffle (0 = all)")
  ex.add_argument("--workers", type=int, default=2)
  ex.add_argument("--epsilon", type=float, default=0.0)
  ex.add_argument("--stop-prob", type=float, default=0.0)
  ex.add_argument("--seed", type=int, default=0)
  ex.add_argument("--json", default="", help="write the full result here")
  dm = sub.add_parser("demos", help="expert demonstrations into a trajectory store (+ OpenWebVoyager IL samples)")
  dm.add_argument("--out", required=True)
  dm.add_argument("--profile", choices=tasks.PROFILES, default="web")
  dm.add_argument("--format", default="openwebvoyager")
  dm.add_argument("--split", default="train")
  dm.add_argument("--limit", type=int, default=100)
  dm.add_argument("--workers", type=int, default=2)
  dm.add_argument("--epsilon", type=float, default=0.0)
  dm.add_argument("--stop-prob", type=float, default=0.0)
  dm.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)

  if args.command == "demos":
    import random  # noqa: PLC0415
    from jaxagent.envs.sites import demos  # noqa: PLC0415
    suite = [t for t in tasks.generate(args.seed)[args.split] if t.profile == args.profile]
    random.Random(args.seed).shuffle(suite)
    print(json.dumps(demos.make_demos(suite[:args.limit], args.out, args.format, args.profile, args.workers,
                                      args.epsilon, args.stop_prob, args.seed), indent=1))
    return 0

  if args.command == "expert":
    import random  # noqa: PLC0415
    from jaxagent.envs.sites import measure  # noqa: PLC0415
    suite = tasks.load_tasks(args.tasks) if args.tasks else tasks.generate(args.seed)[args.split]
    suite = [t for t in suite if t.profile == args.profile]
    if args.limit:
      random.Random(args.seed).shuffle(suite)
      suite = suite[:args.limit]
    result = measure.measure(suite, args.profile, args.format, args.workers, args.epsilon, args.stop_prob, args.seed)
    if args.json:
      with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    summary = {k: v for k, v in result.items() if k != "failures"}
    summary["failures"] = [f"{r['id']}: {r['reason'][:160]}" for r in result["failures"][:20]]
    print(json.dumps(summary, indent=1))
    return 0

  if args.command == "serve":
    s = server.SiteServer(port=args.port, host=args.host, seed=args.seed).start()
    print(f"serving the bundled sites on {s.base_url}  (try {s.base_url}/s/demo/launcher/)", flush=True)
    s.serve_forever()
    return 0
  paths = tasks.write_suite(args.out, seed=args.seed)
  counts = {name: sum(1 for _ in open(path)) for name, path in paths.items()}
  print(json.dumps({"out": args.out, "seed": args.seed, "tasks": counts}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
