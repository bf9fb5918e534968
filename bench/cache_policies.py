#!/usr/bin/env python3
"""Offline headroom of expert-cache replacement policies on a replayed routing trace (issue 32).

Replays a routing trace (spool calibrate --trace-out) onto a target of E_t experts per MoE layer and
L_t MoE layers with spool's TraceMap (docs/routing-trace.md; the same splitmix64 expert map), as the
one-sequence tg test of `spool bench -p 0 -n N -r R` routes it (a warm-up repetition, then R timed
ones), and counts hits of a cache of CAP experts under LRU, LFU (undecayed request counts, ties to
the least recent) and Belady's offline optimum (evict the expert used again furthest in the future).
LRU and LFU agree with `spool plan --trace --cache-policy lru|lfu` (which simulates the engine's own
order of operations); Belady is what no online policy can beat.

  bench/cache_policies.py TRACE CAP [E_t=256] [L_t=8] [N=32] [R=2]
"""
import collections
import json
import sys

M64 = (1 << 64) - 1


def splitmix64(st):
    z = (st + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def main():
    path, cap = sys.argv[1], int(sys.argv[2])
    et, lt, n, r = (int(x) for x in (sys.argv[3:] + ["256", "8", "32", "2"][len(sys.argv) - 3:])[:4])
    lines = open(path).read().splitlines()
    h = json.loads(lines[0])
    moe, es, ks = h["moe_layers"], h["n_experts"], h["top_k"]
    rec = {}
    for line in lines[1:]:
        x = json.loads(line)
        rec[(x["t"], moe.index(x["l"]))] = x["e"]
    ntok = max(t for t, _ in rec) + 1
    rr = et // es if et >= es else 1

    def route(j, tok):  # TraceMap::route, top-k of the target = 8
        tok %= ntok
        se, ids = rec[(tok, j % len(moe))], []
        for i in range(8):
            e, p = se[i % ks], i // ks
            idx = e + es * (splitmix64(((j << 48) ^ (tok << 16) ^ e ^ (p << 56)) & M64) % rr) if et >= es else e % et
            while idx in ids:
                idx = (idx + 1) % et
            ids.append(idx)
        return ids

    reqs = [(j, route(j, t)) for t in range(n * (r + 1)) for j in range(lt)]
    warm = n * lt

    def run(policy):
        cache, last, freq, hits, miss, clock = set(), {}, collections.Counter(), 0, 0, 0
        pos, ptr = collections.defaultdict(list), collections.defaultdict(int)
        for i, (j, ids) in enumerate(reqs):
            for e in ids:
                pos[(j, e)].append(i)
        for i, (j, ids) in enumerate(reqs):
            keys = [(j, e) for e in ids]
            for k in keys:
                clock += 1
                ptr[k] += 1
                if k in cache:
                    hits += i >= warm
                else:
                    miss += i >= warm
                    if len(cache) >= cap:
                        cand = [c for c in cache if c not in keys]
                        if policy == "lru":
                            v = min(cand, key=lambda c: last[c])
                        elif policy == "lfu":
                            v = min(cand, key=lambda c: (freq[c], last[c]))
                        else:  # belady
                            v = max(cand, key=lambda c: pos[c][ptr[c]] if ptr[c] < len(pos[c]) else 1 << 40)
                        cache.discard(v)
                    cache.add(k)
                last[k] = clock
                freq[k] += 1
        return hits / (hits + miss), miss / (n * r)

    for policy in ("lru", "lfu", "belady"):
        hr, mpt = run(policy)
        print(f"{policy:7s} hit rate {hr:.1%}  misses per token {mpt:.2f}")


if __name__ == "__main__":
    main()
