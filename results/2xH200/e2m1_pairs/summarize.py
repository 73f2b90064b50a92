"""main / revert on 2x H200 (time_experiments.sh's JSON): per (format, hidden, layout, impl), each
token case's range over main's two runs (< 1: main, with the change, is faster).

    python3 results/2xH200/e2m1_pairs/summarize.py CALL_DIR REVERT_NAME
"""
import json
import sys
from collections import defaultdict


def load(path):
    return {(r["layout"], r["format"], r["hidden"], r["case"], tuple(r["tokens_per_dp"]), r["impl"]): r["us"]
            for r in json.load(open(path))["records"]}


call, name = sys.argv[1:3]
d = f"{call}/experiments/"
m1, rv, m2 = load(d + "main_1.json"), load(d + f"{name}.json"), load(d + "main_2.json")
rows = defaultdict(list)
for k, v in rv.items():
    if k in m1 and k in m2 and (k[5].startswith("hc_") or k[5] == "hybridcomm"):
        rows[(k[0], k[1], k[2], k[5])].append((k[4], min(m1[k], m2[k]) / v, max(m1[k], m2[k]) / v))
for key in sorted(rows):
    print(" ".join(map(str, key)), "|", " ".join(f"{','.join(map(str, t))}: {lo:.2f}-{hi:.2f}" for t, lo, hi in rows[key]))
