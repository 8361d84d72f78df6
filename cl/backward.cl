/* backward.cl: the blockwise CASTLE backward pass (SPEC section 4).
 *
 * One launch per anti-diagonal, in reverse (k = N-1 .. 0); work-group (j, bh) handles the block
 * pair (i = j + k, j) of batch entry b = bh / H, head h = bh % H:
 *   G = G[T_j, T_i];  D_j^(k) = D_j^(k+1) - VU[T_i]^T G^T      (rolled back as a hi/lo pair)
 *   SU, A as in the forward;  P = exp(A - lse);  dA = P * (dO VC^T - Delta)
 *   dSU = -SiLU'(SU) dA;  dY = (dSU G) masked;  dG = dSU^T Y + dD_j^T VU[T_i]^T;  dZ = dG G (1 - G)
 * Row block i receives dQC, dVU, dKU; column block j receives dKC, dVC, dQU and dD_j.  No two
 * work-groups of a launch write the same memory: no atomics, bitwise reproducible.
 * Row block i is first touched at k = i (j = 0), column block j at i = N-1: those work-groups
 * initialise the gradients instead of accumulating.
 * Workspace regions (floats, per batch entry x head): the forward's D hi/lo (read at a column's first
 * touch), the working copy W hi/lo of D_j^(k) (rolled back here, so the forward's state survives and
 * the backward can run again), dD (gradient of D_j^(k+1)), X (the forward's scaled masked X blocks). */

#if (NT % BLK) != 0 || ((BLK * BLK) % NT) != 0 || ((BLK * DT) % NT) != 0 || NT < BLK
#error "backward.cl: NT must be a multiple of BLK that divides BLK*BLK and BLK*DT"
#endif

#define BW_MATS 6
#define BW_TILES 6
#define LM_BW (BW_MATS * BLK * BP + BW_TILES * BLK * TS + 2 * BLK)

/* out[e] = (first ? 0 : out[e]) + v */
inline void accumulate(__global float *p, bool first, float v) { *p = first ? v : *p + v; }

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_backward_block(const int k, const int L, const int d, const int H, const int W, const float sc,
                           __global const float *qu, const ulong4 squ,
                           __global const float *ku, const ulong4 sku,
                           __global const float *vu, const ulong4 svu,
                           __global const float *qc, const ulong4 sqc,
                           __global const float *kc, const ulong4 skc,
                           __global const float *vc, const ulong4 svc,
                           __global const float *o, const ulong4 so,
                           __global const float *lse, const ulong4 slse,
                           __global const float *dout, const ulong4 sdo,
                           __global float *dqu, const ulong4 sdqu,
                           __global float *dku, const ulong4 sdku,
                           __global float *dvu, const ulong4 sdvu,
                           __global float *dqc, const ulong4 sdqc,
                           __global float *dkc, const ulong4 sdkc,
                           __global float *dvc, const ulong4 sdvc,
                           __global float *ws, const ulong ws_dlo, const ulong ws_whi, const ulong ws_wlo,
                           const ulong ws_dd, const ulong ws_x)
{
    __local float lm[LM_BW];
    const int lid = get_local_id(0);
    const int j = get_group_id(0), i = j + k;
    const int bh = get_group_id(1);
    const uint b = bh / H, h = bh % H;
    const int N = (L + BLK - 1) / BLK, Lpad = N * BLK;
    const int t0 = i * BLK, s0 = j * BLK;
    const int smax = min(s0 + BLK, L) - 1;
    const bool gate = (W == 0) || (t0 <= smax + W);
    const bool first_row = j == 0;     /* first backward touch of row block i */
    const bool first_col = i == N - 1; /* first backward touch of column block j */

    __global const float *pqu = qu + tensor_offset(squ, b, h, 0);
    __global const float *pku = ku + tensor_offset(sku, b, h, 0);
    __global const float *pvu = vu + tensor_offset(svu, b, h, 0);
    __global const float *pqc = qc + tensor_offset(sqc, b, h, 0);
    __global const float *pkc = kc + tensor_offset(skc, b, h, 0);
    __global const float *pvc = vc + tensor_offset(svc, b, h, 0);
    __global const float *po = o + tensor_offset(so, b, h, 0);
    __global const float *pdo = dout + tensor_offset(sdo, b, h, 0);
    const ulong bhd = (ulong)bh * Lpad * d;
    __global const float *Dsrc_hi = first_col ? ws + bhd : ws + ws_whi + bhd;
    __global const float *Dsrc_lo = first_col ? ws + ws_dlo + bhd : ws + ws_wlo + bhd;
    __global float *Whi = ws + ws_whi + bhd;
    __global float *Wlo = ws + ws_wlo + bhd;
    __global float *dD = ws + ws_dd + bhd;
    __global const float *X = ws + ws_x + ((ulong)bh * N + i) * (BLK * BLK);

    __local float *sG = lm, *sY = lm + BLK * BP, *sP = lm + 2 * BLK * BP;
    __local float *sdA = lm + 3 * BLK * BP, *sdSU = lm + 4 * BLK * BP, *sdY = lm + 5 * BLK * BP;
    __local float *T0 = lm + BW_MATS * BLK * BP, *T1 = T0 + BLK * TS, *T2 = T1 + BLK * TS;
    __local float *T3 = T2 + BLK * TS, *T4 = T3 + BLK * TS, *T5 = T4 + BLK * TS;
    __local float *sDelta = T5 + BLK * TS, *sLse = sDelta + BLK;

    const int col = lid % BLK, row0 = lid / BLK;
    float s1[EPT], s2[EPT], dp[EPT], g[EPT];
    for (int r = 0; r < EPT; ++r)
        s1[r] = s2[r] = dp[r] = g[r] = 0.0f;

    /* Phase A1: the gate logits QU[T_j] KU[T_i]^T, then G and Y = X[T_i, T_i] (masked) in local. */
    if (gate) {
        for (int c0 = 0; c0 < d; c0 += DT) {
            load_tile(T0, pqu, squ.z, s0, L, c0, d);
            load_tile(T1, pku, sku.z, t0, L, c0, d);
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int r = 0; r < EPT; ++r) {
                const int rr = row0 + r * RSTEP;
                for (int c = 0; c < DT; ++c)
                    g[r] += T0[rr * TS + c] * T1[col * TS + c];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            const int s = s0 + rr, jp = t0 + col;
            const bool allowed = s < L && jp < L && s < jp && (W == 0 || jp <= s + W);
            sG[rr * BP + col] = allowed ? castle_sigmoid(sc * g[r]) : 0.0f;
            sY[rr * BP + col] = X[rr * BLK + col];
            g[r] = 0.0f; /* reused for dG below */
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase A2: roll D_j back to D_j^(k) (into W and the local tile T5), Delta = rowsum(dO * O),
       and the products QC KC^T, QC D_j^(k), dO VC^T. */
    float delta = 0.0f;
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile(T0, pqc, sqc.z, t0, L, c0, d);
        load_tile(T1, pkc, skc.z, s0, L, c0, d);
        load_tile(T2, pdo, sdo.z, t0, L, c0, d);
        load_tile(T3, pvc, svc.z, s0, L, c0, d);
        if (gate && k > 0)
            load_tile(T4, pvu, svu.z, t0, L, c0, d);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k > 0)
            for (int e = 0; e < EPC; ++e) {
                const int idx = lid + e * NT;
                const int rr = idx / DT, c = idx % DT, gc = c0 + c;
                const int s = s0 + rr;
                float hi = 0.0f, lo = 0.0f;
                if (s < L && gc < d) {
                    const ulong off = (ulong)s * d + gc;
                    hi = Dsrc_hi[off];
                    lo = Dsrc_lo[off];
                    if (gate) {
                        float term = 0.0f;
                        for (int jj = 0; jj < BLK; ++jj)
                            term += sG[rr * BP + jj] * T4[jj * TS + c];
                        pair_add(&hi, &lo, -term);
                    }
                    Whi[off] = hi;
                    Wlo[off] = lo;
                }
                T5[rr * TS + c] = hi;
            }
        if (lid < BLK && t0 + lid < L)
            for (int c = 0; c < DT && c0 + c < d; ++c)
                delta += T2[lid * TS + c] * po[(ulong)(t0 + lid) * so.z + c0 + c];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            for (int c = 0; c < DT; ++c) {
                s1[r] += T0[rr * TS + c] * T1[col * TS + c];
                dp[r] += T2[rr * TS + c] * T3[col * TS + c];
            }
        }
        if (k > 0)
            for (int r = 0; r < EPT; ++r) {
                const int rr = row0 + r * RSTEP;
                for (int c = 0; c < DT; ++c)
                    s2[r] += T0[rr * TS + c] * T5[col * TS + c];
            }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    }
    if (lid < BLK) {
        sDelta[lid] = delta;
        sLse[lid] = (t0 + lid < L) ? lse[tensor_offset(slse, b, h, t0 + lid)] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase B: SU, P, dA, dSU for the block (rows t in T_i, columns s in T_j). */
    for (int r = 0; r < EPT; ++r) {
        const int rr = row0 + r * RSTEP;
        const int t = t0 + rr, s = s0 + col;
        float su = sc * s2[r];
        if (gate)
            for (int jj = 0; jj < BLK; ++jj)
                su += sY[rr * BP + jj] * sG[col * BP + jj];
        float p = 0.0f;
        if (t < L && s < L && !(k == 0 && s > t))
            p = exp(sc * s1[r] - castle_silu(su) - sLse[rr]);
        const float da = p * (dp[r] - sDelta[rr]);
        sP[rr * BP + col] = p;
        sdA[rr * BP + col] = da;
        sdSU[rr * BP + col] = -castle_silu_grad(su) * da;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase C: dY = (dSU G) masked j' <= t, and the dSU^T Y part of dG (entries s = row, j' = col). */
    if (gate) {
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            float dy = 0.0f, dg = 0.0f;
            for (int q = 0; q < BLK; ++q) {
                dy += sdSU[rr * BP + q] * sG[q * BP + col];
                dg += sdSU[q * BP + rr] * sY[q * BP + col];
            }
            sdY[rr * BP + col] = col <= rr ? dy : 0.0f;
            g[r] = dg;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase D1: the d-wide products.  Tiles: T0 QC[T_i], T1 KC[T_j], T2 dO[T_i], T3 VU[T_i],
       T4 D_j^(k) (W, written in phase A2), T5 dD_j (gradient of D_j^(k+1); 0 at the first touch). */
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile(T0, pqc, sqc.z, t0, L, c0, d);
        load_tile(T1, pkc, skc.z, s0, L, c0, d);
        load_tile(T2, pdo, sdo.z, t0, L, c0, d);
        load_tile(T3, pvu, svu.z, t0, L, c0, d);
        if (k > 0)
            load_tile(T4, Whi, (ulong)d, s0, L, c0, d);
        if (first_col) {
            for (int e = lid; e < BLK * DT; e += NT)
                T5[(e / DT) * TS + e % DT] = 0.0f;
        } else {
            load_tile(T5, dD, (ulong)d, s0, L, c0, d);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (gate) /* dG += dD_j^T VU[T_i]^T (entries s = row, j' = col) */
            for (int r = 0; r < EPT; ++r) {
                const int rr = row0 + r * RSTEP;
                for (int c = 0; c < DT; ++c)
                    g[r] += T5[rr * TS + c] * T3[col * TS + c];
            }
        for (int e = 0; e < EPC; ++e) {
            const int idx = lid + e * NT;
            const int rr = idx / DT, c = idx % DT, gc = c0 + c;
            if (gc >= d)
                continue;
            /* row block i: rr is t (dQC) or j' (dVU) */
            const int t = t0 + rr;
            if (t < L) {
                float vq = 0.0f, vv = 0.0f;
                for (int q = 0; q < BLK; ++q)
                    vq += sdA[rr * BP + q] * T1[q * TS + c];
                if (k > 0)
                    for (int q = 0; q < BLK; ++q)
                        vq += sdSU[rr * BP + q] * T4[q * TS + c];
                if (gate) {
                    float vy = 0.0f;
                    for (int q = 0; q < BLK; ++q) {
                        vq += sdY[rr * BP + q] * T3[q * TS + c];
                        vy += sdY[q * BP + rr] * T0[q * TS + c];
                        vv += sG[q * BP + rr] * T5[q * TS + c];
                    }
                    vv += sc * vy;
                }
                accumulate(dqc + tensor_offset(sdqc, b, h, t) + gc, first_row, sc * vq);
                accumulate(dvu + tensor_offset(sdvu, b, h, t) + gc, first_row, vv);
            }
            /* column block j: rr is s */
            const int s = s0 + rr;
            if (s < L) {
                float vc_ = 0.0f, vk = 0.0f, vd = 0.0f;
                for (int q = 0; q < BLK; ++q) {
                    vc_ += sP[q * BP + rr] * T2[q * TS + c];
                    vk += sdA[q * BP + rr] * T0[q * TS + c];
                    vd += T0[q * TS + c] * sdSU[q * BP + rr];
                }
                accumulate(dvc + tensor_offset(sdvc, b, h, s) + gc, first_col, vc_);
                accumulate(dkc + tensor_offset(sdkc, b, h, s) + gc, first_col, sc * vk);
                dD[(ulong)s * d + gc] = T5[rr * TS + c] + sc * vd;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* dZ = dG G (1 - G) on the allowed gate entries, into sP (P is no longer needed). */
    if (gate) {
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            const float gv = sG[rr * BP + col];
            sP[rr * BP + col] = g[r] * gv * (1.0f - gv); /* 0 where the gate is masked (gv = 0) */
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase D2: dKU[T_i] += sc dZ^T QU[T_j], dQU[T_j] += sc dZ KU[T_i]. */
    for (int c0 = 0; c0 < d && (gate || first_row || first_col); c0 += DT) {
        if (gate) {
            load_tile(T0, pqu, squ.z, s0, L, c0, d);
            load_tile(T1, pku, sku.z, t0, L, c0, d);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = 0; e < EPC; ++e) {
            const int idx = lid + e * NT;
            const int rr = idx / DT, c = idx % DT, gc = c0 + c;
            if (gc >= d)
                continue;
            float vk = 0.0f, vq = 0.0f;
            if (gate)
                for (int q = 0; q < BLK; ++q) {
                    vk += sP[q * BP + rr] * T0[q * TS + c];
                    vq += sP[rr * BP + q] * T1[q * TS + c];
                }
            if (t0 + rr < L && (gate || first_row))
                accumulate(dku + tensor_offset(sdku, b, h, t0 + rr) + gc, first_row, sc * vk);
            if (s0 + rr < L && (gate || first_col))
                accumulate(dqu + tensor_offset(sdqu, b, h, s0 + rr) + gc, first_col, sc * vq);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
