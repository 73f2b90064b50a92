"""Two runs of one benchmark (`bench ops`, `transitions` or `quant` JSON) side by side, record by
record: after / before per case (hybridcomm.bench.compare says how records are paired). With a
third run, the triple main / change / main of scripts/shared_gpu_timing.sh: the change against
both main runs and a verdict per case (faster / slower beyond the drift). Reads results only: no GPU.

    PYTHONPATH=src python3 scripts/compare_results.py BEFORE.json AFTER.json [MAIN_AGAIN.json] [--impl hc_quant,...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hybridcomm.bench.compare import bracketed_markdown, compare_markdown
from hybridcomm.bench.report import _header


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("main_again", type=Path, nargs="?", help="main timed again after the change")
    parser.add_argument("--impl", help="comma-separated impls to keep (default: all)")
    args = parser.parse_args()
    before, after = (json.loads(p.read_text()) for p in (args.before, args.after))
    impls = set(args.impl.split(",")) if args.impl else None
    if args.main_again:
        again = json.loads(args.main_again.read_text())
        print(f"# {args.after} between {args.before} and {args.main_again}\n")
        for name, run in (("main_1", before), ("change", after), ("main_2", again)):
            print(f"{name}: {_header(run['environment'])}\n")
        print(bracketed_markdown(before, after, again, impls))
        return
    print(f"# {args.after} against {args.before}\n")
    print(f"before: {_header(before['environment'])}\n\nafter: {_header(after['environment'])}\n")
    print(compare_markdown(before, after, impls, ("before", "after")))


if __name__ == "__main__":
    main()
