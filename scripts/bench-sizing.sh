#!/usr/bin/env bash
# Sizing benchmarks of issue 30 (docs/SIZING.md, "Benchmarks"): prints, never asserts.
#   1. curve time of `tiercache sim mrc` on about 1M line accesses (the 4 KiB-split bursty
#      trace) and on 100M (a Zipf trace of 100M 4 KiB requests; skipped with --quick);
#   2. the timed replay of the bursty trace (`tiercache sim scripts/burst-replay.toml --trace`):
#      wall time and events/s.
# usage: scripts/bench-sizing.sh [--quick] [TIERCACHE_BINARY]   (traces go to $TMPDIR)
set -euo pipefail
quick=0
if [[ ${1:-} == --quick ]]; then
    quick=1
    shift
fi
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../target/release/tiercache}
dir=${TMPDIR:-/tmp}/tiercache-bench-sizing
mkdir -p "$dir"

if [[ ! -s $dir/burst4k.csv ]]; then
    python3 "$here/burst_trace.py" --split4k >"$dir/burst4k.csv"
fi
echo "== sim mrc, 1.1M line accesses (burst_trace.py --split4k), exact LRU, 24 sizes"
/usr/bin/time -f "   whole command: %e s wall, %M KB max RSS" \
    "$bin" sim mrc --trace "$dir/burst4k.csv" | grep -E "method:|footprint"
echo "== sim mrc, same trace, the core (S3-FIFO), 8 sizes"
/usr/bin/time -f "   whole command: %e s wall, %M KB max RSS" \
    "$bin" sim mrc --trace "$dir/burst4k.csv" --method core --eviction s3fifo \
    --sizes 0.5%,1%,2%,5%,10%,20%,50%,100% | grep -E "method:"

if [[ $quick == 0 ]]; then
    if [[ ! -s $dir/zipf100m.csv ]]; then
        # 1M 4 KiB requests, Zipf(0.9) over 20M lines (80 GiB) by the continuous inverse CDF,
        # 30% writes, all at time 0 (the readers sort stably, so the order is kept), written
        # 100 times over: 100M line accesses, about 2.5 GB of CSV, in seconds (awk alone
        # would take many minutes for 100M lines).
        awk 'BEGIN { srand(30); n = 20000000; s = 0.9; a = n ^ (1 - s) - 1;
                     for (i = 0; i < 1000000; i++) {
                         k = int(((a * rand() + 1) ^ (1 / (1 - s))) - 1);
                         slot = (k * 40503) % n;
                         printf "0,%s,%.0f,4096\n", (rand() < 0.3 ? "W" : "R"), slot * 4096 } }' \
            >"$dir/zipf1m.part"
        { echo "time_us,op,offset,length"; for _ in $(seq 100); do cat "$dir/zipf1m.part"; done; } \
            >"$dir/zipf100m.csv"
    fi
    echo "== sim mrc, 100M line accesses (a 1M Zipf 0.9 trace 100 times over), auto: SHARDS 1% with its exact check"
    /usr/bin/time -f "   whole command: %e s wall, %M KB max RSS" \
        "$bin" sim mrc --trace "$dir/zipf100m.csv" | grep -E "method:|footprint|shards|SHARDS"
fi

echo "== timed replay, burst_trace.py --split4k (1.1M requests), scripts/burst-replay.toml"
/usr/bin/time -f "   whole command: %e s wall, %U s user" \
    "$bin" sim "$here/burst-replay.toml" --trace "$dir/burst4k.csv" | grep -E "ran trace|simulated"
