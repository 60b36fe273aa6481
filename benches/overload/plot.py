#!/usr/bin/env python3
"""Draws benches/overload/results.json as an SVG (no plotting library needed): goodput and
the critical class's p99 latency, with and without load shedding.
`plot.py results.json out.svg` writes the image; `plot.py --table results.json` prints the
markdown table for BENCHMARKS.md."""
import json
import sys

COLORS = {"shedding": "#2b8a3e", "no-shedding": "#c92a2a"}
LABELS = {"shedding": "with shedding", "no-shedding": "without shedding"}


def table(result):
    rows = [
        "| | goodput (200/s) | critical: served | critical p50 | critical p99 | sheddable: served | shed (503) | upstream timeout (504) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for target in ("shedding", "no-shedding"):
        t = result["targets"][target]
        c, b = t["critical"], t["bulk"]
        shed = c["shed_503"] + b["shed_503"]
        timeouts = c["timeout_504"] + b["timeout_504"]
        rows.append(
            f"| {LABELS[target]} | {t['goodput_rps']:.0f} | {c['success_rate'] * 100:.1f}% "
            f"| {c['p50_ms']:.0f} ms | {c['p99_ms']:.0f} ms | {b['success_rate'] * 100:.1f}% "
            f"| {shed:.0f} | {timeouts:.0f} |"
        )
    return "\n".join(rows)


def panel(x, title, unit, values, height=200, width=300):
    top = max(values.values()) or 1
    base = 60 + height
    parts = [
        f'<text x="{x + width / 2}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{title}</text>',
        f'<line x1="{x + 20}" y1="{base}" x2="{x + width - 20}" y2="{base}" stroke="#333"/>',
    ]
    bar = 80
    for i, (target, value) in enumerate(values.items()):
        h = height * value / top
        bx = x + 50 + i * (bar + 60)
        parts.append(
            f'<rect x="{bx}" y="{base - h:.1f}" width="{bar}" height="{h:.1f}" fill="{COLORS[target]}"/>'
        )
        parts.append(
            f'<text x="{bx + bar / 2}" y="{base - h - 6:.1f}" text-anchor="middle" font-size="13">{value:,.{1 if unit == "%" else 0}f} {unit}</text>'
        )
        parts.append(
            f'<text x="{bx + bar / 2}" y="{base + 18}" text-anchor="middle" font-size="12">{LABELS[target]}</text>'
        )
    return parts


def svg(result):
    targets = result["targets"]
    goodput = {t: targets[t]["goodput_rps"] for t in ("shedding", "no-shedding")}
    p99 = {t: targets[t]["critical"]["p99_ms"] for t in ("shedding", "no-shedding")}
    served = {t: targets[t]["critical"]["success_rate"] * 100 for t in ("shedding", "no-shedding")}
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="960" height="330" font-family="sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>']
    parts += panel(0, "Goodput (200 responses/s)", "/s", goodput)
    parts += panel(320, "Critical class: p99 latency", "ms", p99)
    parts += panel(640, "Critical class: served", "%", served)
    parts.append(f'<text x="480" y="318" text-anchor="middle" font-size="11" fill="#555">{result["setup"]}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    if sys.argv[1] == "--table":
        with open(sys.argv[2]) as f:
            print(table(json.load(f)))
        return
    with open(sys.argv[1]) as f:
        result = json.load(f)
    with open(sys.argv[2], "w") as f:
        f.write(svg(result))


if __name__ == "__main__":
    main()
