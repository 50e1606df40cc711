#!/usr/bin/env bash
# A throw-away single-node Ceph cluster on loopback, for tests and demos (docs/CEPH.md).
#
#   ceph-cluster.sh start DIR [--osds N] [--mgr] [--memstore] [--image NAME:SIZE]...
#                             [--port-base P] [--osd-size SIZE] [--set KEY=VALUE]...
#                             [--watch-pid PID]
#   ceph-cluster.sh add-osd DIR --block PATH [--db PATH --db-size SIZE] [--opt KEY=VALUE]...
#   ceph-cluster.sh remove-osd DIR ID
#   ceph-cluster.sh stop-osd DIR ID     # stop it, keep it in the cluster (its data stays)
#   ceph-cluster.sh start-osd DIR ID    # start it again, with the options it was added with
#   ceph-cluster.sh stop DIR
#   ceph-cluster.sh env DIR      # prints `export CEPH_CONF=...` lines (eval them)
#   ceph-cluster.sh status DIR   # the processes it started, and whether each is alive
#
# One mon (and optionally one mgr) plus N OSDs (1-3, default 1; BlueStore on sparse files in
# DIR, or MemStore with --memstore), every listener on 127.0.0.1, cephx on, pool `rbd`
# (size 1) created and initialised, then the images asked for. With --osds 0 only the mon (and
# mgr) start: no pool, no image; OSDs on devices of the caller's are then added one at a time
# with `add-osd` (BlueStore on an existing file or device PATH, not created or resized; its
# RocksDB and WAL on PATH too, or on a file --db of --db-size created by mkfs; --opt adds a
# `--KEY=VALUE` ceph option to this OSD's command lines only). It prints the new OSD's id as the
# last line once the OSD is up. `remove-osd` stops that OSD (TERM, then KILL) and purges it from
# the cluster (its id can be reused); its devices are left to the caller. `stop-osd` stops an
# OSD (TERM, then KILL; nothing if it already exited, e.g. after an abort on an IO error) and
# marks it down (a lone OSD has no peer to report it, so the mon would show it up for
# minutes); `start-osd` starts it again with the options `add-osd` gave it (kept in its data
# directory) and prints its id once it is up again. Plain background processes: no
# systemd, no containers; works as root. The PIDs it starts are recorded in DIR/pids and `stop`
# signals exactly those (checking each still runs with DIR's config), OSDs first, then the mgr
# and the mon: TERM, then KILL after a timeout. It never uses pkill or killall.
#
# Ports: the mon listens on P (msgr2) and P+1 (msgr1). Without --port-base the first free pair
# from 33000 up (step 2) is taken, chosen under a lock file so that clusters started at the same
# time in different DIRs get different ports. OSDs and the mgr bind free ports in 6800-7300 as
# usual. Several DIRs can therefore run side by side.
#
# --set KEY=VALUE adds a ceph option to [global] (e.g. osd_client_watch_timeout=10: a killed
# client's watch, and so its exclusive lock, is given up after 10 s instead of 30 s).
#
# --watch-pid PID starts a watcher that stops the cluster when PID exits (tests pass their own
# PID, so a test process killed outright does not leave a cluster behind).
#
# Every ceph CLI call runs under `timeout` (CEPH_CLUSTER_TIMEOUT seconds each, default 60).
set -euo pipefail

SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
CALL_TIMEOUT=${CEPH_CLUSTER_TIMEOUT:-60}
STOP_TIMEOUT=${CEPH_CLUSTER_STOP_TIMEOUT:-10}
# Free space DIR's file system must have to start (the mon store, logs, the OSDs' written data).
MIN_FREE_MIB=${CEPH_CLUSTER_MIN_FREE_MIB:-2048}

die() {
    echo "ceph-cluster: $*" >&2
    exit 1
}

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

now_ms() { date +%s%3N; }

# ceph/rbd CLI, always bounded in time.
ceph_() { timeout -k 5 "$CALL_TIMEOUT" ceph -c "$CONF" "$@"; }
rbd_() { timeout -k 5 "$CALL_TIMEOUT" rbd -c "$CONF" "$@"; }

port_busy() {
    # Something listens on 127.0.0.1:$1 (or the port is bound by a listener on any address).
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    return 1
}

# Is PID alive and one of ours (its command line names our config)?
ours() {
    local pid=$1
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- " -c $CONF "
}

record() { echo "$1 $2" >>"$DIR/pids"; }

# Starts a daemon in the background, its output in DIR/log, and records its PID.
spawn() {
    local name=$1
    shift
    "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 9>&- &
    record "$name" $!
}

log_tail() {
    local f
    for f in "$DIR"/log/*.log "$DIR"/log/*.out; do
        [ -s "$f" ] || continue
        echo "--- last lines of $f" >&2
        tail -n 15 "$f" >&2
    done
}

# Signals the recorded processes whose name matches $1 (a grep -E pattern): TERM, wait, KILL.
stop_group() {
    local pat=$1 name pid pids=()
    [ -f "$DIR/pids" ] || return 0
    while read -r name pid; do
        [[ $name =~ $pat ]] || continue
        ours "$pid" || continue
        kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    done <"$DIR/pids"
    [ ${#pids[@]} -gt 0 ] || return 0
    local deadline=$(($(now_ms) + STOP_TIMEOUT * 1000)) p alive
    while :; do
        alive=()
        for p in "${pids[@]}"; do
            ours "$p" && alive+=("$p")
        done
        [ ${#alive[@]} -gt 0 ] || return 0
        if [ "$(now_ms)" -ge "$deadline" ]; then
            echo "ceph-cluster: ${alive[*]} did not stop after TERM within ${STOP_TIMEOUT}s: KILL" >&2
            kill -KILL "${alive[@]}" 2>/dev/null || true
            sleep 0.2
            return 0
        fi
        sleep 0.05
    done
}

cmd_stop() {
    [ -d "$DIR" ] || return 0
    [ -f "$DIR/ceph.conf" ] || return 0
    # The watcher first (unless the watcher is who asked), so it does not stop us twice.
    if [ -z "${CEPH_CLUSTER_FROM_WATCHER:-}" ] && [ -f "$DIR/pids" ]; then
        local name pid
        while read -r name pid; do
            if [ "$name" = watcher ] && [ -r "/proc/$pid/cmdline" ] &&
                tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$SELF"; then
                kill -TERM "$pid" 2>/dev/null || true
            fi
        done <"$DIR/pids"
    fi
    stop_group '^osd\.'
    stop_group '^mgr\.'
    stop_group '^mon\.'
    : >"$DIR/stopped"
}

cmd_status() {
    [ -f "$DIR/pids" ] || die "$DIR: no cluster was started here"
    local name pid
    while read -r name pid; do
        if [ "$name" = watcher ]; then
            # (a zombie has an empty command line)
            if tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q .; then
                echo "$name $pid running"
            else
                echo "$name $pid gone"
            fi
        elif ours "$pid"; then
            echo "$name $pid running"
        else
            echo "$name $pid gone"
        fi
    done <"$DIR/pids"
}

cmd_env() {
    [ -f "$DIR/ceph.conf" ] || die "$DIR: no cluster config here (start one first)"
    local port
    port=$(cat "$DIR/port-base")
    echo "export CEPH_CONF=$CONF"
    echo "export CEPH_KEYRING=$DIR/keyring"
    echo "export CEPH_ID=admin"
    echo "export CEPH_MON=127.0.0.1:$port"
}

write_conf() {
    local fsid=$1 port=$2 store=$3 osd_bytes=$4
    shift 4
    cat >"$CONF" <<EOF
# Written by scripts/ceph-cluster.sh: a throw-away single-node cluster on loopback.
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$port,v1:127.0.0.1:$((port + 1))]
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
keyring = $DIR/keyring
run_dir = $DIR/run
admin_socket = $DIR/run/\$name.asok
log_file = $DIR/log/\$name.log
mon_data = $DIR/mon/\$cluster-\$id
osd_data = $DIR/osd/\$cluster-\$id
mgr_data = $DIR/mgr/\$cluster-\$id
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
# A test machine's disk is often fuller than a mon likes: by default it warns below 30% free and
# below 5% exits at start without a word in its log (it did on a CI machine with 4-5% of a 252 GiB
# disk free). This script checks the free space itself instead (MIN_FREE_MIB, before it starts).
mon_data_avail_warn = 1
mon_data_avail_crit = 0
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_osd_initial_require_min_compat_client = mimic
# Start-up in seconds instead of 11-13 s (../shared/research/ceph.md).
paxos_propose_interval = 0.1
bdev_aio_poll_ms = 10

[client]
# Clients (ceph, rbd, librados users) log nowhere by default.
log_file = /dev/null
admin_socket =

[mon]
keyring = \$mon_data/keyring

[mgr]
keyring = \$mgr_data/keyring

[osd]
keyring = \$osd_data/keyring
osd_objectstore = $store
bluestore_block_path = $DIR/osd/\$cluster-\$id.block
bluestore_block_create = true
bluestore_block_size = $osd_bytes
memstore_device_bytes = $osd_bytes
osd_memory_target = 1073741824
EOF
    if [ $# -gt 0 ]; then
        {
            echo
            echo "[global]"
            echo "# --set"
            local kv
            for kv in "$@"; do echo "${kv%%=*} = ${kv#*=}"; done
        } >>"$CONF"
    fi
}

# Bytes from NUM[K|M|G|T].
to_bytes() {
    local s=${1^^} n mul=1
    s=${s%IB}
    s=${s%B}
    case $s in
    *K) mul=1024 ;;
    *M) mul=$((1024 * 1024)) ;;
    *G) mul=$((1024 * 1024 * 1024)) ;;
    *T) mul=$((1024 * 1024 * 1024 * 1024)) ;;
    esac
    n=${s%[KMGT]}
    [[ $n =~ ^[0-9]+$ ]] || return 1
    echo $((n * mul))
}

wait_until() {
    # wait_until SECONDS WHAT CMD...: runs CMD every 100 ms until it succeeds.
    local secs=$1 what=$2
    shift 2
    local deadline=$(($(now_ms) + secs * 1000))
    until "$@" >/dev/null 2>&1; do
        if [ "$(now_ms)" -ge "$deadline" ]; then
            echo "ceph-cluster: timed out after ${secs}s waiting for $what" >&2
            return 1
        fi
        sleep 0.1
    done
}

osds_up() {
    local want=$1 out
    out=$(timeout -k 2 10 ceph -c "$CONF" osd stat -f json 2>/dev/null) || return 1
    [[ $out =~ \"num_up_osds\":([0-9]+) ]] || return 1
    [ "${BASH_REMATCH[1]}" -ge "$want" ]
}

mon_up() {
    # The last attempt's error is kept for diagnose_mon.
    timeout -k 2 10 ceph -c "$CONF" --connect-timeout 5 mon stat >/dev/null 2>"$DIR/log/mon-stat.err"
}

# What a mon that does not answer is doing: alive or not, its state and wait channel, what it
# listens on, the last `ceph mon stat` error and the end of its log.
diagnose_mon() {
    local name pid
    echo "ceph-cluster: the mon did not answer; what it was doing:" >&2
    while read -r name pid; do
        [ "$name" = mon.a ] || continue
        if ours "$pid"; then
            echo "  pid $pid alive: $(grep -E '^(State|Threads|VmRSS)' "/proc/$pid/status" | tr '\n\t' '  ')" >&2
            echo "  wchan: $(cat "/proc/$pid/wchan" 2>/dev/null) stack: $(head -n 4 "/proc/$pid/stack" 2>/dev/null | tr '\n' ' ')" >&2
            echo "  listening: $(ss -Hltnp 2>/dev/null | grep "pid=$pid," | awk '{print $4}' | tr '\n' ' ')" >&2
        else
            echo "  pid $pid has exited (a mon that exits without a word in its log: see the free-space check)" >&2
        fi
    done <"$DIR/pids"
    echo "  last 'ceph mon stat' error: $(tail -n 3 "$DIR/log/mon-stat.err" 2>/dev/null | tr '\n' ' ')" >&2
    echo "  loadavg: $(cat /proc/loadavg); free MiB: $(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo); disk: $(df -h "$DIR" | tail -n 1)" >&2
    log_tail
}

cmd_start() {
    local osds=1 mgr=0 store=bluestore port_base="" osd_size=10G watch_pid="" images=() sets=()
    while [ $# -gt 0 ]; do
        case $1 in
        --osds)
            osds=${2:?--osds needs a number}
            shift 2
            ;;
        --mgr)
            mgr=1
            shift
            ;;
        --memstore)
            store=memstore
            shift
            ;;
        --image)
            images+=("${2:?--image needs NAME:SIZE}")
            shift 2
            ;;
        --port-base)
            port_base=${2:?--port-base needs a port}
            shift 2
            ;;
        --osd-size)
            osd_size=${2:?--osd-size needs a size}
            shift 2
            ;;
        --set)
            [[ ${2:-} =~ ^[A-Za-z0-9_\ ]+=.+$ ]] || die "--set wants KEY=VALUE (got '${2:-}')"
            sets+=("$2")
            shift 2
            ;;
        --watch-pid)
            watch_pid=${2:?--watch-pid needs a PID}
            shift 2
            ;;
        *) die "start: unknown option '$1' (see the top of $SELF)" ;;
        esac
    done
    [[ $osds =~ ^[0-3]$ ]] || die "--osds must be 0, 1, 2 or 3 (got '$osds')"
    [ "$osds" -gt 0 ] || [ ${#images[@]} -eq 0 ] || die "--image needs at least one OSD (got --osds 0)"
    local osd_bytes
    osd_bytes=$(to_bytes "$osd_size") || die "--osd-size '$osd_size' is not a size"
    local img
    for img in "${images[@]}"; do
        [[ $img =~ ^[A-Za-z0-9._-]+:[0-9]+[KkMmGgTt]?$ ]] ||
            die "--image '$img': want NAME:SIZE, e.g. disk1:1G"
    done
    if [ -n "$port_base" ]; then
        [[ $port_base =~ ^[0-9]+$ ]] && [ "$port_base" -ge 1024 ] && [ "$port_base" -le 65534 ] ||
            die "--port-base must be a port in 1024-65534"
    fi
    [ -n "$watch_pid" ] && { kill -0 "$watch_pid" 2>/dev/null || die "--watch-pid $watch_pid: no such process"; }
    local prog
    for prog in ceph ceph-mon ceph-osd ceph-authtool monmaptool rbd; do
        command -v "$prog" >/dev/null 2>&1 ||
            die "$prog is not installed (apt-get install ceph-mon ceph-osd ceph-common)"
    done
    [ "$mgr" = 0 ] || command -v ceph-mgr >/dev/null 2>&1 || die "ceph-mgr is not installed (apt-get install ceph-mgr)"

    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    CONF=$DIR/ceph.conf
    local free_mib
    free_mib=$(df -Pm "$DIR" | awk 'NR == 2 {print $4}')
    [ "${free_mib:-0}" -ge "$MIN_FREE_MIB" ] ||
        die "$DIR: only ${free_mib:-?} MiB free on its file system; a cluster needs at least $MIN_FREE_MIB MiB (CEPH_CLUSTER_MIN_FREE_MIB)"
    if [ -f "$DIR/pids" ] && [ ! -f "$DIR/stopped" ]; then
        die "$DIR already holds a cluster that was not stopped (run: $SELF stop $DIR)"
    fi
    rm -rf "$DIR/mon" "$DIR/osd" "$DIR/mgr" "$DIR/run" "$DIR/log" "$DIR/pids" "$DIR/stopped" \
        "$DIR/keyring" "$DIR/monmap" "$DIR/ceph.conf" "$DIR/port-base"
    mkdir -p "$DIR/mon" "$DIR/osd" "$DIR/mgr" "$DIR/run" "$DIR/log"
    : >"$DIR/pids"

    local t0
    t0=$(now_ms)
    # From here on, a failure stops whatever was started and shows the logs.
    trap 'rc=$?; if [ $rc -ne 0 ]; then echo "ceph-cluster: start failed; stopping what was started" >&2; log_tail; cmd_stop; fi' EXIT

    local fsid
    fsid=$(cat /proc/sys/kernel/random/uuid)

    # Keys (kept outside the mon data dir: a non-empty mon dir makes --mkfs a silent no-op).
    ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool "$DIR/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
        --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
    chmod 600 "$DIR/keyring"

    # Ports, then the mon listening on them, under one lock so parallel starts do not collide.
    exec 9>"${TMPDIR:-/tmp}/tiercache-ceph-cluster-ports.lock"
    flock -w 120 9 || die "could not take the port lock"
    # A mon that does not answer within 30 s is stopped, shown (diagnose_mon) and started again
    # from scratch on the next free port pair, up to 3 times (a CI run once saw every mon of a
    # test run stay silent for 30 s while the same script started in 2 s everywhere else).
    local attempt fixed_port=$port_base p=33000
    for attempt in 1 2 3; do
        if [ -z "$fixed_port" ]; then
            while port_busy "$p" || port_busy $((p + 1)); do
                p=$((p + 2))
                [ "$p" -lt 65000 ] || die "no free port pair found from 33000"
            done
            port_base=$p
        elif port_busy "$port_base" || port_busy $((port_base + 1)); then
            die "port $port_base or $((port_base + 1)) on 127.0.0.1 is in use (choose another --port-base)"
        fi
        echo "$port_base" >"$DIR/port-base"
        write_conf "$fsid" "$port_base" "$store" "$osd_bytes" "${sets[@]}"

        rm -rf "$DIR/mon/ceph-a" "$DIR/monmap"
        monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port_base,v1:127.0.0.1:$((port_base + 1))]" \
            "$DIR/monmap" >/dev/null
        mkdir -p "$DIR/mon/ceph-a"
        timeout -k 5 "$CALL_TIMEOUT" ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/keyring"
        [ -f "$DIR/mon/ceph-a/keyring" ] || die "ceph-mon --mkfs did not create the mon store"
        spawn mon.a ceph-mon -f -c "$CONF" -i a
        wait_until 30 "the mon to answer (attempt $attempt of 3)" mon_up && break
        diagnose_mon
        stop_group '^mon\.'
        [ "$attempt" -lt 3 ] || die "the mon did not answer in 3 attempts"
        p=$((port_base + 2))
    done
    flock -u 9
    exec 9>&-

    if [ "$mgr" = 1 ]; then
        mkdir -p "$DIR/mgr/ceph-x"
        ceph_ auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
            -o "$DIR/mgr/ceph-x/keyring" >/dev/null
        spawn mgr.x ceph-mgr -f -c "$CONF" -i x
    fi

    # OSDs: registered one by one, created (mkfs) in parallel, then started.
    local i ids=() uuid secret id mkfs_pids=()
    for ((i = 0; i < osds; i++)); do
        uuid=$(cat /proc/sys/kernel/random/uuid)
        secret=$(ceph-authtool --gen-print-key)
        id=$(echo "{\"cephx_secret\": \"$secret\"}" | ceph_ osd new "$uuid" -i -)
        [[ $id =~ ^[0-9]+$ ]] || die "ceph osd new gave '$id'"
        mkdir -p "$DIR/osd/ceph-$id"
        ceph-authtool --create-keyring "$DIR/osd/ceph-$id/keyring" --name "osd.$id" --add-key "$secret" >/dev/null
        timeout -k 5 "$CALL_TIMEOUT" ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$uuid" \
            >>"$DIR/log/osd.$id.mkfs.out" 2>&1 &
        mkfs_pids+=($!)
        ids+=("$id")
    done
    for i in "${!mkfs_pids[@]}"; do
        wait "${mkfs_pids[$i]}" || die "ceph-osd --mkfs of osd.${ids[$i]} failed (see $DIR/log/osd.${ids[$i]}.mkfs.out)"
    done
    for id in "${ids[@]}"; do
        spawn "osd.$id" ceph-osd -f -c "$CONF" -i "$id"
    done
    if [ "$osds" -gt 0 ]; then
        wait_until 60 "$osds OSD(s) to come up" osds_up "$osds"
        local out
        out=$(ceph_ osd pool create rbd 8 8 2>&1) || die "ceph osd pool create rbd failed: $out"
        rbd_ pool init rbd
        for img in "${images[@]}"; do
            rbd_ create --size "${img#*:}" "rbd/${img%%:*}"
        done
    fi

    if [ -n "$watch_pid" ]; then
        CEPH_CLUSTER_FROM_WATCHER=1 setsid bash -c \
            'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; exec "$2" stop "$3"' \
            watcher "$watch_pid" "$SELF" "$DIR" </dev/null >>"$DIR/log/watcher.out" 2>&1 &
        record watcher $!
    fi
    trap - EXIT
    local t1
    t1=$(now_ms)
    local ms=$((t1 - t0))
    local pool=", pool rbd"
    [ "$osds" -gt 0 ] || pool=", no pool"
    echo "ceph-cluster: up in $((ms / 1000)).$(printf %03d $((ms % 1000)))s: $osds OSD(s) ($store), mon on 127.0.0.1:$port_base$pool${images:+, images ${images[*]}}"
    echo "ceph-cluster: eval \"\$($SELF env $DIR)\" to use it; $SELF stop $DIR to stop it"
}

osd_is_up() {
    local out
    out=$(timeout -k 2 10 ceph -c "$CONF" osd dump -f json 2>/dev/null) || return 1
    echo "$out" | tr -d ' \n' | grep -qE "\"osd\":$1,\"uuid\":\"[^\"]*\",\"up\":1"
}

# Removes OSD $1 from the maps and its key (`ceph osd purge` goes through the mgr, which these
# clusters may not run: it would wait for ever).
purge_osd() {
    ceph_ osd crush remove "osd.$1" >/dev/null 2>&1 || true
    ceph_ auth del "osd.$1" >/dev/null 2>&1 || true
    ceph_ osd rm "$1" >/dev/null 2>&1
}

cmd_add_osd() {
    local block="" db="" db_size="" opts=()
    while [ $# -gt 0 ]; do
        case $1 in
        --block)
            block=${2:?--block needs a path}
            shift 2
            ;;
        --db)
            db=${2:?--db needs a path}
            shift 2
            ;;
        --db-size)
            db_size=${2:?--db-size needs a size}
            shift 2
            ;;
        --opt)
            [[ ${2:-} =~ ^[A-Za-z0-9_]+=.+$ ]] || die "--opt wants KEY=VALUE (got '${2:-}')"
            opts+=("--$2")
            shift 2
            ;;
        *) die "add-osd: unknown option '$1' (see the top of $SELF)" ;;
        esac
    done
    [ -f "$DIR/pids" ] && [ ! -f "$DIR/stopped" ] || die "$DIR: no running cluster here (start one first)"
    [ -n "$block" ] || die "add-osd needs --block PATH"
    [ -e "$block" ] || die "add-osd --block $block: no such file or device"
    opts+=("--bluestore_block_path=$block" "--bluestore_block_create=false")
    if [ -n "$db" ]; then
        local db_bytes
        db_bytes=$(to_bytes "${db_size:-}") || die "add-osd --db needs --db-size SIZE (got '${db_size:-}')"
        opts+=("--bluestore_block_db_path=$db" "--bluestore_block_db_create=true"
            "--bluestore_block_db_size=$db_bytes")
    fi
    local uuid secret id
    uuid=$(cat /proc/sys/kernel/random/uuid)
    secret=$(ceph-authtool --gen-print-key)
    id=$(echo "{\"cephx_secret\": \"$secret\"}" | ceph_ osd new "$uuid" -i -)
    [[ $id =~ ^[0-9]+$ ]] || die "ceph osd new gave '$id'"
    rm -rf "$DIR/osd/ceph-$id"
    mkdir -p "$DIR/osd/ceph-$id"
    ceph-authtool --create-keyring "$DIR/osd/ceph-$id/keyring" --name "osd.$id" --add-key "$secret" >/dev/null
    timeout -k 5 "$CALL_TIMEOUT" ceph-osd -c "$CONF" -i "$id" "${opts[@]}" --mkfs --osd-uuid "$uuid" \
        >>"$DIR/log/osd.$id.mkfs.out" 2>&1 || {
        tail -n 5 "$DIR/log/osd.$id.mkfs.out" >&2
        purge_osd "$id" || true
        die "ceph-osd --mkfs of osd.$id on $block failed (see $DIR/log/osd.$id.mkfs.out)"
    }
    # For start-osd: the options this OSD runs with.
    printf '%s\n' "${opts[@]}" >"$DIR/osd/ceph-$id/add-osd.opts"
    spawn "osd.$id" ceph-osd -f -c "$CONF" -i "$id" "${opts[@]}"
    wait_until 60 "osd.$id to come up" osd_is_up "$id" || {
        tail -n 15 "$DIR/log/osd.$id.log" >&2 || true
        stop_group "^osd\.$id\$"
        purge_osd "$id" || true
        die "osd.$id did not come up"
    }
    echo "$id"
}

cmd_stop_osd() {
    local id=${1:-}
    [[ $id =~ ^[0-9]+$ ]] || die "$VERB wants an OSD id (got '$id')"
    [ -f "$DIR/pids" ] || die "$DIR: no cluster was started here"
    stop_group "^osd\.$id\$"
    ceph_ osd down "$id" >/dev/null 2>&1 || true
}

cmd_remove_osd() {
    cmd_stop_osd "${1:-}"
    purge_osd "$1" || die "could not remove osd.$1 from the cluster"
    rm -rf "$DIR/osd/ceph-$1"
}

cmd_start_osd() {
    local id=${1:-} name pid
    [[ $id =~ ^[0-9]+$ ]] || die "start-osd wants an OSD id (got '$id')"
    [ -f "$DIR/pids" ] && [ ! -f "$DIR/stopped" ] || die "$DIR: no running cluster here (start one first)"
    [ -f "$DIR/osd/ceph-$id/add-osd.opts" ] || die "osd.$id was not added with add-osd here"
    while read -r name pid; do
        [ "$name" = "osd.$id" ] && ours "$pid" && die "osd.$id is running (pid $pid)"
    done <"$DIR/pids"
    local opts=()
    mapfile -t opts <"$DIR/osd/ceph-$id/add-osd.opts"
    spawn "osd.$id" ceph-osd -f -c "$CONF" -i "$id" "${opts[@]}"
    wait_until 60 "osd.$id to come up" osd_is_up "$id" || {
        tail -n 15 "$DIR/log/osd.$id.log" >&2 || true
        stop_group "^osd\.$id\$"
        die "osd.$id did not come up"
    }
    echo "$id"
}

[ $# -ge 2 ] || usage
VERB=$1
DIR=$2
shift 2
case $VERB in
start) cmd_start "$@" ;;
add-osd | remove-osd | stop-osd | start-osd)
    [ -d "$DIR" ] || die "$DIR: no such directory"
    DIR=$(cd "$DIR" && pwd)
    CONF=$DIR/ceph.conf
    case $VERB in
    add-osd) cmd_add_osd "$@" ;;
    remove-osd) cmd_remove_osd "$@" ;;
    stop-osd) cmd_stop_osd "$@" ;;
    start-osd) cmd_start_osd "$@" ;;
    esac
    ;;
stop | env | status)
    [ $# -eq 0 ] || die "$VERB takes only DIR"
    [ -d "$DIR" ] || { [ "$VERB" = stop ] && exit 0; } || die "$DIR: no such directory"
    DIR=$(cd "$DIR" && pwd)
    CONF=$DIR/ceph.conf
    "cmd_$VERB"
    ;;
*) usage ;;
esac
