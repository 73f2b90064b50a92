"""The change against the faster of the two main runs (the larger of its two ratios), per case:
one line per (call, layout, format, hidden), one cell per token case, the range over our
quantized impls (hc_quant*, hybridcomm) and, apart, hc_bf16 (unchanged: the control). The three
runs are paired by hybridcomm.bench.compare.bracketed.

    python3 results/shared_1xH100/84_e2m1_pairs/summarize.py CALL_DIR ...
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))
from hybridcomm.bench.compare import bracketed  # noqa: E402

for call in sys.argv[1:]:
    d = Path(call) / "shared_timing"
    m1, ch, m2 = (json.loads((d / f"{n}_quant.json").read_text()) for n in ("main_1", "e2m1_pairs", "main_2"))
    rows = defaultdict(dict)
    for r, t1, c, t2 in bracketed(m1, ch, m2):
        cases = rows[(r["layout"], r["format"], r["hidden"])]
        cases.setdefault((r["case"], tuple(r["tokens_per_dp"])), []).append((r["impl"], max(c / t1, c / t2)))
    for (layout, fmt, hidden), cases in sorted(rows.items()):
        cells = []
        for (case, tokens), pairs in cases.items():
            q = [r for i, r in pairs if i != "hc_bf16"]
            b = [r for i, r in pairs if i == "hc_bf16"]
            control = f" (bf16 {b[0]:.2f})" if b else ""
            cells.append(f"{','.join(map(str, tokens))}: {min(q):.2f}-{max(q):.2f}{control}")
        print(f"{Path(call).name} {layout} {fmt} h{hidden} | " + " | ".join(cells))
