#!/usr/bin/env bash
# One server, one fio job, by hand: for A/B runs of two tiercache binaries (alternate them:
# `BIN=old.bin scripts/bench-hits.sh; BIN=new.bin scripts/bench-hits.sh; ...`). A benchmark:
# nothing asserted (docs/BENCHMARKS.md).
#
# The server runs on CPU 0, fio's nbd engine on CPU 1. MODE: wt | wb (a file cache, 1.5x WS,
# over a file core of WS MiB of random data), ram (a `ram:` cache, wt), pt (a pass-through
# cache over the file core: every read reaches the device), nbdkit (nbdkit memory with the
# same data). The working set is read twice first (every line cached), then ROUNDS runs of
# RW (randread | randwrite | randrw) 4K at QD for RT seconds each; each prints IOPS, the
# server's CPU-us per IO (/proc utime+stime), p99 and fio's CPU share. PERF=1 records the
# server with `perf` during the first run (PERFG: perf's call-graph option, default -g);
# PSTAT=EVENTS counts those events instead (`perf stat -e`); output in $OUT (default .).
#
#   env: BIN MODE RW WS(MiB) RT(s) ROUNDS QD PREFILL(=1: the cache file written with zeros)
set -euo pipefail
BIN=${BIN:-$(dirname "$0")/../target/release/tiercache}
OUT=${OUT:-.}
MODE=${MODE:-wt}; WS=${WS:-256}; RT=${RT:-5}; ROUNDS=${ROUNDS:-3}; QD=${QD:-16}
D=$(mktemp -d "${TMPDIR:-/tmp}/tiercache-hits.XXXXXX")
export TIERCACHE_SOCKET=$D/admin.sock
if [ "${PREFILL:-0}" = 1 ]; then dd if=/dev/zero of=$D/cache.img bs=1M count=$((WS*3/2)) status=none; else truncate -s $((WS*3/2))M $D/cache.img; fi
head -c $((WS<<20)) /dev/urandom > $D/core.img
if [ "$MODE" = nbdkit ]; then
  taskset -c 0 nbdkit -f -U $D/nbd.sock memory $((WS<<20)) > $D/daemon.log 2>&1 &
  DP=$!
  trap 'kill $DP 2>/dev/null; wait $DP 2>/dev/null; rm -rf $D' EXIT
  for i in $(seq 50); do [ -S $D/nbd.sock ] && break; sleep 0.1; done
  nbdcopy $D/core.img "nbd+unix:///?socket=$D/nbd.sock"
  URI="nbd+unix:///?socket=$D/nbd.sock"
else
taskset -c 0 $BIN daemon --socket $D/admin.sock --nbd-listen unix:$D/nbd.sock --metrics-listen 127.0.0.1:0 > $D/daemon.log 2>&1 &
DP=$!
trap 'kill $DP 2>/dev/null; wait $DP 2>/dev/null; rm -rf $D' EXIT
for i in $(seq 50); do [ -S $D/admin.sock ] && break; sleep 0.1; done
if [ "$MODE" = ram ]; then
  $BIN start-cache --cache-id 1 --cache-device ram:$((WS*3/2))m --mode wt >/dev/null
elif [ "$MODE" = pt ]; then
  $BIN start-cache --cache-id 1 --cache-device ram:16m --mode pt >/dev/null
else
  $BIN start-cache --cache-id 1 --cache-device $D/cache.img --mode $MODE --force >/dev/null
fi
$BIN add-core --cache-id 1 --core-device $D/core.img --export e >/dev/null
$BIN set-param --cache-id 1 seq-cutoff --policy never >/dev/null
URI="nbd+unix:///e?socket=$D/nbd.sock"
fi
# warm: read everything twice
for k in 1 2; do taskset -c 1 fio --name=w --ioengine=nbd --uri="$URI" --rw=read --bs=256k --iodepth=8 --size=${WS}M --output=/dev/null; done
for r in $(seq $ROUNDS); do
  t0=$(awk '{print $14+$15}' /proc/$DP/stat)
  if [ -n "${PSTAT:-}" ] && [ $r = 1 ]; then perf stat -e $PSTAT -p $DP -o $OUT/pstat.txt -- sleep $((RT-1)) >/dev/null 2>&1 & PP=$!; elif [ "${PERF:-0}" = 1 ] && [ $r = 1 ]; then perf record ${PERFG:--g} -p $DP -o $OUT/perf.data -- sleep $((RT-1)) >/dev/null 2>&1 & PP=$!; fi
  out=$(taskset -c 1 fio --name=r --ioengine=nbd --uri="$URI" --rw=${RW:-randread} --bs=4k --iodepth=$QD --size=${WS}M --time_based --runtime=$RT --output-format=json)
  t1=$(awk '{print $14+$15}' /proc/$DP/stat)
  [ -n "${PP:-}" ] && wait $PP 2>/dev/null; PP=
  python3 - "$out" $((t1-t0)) $(getconf CLK_TCK) <<'PY'
import json,sys
a=sys.argv[1]; j=json.loads(a[a.index('{'):]); r=j['jobs'][0]['read'] if j['jobs'][0]['read']['total_ios'] else j['jobs'][0]['write']; n=r['total_ios']; tk=int(sys.argv[2]); hz=int(sys.argv[3])
print(f"iops {r['iops']:.0f}  cpu-us/io {tk/hz*1e6/max(n,1):.2f}  p99 {r['clat_ns']['percentile']['99.000000']/1000:.0f}us  cli-cpu {j['jobs'][0]['usr_cpu']+j['jobs'][0]['sys_cpu']:.0f}%")
PY
done
[ "$MODE" = nbdkit ] || $BIN stats --cache-id 1 --json | python3 -c 'import json,sys; s=json.load(sys.stdin); m=s.get("metadata",{}); print("meta", {k:v for k,v in m.items() if "commit" in k or "checkpoint" in k})' 2>/dev/null || true
