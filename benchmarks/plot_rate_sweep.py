"""Plot output throughput and median ITL against request rate from bench_serving JSONL.

    python benchmarks/plot_rate_sweep.py docs/results/serving_llama8b_h200.jsonl docs/rate_sweep.png

Rows with request_rate inf are left out (they are not points on a rate axis). matplotlib is
needed for this script only; it is not a mini-sglang dependency.
"""

from __future__ import annotations

import json
import math
import sys


def main(src: str, dst: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(src) if line.strip()]
    rows = [r for r in rows if not math.isinf(float(r["request_rate"]))]
    rows.sort(key=lambda r: r["request_rate"])
    rates = [r["request_rate"] for r in rows]
    fig, ax1 = plt.subplots(figsize=(6.5, 4))
    ax1.plot(rates, [r["output_throughput"] for r in rows], "o-", color="tab:blue")
    ax1.set_xlabel("request rate (req/s)")
    ax1.set_ylabel("output throughput (tok/s)", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(rates, [r["median_itl_ms"] for r in rows], "s--", color="tab:red")
    ax2.set_ylabel("median ITL (ms)", color="tab:red")
    ax2.set_ylim(bottom=0)
    ax1.set_title("mini-sglang, Llama-3.1-8B (dummy weights), H200")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
