"""The bytes floor of a quantized gather, from one `bench quant` run.

Where attention TP is 1 only quantized rows travel, so a quantized gather of T tokens per DP
rank moves what our bf16 gather moves at T x (quantized row bytes / bf16 row bytes) tokens: about
T / 2 for fp8, T / 3.6 for nvfp4. The bf16 gather's time at that token count (hc_bf16 of the
same run, linear between the nearest measured counts) is what the quantized gather would take
if quantizing cost nothing and its bytes moved as fast as our bf16 rows do. So

  floor / bf16   the best q/bf16 a quantized gather can show on that machine while it moves its
                 bytes no faster than our bf16 gather (a goal below it asks for a faster wire,
                 not a cheaper quantization);
  q / floor      how much slower the quantized gather is than moving its bytes: the part its
                 own work (quantizing, scales, its protocol) costs.

With attention TP > 1 the transitions also move partial (unquantized) rows, so there is no such
floor from the bf16 curve alone; those layouts are left out.
"""

from __future__ import annotations

from collections import defaultdict

from ..layout import Layout
from ..quant import FORMATS
from .report import _table, input_elem_bytes


def interpolate(curve: list[tuple[float, float]], x: float) -> float | None:
    """The curve's y at x, linear between the nearest measured points; None outside them."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def floor_rows(results: dict) -> list[dict]:
    """One row per pure-DP layout, hidden, format and balanced token count that has both a
    quantized time (the Communicator's choice, "hybridcomm") and an hc_bf16 curve around it."""
    elem = input_elem_bytes(results)
    times: dict = defaultdict(dict)  # (layout, hidden, format) -> tokens -> impl -> us
    for r in results["records"]:
        if r["case"] == "balanced" and Layout.parse(r["layout"]).attn_tp == 1:
            times[(r["layout"], r["hidden"], r["format"])].setdefault(r["tokens_per_dp"][0], {})[r["impl"]] = r["us"]
    rows = []
    for (layout, hidden, fmt), by_tokens in times.items():
        curve = sorted((t, cols["hc_bf16"]) for t, cols in by_tokens.items() if "hc_bf16" in cols)
        share = FORMATS[fmt].row_bytes(hidden) / (elem * hidden)
        for tokens, cols in sorted(by_tokens.items()):
            if "hybridcomm" not in cols or "hc_bf16" not in cols:
                continue
            floor = interpolate(curve, tokens * share)
            if floor is None:
                continue
            rows.append({"layout": layout, "hidden": hidden, "format": fmt, "tokens": tokens,
                         "bf16": cols["hc_bf16"], "quantized": cols["hybridcomm"], "as_bf16_tokens": tokens * share,
                         "floor": floor})
    return rows


def floor_markdown(results: dict) -> str:
    rows = [[r["layout"], str(r["hidden"]), r["format"], str(r["tokens"]), f"{r['bf16']:.2f}",
             f"{r['quantized']:.2f}", f"{r['quantized'] / r['bf16']:.2f}", f"{r['as_bf16_tokens']:.1f}",
             f"{r['floor']:.2f}", f"{r['floor'] / r['bf16']:.2f}", f"{r['quantized'] / r['floor']:.2f}"]
            for r in floor_rows(results)]
    if not rows:
        return ""
    header = ["layout", "hidden", "format", "tokens/DP rank", "bf16", "quantized", "q/bf16", "its bytes as bf16 tokens",
              "floor", "floor/bf16", "q/floor"]
    return "\n".join([
        "## Bytes floor (attention TP 1, balanced)", "",
        "floor = our bf16 gather of this run at the token count that moves the quantized rows' bytes "
        "(linear between the nearest measured counts): the time if quantizing cost nothing. floor/bf16: "
        "the best q/bf16 while the bytes move no faster than bf16 rows do; q/floor: what the quantized "
        "gather's own work costs on top (hybridcomm.bench.quant_floor).", "",
        _table(header, rows), ""])
