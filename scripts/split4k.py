#!/usr/bin/env python3
"""Writes the "4 KiB-split form" of a block trace: every read and write cut at 4 KiB
boundaries, all pieces at the request's time, in tiercache's CSV (time_us,op,offset,length),
sorted by time (stable), times from the first request. Issue 30's timed-replay benchmark
replays this form of the public CloudPhysics vscsi trace (docs/SIZING.md, section 4).

usage: split4k.py TRACE > split.csv
TRACE is VMware vscsi binary (v1 or v2, as sim/src/trace/vscsi.rs reads it) or tiercache CSV.
Trims, flushes and other commands are left out (the timed replay does not replay them).
"""
import struct
import sys

READS = {0x08, 0x28, 0xA8, 0x88}
WRITES = {0x0A, 0x2A, 0xAA, 0x8A}


def vscsi(data):
    """(time_us, op, offset, length) of each read and write, or None if not vscsi."""
    for size, ver_at, version in ((40, 2, 2), (32, 14, 1)):
        if len(data) >= size and len(data) % size == 0 and data[ver_at + 1] == version:
            break
    else:
        return None
    out = []
    for at in range(0, len(data), size):
        if version == 1:
            _, length, _, cmd, _, lbn, ts = struct.unpack_from("<IIIHHQQ", data, at)
        else:
            cmd, _, _, length, _, lbn, ts = struct.unpack_from("<HHIIIQQ", data, at)
        if (cmd in READS or cmd in WRITES) and length > 0:
            out.append((ts, "R" if cmd in READS else "W", lbn * 512, length))
    return out


def csv(text):
    out = []
    for line in text.splitlines():
        f = line.split(",")
        if len(f) == 4 and f[1] in ("R", "W"):
            out.append((int(f[0]), f[1], int(f[2]), int(f[3])))
    return out


def main():
    data = open(sys.argv[1], "rb").read()
    reqs = vscsi(data)
    if reqs is None:
        reqs = csv(data.decode())
    reqs.sort(key=lambda r: r[0])
    t0 = reqs[0][0] if reqs else 0
    w = sys.stdout.write
    w("time_us,op,offset,length\n")
    for ts, op, off, length in reqs:
        end = off + length
        while off < end:
            piece = min(end, (off // 4096 + 1) * 4096) - off
            w(f"{ts - t0},{op},{off},{piece}\n")
            off += piece


main()
