#!/usr/bin/env python3
"""Random-read latency probe for bench/readers.sh: what a reader that cannot predict its next
offset (a database looking up rows) sees, one read at a time.

    pread_lat.py FILE [--seconds S] [--reads N] [--block BYTES] [--seed S]

Tells the kernel the access is random (posix_fadvise RANDOM: no read-ahead, so each pread
asks the file system for exactly one block), then reads blocks at random block-aligned
offsets, each block at most once (a block read twice could come from the page cache), until
S seconds have passed or N reads were done, timing each read with perf_counter_ns. Prints
one JSON object: count, seconds, reads_per_sec, p50_ms, p90_ms, p99_ms, max_ms, mean_ms.
Exit status 1 if a read fails or comes back short.
"""

import argparse
import json
import math
import os
import random
import sys
import time


def percentile(sorted_ns, q):
    """Nearest-rank percentile of a sorted list, in ms."""
    k = max(0, min(len(sorted_ns) - 1, math.ceil(q / 100 * len(sorted_ns)) - 1))
    return sorted_ns[k] / 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--reads", type=int, default=0, help="stop after N reads (0: no limit)")
    p.add_argument("--block", type=int, default=4096)
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args()

    fd = os.open(a.file, os.O_RDONLY)
    size = os.fstat(fd).st_size
    blocks = size // a.block
    if blocks == 0:
        sys.exit(f"pread_lat: {a.file} is smaller than one block")
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    rng = random.Random(a.seed)
    order = list(range(blocks))
    rng.shuffle(order)

    lat = []
    i = 0
    start = time.perf_counter_ns()
    deadline = start + int(a.seconds * 1e9)
    while True:
        if i == len(order):  # every block read once: another pass (can hit the page cache)
            rng.shuffle(order)
            i = 0
        off = order[i] * a.block
        i += 1
        t0 = time.perf_counter_ns()
        data = os.pread(fd, a.block, off)
        t1 = time.perf_counter_ns()
        if len(data) != a.block:
            sys.exit(f"pread_lat: short read at {off}: {len(data)} bytes")
        lat.append(t1 - t0)
        if t1 >= deadline or (a.reads and len(lat) >= a.reads):
            break
    elapsed = (time.perf_counter_ns() - start) / 1e9
    os.close(fd)

    lat.sort()
    print(json.dumps({
        "count": len(lat),
        "seconds": round(elapsed, 3),
        "reads_per_sec": round(len(lat) / elapsed, 1),
        "p50_ms": round(percentile(lat, 50), 4),
        "p90_ms": round(percentile(lat, 90), 4),
        "p99_ms": round(percentile(lat, 99), 4),
        "max_ms": round(lat[-1] / 1e6, 4),
        "mean_ms": round(sum(lat) / len(lat) / 1e6, 4),
        "blocks_in_file": blocks,
    }))


if __name__ == "__main__":
    main()
