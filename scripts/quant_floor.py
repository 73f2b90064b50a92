"""The bytes floor of committed `bench quant` runs (hybridcomm.bench.quant_floor says what it
is): per pure-DP layout, hidden, format and balanced token count, the time our bf16 gather of
the same run takes to move the quantized rows' bytes, against the quantized gather's own time.
Reads results only: no GPU.

    PYTHONPATH=src python3 scripts/quant_floor.py results/2xH200/quant_2xH200.json [...]

(`hybridcomm bench quant` writes the same section at the end of its Markdown.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hybridcomm.bench.quant_floor import floor_markdown
from hybridcomm.bench.report import _header


def main() -> None:
    for path in sys.argv[1:]:
        results = json.loads(Path(path).read_text())
        print(f"# Bytes floor of {path}, {results['dtype']} input\n\n{_header(results['environment'])}\n")
        print(floor_markdown(results) or "(no layout with attention TP 1 and a bf16 curve)\n")


if __name__ == "__main__":
    main()
