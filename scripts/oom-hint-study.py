#!/usr/bin/env python3
"""How often does the OOM report's `max_split_size_mb` suggestion avoid the OOM?

Replays every real trace (../shared/traces/real or $CACHEALLOC_TRACES) and a set of synthetic
runs on devices between their peak allocated and peak reserved memory, where fragmentation
out-of-memory errors happen. For each fragmentation OOM it reads the report (the request, the
largest free cached block, the value the report suggests), lets `cachealloc` replay the
standard values (1024 ... 20) to see which fit, and counts, for the report's rule and for
alternatives, how often the value a rule names is one that fits — and what it costs: its
cudaMalloc calls over the fewest any fitting value needs.

Usage: cargo build --release && scripts/oom-hint-study.py [NAME-FILTER]   (about a minute)
Environment: CACHEALLOC_BIN (default target/release/cachealloc), STUDY_FRACTIONS (device sizes
as fractions of the way from peak allocated to peak reserved, e.g. "0.1,0.25").
"""
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("CACHEALLOC_BIN") or os.path.join(ROOT, "target", "release", "cachealloc")
TRACES = os.environ.get("CACHEALLOC_TRACES") or os.path.join(ROOT, "..", "shared", "traces", "real")
LADDER = [1024, 512, 256, 128, 64, 48, 32, 20]
# Devices between peak allocated (0) and peak reserved (1) of an unlimited replay.
FRACTIONS = [float(f) for f in
             os.environ.get("STUDY_FRACTIONS", "0.03,0.06,0.1,0.15,0.25,0.4").split(",") if f.strip()]
MIB = 1 << 20


def ladder_at_most(mib):
    return next((mb for mb in LADDER if mb <= mib), LADDER[-1])


# Rules, from the report's figures (MiB): the one the report uses first (None: no value named).
RULES = {
    "largest free block, down to a standard value (the report's rule)":
        lambda req, lf: ladder_at_most(lf) if lf >= LADDER[-1] else None,
    "the request's size (the earlier rule)": lambda req, lf: max(20, int(req)),  # rounded, MiB
    "half the request, down to a standard value": lambda req, lf: ladder_at_most(req / 2),
    "always 128": lambda req, lf: 128,
    "always 20": lambda req, lf: 20,
}


def run(source, capacity, conf=None):
    """The replay's JSON, on a device of `capacity` bytes (None: unlimited)."""
    cmd = [BIN] + source + ["--json"]
    if capacity is not None:
        cmd += ["--capacity", str(int(capacity))]
    if conf:
        cmd += ["--conf", conf]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        return None
    return json.loads(done.stdout)


def device_allocs_if_fits(source, capacity, mb):
    """cudaMalloc calls of a replay under `mb` that avoids every OOM, else None."""
    out = run(source, capacity, f"max_split_size_mb:{mb}")
    return out["num_device_alloc"] if out is not None and out["num_ooms"] == 0 else None


def study(name, source):
    # The largest device the replay simulates, not an unlimited one: with a capacity the
    # replay also requests the recording's own failed requests again, as the runs below do.
    base = run(source, 127 << 40)
    if base is None:
        return []
    allocated, reserved = base["peak_allocated_bytes"], base["peak_reserved_bytes"]
    cases = []
    for fraction in FRACTIONS:
        capacity = allocated + fraction * (reserved - allocated)
        out = run(source, capacity)
        if out is not None and "first_oom_report" not in out:
            sys.exit(f"{BIN} is too old: its JSON has no first_oom_report")
        report = out and out["first_oom_report"]
        if not report or report["kind"] != "fragmentation":
            continue
        req_mib = report["rounded_bytes"] / MIB
        lf_mib = max(report["largest_free_blocks_bytes"], default=0) / MIB
        # The values that fit with the run's settings: each listed, and those folded into it
        # for the same figures.
        fitting = {mb: f["num_device_alloc"]
                   for f in out["fitting_settings"]
                   if not f.get("dropped_settings") and f["max_split_size_mb"] is not None
                   for mb in [f["max_split_size_mb"], *f.get("same_figures_max_split_size_mb", [])]}
        named = {rule: f(req_mib, lf_mib) for rule, f in RULES.items()}
        # cudaMalloc calls under each rule's value when it fits, else None.
        allocs = {rule: None if mb is None
                  else fitting.get(mb) if mb in LADDER
                  else device_allocs_if_fits(source, capacity, mb)
                  for rule, mb in named.items()}
        report_value = report["suggested_max_split_size_mb"]
        cases.append({"name": name, "fraction": fraction, "fitting": fitting, "named": named,
                      "allocs": allocs, "report": report_value,
                      "oom": (name, round(req_mib, 2), round(lf_mib, 2))})
        print(f"{name} at {fraction:.2f}: request {req_mib:.1f} MiB, largest free {lf_mib:.1f} MiB,"
              f" report says {report_value}, fitting {sorted(fitting, reverse=True)}", flush=True)
    return cases


def sources():
    for seed in range(1, 9):
        yield f"synth transformer seed {seed}", ["synth", "transformer", "--seed", str(seed)]
    for seed in range(1, 4):
        yield f"synth loguniform seed {seed}", ["synth", "loguniform:ops=50000", "--seed", str(seed)]
    for path in sorted(glob.glob(os.path.join(TRACES, "**", "*"), recursive=True)):
        if os.path.isfile(path) and path.endswith((".pickle", ".pkl", ".json")):
            yield os.path.relpath(path, TRACES), ["replay", path]


def main():
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} not found: run cargo build --release first")
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    cases = [c for name, src in sources() if only in name for c in study(name, src)]
    helpable = [c for c in cases if c["fitting"]]
    distinct = len({c["oom"] for c in helpable})
    print(f"\n{len(cases)} fragmentation OOMs; in {len(helpable)} some standard value fits "
          f"({distinct} distinct OOMs: the same one recurs at several device sizes; in "
          f"{sum(len(c['fitting']) == len(LADDER) for c in helpable)} every value fits).")
    print("rule: fits in / cases; cudaMalloc calls over the fewest of any fitting value (mean)")
    for rule in RULES:
        hits = [c for c in helpable if c["allocs"][rule] is not None]
        extra = [c["allocs"][rule] / min(c["fitting"].values()) for c in hits]
        mean = sum(extra) / len(extra) if extra else float("nan")
        print(f"  {rule}: {len(hits)} / {len(helpable)}; {mean:.2f}x")
    first = next(iter(RULES))
    agree = sum(c["report"] == c["named"][first] for c in cases)
    print(f"The report named the first rule's value in {agree} of {len(cases)} "
          f"({sum(c['report'] is None for c in cases)} times no value: no free block of 20 MiB).")


if __name__ == "__main__":
    main()
