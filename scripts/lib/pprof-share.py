#!/usr/bin/env python3
"""Share of a CPU profile's samples spent in a feature's own code (scripts/datapath-cost.sh -P).

Reads `go tool pprof -traces PROFILE` on stdin. Each sample is charged to the deepest frame of a
github.com/ package on its stack (the standard library and the runtime it calls count as that
frame's: time.Since under ratecap counts as ratecap, a syscall under quic-go as quic-go). A sample
is the feature's when that frame matches FEATURE (a regular expression): so a wrapper's own work
counts, what it wraps does not (ratecap.Stream.Read's call into quic-go's Stream.Read is quic-go's).
Prints: feature seconds, total seconds, share in %, and the feature's functions by seconds.
Usage: go tool pprof -traces PROFILE | pprof-share.py FEATURE
"""
import re
import sys

UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def samples(lines):
    """Yields (seconds, frames leaf first) of each trace."""
    value, frames = None, []
    for line in lines:
        if line.startswith("-----------+"):
            if value is not None:
                yield value, frames
            value, frames = None, []
            continue
        m = re.match(r"^\s+([0-9.]+)(ns|us|µs|ms|s|m|h)\s+(\S.*)$", line)
        if m and value is None:
            value, frames = float(m.group(1)) * UNITS[m.group(2)], [m.group(3).strip()]
        elif value is not None and line.strip():
            frames.append(line.strip())
    if value is not None:
        yield value, frames


def main():
    feature = re.compile(sys.argv[1])
    total = mine = 0.0
    by_func = {}
    for secs, frames in samples(sys.stdin):
        total += secs
        owner = next((f for f in frames if f.startswith("github.com/")), None)
        if owner and feature.search(owner):
            mine += secs
            name = re.sub(r" \(inline\)$", "", owner)
            by_func[name] = by_func.get(name, 0.0) + secs
    share = 100 * mine / total if total else 0.0
    top = ", ".join("%s %.2fs" % (f.replace("github.com/quictun/quictun/", ""), s)
                    for f, s in sorted(by_func.items(), key=lambda kv: -kv[1])[:6])
    print("%.2f %.2f %.3f %s" % (mine, total, share, top or "-"))


if __name__ == "__main__":
    main()
