#!/usr/bin/env python3
"""Host-side checks of the tensor-core attention kernels (needs numpy, no GPU); not a CTest.
1) emulates ldmatrix.x4 (+.trans) and mma.m16n8k16 per the PTX fragment layouts and runs the
   fragment-address helpers of ops/attention_mma.cuh the way attention_fwd.cu / attention_bwd.cu
   use them (S = Q K^T, O = P V, dQ = dS K, the dS^T store);
2) replays the kernels tile loops, causal masks, online softmax and lse/D padding at matrix
   level for odd T against a dense causal reference, the pipelined backward (one barrier per
   query tile) with its double-buffer indices and a check that no shared buffer is written
   and read between the same two barriers.
3) replays the dropout keep-bit assignment of every kernel (mma.sync and wgmma forward and
   backward in each block shape, the simple kernels: which lane draws which Philox blocks,
   the byte compares, the shuffles, the bit positions) against the 8-bit rule of
   ops/attention.h read from the stream element by element.
Usage: python3 tests/attention_mma_emulation.py  (every error printed should be ~1e-14, every
mask line OK)"""
import numpy as np

rng = np.random.default_rng(0)
D = 64; LD = D + 8

def ldsm(smem, addrs, trans):
    # smem: flat array; addrs[lane] = flat element index of row start for matrix lane//8
    regs = [[None]*32 for _ in range(4)]
    for i in range(4):
        M = np.array([smem[addrs[8*i + r]: addrs[8*i + r] + 8] for r in range(8)])
        for L in range(32):
            g, c = L // 4, 2 * (L % 4)
            regs[i][L] = (M[g, c], M[g, c+1]) if not trans else (M[c, g], M[c+1, g])
    return regs  # regs[i][lane] = pair

def mma(C, a, b0, b1):
    # C[lane] = [c0..c3]; a[j][lane] pairs (4 regs), b0/b1[lane] pairs
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for L in range(32):
        g, c = L // 4, 2 * (L % 4)
        A[g, c:c+2] = a[0][L]; A[g+8, c:c+2] = a[1][L]; A[g, c+8:c+10] = a[2][L]; A[g+8, c+8:c+10] = a[3][L]
        B[c:c+2, g] = b0[L]; B[c+8:c+10, g] = b1[L]
    R = A @ B
    for L in range(32):
        g, c = L // 4, 2 * (L % 4)
        C[L][0] += R[g, c]; C[L][1] += R[g, c+1]; C[L][2] += R[g+8, c]; C[L][3] += R[g+8, c+1]

def a_frag_addr(ld, r0, c0, L): return (r0 + (L & 7) + ((L >> 3) & 1) * 8) * ld + c0 + (L >> 4) * 8
def bt_frag_addr(ld, n0, k0, L): return (n0 + (L & 7) + (L >> 4) * 8) * ld + k0 + ((L >> 3) & 1) * 8
def b_frag_addr_t(ld, k0, n0, L): return (k0 + (L & 7) + ((L >> 3) & 1) * 8) * ld + n0 + (L >> 4) * 8
def at_frag_addr_t(ld, m0, k0, L): return (k0 + (L & 7) + (L >> 4) * 8) * ld + m0 + ((L >> 3) & 1) * 8

def tile(rows, ld, cols):
    t = np.zeros((rows, ld)); t[:, :cols] = rng.standard_normal((rows, cols)); return t

def acc_to_mat(C, ntiles):   # per-lane accumulators [ntiles][lane][4] -> 16 x (8*ntiles)
    M = np.zeros((16, 8 * ntiles))
    for nt in range(ntiles):
        for L in range(32):
            g, c = L // 4, 2 * (L % 4)
            M[g, nt*8+c:nt*8+c+2] = C[nt][L][0:2]; M[g+8, nt*8+c:nt*8+c+2] = C[nt][L][2:4]
    return M

def pack_A(S, kk):  # accumulator layout of S (ntiles) -> A fragment for k-chunk kk
    return [[tuple(S[2*kk][L][0:2]) for L in range(32)], [tuple(S[2*kk][L][2:4]) for L in range(32)],
            [tuple(S[2*kk+1][L][0:2]) for L in range(32)], [tuple(S[2*kk+1][L][2:4]) for L in range(32)]]

warp = 1; KS = D // 16; ST = 8
Q = tile(128, LD, D); K = tile(64, LD, D); V = tile(64, LD, D)
q, k, v = Q.ravel(), K.ravel(), V.ravel()
for mi in range(2):
    r0 = warp * 32 + mi * 16
    qf = [ldsm(q, [a_frag_addr(LD, r0, kk*16, L) for L in range(32)], False) for kk in range(KS)]
    S = [[[0.0]*4 for _ in range(32)] for _ in range(ST)]
    for kk in range(KS):
        for np_ in range(ST // 2):
            b = ldsm(k, [bt_frag_addr(LD, np_*16, kk*16, L) for L in range(32)], False)
            mma(S[2*np_], qf[kk], b[0], b[1]); mma(S[2*np_+1], qf[kk], b[2], b[3])
    ref = Q[r0:r0+16, :D] @ K[:, :D].T
    print("S = Q K^T   max err", np.abs(acc_to_mat(S, ST) - ref).max())
    O = [[[0.0]*4 for _ in range(32)] for _ in range(D // 8)]
    for kk in range(4):
        a = pack_A(S, kk)
        for dp in range(D // 16):
            b = ldsm(v, [b_frag_addr_t(LD, kk*16, dp*16, L) for L in range(32)], True)
            mma(O[2*dp], a, b[0], b[1]); mma(O[2*dp+1], a, b[2], b[3])
    print("O = S V     max err", np.abs(acc_to_mat(O, D // 8) - ref @ V[:, :D]).max())

# backward: dQ[16 q of warp] = dS K with dS^T stored [key][query] (ld 72); K tile [key][d]
LDS = 64 + 8
dST = tile(64, LDS, 64)   # [key][query]
dst = dST.ravel()
dQ = [[[0.0]*4 for _ in range(32)] for _ in range(D // 8)]
for kk in range(4):
    a = ldsm(dst, [at_frag_addr_t(LDS, warp*16, kk*16, L) for L in range(32)], True)
    for dp in range(D // 16):
        b = ldsm(k, [b_frag_addr_t(LD, kk*16, dp*16, L) for L in range(32)], True)
        mma(dQ[2*dp], a, b[0], b[1]); mma(dQ[2*dp+1], a, b[2], b[3])
ref = dST[:, warp*16:warp*16+16].T @ K[:, :D]
print("dQ = dS K   max err", np.abs(acc_to_mat(dQ, D // 8) - ref).max())
# 16-byte dQ reductions (dq_tile, kV4): lane pairs swap halves, then each lane adds four
# adjacent floats of one row at (row, col + dt * 8); every element must land exactly once.
got = np.zeros((16, D)); hits = np.zeros((16, D), dtype=int)
for dt in range(D // 8):
    sent = {}
    for L in range(32):
        odd = L & 1
        sent[L] = tuple(dQ[dt][L][0:2]) if odd else tuple(dQ[dt][L][2:4])
    for L in range(32):
        odd = L & 1; r = sent[L ^ 1]
        row = L // 4 + (8 if odd else 0); col = 2 * (L & 2) + dt * 8
        vals = (r[0], r[1], dQ[dt][L][2], dQ[dt][L][3]) if odd else (dQ[dt][L][0], dQ[dt][L][1], r[0], r[1])
        got[row, col:col+4] += vals; hits[row, col:col+4] += 1
print("dQ red.v4   max err", np.abs(got - ref).max(), "(each element once:", bool((hits == 1).all()), ")")
# dS^T store layout check: as[] written to dss as the kernel does, then read back
S = [[[float(x) for x in rng.standard_normal(4)] for _ in range(32)] for _ in range(8)]
M = acc_to_mat(S, 8); dss = np.zeros((64, LDS))
for kk in range(4):
    a = pack_A(S, kk)
    for L in range(32):
        kr, qc = warp*16 + L // 4, kk*16 + 2*(L % 4)
        dss[kr, qc:qc+2] = a[0][L]; dss[kr+8, qc:qc+2] = a[1][L]; dss[kr, qc+8:qc+10] = a[2][L]; dss[kr+8, qc+8:qc+10] = a[3][L]
print("dS^T store  max err", np.abs(dss[warp*16:warp*16+16, :64] - M).max())

print("--- tile flow (T, D, max err of O, lse, dq, dk, dv)")
rng = np.random.default_rng(1)
kBc, kWarps, kM = 64, 4, 2
kBr = 16 * kWarps * kM
def ex2(x): return np.exp2(x)

def fwd(Q, K, V):
    T, D = Q.shape; scale = 1/np.sqrt(D); sl2 = scale*np.log2(np.e)
    n_qt, n_kt = -(-T//kBr), -(-T//kBc)
    O = np.zeros((T, D)); LSE = np.zeros(T)
    pad = lambda X, r0, n: np.vstack([X[r0:min(r0+n, T)], np.zeros((max(0, r0+n-T), D))])
    for qt in range(n_qt):
        q0 = qt*kBr; kt_end = min(n_kt-1, (q0+kBr-1)//kBc)
        Qs = pad(Q, q0, kBr)
        m = np.full(kBr, -np.inf); l = np.zeros(kBr); o = np.zeros((kBr, D))
        for kt in range(kt_end+1):
            Ks, Vs = pad(K, kt*kBc, kBc), pad(V, kt*kBc, kBc)
            needs_mask = kt*kBc + kBc - 1 > q0
            for w in range(kWarps):
                for mi in range(kM):
                    r = w*16*kM + mi*16; rows = slice(r, r+16)
                    if not (q0 + r + 15 >= kt*kBc): continue
                    s = Qs[rows] @ Ks.T
                    if needs_mask:
                        key = kt*kBc + np.arange(kBc)[None, :]; row = q0 + r + np.arange(16)[:, None]
                        s = np.where(key > row, -np.inf, s)
                    mx = np.maximum(m[rows], s.max(1))
                    corr = ex2((m[rows]-mx)*sl2); p = ex2(s*sl2 - (mx*sl2)[:, None])
                    l[rows] = l[rows]*corr + p.sum(1); m[rows] = mx
                    o[rows] = o[rows]*corr[:, None] + p @ Vs
        for i in range(kBr):
            if q0+i < T: O[q0+i] = o[i]/l[i]; LSE[q0+i] = m[i]*scale + np.log(l[i])
    return O, LSE

def bwd(Q, K, V, O, dO, LSE, W):
    T, D = Q.shape; scale = 1/np.sqrt(D); sl2 = scale*np.log2(np.e); Br = 64; Bc = 16 * W
    n_t = -(-T//Br); n_kt = -(-T//Bc); Dr = (dO*O).sum(1)
    dq = np.zeros((T, D)); dk = np.zeros((T, D)); dv = np.zeros((T, D))
    pad = lambda X, r0, n: np.vstack([X[r0:min(r0+n, T)], np.zeros((max(0, r0+n-T), D))])
    for kt in range(n_kt):
        k0 = kt*Bc; qt0 = k0 // Br
        Ks, Vs = pad(K, k0, Bc), pad(V, k0, Bc); gk = np.zeros((Bc, D)); gv = np.zeros((Bc, D))
        for qt in range(qt0, n_t):
            Qs, dOs = pad(Q, qt*Br, Br), pad(dO, qt*Br, Br)
            rows = qt*Br + np.arange(Br)
            lb = np.where(rows < T, LSE[np.minimum(rows, T-1)]*np.log2(np.e), np.inf)
            drb = np.where(rows < T, Dr[np.minimum(rows, T-1)], 0.0)
            needs_mask = qt*Br < k0 + Bc - 1
            dss = np.zeros((Bc, Br))
            for w in range(W):
                ks_ = slice(w*16, w*16+16)
                if not (qt*Br + Br - 1 >= k0 + w*16): continue   # inactive: zeros in dS^T
                st = Ks[ks_] @ Qs.T; dpt = Vs[ks_] @ dOs.T         # [key][query]
                p = ex2(st*sl2 - lb[None, :])
                if needs_mask:
                    p = np.where(rows[None, :] < (k0 + w*16 + np.arange(16))[:, None], 0, p)
                ds = p*(dpt - drb[None, :])
                gv[ks_] += p @ dOs; gk[ks_] += ds @ Qs; dss[ks_] = ds
            dqa = dss.T @ Ks
            for i in range(Br):
                if qt*Br + i < T: dq[qt*Br+i] += dqa[i]
        for j in range(Bc):
            if k0 + j < T: dk[k0+j] += gk[j]*scale; dv[k0+j] += gv[j]
    return dq*scale, dk, dv

def bwd_pipe(Q, K, V, O, dO, LSE, W):
    """The default backward kernel's schedule (kPipe): one barrier per query tile, the dQ of
    tile i - 1 and the key-side work of tile i between barriers i and i + 1, with the kernel's
    buffer indices. Asserts that no shared buffer is both written and read between two
    barriers (cp.async writes count in the interval that issues them: they are waited for
    just before the next barrier) and that every read finds the tile it expects."""
    T, D = Q.shape; scale = 1/np.sqrt(D); sl2 = scale*np.log2(np.e); Br = 64; Bc = 16 * W
    n_t = -(-T//Br); n_kt = -(-T//Bc); Dr = (dO*O).sum(1)
    dq = np.zeros((T, D)); dk = np.zeros((T, D)); dv = np.zeros((T, D))
    pad = lambda X, r0, n: np.vstack([X[r0:min(r0+n, T)], np.zeros((max(0, r0+n-T), D))])
    def lse_d(qt):
        rows = qt*Br + np.arange(Br)
        return (np.where(rows < T, LSE[np.minimum(rows, T-1)]*np.log2(np.e), np.inf),
                np.where(rows < T, Dr[np.minimum(rows, T-1)], 0.0))
    for kt in range(n_kt):
        k0 = kt*Bc; qt0 = k0 // Br
        Ks, Vs = pad(K, k0, Bc), pad(V, k0, Bc); gk = np.zeros((Bc, D)); gv = np.zeros((Bc, D))
        qs, dos, dss, ls = [None, None], [None, None], [None, None], [None, None]
        qs[0] = (qt0, pad(Q, qt0*Br, Br)); dos[0] = (qt0, pad(dO, qt0*Br, Br)); ls[0] = (qt0, lse_d(qt0))
        for qt in range(qt0, n_t + 1):
            buf = (qt - qt0) & 1; R, Wr = set(), set()   # after barrier qt
            if qt + 1 < n_t:
                qs[buf ^ 1] = (qt+1, pad(Q, (qt+1)*Br, Br)); dos[buf ^ 1] = (qt+1, pad(dO, (qt+1)*Br, Br))
                Wr |= {("qs", buf ^ 1), ("dos", buf ^ 1)}
            if qt > qt0:
                R |= {("dss", buf ^ 1)}
                tile, ds_all = dss[buf ^ 1]; assert tile == qt - 1
                dqa = ds_all.T @ Ks
                for i in range(Br):
                    if (qt-1)*Br + i < T: dq[(qt-1)*Br+i] += dqa[i]
            if qt < n_t:
                R |= {("qs", buf), ("dos", buf), ("ls", buf)}; Wr |= {("dss", buf)}
                assert qs[buf][0] == qt and dos[buf][0] == qt and ls[buf][0] == qt
                Qs, dOs = qs[buf][1], dos[buf][1]; lb, drb = ls[buf][1]
                rows = qt*Br + np.arange(Br); needs_mask = qt*Br < k0 + Bc - 1
                ds_all = np.zeros((Bc, Br))
                for w in range(W):
                    ks_ = slice(w*16, w*16+16)
                    if not (qt*Br + Br - 1 >= k0 + w*16): continue
                    st = Ks[ks_] @ Qs.T; dpt = Vs[ks_] @ dOs.T
                    p = ex2(st*sl2 - lb[None, :])
                    if needs_mask:
                        p = np.where(rows[None, :] < (k0 + w*16 + np.arange(16))[:, None], 0, p)
                    ds = p*(dpt - drb[None, :])
                    gv[ks_] += p @ dOs; gk[ks_] += ds @ Qs; ds_all[ks_] = ds
                dss[buf] = (qt, ds_all)
            if qt + 1 < n_t:
                ls[buf ^ 1] = (qt+1, lse_d(qt+1)); Wr |= {("ls", buf ^ 1)}
            assert not (R & Wr), (T, W, qt, R & Wr)
        for j in range(Bc):
            if k0 + j < T: dk[k0+j] += gk[j]*scale; dv[k0+j] += gv[j]
    return dq*scale, dk, dv

def ref(Q, K, V, dO):
    T, D = Q.shape; s = Q @ K.T / np.sqrt(D); s[np.triu_indices(T, 1)] = -np.inf
    m = s.max(1, keepdims=True); P = np.exp(s-m); l = P.sum(1, keepdims=True); P /= l
    O = P @ V; lse = (m + np.log(l)).ravel()
    dP = dO @ V.T; dS = P*(dP - (dO*O).sum(1, keepdims=True)) / np.sqrt(D)
    return O, lse, dS @ K, dS.T @ Q, P.T @ dO

for T in [1, 37, 64, 65, 100, 128, 129, 200, 257, 300, 513, 700]:
    for D in [32, 64]:
        Q, K, V, dO = (rng.uniform(-2, 2, (T, D)) for _ in range(4))
        kWarps, kM = 8, 1   # 8 warps of 16 rows (a variant the library no longer builds)
        O8, L8 = fwd(Q, K, V)
        kWarps, kM = 4, 2
        O, L = fwd(Q, K, V); Or, Lr, dqr, dkr, dvr = ref(Q, K, V, dO)
        print(T, D, "fwd 8 warps", ["%.1e" % np.abs(a-b).max() for a, b in [(O8, Or), (L8, Lr)]])
        for W in (4, 8):
            for name, f in (("bwd", bwd), ("bwd pipe", bwd_pipe)):
                dq, dk, dv = f(Q, K, V, O, dO, L, W)
                e = [np.abs(a-b).max() for a, b in [(O, Or), (L, Lr), (dq, dqr), (dk, dkr), (dv, dvr)]]
                print(T, D, name, "warps", W, ["%.1e" % x for x in e])

print("--- dropout keep bits: the kernels' lane -> (row, keys) assignment, shuffles and bit")
print("    extraction against keep(bh, i, j) read straight from the stream (must all be OK)")
M64 = (1 << 64) - 1; M32 = 0xffffffff

def philox(blk, seed):   # Philox4x32-10 as core/rng.c: counter (blk lo, blk hi, 0, 0), key = seed
    c = [blk & M32, (blk >> 32) & M32, 0, 0]; k0, k1 = seed & M32, (seed >> 32) & M32
    for r in range(10):
        if r: k0 = (k0 + 0x9E3779B9) & M32; k1 = (k1 + 0xBB67AE85) & M32
        p0 = 0xD2511F53 * c[0]; p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
    return c

from functools import lru_cache
SEED = 0x1234567890abcdef
THR = 51   # the byte threshold of p = 0.2 (set per run below: 0, 51, 128, 255)
@lru_cache(maxsize=None)
def block(b): return philox(b, SEED)
def number(n): return block(n >> 2)[n & 3]   # number n of the stream (core/rng.h)

def keep(off, e):
    """The documented rule (ops/attention.h), written from the stream numbers: element e of a
    mask reserved at stream number off keeps iff byte e % 4 of number off + e // 4 >= thr."""
    return ((number(off + e // 4) >> (8 * (e % 4))) & 0xff) >= THR

# --- the device helpers of attention_cuda.cuh, on mask indices (drop_origin = 4 * offset) ---
def vcmpgeu4(x, y):   # __vcmpgeu4: per byte 0xff where x's byte >= y's, else 0
    return sum((0xff << (8 * k)) for k in range(4) if ((x >> (8 * k)) & 0xff) >= ((y >> (8 * k)) & 0xff))
def keep4(x): return (((vcmpgeu4(x, THR * 0x01010101) & 0x08040201) * 0x01010101) & M32) >> 24
def keep16(b): w = block(b); return keep4(w[0]) | keep4(w[1]) << 4 | keep4(w[2]) << 8 | keep4(w[3]) << 12

def keep_bits(N, first):   # keep_bits<N>: uint32 arithmetic
    b0, a = first >> 4, first & 15
    bits = keep16(b0)
    if N == 32: bits |= keep16(b0 + 1) << 16
    if a: bits = ((bits >> a) | (keep16(b0 + N // 16) << (N - a))) & M32
    return bits if N == 32 else bits & 0xffff

def check(name, bad, n):
    print(f"  {name:58s} {'OK' if bad == 0 else 'WRONG'} ({n} probabilities, {bad} wrong)")
    assert bad == 0

def fwd_masks(T, BH, offset, KB, kM, kBr=128, n_warps=None):
    """attention_fwd.cu (kBr 128, 8 / kM warps) and attention_fwd_wg.cu (kBr 64, 4 warps of
    kM = 1; every row of the warpgroup active): lanes draw kSlots words per tile (draw_keep),
    the fragment owners shuffle them in (apply_keep)."""
    kRw = 16 * kM; kLp = 32 // kRw; kSlots = KB // 32 // kLp; bad = n = 0
    n_warps = n_warps or 8 // kM; origin = 4 * offset
    for bh in range(BH):
        for qt in range(-(-T // kBr)):
            q0 = qt * kBr; kt_end = min(-(-T // KB) - 1, (q0 + kBr - 1) // KB)
            for warp in range(n_warps):
                row_w = q0 + warp * 16 * kM
                for kt in range(kt_end + 1):
                    key0 = kt * KB; diag = key0 + KB - 1 > q0
                    kw = []
                    for lane in range(32):   # generation
                        lane_row = row_w + lane % kRw
                        lane_first = origin + (bh * T + lane_row) * T
                        ws = []
                        for sl in range(kSlots):
                            key = key0 + 32 * (sl * kLp + lane // kRw)
                            ws.append(keep_bits(32, lane_first + key) if (not diag or key <= lane_row) else 0)
                        kw.append(ws)
                    for mi in range(kM):
                        if kBr == 128 and diag and not (row_w + mi * 16 + 15 >= key0): continue   # inactive m-block
                        for lane in range(32):
                            for h in range(2):
                                r = (lane >> 2) + mi * 16 + h * 8; row = row_w + r
                                for c in range(KB // 32):
                                    w = kw[r + kRw * (c % kLp)][c // kLp] >> (2 * (lane & 3))
                                    for qn in range(4):
                                        for e in range(2):
                                            key = key0 + (4 * c + qn) * 8 + 2 * (lane & 3) + e
                                            if row >= T or key > row: continue   # P = 0 anyway
                                            n += 1
                                            bad += ((w >> (8 * qn + e)) & 1) != keep(offset, (bh * T + row) * T + key)
    return bad, n

def bwd_keep_word(q_first, T, q_base, key0, lane, mask):   # attention_bwd_common.cuh
    i0 = q_base + 2 * lane; f0 = q_first + 2 * lane * T; x = 0
    if not mask or i0 >= key0: x = keep_bits(16, f0)
    if not mask or i0 + 1 >= key0: x |= keep_bits(16, f0 + T) << 16
    return x

def p_ds_check(kw, T, bh, offset, q_base, warp_k0, n_st=8):   # p_ds: the fragment owners' bits
    bad = n = 0
    for lane in range(32):
        key_a = warp_k0 + (lane >> 2)
        for nt in range(n_st):
            w = kw[nt * 4 + (lane & 3)] >> (lane >> 2)
            for e in range(4):
                query = q_base + nt * 8 + 2 * (lane & 3) + (e & 1)
                key = key_a + (e >> 1) * 8
                if query >= T or key >= T or query < key: continue
                n += 1
                bad += ((w >> ((e & 1) * 16 + (e >> 1) * 8)) & 1) != keep(offset, (bh * T + query) * T + key)
    return bad, n

def bwd_masks(T, BH, offset, W):
    """attention_bwd.cu: lane L draws queries 2L, 2L + 1 of the warp's 16 keys, one shuffle per nt."""
    kBr, kBc = 64, 16 * W; n_t = -(-T // kBr); bad = n = 0
    for bh in range(BH):
        head_first = 4 * offset + bh * T * T
        for kt in range(-(-T // kBc)):
            k0 = kt * kBc; qt0 = k0 // kBr
            for qt in range(qt0, n_t):
                q_base = qt * kBr
                needs_mask = q_base < k0 + kBc - 1
                for warp in range(W):
                    if not (q_base + kBr - 1 >= k0 + warp * 16): continue   # inactive warp
                    q_first = head_first + q_base * T + k0 + warp * 16
                    kw = [bwd_keep_word(q_first, T, q_base, k0 + warp * 16, lane, needs_mask) for lane in range(32)]
                    b, m = p_ds_check(kw, T, bh, offset, q_base, k0 + warp * 16); bad += b; n += m
    return bad, n

def bwd_wg_masks(T, BH, offset, kWG):
    """attention_bwd_wg.cu: blocks of kWG warpgroups (64 keys each, 4 warps of 16), the
    warpgroup-wide activity and mask tests, then bwd_keep_word / p_ds as the mma.sync kernel."""
    kBr, kBc = 64, 64 * kWG; n_t = -(-T // kBr); bad = n = 0
    for bh in range(BH):
        head_first = 4 * offset + bh * T * T
        for kt in range(-(-T // kBc)):
            k0 = kt * kBc; qt0 = k0 // kBr
            for qt in range(qt0, n_t):
                q0 = qt * kBr
                for wg in range(kWG):
                    wg_k0 = k0 + 64 * wg
                    if not (kWG == 1 or q0 + kBr - 1 >= wg_k0): continue
                    mask = q0 < wg_k0 + 63
                    for warp in range(4):
                        q_first = head_first + q0 * T + wg_k0 + 16 * warp
                        kw = [bwd_keep_word(q_first, T, q0, wg_k0 + 16 * warp, lane, mask) for lane in range(32)]
                        b, m = p_ds_check(kw, T, bh, offset, q0, wg_k0 + 16 * warp); bad += b; n += m
    return bad, n

def simple_masks(T, BH, offset):
    """attention.cu: keep_run (a row's keys, 32 blocks per refill, one shuffle per key) and keep_column32."""
    bad = n = 0; origin = 4 * offset
    for bh in range(BH):
        for i in range(T):
            first = origin + (bh * T + i) * T; b0, a = first >> 4, first & 15
            for j in range(i + 1):
                r = a + j
                if j == 0 or (r & 511) == 0:
                    bits = [keep16(b0 + ((r >> 4) & ~31) + lane) for lane in range(32)]
                n += 1; bad += ((bits[(r >> 4) & 31] >> (r & 15)) & 1) != keep(offset, (bh * T + i) * T + j)
        for j in range(T):
            col_first = origin + bh * T * T + j
            for i in range(j, T):
                if (i - j) % 32 == 0:
                    ball = 0
                    for lane in range(32):
                        nn = col_first + (i + lane) * T
                        u = block(nn >> 4)[(nn >> 2) & 3]
                        ball |= (((u >> (8 * (nn & 3))) & 0xff) >= (THR * 0x01010101 & 0xff)) << lane
                n += 1; bad += ((ball >> ((i - j) % 32)) & 1) != keep(offset, (bh * T + i) * T + j)
    return bad, n

def threshold(p):   # nt_attention_keep_threshold
    import math
    return min(255, max(0, math.floor(p * 256 + 0.5)))
assert [threshold(p) for p in (0.0, 0.001, 0.1, 0.2, 0.5, 0.9, 0.999)] == [0, 0, 26, 51, 128, 230, 255]

# keep_bits itself, every alignment, and the byte compare at the edge thresholds
for THR in (0, 1, 51, 128, 255):
    bad = n = 0
    for first in range(16 * 1000, 16 * 1000 + 48):
        for N in (16, 32):
            b = keep_bits(N, first)
            for i in range(N):
                e = first + i - 4 * 3996   # mask indices from the origin of offset 3996
                n += 1; bad += ((b >> i) & 1) != keep(3996, e)
    check(f"keep_bits<16/32> at every alignment, threshold {THR}", bad, n)

THR = threshold(0.2)
for T, BH, offset in [(1, 1, 0), (37, 2, 4), (64, 1, 0), (130, 1, 1 << 40), (200, 2, 8), (257, 1, 12)]:
    for KB, kM in ((64, 2), (64, 1), (128, 2)):
        check(f"fwd T {T} BH {BH} offset {offset} keys {KB} warps {8 // kM}", *fwd_masks(T, BH, offset, KB, kM))
    for KB in (64, 128):
        check(f"fwd wgmma T {T} BH {BH} offset {offset} keys {KB}", *fwd_masks(T, BH, offset, KB, 1, 64, 4))
    for W in (4, 8):
        check(f"bwd T {T} BH {BH} offset {offset} warps {W}", *bwd_masks(T, BH, offset, W))
    for kWG in (1, 2):
        check(f"bwd wgmma T {T} BH {BH} offset {offset} keys {64 * kWG}", *bwd_wg_masks(T, BH, offset, kWG))
    if T <= 130:
        check(f"simple T {T} BH {BH} offset {offset}", *simple_masks(T, BH, offset))
# a row longer than 512 keys: the simple kernels' second refill
check("simple T 600 BH 1 offset 8", *simple_masks(600, 1, 8))
