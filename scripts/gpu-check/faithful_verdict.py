"""Row (h) of gpu-check.sh: reads `cachealloc replay --faithful --json` on stdin and prints one
line, the replay's figures next to the recording's (retries from its `retry` lines), prefixed with "FAILED: " when any differs,
when nothing was allocated or when the recording has no out-of-memory (row (e) runs until one)."""
import json
import sys


def mib(b):
    return "none" if b is None else "%.1f MiB" % (b / 1048576)


r = json.load(sys.stdin)
recorded_oom = r["recorded_oom"] or {}
oom = recorded_oom.get("event_index")
same = (
    r["allocs"] > 0
    and oom is not None
    and r["allocs_at_recorded_addr"] == r["allocs"]
    and r["peak_reserved_bytes"] == r["recorded_peak_reserved_bytes"]
    and r["num_device_alloc"] == r["recorded_segment_maps"]
    and r["num_alloc_retries"] == r["recorded_retries"]
    and not r["recorded_retries_upper_bound"]
    and r["first_oom_event_index"] == oom
)
print(
    "%s%d of %d allocations at their recorded address; peak reserved %s (recorded %s); "
    "%d page maps (recorded %d); %d retries (recorded %s); first OOM at event %s (recorded %s, "
    "%s free then); "
    "device memory %s, capacity %s"
    % (
        "" if same else "FAILED: ",
        r["allocs_at_recorded_addr"],
        r["allocs"],
        mib(r["peak_reserved_bytes"]),
        mib(r["recorded_peak_reserved_bytes"]),
        r["num_device_alloc"],
        r["recorded_segment_maps"],
        r["num_alloc_retries"],
        ("at most %d" if r["recorded_retries_upper_bound"] else "%d") % r["recorded_retries"],
        r["first_oom_event_index"],
        oom,
        mib(recorded_oom.get("device_free")),
        mib(r["device_memory_bytes"]),
        mib(r["capacity_bytes"]),
    )
)
