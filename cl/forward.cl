/* forward.cl: the blockwise CASTLE forward pass (docs/algorithm.md section 3).
 *
 * One launch per anti-diagonal k; work-group (j, bh) computes the block pair (i = j + k, j) of
 * batch entry b = bh / H, head h = bh % H:
 *   SU[T_i,T_j] = sc QC[T_i] D_j + (X[T_i,T_i] masked j' <= t) G[T_j,T_i]^T
 *   A[T_i,T_j]  = sc QC[T_i] KC[T_j]^T - SiLU(SU)            (causal mask when k = 0)
 *   online-softmax update of rows T_i (m, l in the workspace, the accumulator in O)
 *   D_j        += VU[T_i]^T G[T_j,T_i]^T
 * Within one launch every work-group writes only its row block i (O, lse, m, l, X) and its column
 * block j (D_j), so no two work-groups touch the same memory and no atomics are needed.
 * Workspace (floats): D hi and lo parts (BH x Lpad x d each, row s of D_j^T at s; the pair is
 * accumulated with pair_add), X (BH x N x 2 BLK x BLK: the scaled masked X[T_i,T_i] written at k = 0,
 * row-major, then its transpose),
 * ML (BH x Lpad x 2: running max m and sum l per row), and the block-transposed copies of QU, KU, QC
 * and KC (common.cl, castle_transpose_blocks: launched before the wavefront).
 * Row block i is finished at k = i by work-group j = 0, which writes O = acc / l and lse = m + log l. */

#if (NT % BLK) != 0 || NT < BLK
#error "forward.cl: NT must be a multiple of BLK"
#endif

/* Mapping (common.cl, "Register micro-tiles").  Every BLK x BLK product of a block pair is split into
   micro-tiles of TM rows x TN vectors of VW columns, and every BLK x DT slab of outputs likewise; work-item
   lid owns micro-tiles lid + m NT.  The B operands are staged k-major (contraction index first, row
   stride KS, BLK or DT), and so are the A operands, except under TM = 1, where a micro-tile reads a
   single A row and the A tiles stay row-major (MT_AT, common.cl), and except for the masked X block
   under MT_AM_ROWS (the CPU mappings: MT_AM, common.cl), read row-major; one contraction step loads a tile's
   TM values of A and TN vectors of B once each and reuses them across the TM x TN FMAs.  The CPU
   mapping (TM = 4, TN = 1, VW = 16) is a broadcast scalar times a 16-wide vector, SIMD without
   reassociating a sum, each vector of B serving 4 rows; the GPU mapping (TM = 2, TN = 1, VW = 4) holds a 2 x 4
   tile in registers, two scalar loads and one float4 load from local memory per 8 FMAs. */
/* FU, FUC, FUPT, FUPC: common.cl. */
#define FRV (BLK / VW)  /* vectors of VW rows in a block (the softmax's units) */

#define LM_SIZE CASTLE_LM_FORWARD(BLK, DT) /* local_memory.h */

/* The kernels' shared parameters (after the launch index k) and the matching argument list. */
#define FORWARD_BLOCK_PARAMS \
    const int L, const int d, const int H, const int W, const float sc, __global const float *qu, \
    const ulong4 squ, __global const float *ku, const ulong4 sku, __global const float *vu, \
    const ulong4 svu, __global const float *qc, const ulong4 sqc, __global const float *kc, \
    const ulong4 skc, __global const float *vc, const ulong4 svc, __global float *o, const ulong4 so, \
    __global float *lse, const ulong4 slse, __global float *ws, const ulong ws_dlo, const ulong ws_x, \
    const ulong ws_ml, const ulong2 ws_t
#define FORWARD_BLOCK_ARGS \
    L, d, H, W, sc, qu, squ, ku, sku, vu, svu, qc, sqc, kc, skc, vc, svc, o, so, lse, slse, ws, ws_dlo, \
    ws_x, ws_ml, ws_t

/* The block pair (i = j + k, j) of batch entry x head bh, computed by the whole work-group. */
inline void forward_block(__local float *lm, const int k, const int j, const int bh, FORWARD_BLOCK_PARAMS)
{
    const int lid = get_local_id(0);
    const int i = j + k;
    const uint b = bh / H, h = bh % H;
    const int N = (L + BLK - 1) / BLK, Lpad = N * BLK;
    const int t0 = i * BLK; /* first query row of T_i */
    const int s0 = j * BLK; /* first key row of T_j */
    const int smax = min(s0 + BLK, L) - 1;
    /* G[T_j, T_i] is identically zero once T_i starts beyond the window of T_j's last row. */
    const bool gate = (W == 0) || (t0 <= smax + W);
    const bool need_d = k > 0;            /* D_j^(0) = 0 */
    const bool need_x = gate && k == 0;   /* X[T_i, T_i] is computed at k = 0, read back later */
    const vfloat lane = lane_index();

    __global const float *pku = ku + tensor_offset(sku, b, h, 0);
    __global const float *pvu = vu + tensor_offset(svu, b, h, 0);
    __global const float *pqc = qc + tensor_offset(sqc, b, h, 0);
    __global const float *pvc = vc + tensor_offset(svc, b, h, 0);
    __global float *D = ws + (ulong)bh * Lpad * d;
    __global float *Dlo = ws + ws_dlo + (ulong)bh * Lpad * d;
    /* X[T_i, T_i] row-major (t, j') and transposed (X^T, as sXt), one after the other */
    __global float *X = ws + ws_x + ((ulong)bh * N + i) * (2 * BLK * BLK), *XT = X + BLK * BLK;
    __global float *ML = ws + ws_ml + (ulong)bh * Lpad * 2;
    /* block-transposed copies of the inputs (common.cl, castle_transpose_blocks) */
    __global const float *xqu = tcopy(ws, ws_t, CASTLE_T_QU, bh, Lpad, d);
    __global const float *xku = tcopy(ws, ws_t, CASTLE_T_KU, bh, Lpad, d);
    __global const float *xqc = tcopy(ws, ws_t, CASTLE_T_QC, bh, Lpad, d);
    __global const float *xkc = tcopy(ws, ws_t, CASTLE_T_KC, bh, Lpad, d);

    /* Prefetches (common.cl; tuning prefetch = 1, CPUs) of the rows phase 5 reads back micro-tile by
       micro-tile: the accumulator O[T_i] and D_j's low part (the tiles are staged front to back, which
       the hardware prefetches).  No branch around them (backward.cl says why). */
    prefetch_rows(o + tensor_offset(so, b, h, 0), so.z, t0, k > 0 ? L : 0, d);
    prefetch_rows(Dlo, (ulong)d, s0, gate && k > 0 ? L : 0, d);

    /* Phase 1: the BLK x BLK x d products, d staged through local memory in chunks of DT:
         s1 = QC[T_i] KC[T_j]^T,  sx = QC[T_i] D_j (k > 0) or QC[T_i] VU[T_i]^T (k = 0),
         gl = KU[T_i] QU[T_j]^T, the gate logits transposed (rows j', columns s): G is read only as
         G^T (phases 3 and 5), which phase 2 then stores with vector stores. */
    vfloat s1[FUPT][MT_ACC], sx[FUPT][MT_ACC], gl[FUPT][MT_ACC];
    #pragma unroll
    for (int m = 0; m < FUPT; ++m) {
        mt_zero(s1[m]);
        mt_zero(sx[m]);
        mt_zero(gl[m]);
    }
    __local float *tQC = lm, *tKU = lm + KS * DT, *tKC = lm + 2 * KS * DT; /* k-major: [c * KS + row] */
    __local float *tDV = lm + 3 * KS * DT, *tQU = lm + 4 * KS * DT;          /* tDV: D_j or VU[T_i] */
    for (int c0 = 0; c0 < d; c0 += DT) {
        stage_cols_a(tQC, KS, DT, xqc, pqc, sqc.z, i, L, c0, DT, d);
        stage_tile_t(tKC, KS, xkc, j, c0, DT, d);
        if (need_d)
            stage_cols(tDV, KS, DT, D, (ulong)d, s0, L, c0, DT, d, true);
        else if (need_x)
            stage_cols(tDV, KS, DT, pvu, svu.z, t0, L, c0, DT, d, true);
        if (gate) { /* KU[T_i] the A operand, QU[T_j] the B one */
            stage_cols_a(tKU, KS, DT, xku, pku, sku.z, i, L, c0, DT, d);
            stage_tile_t(tQU, KS, xqu, j, c0, DT, d);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            /* one contraction loop per product: a loop with branches inside would be run by PoCL
               with its loop over work-items inside, the accumulators in memory (2x slower) */
            if (MT_SHARE && (need_d || need_x)) { /* QC KC^T and QC D^T (or QC VU^T): QC loaded once */
                mt_product_2b(s1[m], sx[m], MT_A_KS(tQC, row0, DT, 0, KS), tKC + col0, tDV + col0, KS, DT);
            } else {
                mt_product(s1[m], MT_A_KS(tQC, row0, DT, 0, KS), tKC + col0, KS, DT);
                if (need_d || need_x)
                    mt_product(sx[m], MT_A_KS(tQC, row0, DT, 0, KS), tDV + col0, KS, DT);
            }
            if (gate) /* rows: j' in T_i, columns: s in T_j */
                mt_product(gl[m], MT_A_KS(tKU, row0, DT, 0, KS), tQU + col0, KS, DT);
        }
        /* global fence too: phase 5 overwrites D_j rows that other work-items read here */
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    }

    /* Phase 2: the gate block G[T_j, T_i] and the masked X[T_i, T_i], both k-major (transposed): G^T
       as gl lies (rows j'); X only an A operand, so row-major under MT_AM_ROWS (common.cl), in sX:
       sXt's place. */
    __local float *sGt = lm, *sXt = lm + BLK * BLK, *sAt = lm + 2 * BLK * BLK; /* [col * BLK + row] */
    __local float *sX = sXt; /* [row * BLK + col] */
    __local float *sAlpha = lm + 3 * BLK * BLK, *sL = sAlpha + BLK;
    __local float *tV = sL + BLK, *tW = tV + BLK * DT; /* row-major BLK x DT */
    if (gate) {
        #pragma unroll
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            #pragma unroll
            for (int e = 0; e < MT_ACC; ++e) {
                const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
                /* G^T: row j' = t0 + rr, the lanes rows s of G */
                VSTORE(castle_gate_t_v(gl[m][e], sc, (float)(s0 + cv) + lane, t0 + rr, L, W), sGt + rr * BLK + cv);
                if (k == 0) { /* rows t = rr, columns j': masked j' <= t, j' < L */
                    const vfloat jp = (float)(t0 + cv) + lane; /* j' of each lane */
                    const vfloat x = select((vfloat)(0.0f), sc * sx[m][e],
                                            VISLESSEQ(lane + (float)cv, (vfloat)(float)rr) &
                                                VISLESS(jp, (vfloat)(float)L));
                    if (MT_AM_ROWS)
                        VSTORE(x, sX + rr * BLK + cv);
                    else
                        store_column(sXt, cv, rr, x);
                    GVSTORE(x, X + rr * BLK + cv);
                }
            }
        }
        if (k > 0) /* X or the transpose written at k = 0 (below): vector copies */
            FOR_SHARE(e, BLK * BLK / VW)
                VSTORE(GVLOAD((MT_AM_ROWS ? X : XT) + e * VW), sX + e * VW);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#if !MT_AM_ROWS
    if (k == 0) /* X^T for the later steps of row block i and the backward */
        FOR_SHARE(e, BLK * BLK / VW)
            GVSTORE(VLOAD(sXt + e * VW), XT + e * VW);
#endif

    /* Phase 3: SU = sc QC D_j + (X masked j' <= t) G^T and the scores A[T_i, T_j] (rows t, columns
       s), stored transposed.  The X G^T product stops at the diagonal (mt_product_lower). */
    #pragma unroll
    for (int m = 0; m < FUPT; ++m) {
        const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
        vfloat su[MT_ACC];
        #pragma unroll
        for (int e = 0; e < MT_ACC; ++e)
            su[e] = need_d ? sc * sx[m][e] : (vfloat)(0.0f);
        if (gate)
            mt_product_lower(su, MT_AM(sX, sXt, row0), sGt + col0, BLK, row0);
        #pragma unroll
        for (int e = 0; e < MT_ACC; ++e) {
            const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
            const int t = t0 + rr;
            vfloat a = sc * s1[m][e] - castle_silu_v(su[e]);
            const vfloat sv = (float)(s0 + cv) + lane;
            a = select(a, (vfloat)(-INFINITY), VISGREATEREQ(sv, (vfloat)(float)L) |
                                                   (k == 0 ? VISGREATER(sv, (vfloat)(float)t) : VFALSE));
            s1[m][e] = a; /* QC KC^T's last use */
        }
        store_tile_t(sAt, row0, col0, s1[m]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase 4: online softmax, VW rows at a time (a vector runs along rows t of the transposed
       scores, so the statistics are lane-wise); A becomes P = exp(A - m_new). */
    for (int u = lid; u < FRV; u += NT) {
        const int r0 = u * VW;
        float mo[VW], lo[VW];
        for (int q = 0; q < VW; ++q) {
            const int t = t0 + r0 + q;
            mo[q] = (k > 0 && t < L) ? ML[2 * t] : -INFINITY;
            lo[q] = (k > 0 && t < L) ? ML[2 * t + 1] : 0.0f;
        }
        const vfloat m_old = VLOAD(mo), l_old = VLOAD(lo);
        const vint valid = VISLESS((float)(t0 + r0) + lane, (vfloat)(float)L);
        vfloat vm = m_old;
        for (int s = 0; s < BLK; ++s)
            vm = fmax(vm, VLOAD(sAt + s * BLK + r0));
        /* vm is finite on valid rows: the diagonal key of row t was seen at k = 0. */
        const vfloat mx = select((vfloat)(0.0f), vm, valid);
        const vfloat alpha = (k > 0) ? select((vfloat)(0.0f), exp(m_old - mx), valid) : (vfloat)(0.0f);
        vfloat vs = (vfloat)(0.0f);
        for (int s = 0; s < BLK; ++s) {
            const vfloat p = select((vfloat)(0.0f), exp(VLOAD(sAt + s * BLK + r0) - mx), valid);
            VSTORE(p, sAt + s * BLK + r0);
            vs += p;
        }
        const vfloat l_new = select((vfloat)(1.0f), l_old * alpha + vs, valid);
        VSTORE(alpha, sAlpha + r0);
        VSTORE(l_new, sL + r0);
        float me[VW], le[VW];
        VLANES(mx, me);
        VLANES(l_new, le);
        for (int q = 0; q < VW; ++q) {
            const int t = t0 + r0 + q;
            if (t < L) {
                ML[2 * t] = me[q];
                ML[2 * t + 1] = le[q];
                if (j == 0)
                    lse[tensor_offset(slse, b, h, t)] = me[q] + log(le[q]);
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase 5: acc[T_i] = alpha acc[T_i] + P VC[T_j] (the accumulator lives in O; normalised by
       work-group j = 0, the last to touch row block i; at k = 0 P is lower triangular and the product
       stops at the diagonal), and D_j += G[T_j,T_i] VU[T_i]. */
    for (int c0 = 0; c0 < d; c0 += DT) {
        stage_tile(tV, pvc, svc.z, s0, L, c0, DT, d, false);
        if (gate)
            stage_tile(tW, pvu, svu.z, t0, L, c0, DT, d, false);
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int m = 0; m < FUPC; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, DT), col0 = MT_COL0(u, DT);
            vfloat acc[MT_ACC];
            mt_zero(acc);
            if (k == 0)
                mt_product_lower(acc, sAt + row0, BLK, tV + col0, DT, row0);
            else
                mt_product(acc, sAt + row0, BLK, tV + col0, DT, BLK);
            #pragma unroll
            for (int e = 0; e < MT_ACC; ++e) {
                const int rr = MT_EROW(row0, e), gc = MT_ECOL(c0 + col0, e);
                const int t = t0 + rr;
                if (t < L && gc < d) {
                    __global float *po = o + tensor_offset(so, b, h, t) + gc;
                    const int n = min(VW, d - gc);
                    vfloat v = (k > 0) ? gload_part(po, n) * sAlpha[rr] + acc[e] : acc[e];
                    if (j == 0)
                        v /= sL[rr];
                    gstore_part(v, po, n);
                }
            }
            if (gate) { /* rows: s in T_j */
                mt_zero(acc);
                mt_product(acc, sGt + row0, BLK, tW + col0, DT, BLK);
                #pragma unroll
                for (int e = 0; e < MT_ACC; ++e) {
                    const int rr = MT_EROW(row0, e), gc = MT_ECOL(c0 + col0, e);
                    if (gc < d) {
                        const ulong off = (ulong)(s0 + rr) * d + gc;
                        const int n = min(VW, d - gc);
                        vfloat hi = acc[e], lo = (vfloat)(0.0f);
                        if (k > 0) {
                            hi = gload_part(D + off, n);
                            lo = gload_part(Dlo + off, n);
                            pair_add_v(&hi, &lo, acc[e]);
                        }
                        gstore_part(hi, D + off, n);
                        gstore_part(lo, Dlo + off, n);
                    }
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

/* One launch per anti-diagonal k: work-group (j, bh). */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_forward_block(const int k, FORWARD_BLOCK_PARAMS, BH0_PARAM)
{
    __local float lm[LM_SIZE] LM_ALIGNED;
    forward_block(lm, k, get_group_id(0), BH_INDEX, FORWARD_BLOCK_ARGS);
}

/* All anti-diagonals in one launch, for short sequences: work-group (0, bh) walks the block pairs
   of its batch entry and head in wavefront order, a barrier between pairs making each pair's
   global writes visible to the next (the dependencies never cross batch entries or heads).  The
   first argument is unused (the per-diagonal kernel's k).  The pair is inlined: as a call
   (FOLD_PAIR, common.cl) it took 72 registers instead of 80 in clang's PTX, but ptxas, inlining the
   call back, left a 32-byte private array on the stack.  One loop over the pairs, (k, j) stepped by
   hand: with a loop over k around a loop over j, PoCL 3.1's code for this kernel read past the
   end of a memory mapping and crashed under micro-tiles of at least 2 x 2 vectors of 8 or 16 floats
   (vector = 8, tm = 4, tn = 2, say), where Oclgrind found nothing amiss and the results agree. */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_forward_fold(const int unused, FORWARD_BLOCK_PARAMS, BH0_PARAM)
{
    __local float lm[LM_SIZE] LM_ALIGNED;
    const int N = (L + BLK - 1) / BLK;
    (void)unused;
    for (int k = 0, j = 0; k < N;) { /* pairs (j + k, j) in wavefront order */
        forward_block(lm, k, j, BH_INDEX, FORWARD_BLOCK_ARGS);
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        if (++j + k >= N) {
            j = 0;
            ++k;
        }
    }
}
