"""``python -m gla_ref.bench list | run SUITE [--only FIELD=VALUE,...] [--out DIR] [--smoke] [--resume] [--fresh]
[--budget-s S]``: the suites of :mod:`gla_ref.bench.suites`, measured by :mod:`gla_ref.bench.runner`."""

from __future__ import annotations

import argparse
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["_row"], ["_first"]):  # a row, or a first call, in its own fresh process (internal)
        if argv[0] == "_row":
            from gla_ref.bench.runner import row_child

            return row_child(argv[1])
        from gla_ref.bench.measures import first_call_child

        return first_call_child(argv[1])
    from gla_ref.bench import runner

    parser = argparse.ArgumentParser(prog="python -m gla_ref.bench", description="gla_ref's benchmark suites")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("list", help="the suites: status, rows, estimated H200 minutes, chapter, shapes")
    show.add_argument("-v", "--verbose", action="store_true", help="also candidates and the methods of each measure")
    run = sub.add_parser("run", help="measure one suite into <out>/<suite>_<device>.json (resumable)")
    run.add_argument("suite")
    run.add_argument("--only", action="append", default=[], metavar="FIELD=VALUE,...",
                     help="rows whose fields match (name, T, K, V, KxV, setup, ...; repeat or comma-separate; "
                          "values of one field are alternatives)")
    run.add_argument("--out", help="folder for the result (default benchmarks/results; --smoke: a temporary folder)")
    run.add_argument("--smoke", action="store_true", help="tiny float32 shapes, 1-2 points, on a CPU (interpreters)")
    run.add_argument("--resume", action="store_true", help="keep the rows of a file measured at another commit")
    run.add_argument("--fresh", action="store_true", help="start afresh, replacing the file's rows")
    run.add_argument("--budget-s", type=float, help="stop before a row that would end past this many seconds")
    args = parser.parse_args(argv)
    if args.command == "list":
        print(runner.list_text(args.verbose))
        return None
    try:
        return runner.run_suite(args.suite, only=args.only, out=args.out, smoke=args.smoke, resume=args.resume,
                                fresh=args.fresh, budget_s=args.budget_s,
                                echo=lambda text: print(text, flush=True))
    except (runner.RunError, ValueError) as err:
        parser.exit(2, f"python -m gla_ref.bench run: {err}\n")


if __name__ == "__main__":
    main()
