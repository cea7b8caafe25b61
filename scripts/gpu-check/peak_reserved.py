"""Peak reserved bytes from cachealloc's exit-time statistics (CACHEALLOC_CONF=stats:json,
stats_file:PATH): the sum over devices of "reserved_bytes.all.peak". Prints the number, or
"none" (exit 0) when the file is missing, empty or has no device."""

import json
import sys

try:
    with open(sys.argv[1]) as f:
        doc = json.loads(f.read() or "{}")
    peaks = [d["stats"]["reserved_bytes.all.peak"] for d in doc.get("devices", [])]
    print(sum(peaks) if peaks else "none")
except (OSError, ValueError, KeyError, TypeError):
    print("none")
