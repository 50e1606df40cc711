#!/usr/bin/env python3
"""Writes a seeded synthetic block trace in tiercache's CSV (time_us,op,offset,length) for
docs/SIZING.md and by-hand checks of `tiercache sim mrc`: Zipf-hot 4 KiB random reads and
writes over a volume, with sequential 64 KiB scans mixed in (10% of requests), in bursts.

usage: synth_trace.py REQUESTS VOLUME_GIB SEED > trace.csv
"""
import bisect
import random
import sys


def main():
    n, gib, seed = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    rnd = random.Random(seed)
    slots = int(gib * (1 << 30)) // 4096
    hot = min(slots, 300_000)
    weights = [1.0 / (k + 1) ** 0.9 for k in range(hot)]
    cum = []
    s = 0.0
    for w in weights:
        s += w
        cum.append(s)
    t, scan = 0, None
    out = sys.stdout
    out.write("time_us,op,offset,length\n")
    for i in range(n):
        t += rnd.choice((1, 2, 5, 50, 400))  # bursts and pauses
        if scan is None and rnd.random() < 0.002:
            scan = [rnd.randrange(slots // 16) * 16, 0]
        if scan is not None and rnd.random() < 0.5:
            out.write(f"{t},R,{(scan[0] + scan[1] * 16) * 4096},65536\n")
            scan[1] += 1
            if scan[1] >= 100:
                scan = None
            continue
        rank = bisect.bisect_left(cum, rnd.random() * s)
        slot = (rank * 2654435761) % slots
        op = "W" if rnd.random() < 0.55 else "R"
        out.write(f"{t},{op},{slot * 4096},4096\n")


main()
