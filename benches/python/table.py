#!/usr/bin/env python3
"""One table of tensorbridge's conversions against their peers, from one bench run.

Reads criterion's results (the median of each benchmark, from `<criterion>/**/new/`) and,
when present, `compare.json` (the Python rows `compare.py` writes on a GPU machine), and
prints a markdown table: each row a conversion, tensorbridge's time, the peer's, the ratio
and the target with its verdict; a missed target carries its reason in a few words and a
link to the argument from profiles (docs/BENCHMARKS.md, "Why the latest run's misses").
With `--write FILE`, the table also replaces what lies between the markers
`<!-- latest-run:begin -->` and `<!-- latest-run:end -->` in FILE.

`cargo xtask bench` runs it after the criterion benches (target/criterion); the GPU
bundle's `bench.sh` runs it at the end with its own `$OUT` (criterion and compare.json).

Usage: table.py [--criterion DIR] [--compare compare.json] [--write FILE] [--title TEXT]
Standard library only: it runs wherever python3 does.
"""

import argparse
import json
import os
import re
import sys

BEGIN = "<!-- latest-run:begin -->"
END = "<!-- latest-run:end -->"
RANKS = (1, 2, 4, 8)

# (conversion, tensorbridge's benchmark, the peer's benchmark or None, peer's name, target,
# the reason a miss has, in a few words)
# `{r}` is the rank. A target is ("ratio", x): ours / peer <= x, or ("ns", rank, x): ours at
# that rank <= x ns. The peers check less (dlpark and `from_shape_ptr` trust their input).
ROWS = [
    ("DLPack round trip (export + import + drop)",
     "dlpack/roundtrip/tensorbridge/rank{r}", "dlpack/roundtrip/dlpark/rank{r}",
     "dlpark's producer + consumer", ("ratio", 1.0),
     "the import compares every field of its own export with a private copy (dlpark's "
     "consumer checks the shape only)"),
    ("`tensorbridge_tch::import`",
     "tch/import/tensorbridge/rank{r}", "tch/import/tch_ptr_size_stride/rank{r}",
     "tch `data_ptr` + `size` + `stride`", ("ratio", 1.2),
     "the core's validation and the owner's `Arc` (tch's reads check nothing)"),
    ("`tensorbridge_tch::export`",
     "tch/export/tensorbridge/rank{r}", "tch/export/tch_from_blob/rank{r}",
     "tch `from_blob`", ("ratio", 1.2),
     "libtorch's tensor creation dominates both"),
    ("ndarray view of a `Tensor`",
     "ndarray/view/tensorbridge/rank{r}", "ndarray/view/from_shape_ptr/rank{r}",
     "`ArrayView::from_shape_ptr`", ("ratio", 1.2),
     "the view checks what `from_shape_ptr` leaves to its caller, then calls it"),
    ("candle tensor -> `Tensor`",
     "candle/import/tensorbridge/rank{r}", "candle/import/by_hand/rank{r}",
     "candle's storage read by hand", ("ratio", 2.0),
     "the peer reads a pointer and stops; the validation alone is over 2x of it"),
    ("core raw -> `Tensor`",
     "core/raw_to_tensor/rank{r}", None, "", ("ns", 4, 25.0),
     "the validation and a 240-byte `Tensor` built and moved"),
    ("CAI import",
     "cai/import/cuda_array_interface/{r}", None, "", ("ns", 4, 100.0),
     "the core's floor plus the typestr and byte strides decoded"),
]

# Where a miss's reason is argued from profiles (an anchor in docs/BENCHMARKS.md).
WHY = "#why-the-latest-runs-misses"


def criterion_medians(root):
    """{full benchmark id: median ns} of every benchmark under `root`."""
    out = {}
    if not root or not os.path.isdir(root):
        return out
    for dirpath, _dirs, files in os.walk(root):
        if os.path.basename(dirpath) != "new":
            continue
        if "benchmark.json" not in files or "estimates.json" not in files:
            continue
        try:
            with open(os.path.join(dirpath, "benchmark.json")) as f:
                full_id = json.load(f)["full_id"]
            with open(os.path.join(dirpath, "estimates.json")) as f:
                out[full_id] = json.load(f)["median"]["point_estimate"]
        except (OSError, KeyError, ValueError):
            continue
    return out


def fmt_ns(v):
    return "-" if v is None else f"{v:.1f}"


def fmt_list(vals, fmt):
    return " / ".join(fmt(v) for v in vals)


def rust_rows(medians):
    lines = []
    for name, ours_id, peer_id, peer_name, target, why in ROWS:
        ours = [medians.get(ours_id.format(r=r)) for r in RANKS]
        if all(v is None for v in ours):
            continue
        peer = [medians.get(peer_id.format(r=r)) if peer_id else None for r in RANKS]
        ratios = [o / p if o is not None and p else None for o, p in zip(ours, peer)]
        if target[0] == "ratio":
            want = f"<= {target[1]:.1f}x"
            known = [x for x in ratios if x is not None]
            verdict = ("met" if all(x <= target[1] for x in known) else "**missed**") \
                if known else "-"
        else:
            _, rank, limit = target
            want = f"<= {limit:.0f} ns at rank {rank}"
            at = ours[RANKS.index(rank)]
            verdict = "-" if at is None else ("met" if at <= limit else "**missed**")
        if verdict == "**missed**":
            verdict += f": {why} ([why]({WHY}))"
        lines.append(
            f"| {name} | {fmt_list(ours, fmt_ns)} ns | "
            f"{peer_name + ': ' + fmt_list(peer, fmt_ns) + ' ns' if peer_id else '-'} | "
            f"{fmt_list(ratios, lambda x: '-' if x is None else f'{x:.2f}x') if peer_id else '-'} | "
            f"{want}: {verdict} |")
    return lines


def python_rows(path):
    if not path or not os.path.isfile(path):
        return []
    with open(path) as f:
        rows = json.load(f)
    lines = []
    for row in rows:
        if "error" in row:
            lines.append(f"| {row.get('path', '?')} (Python) | error: {row['error']} | | | |")
            continue
        if "host_ms" in row:  # a stream row: how long the consumer kept the host
            lines.append(
                f"| {row['path']} (Python), producer busy | {row['host_ms']:.3f} ms of host time "
                f"| - | - | blocks the host: {'yes' if row.get('blocks') else 'no'}; values "
                f"{'right' if row.get('correct') else '**wrong**'} |")
            continue
        ours, peer, ratio, target = (row.get(k) for k in ("ours_ns", "peer_ns", "ratio",
                                                           "target"))
        if ours is None:
            lines.append(f"| {row.get('path', '?')} (Python) | no time in compare.json | | | |")
            continue
        if target is None:
            want = "(informational)"
        elif ratio is None:
            want = f"<= {target:.1f}x: -"
        else:
            want = f"<= {target:.1f}x: {'met' if ratio <= target else '**missed**'}"
            if ratio > target:
                want += f" ([why]({WHY}))"
        peer_cell = "-"
        if row.get("peer"):
            peer_cell = f"{row['peer']}: {'-' if peer is None else f'{peer / 1e3:.3f} µs'}"
        lines.append(
            f"| {row['path']} (Python) | {ours / 1e3:.3f} µs | {peer_cell} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | {want} |")
    return lines


def table(medians, compare):
    head = [
        "| conversion | tensorbridge (rank 1 / 2 / 4 / 8) | peer | ratio | target |",
        "|---|---:|---|---:|---|",
    ]
    body = rust_rows(medians) + python_rows(compare)
    if not body:
        return None
    return "\n".join(head + body)


def write_section(path, text):
    with open(path) as f:
        doc = f.read()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        sys.exit(f"table.py: {path} has no {BEGIN} ... {END} section to replace")
    doc = pattern.sub(lambda _m: f"{BEGIN}\n{text}\n{END}", doc, count=1)
    with open(path, "w") as f:
        f.write(doc)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--criterion", default="target/criterion")
    p.add_argument("--compare", default=None, help="compare.py's compare.json")
    p.add_argument("--write", default=None, help="a markdown file with the markers")
    p.add_argument("--title", default=None, help="a line printed above the table")
    args = p.parse_args()
    t = table(criterion_medians(args.criterion), args.compare)
    if t is None:
        sys.exit(f"table.py: no results under {args.criterion}"
                 + (f" nor in {args.compare}" if args.compare else ""))
    text = (args.title + "\n\n" if args.title else "") + t
    print(text)
    if args.write:
        write_section(args.write, text)
        print(f"\nwrote the table into {args.write}")


if __name__ == "__main__":
    main()
