#!/usr/bin/env python3
"""Reads the oha JSON reports of benches/overload/run.sh and prints results.json: per target
(shedding, no-shedding), the median over rounds of goodput, the critical class's success
rate and latency percentiles, and the share of each status."""
import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def figures(work, target, round_, duration):
    out = {}
    ok_total = 0
    for cls in ("critical", "bulk"):
        report = load(os.path.join(work, f"{target}-{round_}-{cls}.json"))
        statuses = {int(k): v for k, v in report.get("statusCodeDistribution", {}).items()}
        errors = sum(report.get("errorDistribution", {}).values())
        total = sum(statuses.values()) + errors
        ok = statuses.get(200, 0)
        ok_total += ok
        pct = report.get("latencyPercentiles", {})
        out[cls] = {
            "sent": total,
            "ok": ok,
            "shed_503": statuses.get(503, 0),
            "timeout_504": statuses.get(504, 0),
            "other": total - ok - statuses.get(503, 0) - statuses.get(504, 0),
            "success_rate": ok / total if total else 0.0,
            "p50_ms": (pct.get("p50") or 0) * 1000,
            "p99_ms": (pct.get("p99") or 0) * 1000,
        }
    out["goodput_rps"] = ok_total / duration
    return out


def median_of(runs, path):
    values = []
    for r in runs:
        v = r
        for p in path:
            v = v[p]
        values.append(v)
    return statistics.median(values)


def main():
    work, rounds, duration, setup = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    result = {"setup": setup, "targets": {}}
    for target in ("shedding", "no-shedding"):
        runs = [figures(work, target, r, duration) for r in range(1, rounds + 1)]
        summary = {"goodput_rps": median_of(runs, ["goodput_rps"]), "rounds": runs}
        for cls in ("critical", "bulk"):
            summary[cls] = {
                k: median_of(runs, [cls, k])
                for k in ("sent", "ok", "shed_503", "timeout_504", "other", "success_rate", "p50_ms", "p99_ms")
            }
        result["targets"][target] = summary
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
