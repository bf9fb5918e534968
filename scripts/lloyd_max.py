#!/usr/bin/env python3
"""Lloyd-Max codebooks of the spool quantized format for N(0, 1) (docs/quant-format.md).

Deterministic Lloyd iteration in double precision: start from the quantiles of N(0, 1) at
(i + 0.5) / L, then repeat {boundaries = midpoints of adjacent centroids; centroid of each cell =
E[X | a < X < b] = (phi(a) - phi(b)) / (Phi(b) - Phi(a))} until no centroid moves by more than
1e-13 (max 10^6 rounds). Symmetry is imposed exactly (c[L-1-i] = -c[i]). Prints each table with
9 significant digits (enough to identify a float exactly) and the unit-variance MSE
E[(X - Q(X))^2], computed in closed form per cell.

Also prints the MSE of the uniform symmetric 256-level grid c_k = (2k - 255) / 64 used by q8, and
of the best uniform step, for comparison with the 256-level Lloyd-Max table.

Usage: scripts/lloyd_max.py [levels ...]   (default: 4 8 16 32 64 256)
"""
import math
import sys

SQRT2 = math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def phi(x):
    return 0.0 if math.isinf(x) else INV_SQRT_2PI * math.exp(-0.5 * x * x)


def cdf(x):
    if x == math.inf:
        return 1.0
    if x == -math.inf:
        return 0.0
    return 0.5 * math.erfc(-x / SQRT2)


def upper_tail(x):  # 1 - Phi(x), accurate for large x
    if x == math.inf:
        return 0.0
    return 0.5 * math.erfc(x / SQRT2)


def mass(a, b):
    # P(a < X < b), using the upper tail for positive cells (no cancellation in the tail).
    if a >= 0:
        return upper_tail(a) - upper_tail(b)
    return cdf(b) - cdf(a)


def inv_cdf(p):  # bisection, double precision
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def cell_mse(c, a, b):
    # E[(X - c)^2 ; a < X < b] = m2 - 2 c m1 + c^2 m0 with m_k the partial moments.
    m0 = mass(a, b)
    m1 = phi(a) - phi(b)
    ta = 0.0 if math.isinf(a) else a * phi(a)
    tb = 0.0 if math.isinf(b) else b * phi(b)
    m2 = m0 + ta - tb
    return m2 - 2 * c * m1 + c * c * m0


def mse(c):
    e = 0.0
    L = len(c)
    for i in range(L):
        a = -math.inf if i == 0 else 0.5 * (c[i - 1] + c[i])
        b = math.inf if i == L - 1 else 0.5 * (c[i] + c[i + 1])
        e += cell_mse(c[i], a, b)
    return e


def lloyd_max(L, tol=1e-13, max_rounds=1_000_000):
    c = [inv_cdf((i + 0.5) / L) for i in range(L)]
    for rounds in range(1, max_rounds + 1):
        n = [0.0] * L
        for i in range(L // 2, L):  # positive half; mirror
            a = 0.0 if (L % 2 == 0 and i == L // 2) else 0.5 * (c[i - 1] + c[i])
            b = math.inf if i == L - 1 else 0.5 * (c[i] + c[i + 1])
            n[i] = (phi(a) - phi(b)) / mass(a, b)
        if L % 2 == 1:
            n[L // 2] = 0.0
        for i in range(L // 2):
            n[i] = -n[L - 1 - i]
        delta = max(abs(x - y) for x, y in zip(n, c))
        c = n
        if delta < tol:
            return c, rounds
    raise SystemExit(f"levels {L}: no convergence in {max_rounds} rounds")


def main():
    levels = [int(a) for a in sys.argv[1:]] or [4, 8, 16, 32, 64, 256]
    for L in levels:
        c, rounds = lloyd_max(L)
        print(f"# {L} levels: {rounds} rounds, unit-variance MSE {mse(c):.6g}")
        row = [f"{x:.9g}f" for x in c]
        for i in range(0, L, 8):
            print("  " + ", ".join(row[i:i + 8]) + ",")
    grid = [(2 * k - 255) / 64.0 for k in range(256)]
    print(f"# uniform 256-level grid (2k - 255) / 64: unit-variance MSE {mse(grid):.6g}")
    best = min((mse([(2 * k - 255) * d / 2 for k in range(256)]), d) for d in [0.025 + i * 1e-4 for i in range(150)])
    print(f"# best uniform 256-level step {best[1]:.4f}: unit-variance MSE {best[0]:.6g}")


if __name__ == "__main__":
    main()
