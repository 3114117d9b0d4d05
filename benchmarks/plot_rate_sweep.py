"""Plot output throughput, median / P99 TTFT and median / P99 ITL against request rate from
bench_serving JSONL.

    python benchmarks/plot_rate_sweep.py docs/results/serving_llama8b_h200.jsonl \\
        -o docs/rate_sweep_llama8b_h200.png --title "Llama-3.1-8B (dummy weights), H200"
    python benchmarks/plot_rate_sweep.py main=a.jsonl branch=b.jsonl -o sweep.png

One figure per workload: rows are grouped by what they ran (dataset, prompt count, input and
output lengths, range ratio), since points of different workloads on one rate axis would
read as one curve. The workload goes into the title. Each input file (``LABEL=PATH`` names
it; otherwise the file name does) is a labelled series, split further by a row's
``engine`` or ``revision`` field where rows carry one, so several engines or revisions
compare on one figure. Each figure has three panels: output throughput, TTFT and ITL (a
series' median as a solid line, its P99 dashed in the same colour). Rows with request_rate inf are left out (they are not points on a
rate axis), and so are workloads with fewer than two rates. With one workload left the
figure is written to the -o path; with several, each goes to the -o path with the workload
added to its name (``sweep_in1024_out256_n100.png``).

matplotlib is needed for this script only (the ``plot`` extra), not by mini-sglang.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path


def workload_key(row: dict) -> tuple:
    """What a row ran, apart from its request rate."""
    return (
        row.get("dataset_name"),
        row.get("completed"),
        row.get("random_input_len"),
        row.get("random_output_len"),
        row.get("random_range_ratio"),
    )


def describe(key: tuple) -> str:
    """A workload in words, for the figure's title."""
    dataset, prompts, in_len, out_len, ratio = key
    bound = "" if ratio == 1 else "up to "
    return f"{dataset}, {prompts} prompts, input {bound}{in_len}, output {bound}{out_len}"


def slug(key: tuple) -> str:
    _, prompts, in_len, out_len, _ = key
    return f"in{in_len}_out{out_len}_n{prompts}"


def load(specs: list[str]) -> dict[tuple, dict[str, list[dict]]]:
    """{workload: {series label: rows with a finite rate}} from LABEL=PATH or PATH specs."""
    out: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for spec in specs:
        label, _, path = spec.rpartition("=")
        label = label or Path(path).stem
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for row in rows:
            if math.isinf(float(row["request_rate"])):
                continue
            tag = row.get("engine") or row.get("revision")
            series = f"{label} {tag}" if tag else label
            out[workload_key(row)][series].append(row)
    return out


# (row field, axis label) of each latency panel; medians solid, P99 dashed.
LATENCY_PANELS = (("ttft", "TTFT (ms)"), ("itl", "ITL (ms)"))


def plot(key: tuple, series: dict[str, list[dict]], title: str, dst: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, rows) in enumerate(sorted(series.items())):
        color = colors[i % len(colors)]
        rows = sorted(rows, key=lambda r: r["request_rate"])
        rates = [r["request_rate"] for r in rows]
        axes[0].plot(rates, [r["output_throughput"] for r in rows], "o-", color=color, label=label)
        for ax, (metric, _) in zip(axes[1:], LATENCY_PANELS):
            ax.plot(rates, [r[f"median_{metric}_ms"] for r in rows], "o-", color=color,
                    label=f"{label} median")  # fmt: skip
            p99 = [r.get(f"p99_{metric}_ms") for r in rows]
            if all(v is not None for v in p99):
                ax.plot(rates, p99, "s--", color=color, label=f"{label} P99")
    axes[0].set_ylabel("output throughput (tok/s)")
    for ax, (_, ylabel) in zip(axes[1:], LATENCY_PANELS):
        ax.set_ylabel(ylabel)
    for ax in axes:
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{title}\n{describe(key)}" if title else describe(key))
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", help="bench_serving JSONL files, PATH or LABEL=PATH")
    parser.add_argument("-o", "--out", required=True, help="output PNG")
    parser.add_argument("--title", default="", help="first title line (model, card)")
    args = parser.parse_args()
    workloads = {
        k: s for k, s in load(args.inputs).items() if max(len(rows) for rows in s.values()) >= 2
    }
    if not workloads:
        raise SystemExit("no workload with two or more finite request rates in the input")
    dst = Path(args.out)
    for key, series in workloads.items():
        path = dst if len(workloads) == 1 else dst.with_name(f"{dst.stem}_{slug(key)}{dst.suffix}")
        plot(key, series, args.title, path)
        print(f"{path}: {describe(key)}, series {', '.join(sorted(series))}")


if __name__ == "__main__":
    main()
