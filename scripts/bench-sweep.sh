#!/usr/bin/env bash
# Connections x queue depth sweep of 4K random reads and writes, as docs/BENCHMARKS.md's
# "Connections and queue depth" table: tiercache with a ram: cache (wt) and with a file cache
# (wb, O_DIRECT), nbdkit memory, and fio io_uring direct on a file like the cache file. The
# servers run on CPU $SERVER_CPU, fio on CPU $CLIENT_CPU; every connection is one fio job (its
# own libnbd handle). Prints a Markdown table: IOPS and CPU-us per IO (server's for the NBD
# servers, from /proc/PID/stat; fio's own for the device row). A benchmark: nothing asserted.
#
#   scripts/bench-sweep.sh [RUNTIME_S]      (default 3 s per run; 96 runs, ~7 minutes at 3 s)
set -euo pipefail
RT=${1:-3}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
BIN=${BIN:-$(dirname "$0")/../target/release/tiercache}
for t in fio nbdkit nbdcopy python3 taskset; do
    command -v $t >/dev/null || { echo "bench-sweep: $t is needed" >&2; exit 1; }
done
D=$(mktemp -d "${TMPDIR:-/tmp}/tiercache-sweep.XXXXXX")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
WS=256m
truncate -s 384M "$D/cache.img"
# The device row reads written blocks (a hole is answered without touching the disk).
dd if=/dev/urandom of="$D/device.img" bs=1M count=384 status=none
dd if=/dev/urandom of="$D/core-ram.img" bs=1M count=256 status=none
cp "$D/core-ram.img" "$D/core-file.img"
export TIERCACHE_SOCKET=$D/admin.sock
taskset -c "$SERVER_CPU" "$BIN" daemon --nbd-listen "unix:$D/nbd.sock" --socket "$D/admin.sock" \
    >"$D/daemon.log" 2>&1 &
DPID=$!; PIDS+=("$DPID")
for _ in $(seq 100); do [ -S "$D/admin.sock" ] && break; sleep 0.1; done
"$BIN" start-cache --cache-id 1 --cache-device ram:320m --mode wt >/dev/null
"$BIN" add-core --cache-id 1 --core-device "$D/core-ram.img" --export ram >/dev/null
"$BIN" start-cache --cache-id 2 --cache-device "$D/cache.img" --mode wb >/dev/null
"$BIN" add-core --cache-id 2 --core-device "$D/core-file.img" --export file >/dev/null
for c in 1 2; do
    "$BIN" set-param --cache-id "$c" seq-cutoff --policy never >/dev/null
    "$BIN" set-param --cache-id "$c" cleaning --policy nop >/dev/null 2>&1 || true
done
taskset -c "$SERVER_CPU" nbdkit -f --exit-with-parent -U "$D/mem.sock" memory $WS >"$D/nbdkit.log" 2>&1 &
NPID=$!; PIDS+=("$NPID")
for _ in $(seq 100); do [ -S "$D/mem.sock" ] && break; sleep 0.1; done
nbdcopy "$D/core-ram.img" "nbd+unix:///?socket=$D/mem.sock"
uri() { case $1 in
    tc-ram) echo "nbd+unix:///ram?socket=$D/nbd.sock" ;;
    tc-file) echo "nbd+unix:///file?socket=$D/nbd.sock" ;;
    nbdkit-memory) echo "nbd+unix:///?socket=$D/mem.sock" ;;
esac; }
# Warm both caches: every line read once.
for e in tc-ram tc-file; do
    taskset -c "$CLIENT_CPU" fio --name=warm --ioengine=nbd --uri="$(uri $e)" --rw=read --bs=1M \
        --size=$WS --iodepth=4 --output=/dev/null
done
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
run() { # target rw conns qd -> "iops cpu_us"
    local tgt=$1 rw=$2 n=$3 qd=$4 pid="" t0=0 j
    local common=(--name=x --rw="$rw" --bs=4k --size=$WS --iodepth="$qd" --numjobs="$n"
        --group_reporting --time_based --runtime="$RT" --randrepeat=0 --output-format=json)
    case $tgt in
        tc-*) pid=$DPID ;;
        nbdkit-memory) pid=$NPID ;;
    esac
    [ -n "$pid" ] && t0=$(ticks "$pid")
    if [ "$tgt" = fio-device ]; then
        j=$(taskset -c "$CLIENT_CPU" fio "${common[@]}" --ioengine=io_uring --direct=1 \
            --filename="$D/device.img")
    else
        j=$(taskset -c "$CLIENT_CPU" fio "${common[@]}" --ioengine=nbd --uri="$(uri "$tgt")")
    fi
    local used=-
    [ -n "$pid" ] && used=$(($(ticks "$pid") - t0))
    echo "$j" | python3 -c '
import json, sys
t = sys.stdin.read(); j = json.loads(t[t.index("{"):])["jobs"][0]
k = "read" if sys.argv[1] == "randread" else "write"
iops = j[k]["iops"]; ios = max(1.0, iops * float(sys.argv[2]))
if sys.argv[3] == "-":   # fio on the device: its own CPU
    cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1000 / ios * 1e6
else:                    # the server: clock ticks (10 ms) over the run
    cpu = int(sys.argv[3]) * 1e4 / ios
print("%.0f %.1f" % (iops, cpu))' "$rw" "$RT" "$used"
}
echo "4K random, ${RT} s per run; servers on CPU $SERVER_CPU, fio on CPU $CLIENT_CPU; IOPS / CPU-us per IO"
echo "(server CPU for NBD servers, fio's own CPU for fio-device); $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo
printf '| op | conns | QD |'; for t in tc-file tc-ram nbdkit-memory fio-device; do printf ' %s |' "$t"; done; echo
echo '|---|---|---|---|---|---|---|'
for rw in randread randwrite; do for n in 1 2 4; do for qd in 1 4 16 64; do
    printf '| %s | %s | %s |' "${rw#rand}" "$n" "$qd"
    for t in tc-file tc-ram nbdkit-memory fio-device; do
        read -r iops cpu < <(run "$t" "$rw" "$n" "$qd")
        printf ' %s / %s |' "$iops" "$cpu"
    done
    echo
done; done; done
