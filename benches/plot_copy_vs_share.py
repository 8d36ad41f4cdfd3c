#!/usr/bin/env python3
"""Draws copy_vs_share.csv (from the `copy_vs_share` bench) as an SVG: conversion cost
against tensor size, log-log, zero-copy sharing vs a device-to-device copy of the same bytes.

Usage: python3 benches/plot_copy_vs_share.py copy_vs_share.csv docs/copy_vs_share.svg
No dependencies beyond the standard library, so it runs anywhere the CSV is.
"""
import csv
import math
import sys

W, H = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 80, 30, 40, 60


def main(src, dst, title="Handing a CUDA buffer to another library"):
    rows = list(csv.DictReader(open(src)))
    xs = [int(r["bytes"]) for r in rows]
    series = {
        "zero-copy share (tensorbridge: DLPack out and in + launch view)": (
            [float(r["share_us"]) for r in rows], "#1b7f3b"),
        "device-to-device copy of the same bytes": (
            [float(r["copy_us"]) for r in rows], "#c0392b"),
    }
    ys = [y for v, _ in series.values() for y in v]
    x0, x1 = math.log10(min(xs)), math.log10(max(xs))
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))

    def px(x):
        return LEFT + (math.log10(x) - x0) / (x1 - x0) * (W - LEFT - RIGHT)

    def py(y):
        return H - BOTTOM - (math.log10(y) - y0) / (y1 - y0) * (H - TOP - BOTTOM)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>']
    for e in range(y0, y1 + 1):
        y = py(10 ** e)
        label = {-1: "0.1 µs", 0: "1 µs", 1: "10 µs", 2: "100 µs", 3: "1 ms",
                 4: "10 ms", 5: "100 ms"}.get(e, f"1e{e} µs")
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" '
                   f'stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for x in xs[::2]:
        unit = ["B", "KiB", "MiB", "GiB"]
        k = min(int(math.log2(x) // 10), 3)
        out.append(f'<text x="{px(x):.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">'
                   f'{x >> (10 * k)} {unit[k]}</text>')
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" '
                   f'y2="{H - BOTTOM}" stroke="#eee"/>')
    out.append(f'<text x="{W / 2}" y="{H - 18}" text-anchor="middle">tensor size</text>')
    out.append(f'<text x="18" y="{H / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {H / 2})">time per hand-off (median)</text>')
    for i, (name, (vals, color)) in enumerate(series.items()):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, vals))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" '
                   f'stroke-width="2.5"/>')
        for x, y in zip(xs, vals):
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        ly = TOP + 16 + 18 * i
        out.append(f'<line x1="{LEFT + 14}" y1="{ly}" x2="{LEFT + 40}" y2="{ly}" '
                   f'stroke="{color}" stroke-width="2.5"/>')
        out.append(f'<text x="{LEFT + 46}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
