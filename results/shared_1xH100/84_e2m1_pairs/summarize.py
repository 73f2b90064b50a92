"""The change against the faster of the two main runs (the larger of its two ratios), per case:
one line per (call, layout, format, hidden), one cell per token case, the range over our
quantized impls (hc_quant*, hybridcomm) and, apart, hc_bf16 (unchanged: the control).

    python3 results/shared_1xH100/84_e2m1_pairs/summarize.py CALL_DIR ...
"""
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(path):
    return {(r["layout"], r["format"], r["hidden"], r["case"], tuple(r["tokens_per_dp"]), r["impl"]): r["us"]
            for r in json.loads(Path(path).read_text())["records"]}


for call in sys.argv[1:]:
    d = Path(call) / "shared_timing"
    m1, ch, m2 = (load(d / f"{n}_quant.json") for n in ("main_1", "e2m1_pairs", "main_2"))
    rows = defaultdict(dict)
    for key, us in ch.items():
        if key in m1 and key in m2:
            layout, fmt, hidden, case, tokens, impl = key
            rows[(layout, fmt, hidden)].setdefault((case, tokens), []).append((impl, max(us / m1[key], us / m2[key])))
    for (layout, fmt, hidden), cases in sorted(rows.items()):
        cells = []
        for (case, tokens), pairs in cases.items():
            q = [r for i, r in pairs if i != "hc_bf16"]
            b = [r for i, r in pairs if i == "hc_bf16"]
            cells.append(f"{','.join(map(str, tokens))}: {min(q):.2f}-{max(q):.2f}" + (f" (bf16 {b[0]:.2f})" if b else ""))
        print(f"{Path(call).name} {layout} {fmt} h{hidden} | " + " | ".join(cells))
