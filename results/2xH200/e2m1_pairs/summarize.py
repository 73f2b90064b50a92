"""main / revert on 2x H200 (time_experiments.sh's JSON): per (layout, format, hidden, impl),
each token case's range over main's two runs (< 1: main, with the change, is faster). The three
runs are paired by hybridcomm.bench.compare.bracketed.

    python3 results/2xH200/e2m1_pairs/summarize.py CALL_DIR REVERT_NAME
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))
from hybridcomm.bench.compare import bracketed  # noqa: E402

call, name = sys.argv[1:3]
d = Path(call) / "experiments"
m1, rv, m2 = (json.loads((d / f"{n}.json").read_text()) for n in ("main_1", name, "main_2"))
rows = defaultdict(list)
for r, t1, v, t2 in bracketed(m1, rv, m2):
    if r["impl"].startswith("hc_") or r["impl"] == "hybridcomm":
        rows[(r["layout"], r["format"], r["hidden"], r["impl"])].append(
            (tuple(r["tokens_per_dp"]), min(t1, t2) / v, max(t1, t2) / v))
for key in sorted(rows):
    cells = " ".join(f"{','.join(map(str, t))}: {lo:.2f}-{hi:.2f}" for t, lo, hi in rows[key])
    print(" ".join(map(str, key)), "|", cells)
