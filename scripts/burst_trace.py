#!/usr/bin/env python3
"""Writes a seeded synthetic block trace shaped like the public VMware vscsi trace of issue 30
(one VM disk over 2 hours: 113,872 requests, 41% reads, 512 B - 68 KiB, a 33.6 GB address span,
bursts of 2,200 requests/s), in tiercache's CSV (time_us,op,offset,length). No public trace can
be fetched here, so this stands in for it in the timed-replay benchmark (docs/SIZING.md).

usage: burst_trace.py [--split4k] [REQUESTS [SEED]] > trace.csv

The shape, all seeded (defaults: 113872 requests, seed 30):
- time: 7,200 s. 80% of the requests come in bursts at 2,200 requests/s, each burst 0.2-2.0 s
  long at a random time; the rest arrive as a Poisson stream over the whole 2 hours.
- ops: 59% writes, 41% reads.
- sizes: 38% small (4 KiB mostly; some 512 B, 1 KiB, 8 KiB), 62% large (64 KiB mostly; some
  32 KiB and 68 KiB). Large requests continue the previous large request's run half the time
  (sequential), else start at a 64 KiB region drawn Zipf(0.5) from 12,000 regions; small
  requests draw a 4 KiB slot Zipf(0.9) from 50,000. Regions and slots are spread over the span
  by a multiplicative hash.
- `--split4k` writes every request as its pieces cut at 4 KiB boundaries, all at the request's
  time: the "4 KiB-split form" (about 1.1M requests from the default 113,872).
"""
import bisect
import random
import sys

SPAN = 33_600_000_000
DURATION_US = 7_200_000_000
BURST_RATE = 2200.0
BURST_SHARE = 0.8


def zipf_table(n, a):
    cum, s = [], 0.0
    for k in range(n):
        s += 1.0 / (k + 1) ** a
        cum.append(s)
    return cum


def pick(rnd, cum):
    return bisect.bisect_left(cum, rnd.random() * cum[-1])


def arrival_times(rnd, n):
    """`n` arrival times in µs, sorted: bursts at BURST_RATE plus a Poisson background."""
    in_bursts = int(n * BURST_SHARE)
    times = []
    while len(times) < in_bursts:
        start = rnd.randrange(DURATION_US - 2_000_000)
        k = min(int(BURST_RATE * rnd.uniform(0.2, 2.0)), in_bursts - len(times))
        t = float(start)
        for _ in range(k):
            t += rnd.expovariate(BURST_RATE) * 1e6
            times.append(int(t))
    times += [rnd.randrange(DURATION_US) for _ in range(n - in_bursts)]
    times.sort()
    return times


def main():
    args = sys.argv[1:]
    split = "--split4k" in args
    args = [a for a in args if a != "--split4k"]
    n = int(args[0]) if args else 113_872
    seed = int(args[1]) if len(args) > 1 else 30
    rnd = random.Random(seed)
    slots, regions = SPAN // 4096, SPAN // 65536
    small_cum, large_cum = zipf_table(50_000, 0.9), zipf_table(12_000, 0.5)
    run_end = 0
    out = sys.stdout
    out.write("time_us,op,offset,length\n")
    for t in arrival_times(rnd, n):
        op = "W" if rnd.random() < 0.59 else "R"
        if rnd.random() < 0.38:
            length = rnd.choices((512, 1024, 4096, 8192), (5, 5, 80, 10))[0]
            off = (pick(rnd, small_cum) * 2654435761) % slots * 4096
            if length < 4096:
                off += rnd.randrange(4096 // length) * length
        else:
            length = rnd.choices((32768, 65536, 69632), (15, 75, 10))[0]
            if run_end and rnd.random() < 0.5:
                off = run_end
            else:
                off = (pick(rnd, large_cum) * 2654435761) % regions * 65536
            if off + length > SPAN:
                off = 0
            run_end = off + length
        if not split:
            out.write(f"{t},{op},{off},{length}\n")
            continue
        end = off + length
        while off < end:
            piece = min(end, (off // 4096 + 1) * 4096) - off
            out.write(f"{t},{op},{off},{piece}\n")
            off += piece


main()
