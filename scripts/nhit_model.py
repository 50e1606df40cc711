#!/usr/bin/env python3
"""Open CAS's nhit promotion, modelled exactly (a hash of 2 x footprint counted core lines, the
oldest overwritten; nothing counted below the trigger; a request is admitted when every line has
`threshold` misses, or when some of its lines are mapped; counts purged on insertion), on a cache
as large as the trace's footprint (no eviction): how many lines get in. docs/SIZING.md compares
it with `tiercache sim mrc --method core --promotion nhit --sizes 100%`.

With --free-lines it models tiercache's rule instead: the same, except that a request that fits
in the free lines evicts nothing and is admitted (core/src/policy/promotion/nhit.rs), so a cache
as large as the footprint fills.

usage: nhit_model.py [--free-lines] TRACE.csv   (tiercache's CSV: time_us,op,offset,length; 4 KiB lines)
"""
import sys
from collections import OrderedDict
LINE = 4096
reqs = []
lines_seen = set()
args = sys.argv[1:]
free_lines = '--free-lines' in args
args = [a for a in args if a != '--free-lines']
with open(args[0]) as f:
    next(f)
    for l in f:
        t, op, off, ln = l.split(',')
        off, ln = int(off), int(ln)
        a, b = off // LINE, (off + ln - 1) // LINE
        reqs.append((a, b))
        lines_seen.update(range(a, b + 1))
total = len(lines_seen)
threshold, trigger = 3, 80
cap = 2 * total
mapped = set()
counts = OrderedDict()
trig = -(-trigger * total // 100)
for a, b in reqs:
    ls = range(a, b + 1)
    if all(x in mapped for x in ls):
        continue
    if any(x in mapped for x in ls) or len(mapped) < trig or (
            free_lines and len(mapped) + len(ls) <= total):
        admit = True
    else:
        admit = True
        for x in ls:
            c = counts.get(x, 0) + 1
            if x not in counts and len(counts) >= cap:
                counts.popitem(last=False)
            counts[x] = c
            if c < threshold:
                admit = False
    if admit:
        for x in ls:
            mapped.add(x)
            counts.pop(x, None)
rule = "tiercache (free lines filled)" if free_lines else "Open CAS"
print(f"footprint {total} lines, trigger at {trig}; {rule} nhit maps {len(mapped)} ({100*len(mapped)/total:.1f}%)")
