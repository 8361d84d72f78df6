/* backward.cl: the blockwise CASTLE backward pass (docs/algorithm.md section 4).
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

/* Local memory: nine BLK x BP matrices (each kept in the orientation its consumers read along
   rows, so that every dot product runs over contiguous memory in VW-wide vectors), six tiles of d
   columns (row layout BLK x TS for the d-long products, transposed DT x BP for the block-long ones)
   and the O tile for Delta,
   and Delta, lse of the rows. */
#define BW_MATS 9
#define BW_TILE (BLK * TS > DT * BP ? BLK * TS : DT * BP)
#define BW_TILES 7
#define LM_BW (BW_MATS * BLK * BP + BW_TILES * BW_TILE + 2 * BLK)

/* out[e] = (first ? 0 : out[e]) + v */
inline void accumulate(__global float *p, bool first, float v) { *p = first ? v : *p + v; }

/* The kernels' shared parameters (after the launch index k) and the matching argument list. */
#define BACKWARD_BLOCK_PARAMS \
    const int L, const int d, const int H, const int W, const float sc, __global const float *qu, \
    const ulong4 squ, __global const float *ku, const ulong4 sku, __global const float *vu, \
    const ulong4 svu, __global const float *qc, const ulong4 sqc, __global const float *kc, \
    const ulong4 skc, __global const float *vc, const ulong4 svc, __global const float *o, \
    const ulong4 so, __global const float *lse, const ulong4 slse, __global const float *dout, \
    const ulong4 sdo, __global float *dqu, const ulong4 sdqu, __global float *dku, const ulong4 sdku, \
    __global float *dvu, const ulong4 sdvu, __global float *dqc, const ulong4 sdqc, \
    __global float *dkc, const ulong4 sdkc, __global float *dvc, const ulong4 sdvc, __global float *ws, \
    const ulong ws_dlo, const ulong ws_whi, const ulong ws_wlo, const ulong ws_dd, const ulong ws_x
#define BACKWARD_BLOCK_ARGS \
    L, d, H, W, sc, qu, squ, ku, sku, vu, svu, qc, sqc, kc, skc, vc, svc, o, so, lse, slse, dout, sdo, \
    dqu, sdqu, dku, sdku, dvu, sdvu, dqc, sdqc, dkc, sdkc, dvc, sdvc, ws, ws_dlo, ws_whi, ws_wlo, \
    ws_dd, ws_x

/* The block pair (i = j + k, j) of batch entry x head bh, computed by the whole work-group. */
inline void backward_block(__local float *lm, const int k, const int j, const int bh, BACKWARD_BLOCK_PARAMS)
{
    const int lid = get_local_id(0);
    const int i = j + k;
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

    /* Matrices (row index first): G [s][j'], Gt [j'][s], Y [t][j'], Yt [j'][t], dA [t][s],
       dAt [s][t], dSU [t][s], dSUt [s][t], Pt [s][t].  After phase B, Y and G are dead: dY [t][j']
       takes Y's place and dYt [j'][t] G's; after phase D1, dZ [s][j'] takes dA's, dZt [j'][s] dAt's. */
    __local float *sG = lm, *sGt = lm + BLK * BP, *sY = lm + 2 * BLK * BP, *sYt = lm + 3 * BLK * BP;
    __local float *sdA = lm + 4 * BLK * BP, *sdAt = lm + 5 * BLK * BP, *sdSU = lm + 6 * BLK * BP;
    __local float *sdSUt = lm + 7 * BLK * BP, *sPt = lm + 8 * BLK * BP;
    __local float *sdY = sY, *sdYt = sG, *sdZ = sdA, *sdZt = sdAt;
    __local float *T0 = lm + BW_MATS * BLK * BP, *T1 = T0 + BW_TILE, *T2 = T1 + BW_TILE;
    __local float *T3 = T2 + BW_TILE, *T4 = T3 + BW_TILE, *T5 = T4 + BW_TILE, *T6 = T5 + BW_TILE;
    __local float *sDelta = T6 + BW_TILE, *sLse = sDelta + BLK;

    const int col = lid % BLK, row0 = lid / BLK;
    float g[EPT], gv[EPT];
    vfloat a1[EPT], a2[EPT], ap[EPT];
    for (int r = 0; r < EPT; ++r) {
        g[r] = gv[r] = 0.0f;
        a1[r] = a2[r] = ap[r] = (vfloat)(0.0f);
    }

    /* Phase A1: the gate logits QU[T_j] KU[T_i]^T, then G, Gt, Y, Yt (Y = the forward's masked X). */
    if (gate) {
        vfloat ag[EPT];
        for (int r = 0; r < EPT; ++r)
            ag[r] = (vfloat)(0.0f);
        for (int c0 = 0; c0 < d; c0 += DT) {
            load_tile(T0, pqu, squ.z, s0, L, c0, d);
            load_tile(T1, pku, sku.z, t0, L, c0, d);
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int r = 0; r < EPT; ++r) {
                const int rr = row0 + r * RSTEP;
                for (int c = 0; c < DT; c += VW)
                    ag[r] += VLOAD(T0 + rr * TS + c) * VLOAD(T1 + col * TS + c);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            const int s = s0 + rr, jp = t0 + col;
            const bool allowed = s < L && jp < L && s < jp && (W == 0 || jp <= s + W);
            const float gval = allowed ? castle_sigmoid(sc * vsum(ag[r])) : 0.0f;
            gv[r] = gval; /* entry (s = rr, j' = col), kept for dZ */
            sG[rr * BP + col] = gval;
            sGt[col * BP + rr] = gval;
            const float y = X[rr * BLK + col]; /* entry (t = rr, j' = col) */
            sY[rr * BP + col] = y;
            sYt[col * BP + rr] = y;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase A2: roll D_j back to D_j^(k) (into W and the tile T5), Delta = rowsum(dO * O), and the
       products QC KC^T, QC D_j^(k), dO VC^T.  T4 holds VU[T_i] transposed for the roll-back, T6 O.
       Delta and dO VC^T accumulate in the same lane order, so that dA = P (dP - Delta) is exactly 0
       where the two agree exactly (a row with a single key: O = VC). */
    vfloat delta = (vfloat)(0.0f);
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile(T0, pqc, sqc.z, t0, L, c0, d);
        load_tile(T1, pkc, skc.z, s0, L, c0, d);
        load_tile(T2, pdo, sdo.z, t0, L, c0, d);
        load_tile(T3, pvc, svc.z, s0, L, c0, d);
        load_tile(T6, po, so.z, t0, L, c0, d);
        if (gate && k > 0)
            load_tile_t(T4, pvu, svu.z, t0, L, c0, d);
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
                    if (gate)
                        pair_add(&hi, &lo, -ldot(sG + rr * BP, T4 + c * BP, BLK));
                    Whi[off] = hi;
                    Wlo[off] = lo;
                }
                T5[rr * TS + c] = hi;
            }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (lid < BLK)
            for (int c = 0; c < DT; c += VW)
                delta += VLOAD(T2 + lid * TS + c) * VLOAD(T6 + lid * TS + c);
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            for (int c = 0; c < DT; c += VW) {
                const vfloat q = VLOAD(T0 + rr * TS + c);
                a1[r] += q * VLOAD(T1 + col * TS + c);
                ap[r] += VLOAD(T2 + rr * TS + c) * VLOAD(T3 + col * TS + c);
            }
        }
        if (k > 0)
            for (int r = 0; r < EPT; ++r) {
                const int rr = row0 + r * RSTEP;
                for (int c = 0; c < DT; c += VW)
                    a2[r] += VLOAD(T0 + rr * TS + c) * VLOAD(T5 + col * TS + c);
            }
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    }
    if (lid < BLK) {
        sDelta[lid] = vsum(delta);
        sLse[lid] = (t0 + lid < L) ? lse[tensor_offset(slse, b, h, t0 + lid)] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase B: SU, P, dA, dSU for the block (rows t in T_i, columns s in T_j). */
    for (int r = 0; r < EPT; ++r) {
        const int rr = row0 + r * RSTEP;
        const int t = t0 + rr, s = s0 + col;
        float su = sc * vsum(a2[r]);
        if (gate)
            su += ldot(sY + rr * BP, sG + col * BP, BLK);
        float p = 0.0f;
        if (t < L && s < L && !(k == 0 && s > t))
            p = exp(sc * vsum(a1[r]) - castle_silu(su) - sLse[rr]);
        const float da = p * (vsum(ap[r]) - sDelta[rr]);
        const float dsu = -castle_silu_grad(su) * da;
        sPt[col * BP + rr] = p;
        sdA[rr * BP + col] = da;
        sdAt[col * BP + rr] = da;
        sdSU[rr * BP + col] = dsu;
        sdSUt[col * BP + rr] = dsu;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase C: dY = (dSU G) masked j' <= t (into Y's and G's places), and the dSU^T Y part of dG
       (entries s = row, j' = col). */
    if (gate) {
        float dy[EPT];
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            dy[r] = col <= rr ? ldot(sdSU + rr * BP, sGt + col * BP, BLK) : 0.0f;
            g[r] = ldot(sdSUt + rr * BP, sYt + col * BP, BLK);
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* every read of G and Y is done */
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            sdY[rr * BP + col] = dy[r];
            sdYt[col * BP + rr] = dy[r];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase D1: the d-wide products.  Tiles, transposed (column c first): T0 QC[T_i], T1 KC[T_j],
       T2 dO[T_i], T3 VU[T_i], T4 D_j^(k) (W, written in phase A2), T5 dD_j (gradient of D_j^(k+1);
       0 at the first touch). */
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile_t(T0, pqc, sqc.z, t0, L, c0, d);
        load_tile_t(T1, pkc, skc.z, s0, L, c0, d);
        load_tile_t(T2, pdo, sdo.z, t0, L, c0, d);
        load_tile_t(T3, pvu, svu.z, t0, L, c0, d);
        if (k > 0)
            load_tile_t(T4, Whi, (ulong)d, s0, L, c0, d);
        if (first_col) {
            for (int e = lid; e < BLK * DT; e += NT)
                T5[(e % DT) * BP + e / DT] = 0.0f;
        } else {
            load_tile_t(T5, dD, (ulong)d, s0, L, c0, d);
        }
        /* global fence too: below, other work-items overwrite the dD_j entries just read */
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        if (gate) /* dG += dD_j^T VU[T_i]^T (entries s = row, j' = col) */
            for (int r = 0; r < EPT; ++r) {
                const int rr = row0 + r * RSTEP;
                for (int c = 0; c < DT; ++c)
                    g[r] += T5[c * BP + rr] * T3[c * BP + col];
            }
        for (int e = 0; e < EPC; ++e) {
            const int idx = lid + e * NT;
            const int rr = idx / DT, c = idx % DT, gc = c0 + c;
            if (gc >= d)
                continue;
            /* row block i: rr is t (dQC) or j' (dVU) */
            const int t = t0 + rr;
            if (t < L) {
                float vq = ldot(sdA + rr * BP, T1 + c * BP, BLK), vv = 0.0f;
                if (k > 0)
                    vq += ldot(sdSU + rr * BP, T4 + c * BP, BLK);
                if (gate) {
                    vq += ldot(sdY + rr * BP, T3 + c * BP, BLK);
                    vv = ldot(sGt + rr * BP, T5 + c * BP, BLK) + sc * ldot(sdYt + rr * BP, T0 + c * BP, BLK);
                }
                accumulate(dqc + tensor_offset(sdqc, b, h, t) + gc, first_row, sc * vq);
                accumulate(dvu + tensor_offset(sdvu, b, h, t) + gc, first_row, vv);
            }
            /* column block j: rr is s */
            const int s = s0 + rr;
            if (s < L) {
                accumulate(dvc + tensor_offset(sdvc, b, h, s) + gc, first_col, ldot(sPt + rr * BP, T2 + c * BP, BLK));
                accumulate(dkc + tensor_offset(sdkc, b, h, s) + gc, first_col,
                           sc * ldot(sdAt + rr * BP, T0 + c * BP, BLK));
                dD[(ulong)s * d + gc] = T5[c * BP + rr] + sc * ldot(sdSUt + rr * BP, T0 + c * BP, BLK);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* dZ = dG G (1 - G) on the allowed gate entries (G = 0 elsewhere), into dA's and dAt's places. */
    if (gate) {
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            const float dz = g[r] * gv[r] * (1.0f - gv[r]);
            sdZ[rr * BP + col] = dz;
            sdZt[col * BP + rr] = dz;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase D2: dKU[T_i] += sc dZ^T QU[T_j], dQU[T_j] += sc dZ KU[T_i] (tiles transposed). */
    for (int c0 = 0; c0 < d && (gate || first_row || first_col); c0 += DT) {
        if (gate) {
            load_tile_t(T0, pqu, squ.z, s0, L, c0, d);
            load_tile_t(T1, pku, sku.z, t0, L, c0, d);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = 0; e < EPC; ++e) {
            const int idx = lid + e * NT;
            const int rr = idx / DT, c = idx % DT, gc = c0 + c;
            if (gc >= d)
                continue;
            float vk = 0.0f, vq = 0.0f;
            if (gate) {
                vk = ldot(sdZt + rr * BP, T0 + c * BP, BLK);
                vq = ldot(sdZ + rr * BP, T1 + c * BP, BLK);
            }
            if (t0 + rr < L && (gate || first_row))
                accumulate(dku + tensor_offset(sdku, b, h, t0 + rr) + gc, first_row, sc * vk);
            if (s0 + rr < L && (gate || first_col))
                accumulate(dqu + tensor_offset(sdqu, b, h, s0 + rr) + gc, first_col, sc * vq);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

/* One launch per anti-diagonal k: work-group (j, bh). */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_backward_block(const int k, BACKWARD_BLOCK_PARAMS)
{
    __local float lm[LM_BW];
    backward_block(lm, k, get_group_id(0), get_group_id(1), BACKWARD_BLOCK_ARGS);
}

/* All anti-diagonals in one launch, for short sequences: work-group (0, bh) walks the block pairs
   of its batch entry and head in wavefront order, a barrier between pairs making each pair's
   global writes visible to the next (the dependencies never cross batch entries or heads).  The
   first argument is unused (the per-diagonal kernel's k). */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_backward_fold(const int unused, BACKWARD_BLOCK_PARAMS)
{
    __local float lm[LM_BW];
    const int N = (L + BLK - 1) / BLK;
    (void)unused;
    for (int k = N - 1; k >= 0; --k)
        for (int j = 0; j + k < N; ++j) {
            backward_block(lm, k, j, get_group_id(1), BACKWARD_BLOCK_ARGS);
            barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        }
}
