/* causal.cl: standard causal softmax attention, the baseline CASTLE is compared with.
 *
 *   o_t = sum_{s <= t} softmax_s(sc q_t . k_s) v_s,   lse_t = log sum_{s <= t} exp(sc q_t . k_s)
 *
 * FlashAttention-2 style: a work-group owns a block of BLK query rows (or, in the backward pass, of
 * BLK key rows) and loops over the blocks of the other side with an online softmax, so the forward
 * pass is one launch and the backward pass two (keys, then queries), without atomics.
 *
 * Mapping of the forward and backward kernels: register micro-tiles (common.cl; the tuning's TM, TN,
 * VW, NT), as in cl/forward.cl.
 *   forward      scores transposed (key rows x query columns: K staged in DT-column chunks against
 *                Q^T, staged once per work-group when d fits CC_TROWS), so the per-row softmax
 *                statistics are lane-wise vector operations (no horizontal reductions); the
 *                accumulator P V (query rows x columns of d) stays in registers, slab by slab of DT
 *                columns, V staged row-major.
 *   backward kv  S = Q K^T and dP = dO V^T (query rows x keys; K^T and V^T staged once per
 *                work-group when four d-wide tiles fit its staging area), P and dS row-major in
 *                local memory, then dV += P^T dO and dK += dS^T Q in registers slab by slab.
 *   backward q   S^T = K Q^T and dP^T = V dO^T (Q^T, dO^T staged once when they fit), dS^T in local
 *                memory, then dQ += dS K in registers slab by slab.
 * The other kernels map one row and one vector of CC_VK columns to a work-item (CC_NT below), or a
 * cache row to a team of lanes (decode).
 * Delta_t = dO_t . O_t is recomputed where it is needed (BLK d work per block pair, no workspace).
 *
 * Decode with a KV cache: castle_causal_append copies the new rows into the cache; then, for at most
 * CC_DQ new rows, castle_causal_decode (each work-item streams a contiguous range of keys with its
 * own online softmax: no blocks, no barriers), else the forward kernel with the cache as K, V and the
 * new rows' positions offset by t0 (the cache length), its key range split among nsplit work-groups
 * when one block of new rows leaves the device idle.  Split work leaves unnormalised partials
 * (acc, m, l) that castle_causal_combine merges.
 *
 * The forward kernel runs under the forwards' own work-group size and d chunk (tuning fthreads and
 * fdchunk, as cl/forward.cl's): where they differ from threads and dchunk, the host builds this file a
 * second time under them, with CC_FORWARD_ONLY defined, for that kernel alone (host/program.c).
 *
 * Local memory (floats): CASTLE_LM_CAUSAL of local_memory.h at most, CASTLE_LM_CAUSAL_FORWARD under
 * CC_FORWARD_ONLY (host/tuning.c checks both). */

/* Shared with the C host, defined once there and passed as -D options (host/program.c):
   CASTLE_MAX_HEAD_DIM (castle.h), CASTLE_DECODE_ROWS and CASTLE_DECODE_GROUP (host/causal.h). */
#if !defined(CASTLE_MAX_HEAD_DIM) || !defined(CASTLE_DECODE_ROWS) || !defined(CASTLE_DECODE_GROUP)
#error "causal.cl: CASTLE_MAX_HEAD_DIM, CASTLE_DECODE_ROWS and CASTLE_DECODE_GROUP come from the host (-D)"
#endif
#define CC_DMAX CASTLE_MAX_HEAD_DIM
/* Columns of d a transposed Q^T or K^T tile holds: all of them (256) under the usual tunings; on
   tunings shrunk for small local memories the tile is staged in pieces, so that these kernels never
   need more local memory than cl/backward.cl (host/tuning.c).  A program for a class of heads (DACC,
   under ACC == 2) takes no more than such heads use (local_memory.h). */
#define CC_TROWS CASTLE_LM_CAUSAL_TROWS_CLASS(BLK, DT, CC_DMAX, DACC)

#if (NT % BLK) != 0 || ((BLK * BLK) % NT) != 0 || NT < BLK
#error "causal.cl: NT must be a multiple of BLK that divides BLK*BLK"
#endif
#if !CASTLE_CHECK_FUC
#error "causal.cl: NT x TM x TN x VW must divide BLK*DT (common.cl FUPC)"
#endif

/* Work-group size CC_NT of the kernels off the micro-tiles (decode, combine, append; the forward and
   backward kernels run NT).  On SIMD CPUs (decode mapping 1, DEC) fewer, wider work-items are faster:
   BLK*BLK/16 of them, each with 16-wide vectors (PoCL: 4x the speed of 256 work-items with 4-wide
   vectors).  Elsewhere NT.  The host reads the size back from the kernel (reqd_work_group_size). */
#if DEC == 1 && VW > 1 && NT > BLK * BLK / (BLK < 16 ? BLK : 16)
#define CC_NT (BLK * BLK / (BLK < 16 ? BLK : 16))
#else
#define CC_NT NT
#endif
#define CC_EPT (BLK * BLK / CC_NT) /* entries of a BLK x BLK block per work-item */
#if CC_EPT >= 16
#define CC_VK 16
#elif CC_EPT >= 8
#define CC_VK 8
#elif CC_EPT >= 4
#define CC_VK 4
#elif CC_EPT >= 2
#define CC_VK 2
#else
#define CC_VK 1
#endif

#if CC_VK == 1
typedef float cc_vec;
#define CC_LOAD(p) (*(p))
#define CC_STORE(x, p) (*(p) = (x))
#else
typedef CASTLE_CAT(float, CC_VK) cc_vec;
#define CC_LOAD(p) CASTLE_CAT(vload, CC_VK)(0, p)
#define CC_STORE(x, p) CASTLE_CAT(vstore, CC_VK)(x, 0, p)
#endif

/* The first n <= CC_VK elements at p as a vector (zeros beyond), and the first n lanes to p
   (common.cl). */
#define cc_vload_part CASTLE_CAT(gload_n, CC_VK)
#define cc_vstore_part CASTLE_CAT(gstore_n, CC_VK)

/* Offset of partial i (of P) of row `row` of batch x head bh: d accumulator columns, then m and l. */
inline ulong cc_partial(int bh, int n, int row, int P, int i, int d)
{
    return (((ulong)bh * n + row) * P + i) * (ulong)(d + 2);
}

/* The sum of x's lanes. */
inline float cc_hsum(cc_vec x)
{
    float t[CC_VK], r = 0.0f;
    CC_STORE(x, t);
    for (int e = 0; e < CC_VK; ++e)
        r += t[e];
    return r;
}

/* Delta = a . b (dO . O) over d elements as one chain, c ascending: the order in which cc_scores sums
   dP = dO V^T (mt_product), so that dP - Delta is exactly 0 where a row's softmax is one-hot (O is
   then one row of V): the gradient of a saturated softmax is 0, not rounding noise times sc |k|.
   Scalar loads (clang's PTX: 232 registers in the key side against 240 with float4 loads). */
inline float cc_row_dot(__global const float *a, __global const float *b, int d)
{
    float r = 0.0f;
    for (int c = 0; c < d; ++c)
        r += a[c] * b[c];
    return r;
}

/* x with -INFINITY lanes replaced by 0: the reference point of a softmax that has seen no key. */
inline vfloat cc_finite_or_zero(vfloat x) { return select(x, (vfloat)(0.0f), isinf(x)); }

/* The block kernels' mapping (common.cl, "Register micro-tiles"): the BLK x BLK score block of a block
   pair and every BLK x DT slab of an accumulator (rows of the block x columns of d) are split into
   micro-tiles of TM rows x TN vectors of VW columns; work-item lid owns micro-tiles lid + m NT of
   each (m < FUPT, m < FUPC). */
#define CF_NCH ((DACC + DT - 1) / DT) /* slabs of the widest head the accumulators hold (common.cl) */
#define CF_RG (BLK / TM)                 /* rows of micro-tiles in the score block */
/* The accumulator slabs ci (DT columns of d each) that the staging step of w columns from column cv
   holds, c0 = ci DT - cv the first column of slab ci in the step's tile: under ACC == 2 every slab
   index is a constant of an unrolled loop (the accumulators stay in registers), else the loop runs
   over the step's slabs only. */
#if ACC == 2
#define CC_FOR_SLABS(ci, c0, cv, w) \
    ACC_UNROLL for (int ci = 0, c0 = -(cv); ci < CF_NCH; ++ci, c0 += DT) if (c0 >= 0 && c0 < (w))
#else
#define CC_FOR_SLABS(ci, c0, cv, w) \
    for (int ci = (cv) / DT, c0 = 0; ci < CF_NCH && (c0 = ci * DT - (cv)) < (w); ++ci)
#endif
/* K is the A operand of S^T = K Q^T, staged as MT_AT says (common.cl). */
#if CC_TROWS < DT
#error "causal.cl: the Q^T tile must hold a d chunk (DT <= CASTLE_MAX_HEAD_DIM)"
#endif

/* Writes the accumulators acc of a BLK x d block (CF_NCH slabs x FUPC micro-tiles, as the forward's
   acc) to its rows < nrows at out (row stride rs), each value times sc, then divided by div[row] when
   div_rows; with add, adds them to what out holds (an earlier launch's part of the sums). */
__attribute__((always_inline)) inline void cc_store_acc(const vfloat *acc, __global float *out, const ulong rs,
                                                        const int nrows, const int d, const float sc,
                                                        __local const float *div, const bool div_rows,
                                                        const bool add)
{
    const int lid = get_local_id(0);
#pragma unroll
    for (int ci = 0; ci < CF_NCH; ++ci)
        ACC_UNROLL for (int m = 0; m < FUPC; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, DT), col0 = MT_COL0(u, DT);
            ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                const int row = MT_EROW(row0, e), c = MT_ECOL(ci * DT + col0, e);
                if (row >= nrows || c >= d)
                    continue;
                const vfloat x = acc[(ci * FUPC + m) * MT_ACC + e] * sc, y = div_rows ? x / div[row] : x;
                __global float *p = out + (ulong)row * rs + c;
                gstore_part(add ? gload_part(p, d - c) + y : y, p, d - c);
            }
        }
}

/* As mt_product over a whole block (k1 = BLK), except that row row0 + i of the micro-tile takes only
   the terms kk <= lim + i (lim = row0 + the shift of the causal diagonal): the terms of masked keys
   are skipped, never multiplied by a zero weight, so whatever a masked row of b holds (NaN, Inf)
   cannot reach the sum. */
__attribute__((always_inline)) inline void cc_product_until(vfloat *acc, __local const float *a, const int as,
                                                            __local const float *b, const int bs, const int lim)
{
    mt_product(acc, a, as, b, bs, clamp(lim, 0, BLK)); /* the terms every row of the tile takes */
#pragma unroll
    for (int q = 0; q < TM; ++q) { /* kk = lim + q: rows i >= q */
        const int kk = lim + q;
        if (kk >= 0 && kk < BLK) {
            float x[TM];
            mt_frag_a(x, a + kk * as, as);
            mt_step_from(acc, x, b + kk * bs, q);
        }
    }
}

/* Forward pass over query rows 0..n-1 at positions t0..t0+n-1 (keys 0..t0+n-1 in k, v).
 * Work-group (g, bh): query block nq-1-g/nsplit (the longest first), key split g % nsplit.  Per key
 * block: S^T = K Q^T on micro-tiles (Q^T staged once when d fits CC_TROWS; K staged beside it, all
 * of d at once on the usual tunings, and V with it when both fit), masked and scaled; the column
 * maxima of each tile row give each work-item the new running max of its query columns; P^T =
 * exp(S^T - m) into sP (each work-item keeps its columns' partial sums of l); then acc = alpha acc +
 * P V, slab by slab of DT columns of d, V staged row-major. */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_causal_forward(const int n, const int t0, const int d, const int H, const float sc,
                           __global const float *q, const ulong4 sq,
                           __global const float *k, const ulong4 sk,
                           __global const float *v, const ulong4 sv,
                           __global float *o, const ulong4 so,
                           __global float *lse, const ulong4 slse, const int want_lse,
                           const int nsplit, __global float *part, BH0_PARAM)
{
    /* Q^T of the block (Qt[c * BLK + row]: all of d, or DT columns at a time), then the staging area
       of K and V: as many columns of a key block at a time as the rest of the (CC_TROWS + DT) x BLK
       floats holds (all of d on the usual tunings: one staging step and one barrier for K, and V in
       the same step when d <= 64). */
    __local float Qt[(CC_TROWS + DT) * BLK] LM_ALIGNED;
    __local float sP[BLK * BLK] LM_ALIGNED;      /* S^T, then P^T, of the current key block: sP[key * BLK + row] */
    __local float sR[CF_RG * BLK] LM_ALIGNED;    /* per row of micro-tiles: column maxima, at the end partial sums */
    __local float sM[BLK] LM_ALIGNED, sA[BLK] LM_ALIGNED, sL[BLK] LM_ALIGNED;
    const int lid = get_local_id(0);
    const int nq = (n + BLK - 1) / BLK;
    const int qb = nq - 1 - (int)get_group_id(0) / nsplit, sp = (int)get_group_id(0) % nsplit;
    const int bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    const int q0 = qb * BLK, qrows = min(BLK, n - q0);
    const int pos0 = t0 + q0;         /* row r sees the keys s <= pos0 + r */
    const int nkeys = pos0 + qrows;   /* keys the block sees */
    const int nkb = (nkeys + BLK - 1) / BLK, kps = (nkb + nsplit - 1) / nsplit;
    const int kb0 = sp * kps, kb1 = min(nkb, kb0 + kps);
    __global const float *pq = q + tensor_offset(sq, b, h, q0);
    __global const float *pk = k + tensor_offset(sk, b, h, 0);
    __global const float *pv = v + tensor_offset(sv, b, h, 0);
    const vfloat lane = lane_index();

    const int dpad = (d + DT - 1) / DT * DT;
    const bool qall = dpad <= CC_TROWS; /* Q^T staged once, else DT columns at a time */
    const int qw = qall ? dpad : DT;    /* columns of Qt in use */
    __local float *sT = Qt + qw * BLK;  /* the staging area: kvw columns of K or V */
    const int kvw = (CC_TROWS + DT - qw) / DT * DT;
    /* K and V of a key block staged together, in one step and behind one barrier, when both fit the
       staging area (d up to 64 under the built-in entries): V beside K, at sV */
    const bool kv1 = qall && 2 * dpad <= kvw;
    const int kw = kv1 ? dpad : qall ? kvw : DT; /* K: as wide as the Q^T chunk */
    __local float *sV = kv1 ? sT + dpad * BLK : sT;
    if (qall)
        stage_tile(Qt, pq, sq.z, 0, qrows, 0, dpad, d, true);
    if (lid < BLK)
        sM[lid] = -INFINITY;
    vfloat acc[CF_NCH * FUPC * MT_ACC]; /* slab ci, micro-tile m: acc[(ci FUPC + m) MT_ACC ..] */
    vfloat lpart[FUPT * TN];            /* partial sums of l of each owned column vector */
    /* The query columns a work-item owns are the same TN vectors in each of its micro-tiles (NT is a
       multiple of BLK), from colv; under ACC == 2 mrun holds their running max. */
    const int colv = MT_COL0(lid, BLK);
#if ACC == 2
    vfloat mrun[TN];
    for (int j = 0; j < TN; ++j)
        mrun[j] = (vfloat)(-INFINITY);
#endif
    for (int e = 0; e < CF_NCH * FUPC * MT_ACC; ++e)
        acc[e] = (vfloat)(0.0f);
    for (int e = 0; e < FUPT * TN; ++e)
        lpart[e] = (vfloat)(0.0f);
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Barriers per key block where d fits one staging step: K (and V) staged; K consumed; the
       column maxima in sR; (ACC == 1: the running maxima in sM;) P^T, the rescale factors (and V)
       published; V consumed. */
    for (int kb = kb0; kb < kb1; ++kb) {
        const int s0 = kb * BLK;
        vfloat s[FUPT * MT_ACC];
        ACC_UNROLL for (int m = 0; m < FUPT; ++m)
            mt_zero(s + m * MT_ACC);
        for (int c0 = 0; c0 < d; c0 += kw) {
            const int w = min(kw, dpad - c0);
            if (!qall)
                stage_tile(Qt, pq, sq.z, 0, qrows, c0, DT, d, true);
            stage_tile(sT, pk, sk.z, s0, nkeys, c0, w, d, MT_AT);
            if (kv1)
                stage_tile(sV, pv, sv.z, s0, nkeys, 0, dpad, d, false);
            barrier(CLK_LOCAL_MEM_FENCE);
            __local const float *qc = qall ? Qt + c0 * BLK : Qt;
            ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
                const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
                for (int c = 0; c < w; c += DT) /* DT terms per call: a constant trip count */
                    mt_product(s + m * MT_ACC, MT_A(sT, row0, w, c), qc + c * BLK + col0, BLK, DT);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }

        /* Mask and scale (key s sees the query lanes at positions >= s), keep each tile's column
           maxima. */
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            ACC_UNROLL for (int j = 0; j < TN; ++j) {
                vfloat mx = (vfloat)(-INFINITY);
                ACC_UNROLL for (int i = 0; i < TM; ++i) {
                    const int key = s0 + row0 + i, e = m * MT_ACC + MT_E(i, j);
                    /* key > the lane's position: compared as a small difference, exact in float */
                    const vfloat ahead = (vfloat)(float)(key - pos0 - col0 - j * VW);
                    s[e] = key < nkeys ? select(s[e] * sc, (vfloat)(-INFINITY), VISGREATER(ahead, lane))
                                       : (vfloat)(-INFINITY);
                    mx = fmax(mx, s[e]);
                }
                VSTORE(mx, sR + (row0 / TM) * BLK + col0 + j * VW);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* The new running max of each query column and its rescale factor alpha, from every tile
           row's maxima in sR; then P^T = exp(S^T - m) into sP and the partial sums of l of the
           work-item's columns.  Under ACC == 2 (GPUs, which run a group's work-items at once) each
           work-item derives them for its own columns, in registers (mrun), and the owners of tile
           row 0 publish them in sM and sA, with no barrier of their own; under ACC == 1 (CPUs, which
           run the work-items one after another, so that work done by each is done NT times) the
           owners of VW rows derive them once and publish them behind a barrier. */
        vfloat ref[TN], alpha[TN];
#if ACC == 2
        ACC_UNROLL for (int j = 0; j < TN; ++j) {
            const int cv = colv + j * VW;
            vfloat m_new = mrun[j];
            for (int g = 0; g < CF_RG; ++g)
                m_new = fmax(m_new, VLOAD(sR + g * BLK + cv));
            ref[j] = cc_finite_or_zero(m_new);
            alpha[j] = exp(mrun[j] - ref[j]);
            mrun[j] = m_new;
            if (lid < BLK / MT_COLS) {
                VSTORE(alpha[j], sA + cv);
                VSTORE(m_new, sM + cv);
            }
        }
#else
        for (int u = lid; u < BLK / VW; u += NT) {
            const vfloat m_old = VLOAD(sM + u * VW);
            vfloat m_new = m_old;
            for (int g = 0; g < CF_RG; ++g)
                m_new = fmax(m_new, VLOAD(sR + g * BLK + u * VW));
            VSTORE(exp(m_old - cc_finite_or_zero(m_new)), sA + u * VW);
            VSTORE(m_new, sM + u * VW);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int j = 0; j < TN; ++j) {
            ref[j] = cc_finite_or_zero(VLOAD(sM + colv + j * VW));
            alpha[j] = VLOAD(sA + colv + j * VW);
        }
#endif
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int row0 = MT_ROW0(lid + m * NT, BLK);
            ACC_UNROLL for (int j = 0; j < TN; ++j) {
                const int cv = colv + j * VW;
                vfloat ps = (vfloat)(0.0f);
                ACC_UNROLL for (int i = 0; i < TM; ++i) {
                    const vfloat p = exp(s[m * MT_ACC + MT_E(i, j)] - ref[j]);
                    ps += p;
                    VSTORE(p, sP + (row0 + i) * BLK + cv);
                }
                lpart[m * TN + j] = lpart[m * TN + j] * alpha[j] + ps;
            }
        }
        /* acc = alpha acc + P V over this key block, slab by slab of DT columns, V staged kvw
           columns at a time unless it came with K (sP and sA published by the first staging
           barrier).  Row r of the block sees the keys s0 + kk, kk <= r + pos0 - s0.  The slab loop is
           unrolled under ACC == 2 only: unrolled, PoCL keeps every slab's accumulators as values that
           its barrier regions copy at each key block (1.6x the time of this loop on the CPU mapping;
           common.cl, ACC). */
        const int nk = min(BLK, nkeys - s0);
        const bool all_seen = s0 + nk - 1 <= pos0; /* uniform: the block's first row sees every key */
        for (int cv = 0; cv < d; cv += kvw) {
            const int w = min(kvw, dpad - cv);
            if (!kv1)
                stage_tile(sT, pv, sv.z, s0, nkeys, cv, w, d, false);
            barrier(CLK_LOCAL_MEM_FENCE);
            CC_FOR_SLABS(ci, c0, cv, w) {
                ACC_UNROLL for (int m = 0; m < FUPC; ++m) {
                    const int u = lid + m * NT, row0 = MT_ROW0(u, DT), col0 = MT_COL0(u, DT);
                    vfloat *a = acc + (ci * FUPC + m) * MT_ACC;
                    ACC_UNROLL for (int e = 0; e < MT_ACC; ++e)
                        a[e] *= sA[MT_EROW(row0, e)];
                    if (all_seen)
                        mt_product(a, sP + row0, BLK, sV + c0 + col0, w, BLK);
                    else
                        cc_product_until(a, sP + row0, BLK, sV + c0 + col0, w, row0 + pos0 - s0);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }

    ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
        const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
        ACC_UNROLL for (int j = 0; j < TN; ++j)
            VSTORE(lpart[m * TN + j], sR + (row0 / TM) * BLK + col0 + j * VW);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int u = lid; u < BLK / VW; u += NT) {
        vfloat l = (vfloat)(0.0f);
        for (int g = 0; g < CF_RG; ++g)
            l += VLOAD(sR + g * BLK + u * VW);
        VSTORE(l, sL + u * VW);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (nsplit == 1 && want_lse && lid < qrows)
        lse[tensor_offset(slse, b, h, q0 + lid)] = sM[lid] + log(sL[lid]);
    if (nsplit > 1 && lid < qrows) { /* partial sp of each row for castle_causal_combine */
        __global float *pp = part + cc_partial(bh, n, q0 + lid, nsplit, sp, d);
        pp[d] = sM[lid];
        pp[d + 1] = sL[lid];
    }
    if (nsplit == 1)
        cc_store_acc(acc, o + tensor_offset(so, b, h, q0), so.z, qrows, d, 1.0f, sL, true, false);
    else /* partial sp of row r at cc_partial(.., r, ..): rows nsplit (d + 2) floats apart */
        cc_store_acc(acc, part + cc_partial(bh, n, q0, nsplit, sp, d), (ulong)nsplit * (d + 2), qrows, d, 1.0f, sL,
                     false, false);
}

#ifndef CC_FORWARD_ONLY /* the rest of the family (host/program.c, CASTLE_FAMILY_CAUSAL_FORWARD) */

/* Decode of n <= CC_DQ new rows (positions t0..t0+n-1) against the cache's keys 0..t0+n-1.
 * Work-group (split, bh) streams a contiguous range of about (t0 + n) / nsplit keys once, with an
 * online softmax per new row, and leaves CASTLE_CAUSAL_DECODE_PARTIALS (local_memory.h) partials of
 * each row for castle_causal_combine: under the tuning's decode mapping 1 (SIMD CPUs, DEC) one per
 * work-item, each over its own contiguous range of keys, with no local memory and no barriers; under
 * mapping 2 (GPUs) one per work-group, whose teams of CD_LN lanes take a key row each, adjacent lanes
 * on adjacent float4s. */
#define CC_DQ CASTLE_DECODE_ROWS
#define CC_NV (DACC / CC_VK)
/* No local memory, no barriers: a small group bounds the private state (2 CC_DQ DACC floats per
   work-item) a CPU device keeps for the whole group. */
#define CC_DNT (CC_NT < CASTLE_DECODE_GROUP ? CC_NT : CASTLE_DECODE_GROUP)
#if DEC == 1
__kernel __attribute__((reqd_work_group_size(CC_DNT, 1, 1)))
void castle_causal_decode(const int n, const int t0, const int d, const int H, const float sc,
                          __global const float *q, const ulong4 sq,
                          __global const float *k, __global const float *v, const ulong4 sc_,
                          const int nsplit, __global float *part, BH0_PARAM)
{
    const int lid = get_local_id(0), bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    const int P = nsplit * CC_DNT, pi = (int)get_group_id(0) * CC_DNT + lid;
    /* in long: a KV cache may hold nearly INT_MAX keys, and t0 + n + P - 1, pi per or s_begin + per would wrap */
    const int per = (int)(((long)t0 + n + P - 1) / P), s_begin = (int)min((long)pi * per, (long)t0 + n);
    const int s_end = (int)min((long)s_begin + per, (long)t0 + n);
    const int nfull = d / CC_VK, tail = d - nfull * CC_VK; /* column vectors: full ones, then the rest */
    const int nv = nfull + (tail > 0);
    __global const float *pk = k + tensor_offset(sc_, b, h, 0);
    __global const float *pv = v + tensor_offset(sc_, b, h, 0);
    cc_vec qv[CC_DQ][CC_NV], acc[CC_DQ][CC_NV];
    float m[CC_DQ], l[CC_DQ];
    for (int r = 0; r < n; ++r) {
        __global const float *qr = q + tensor_offset(sq, b, h, r);
        for (int j = 0; j < nv; ++j) {
            qv[r][j] = cc_vload_part(qr + j * CC_VK, d - j * CC_VK);
            acc[r][j] = 0.0f;
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (int s = s_begin; s < s_end; ++s) {
        __global const float *kr = pk + (ulong)s * sc_.z, *vr = pv + (ulong)s * sc_.z;
        for (int r = max(0, s - t0); r < n; ++r) { /* the rows that see key s */
            cc_vec y0 = 0.0f, y1 = 0.0f;
            int j = 0;
            for (; j + 2 <= nfull; j += 2) {
                y0 += qv[r][j] * CC_LOAD(kr + j * CC_VK);
                y1 += qv[r][j + 1] * CC_LOAD(kr + (j + 1) * CC_VK);
            }
            if (j < nfull)
                y0 += qv[r][j] * CC_LOAD(kr + j * CC_VK);
            if (tail)
                y1 += qv[r][nfull] * cc_vload_part(kr + nfull * CC_VK, tail);
            const float x = cc_hsum(y0 + y1) * sc;
            if (x > m[r]) { /* new running max: rescale (rare once the first keys are in) */
                const float alpha = exp(m[r] - x);
                l[r] *= alpha;
                for (j = 0; j < nv; ++j)
                    acc[r][j] *= alpha;
                m[r] = x;
            }
            const float p = exp(x - m[r]);
            l[r] += p;
            for (j = 0; j < nfull; ++j)
                acc[r][j] += p * CC_LOAD(vr + j * CC_VK);
            if (tail)
                acc[r][nfull] += p * cc_vload_part(vr + nfull * CC_VK, tail);
        }
    }
    for (int r = 0; r < n; ++r) {
        __global float *pp = part + cc_partial(bh, n, r, P, pi, d);
        for (int j = 0; j < nv; ++j)
            cc_vstore_part(acc[r][j], pp + j * CC_VK, d - j * CC_VK);
        pp[d] = m[r];
        pp[d + 1] = l[r];
    }
}
#else
/* Lanes per key row and key rows per team between two barriers.  On an H200 (B=2 H=16 d=64 t=32768,
   ms) 4 lanes x 1 row took 0.275, 4 x 2 0.302 to 0.312 (eleven runs of one session; 0.327 once),
   8 x 1 0.293, 8 x 2 0.293, 4 x 4 0.361, 2 x 2 0.480 (2026-11-27, cache rows read as float4 where
   aligned); an earlier run: 4 x 2 0.303, 16 x 4 0.359, 16 x 8 0.391 (0.453 without CD_PRE), 8 x 4
   0.389, 8 x 8 0.433, 16 x 16 1.20 (1.00 without CD_PRE).  Wider heads take more lanes, so that a
   lane's accumulators stay 4 quads a row (at 4 lanes a 256-wide head's would spill).  Each may be
   predefined to try another shape (docs/performance.md, "Decode shapes"). */
#ifndef CD_LN
#define CD_LNW (DACC <= 64 ? 4 : DACC <= 128 ? 8 : 16)
#define CD_LN (CC_DNT < CD_LNW ? CC_DNT : CD_LNW)
#endif
#define CD_TEAMS (CC_DNT / CD_LN)
#ifndef CD_RP
#define CD_RP 1
#endif
#define CD_ACCQ ((DACC / 4 + CD_LN - 1) / CD_LN) /* quads of a row per lane */
#define CD_ACCT ((3 + CD_LN - 1) / CD_LN)         /* tail columns of a row per lane */
/* CD_PRE: a pass loads its value rows (the quads of each lane) into registers with its key rows,
   before the barrier between scores and softmax, so that it waits on memory once, not twice; while
   CD_RP CD_ACCQ quads fit DEC_PRE_QUADS (common.cl). */
#ifndef CD_PRE
#define CD_PRE (CD_RP * CD_ACCQ <= DEC_PRE_QUADS)
#endif
__kernel __attribute__((reqd_work_group_size(CC_DNT, 1, 1)))
void castle_causal_decode(const int n, const int t0, const int d, const int H, const float sc,
                          __global const float *q, const ulong4 sq,
                          __global const float *k, __global const float *v, const ulong4 sc_,
                          const int nsplit, __global float *part, BH0_PARAM)
{
    __local float lq[CC_DQ * DACC] LM_ALIGNED;           /* the new rows' queries */
    __local float rx[CD_RP * CC_DQ * CC_DNT] LM_ALIGNED; /* per-lane partial scores */
    __local float tm[CD_TEAMS] LM_ALIGNED, tl[CD_TEAMS] LM_ALIGNED, tacc[CD_TEAMS * DACC] LM_ALIGNED;
    const int lid = get_local_id(0), lane = lid % CD_LN, team = lid / CD_LN;
    const int sp = get_group_id(0), bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    /* in long: a KV cache may hold nearly INT_MAX keys, and keys + nsplit - 1, sp per or s_begin + per would wrap */
    const int keys = t0 + n, per = (int)(((long)keys + nsplit - 1) / nsplit);
    const int s_begin = (int)min((long)sp * per, (long)keys), s_end = (int)min((long)s_begin + per, (long)keys);
    const int nq = d >> 2;
    __global const float *pk = k + tensor_offset(sc_, b, h, 0);
    __global const float *pv = v + tensor_offset(sc_, b, h, 0);
    for (int e = lid; e < n * d; e += CC_DNT)
        lq[(e / d) * DACC + e % d] = q[tensor_offset(sq, b, h, e / d) + e % d];
    float m[CC_DQ], l[CC_DQ];
    float4 acc4[CC_DQ][CD_ACCQ];
    float acct[CC_DQ][CD_ACCT];
    ACC_UNROLL for (int r = 0; r < CC_DQ; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        ACC_UNROLL for (int i = 0; i < CD_ACCQ; ++i)
            acc4[r][i] = (float4)(0.0f);
        ACC_UNROLL for (int i = 0; i < CD_ACCT; ++i)
            acct[r][i] = 0.0f;
    }
#if CD_PRE
    float4 cv[CD_RP][CD_ACCQ]; /* the pass's value rows */
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int sb = s_begin; sb < s_end; sb += CD_TEAMS * CD_RP) {
        /* scores: row r sees key s when s <= t0 + r; keys past the range or the row are never read */
        ACC_UNROLL for (int j = 0; j < CD_RP; ++j) {
            const int s = sb + team + CD_TEAMS * j;
#if CD_PRE
            if (s < s_end) {
                ACC_UNROLL for (int i = 0; i < CD_ACCQ; ++i) {
                    const int qd = lane + CD_LN * i;
                    if (qd < nq)
                        cv[j][i] = vload4(qd, pv + (ulong)s * sc_.z);
                }
            }
#endif
            ACC_UNROLL for (int r = 0; r < CC_DQ; ++r)
                rx[(j * CC_DQ + r) * CC_DNT + lid] =
                    (r < n && s < s_end && s <= t0 + r) ? lane_dot(pk + (ulong)s * sc_.z, false, lq + r * DACC, lane, CD_LN, d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        ACC_UNROLL for (int j = 0; j < CD_RP; ++j) { /* each team's online softmax, its keys in increasing order */
            const int s = sb + team + CD_TEAMS * j;
            if (s >= s_end)
                break;
            __global const float *vr = pv + (ulong)s * sc_.z;
            ACC_UNROLL for (int r = 0; r < CC_DQ; ++r) {
                if (r >= n || s > t0 + r)
                    continue;
                float x = 0.0f;
                for (int i = 0; i < CD_LN; ++i)
                    x += rx[(j * CC_DQ + r) * CC_DNT + team * CD_LN + i];
                x *= sc;
                const float mn = fmax(m[r], x);
                const float alpha = exp(m[r] - mn); /* 0 while m = -inf */
                const float p = exp(x - mn);
                l[r] = l[r] * alpha + p;
                ACC_UNROLL for (int i = 0; i < CD_ACCQ; ++i) {
                    const int qd = lane + CD_LN * i;
                    if (qd >= nq)
                        break;
#if CD_PRE
                    acc4[r][i] = acc4[r][i] * alpha + p * cv[j][i];
#else
                    acc4[r][i] = acc4[r][i] * alpha + p * vload4(qd, vr);
#endif
                }
                ACC_UNROLL for (int i = 0; i < CD_ACCT; ++i) {
                    const int c = 4 * nq + lane + CD_LN * i;
                    if (c >= d)
                        break;
                    acct[r][i] = acct[r][i] * alpha + p * vr[c];
                }
                m[r] = mn;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* the scores are read before the next pass writes them */
    }
    /* Merge the teams, row by row, into the work-group's partial: acc = sum_j acc_j exp(m_j - M).
       Row r's private values are picked by constant indices (CD_PICK), so that m, l, acc4 and acct
       stay in registers: a loop with barriers is not unrolled. */
#define CD_PICK(x, a, col) \
    do { \
        x = (a)[0] col; \
        for (int rr = 1; rr < CC_DQ; ++rr) \
            x = rr == r ? (a)[rr] col : x; \
    } while (0)
    for (int r = 0; r < n; ++r) {
        if (lane == 0) {
            float x;
            CD_PICK(x, m, );
            tm[team] = x;
            CD_PICK(x, l, );
            tl[team] = x;
        }
        ACC_UNROLL for (int i = 0; i < CD_ACCQ; ++i) {
            const int qd = lane + CD_LN * i;
            if (qd >= nq)
                break;
            float4 x;
            CD_PICK(x, acc4, [i]);
            vstore4(x, qd, tacc + team * DACC);
        }
        ACC_UNROLL for (int i = 0; i < CD_ACCT; ++i) {
            const int c = 4 * nq + lane + CD_LN * i;
            if (c >= d)
                break;
            float x;
            CD_PICK(x, acct, [i]);
            tacc[team * DACC + c] = x;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float mx = -INFINITY;
        for (int i = 0; i < CD_TEAMS; ++i)
            mx = fmax(mx, tm[i]);
        __global float *pp = part + cc_partial(bh, n, r, nsplit, sp, d);
        for (int c = lid; c <= d + 1; c += CC_DNT) {
            float x = 0.0f, sum = 0.0f;
            for (int i = 0; i < CD_TEAMS; ++i) {
                /* a team that saw no key (m = -inf) adds nothing, also when none did (mx = -inf) */
                const float w = tm[i] == -INFINITY ? 0.0f : exp(tm[i] - mx);
                if (c < d)
                    x += w * tacc[i * DACC + c];
                else
                    sum += w * tl[i];
            }
            pp[c] = c < d ? x : c == d ? mx : sum;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* tm, tl, tacc are read before the next row writes them */
    }
}
#endif

/* Merges the P partials of each new row: o = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i,
   lse = M + log sum_i e^(m_i - M) l_i (M = max_i m_i; a partial that saw no key has m = -inf, l = 0). */
__kernel __attribute__((reqd_work_group_size(CC_NT, 1, 1)))
void castle_causal_combine(const int n, const int d, const int H, const int P, __global const float *part,
                           __global float *o, const ulong4 so, __global float *lse, const ulong4 slse,
                           const int want_lse, BH0_PARAM)
{
    const int qb = get_group_id(0), bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    const int q0 = qb * BLK, qrows = min(BLK, n - q0);
    for (int e = get_local_id(0); e < qrows * (d + 1); e += CC_NT) {
        const int r = e / (d + 1), c = e % (d + 1); /* c == d: lse */
        __global const float *pr = part + cc_partial(bh, n, q0 + r, P, 0, d);
        float M = -INFINITY;
        for (int i = 0; i < P; ++i)
            M = fmax(M, pr[i * (d + 2) + d]);
        float l = 0.0f, x = 0.0f;
        for (int i = 0; i < P; ++i) {
            const float w = exp(pr[i * (d + 2) + d] - M);
            l += w * pr[i * (d + 2) + d + 1];
            if (c < d)
                x += w * pr[i * (d + 2) + c];
        }
        if (c < d)
            o[tensor_offset(so, b, h, q0 + r) + c] = x / l;
        else if (want_lse)
            lse[tensor_offset(slse, b, h, q0 + r)] = M + log(l);
    }
}

/* Rows 0..n-1 of k, v to rows t0..t0+n-1 of the cache (strides sc): work-group (g, bh) copies the
   rows g BLK .. g BLK + BLK - 1, a vector of VW columns at a time, in the tuning's stage order (a
   contiguous run per work-item on CPUs, consecutive vectors on consecutive work-items on GPUs). */
__kernel __attribute__((reqd_work_group_size(CC_NT, 1, 1)))
void castle_causal_append(const int n, const int t0, const int d, const int H,
                          __global const float *k, const ulong4 sk, __global const float *v, const ulong4 sv,
                          __global float *ck, __global float *cv, const ulong4 sc, BH0_PARAM)
{
    const int bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    const int r0 = get_group_id(0) * BLK, nv = (d + VW - 1) / VW; /* vectors to a row */
    FOR_SHARE_OF(e, min(BLK, n - r0) * nv, CC_NT) {
        const int r = r0 + e / nv, c = (e % nv) * VW, m = min(VW, d - c);
        gstore_part(gload_part(k + tensor_offset(sk, b, h, r) + c, m), ck + tensor_offset(sc, b, h, t0 + r) + c, m);
        gstore_part(gload_part(v + tensor_offset(sv, b, h, r) + c, m), cv + tensor_offset(sc, b, h, t0 + r) + c, m);
    }
}

/* ---- Backward ---------------------------------------------------------------------------------
 * Both kernels on the forward's micro-tiles: the two score products of a block pair, S and dP
 * (cc_scores), then the gradient products, their BLK x d accumulators slab by slab of DT columns
 * (CF_NCH x FUPC micro-tiles per work-item; registers under ACC == 2, as in the forward).
 * The staging area T of CC_ST x BLK floats (as wide as four d-wide tiles where local memory allows:
 * d <= 192 on the CPU table entry, 64 on the GPU one) holds the score operands: the two B operands
 * (transposed) that stay the same for the whole work-group and the two A operands of the current
 * block (as MT_AT says), all of d at once when four such tiles fit (CC_RES: the B operands are
 * staged once per work-group), else everything CC_W1 columns at a time.  The gradient products
 * stage their row-major B operands in what is left of T. */
#define CC_ST CASTLE_LM_CAUSAL_ST_CLASS(BLK, DT, CC_DMAX, DACC) /* columns of BLK floats in T (local_memory.h) */
#if CC_ST < 4 * DT
#error "causal.cl: the backward's staging area must hold four d chunks"
#endif

/* s = A1 B1^T and g = A2 B2^T over the micro-tiles lid + m NT of the BLK x BLK block (s, g: FUPT
   micro-tiles each, zeroed here), where A1, A2 are the rows [ra, ra + BLK) of a1, a2 (row strides
   sa1, sa2; rows >= na read as 0) and B1, B2 the rows [rb, rb + BLK) of b1, b2 (rows >= nb read as
   0).  T: B1^T, B2^T (bw columns each), then A1, A2 (w columns each); with res the B tiles hold all
   of d (bw = dpad), staged by the caller (cc_stage_b) before the first call. */
__attribute__((always_inline)) inline void cc_scores(vfloat *s, vfloat *g, __local float *T, const bool res,
                                                     const int w, const int dpad, const int d,
                                                     __global const float *a1, const ulong sa1,
                                                     __global const float *a2, const ulong sa2, const int ra,
                                                     const int na, __global const float *b1, const ulong sb1,
                                                     __global const float *b2, const ulong sb2, const int rb,
                                                     const int nb)
{
    const int lid = get_local_id(0), bw = res ? dpad : w;
    __local float *tb2 = T + bw * BLK, *ta1 = T + 2 * bw * BLK, *ta2 = ta1 + w * BLK;
    ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
        mt_zero(s + m * MT_ACC);
        mt_zero(g + m * MT_ACC);
    }
    for (int c0 = 0; c0 < d; c0 += w) {
        const int wc = min(w, dpad - c0), bc = res ? c0 : 0; /* B's column c0 + c at bc + c */
        if (!res) {
            stage_tile(T, b1, sb1, rb, nb, c0, wc, d, true);
            stage_tile(tb2, b2, sb2, rb, nb, c0, wc, d, true);
        }
        stage_tile(ta1, a1, sa1, ra, na, c0, wc, d, MT_AT);
        stage_tile(ta2, a2, sa2, ra, na, c0, wc, d, MT_AT);
        barrier(CLK_LOCAL_MEM_FENCE);
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            for (int c = 0; c < wc; c += DT) { /* DT terms per call: a constant trip count */
                mt_product(s + m * MT_ACC, MT_A(ta1, row0, wc, c), T + (bc + c) * BLK + col0, BLK, DT);
                mt_product(g + m * MT_ACC, MT_A(ta2, row0, wc, c), tb2 + (bc + c) * BLK + col0, BLK, DT);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

/* The B operands of cc_scores, all of d (dpad columns each), when they stay for the whole work-group
   (published by cc_scores's first barrier). */
inline void cc_stage_b(__local float *T, const int dpad, const int d, __global const float *b1, const ulong sb1,
                       __global const float *b2, const ulong sb2, const int rb, const int nb)
{
    stage_tile(T, b1, sb1, rb, nb, 0, dpad, d, true);
    stage_tile(T + dpad * BLK, b2, sb2, rb, nb, 0, dpad, d, true);
}

/* Columns of d per staging step of cc_scores and of the gradient products (nb row-major tiles each):
   with res all of d, else as many DT chunks as T holds. */
#define CC_RES(dpad) (4 * (dpad) <= CC_ST)
#define CC_W1(dpad) (CC_RES(dpad) ? (dpad) : CC_ST / (4 * DT) * DT)
#define CC_W2(dpad, nb) (CC_RES(dpad) ? (dpad) : min((dpad), CC_ST / ((nb) * DT) * DT))

/* Backward, key side: work-group (j, bh) owns key block j (the longest first) and loops over the
 * query blocks i >= j of the launch's range [from, upto) (all N of them in one launch, unless the
 * device limits a work-item's loops: host/loops.c; a launch after the block's first adds its sums to
 * what the earlier ones wrote):  S = Q_i K_j^T,  P = exp(sc S - lse_i),  dP = dO_i V_j^T,  dS = P (dP - Delta_i)
 * (query rows x keys, written row-major to sP and sD, masked entries and rows past L 0), then
 * dV_j += P^T dO_i and dK_j += dS^T Q_i (A = P^T, dS^T read k-major from sP, sD; dO_i and Q_i staged
 * row-major).  On the diagonal block key s0 + r takes only the query rows from s0 + r on
 * (mt_product_from): a masked term is skipped, never multiplied by a zero weight; dK = sc dK at the
 * end. */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_causal_backward_kv(const int L, const int d, const int H, const float sc,
                               __global const float *q, const ulong4 sq,
                               __global const float *k, const ulong4 sk,
                               __global const float *v, const ulong4 sv,
                               __global const float *o, const ulong4 so,
                               __global const float *lse, const ulong4 slse,
                               __global const float *dO, const ulong4 sdo,
                               __global float *dk, const ulong4 sdk,
                               __global float *dv, const ulong4 sdv, const int from, const int upto,
                               BH0_PARAM)
{
    __local float T[CC_ST * BLK] LM_ALIGNED;
    __local float sP[BLK * BLK] LM_ALIGNED; /* P[row * BLK + key] */
    __local float sD[BLK * BLK] LM_ALIGNED; /* dS[row * BLK + key] */
    __local float sLse[BLK] LM_ALIGNED, sDel[BLK] LM_ALIGNED;
    const int lid = get_local_id(0);
    const int N = (L + BLK - 1) / BLK, kb = get_group_id(0), bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    const int s0 = kb * BLK, krows = min(BLK, L - s0);
    const int qend = min(N, upto);
    if (kb >= qend) /* uniform: no query block of the range sees this key block */
        return;
    __global const float *pq = q + tensor_offset(sq, b, h, 0);
    __global const float *pk = k + tensor_offset(sk, b, h, 0);
    __global const float *pv = v + tensor_offset(sv, b, h, 0);
    __global const float *po = o + tensor_offset(so, b, h, 0);
    __global const float *pdo = dO + tensor_offset(sdo, b, h, 0);
    const vfloat lane = lane_index();
    const int dpad = (d + DT - 1) / DT * DT;
    const bool res = CC_RES(dpad);
    const int w1 = CC_W1(dpad), w2 = CC_W2(dpad, 2);
    __local float *R = T + (res ? 2 * dpad * BLK : 0); /* the gradient products' tiles: dO_i, Q_i */
    if (res)
        cc_stage_b(T, dpad, d, pk, sk.z, pv, sv.z, s0, L);
    vfloat accK[CF_NCH * FUPC * MT_ACC], accV[CF_NCH * FUPC * MT_ACC]; /* as the forward's acc */
    for (int e = 0; e < CF_NCH * FUPC * MT_ACC; ++e)
        accK[e] = accV[e] = (vfloat)(0.0f);

    for (int qb = max(kb, from); qb < qend; ++qb) {
        const int q0 = qb * BLK, qrows = min(BLK, L - q0);
        if (lid < BLK) { /* published by cc_scores's first barrier */
            const int t = q0 + lid;
            sDel[lid] = lid < qrows ? cc_row_dot(pdo + (ulong)t * sdo.z, po + (ulong)t * so.z, d) : 0.0f;
            sLse[lid] = lid < qrows ? lse[tensor_offset(slse, b, h, t)] : 0.0f;
        }
        vfloat s[FUPT * MT_ACC], g[FUPT * MT_ACC];
        cc_scores(s, g, T, res, w1, dpad, d, pq, sq.z, pdo, sdo.z, q0, L, pk, sk.z, pv, sv.z, s0, L);
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            ACC_UNROLL for (int i = 0; i < TM; ++i) {
                const int row = row0 + i;
                const float lr = sLse[row], dr = sDel[row];
                ACC_UNROLL for (int j = 0; j < TN; ++j) {
                    const int e = m * MT_ACC + MT_E(i, j), c = col0 + j * VW;
                    /* key s0 + c + lane > query q0 + row: compared as a small difference, exact in float */
                    const vint masked = VISGREATER(lane, (vfloat)(float)clamp(q0 + row - s0 - c, -1, BLK));
                    /* the scaled score as its own statement: rounded, as the forward's is, before lse is
                       subtracted (in one expression a compiler may fuse the two into an FMA, and the P of
                       a saturated row is then not the one the forward normalised: errors of 1e-2 in dv
                       at magnitude 1000 where sc is no power of 2) */
                    const vfloat x = s[e] * sc;
                    vfloat p = select(exp(x - lr), (vfloat)(0.0f), masked);
                    vfloat ds = select(p * (g[e] - dr), (vfloat)(0.0f), masked);
                    if (row >= qrows)
                        p = ds = (vfloat)(0.0f);
                    VSTORE(p, sP + row * BLK + c);
                    VSTORE(ds, sD + row * BLK + c);
                }
            }
        }
        const bool diag = qb == kb; /* uniform */
        for (int cv = 0; cv < d; cv += w2) {
            const int w = min(w2, dpad - cv);
            stage_tile(R, pdo, sdo.z, q0, L, cv, w, d, false);
            stage_tile(R + w * BLK, pq, sq.z, q0, L, cv, w, d, false);
            barrier(CLK_LOCAL_MEM_FENCE); /* also publishes sP, sD */
            CC_FOR_SLABS(ci, c0, cv, w) {
                ACC_UNROLL for (int m = 0; m < FUPC; ++m) {
                    const int u = lid + m * NT, row0 = MT_ROW0(u, DT), col0 = MT_COL0(u, DT);
                    vfloat *av = accV + (ci * FUPC + m) * MT_ACC, *ak = accK + (ci * FUPC + m) * MT_ACC;
                    if (diag) { /* key row0 + i takes the query rows kk >= row0 + i */
                        mt_product_from(av, sP + row0, BLK, R + c0 + col0, w, row0, 0, 0, false, lane);
                        mt_product_from(ak, sD + row0, BLK, R + w * BLK + c0 + col0, w, row0, 0, 0, false, lane);
                    } else {
                        mt_product(av, sP + row0, BLK, R + c0 + col0, w, BLK);
                        mt_product(ak, sD + row0, BLK, R + w * BLK + c0 + col0, w, BLK);
                    }
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
    /* two copies of the stores, so that the one launch of devices without a loop limit keeps the
       registers it had (236 against 244 with add a run-time argument: tools/ptx-report.sh) */
    if (kb < from) { /* an earlier launch began this key block's sums */
        cc_store_acc(accK, dk + tensor_offset(sdk, b, h, s0), sdk.z, krows, d, sc, sLse, false, true);
        cc_store_acc(accV, dv + tensor_offset(sdv, b, h, s0), sdv.z, krows, d, 1.0f, sLse, false, true);
    } else {
        cc_store_acc(accK, dk + tensor_offset(sdk, b, h, s0), sdk.z, krows, d, sc, sLse, false, false);
        cc_store_acc(accV, dv + tensor_offset(sdv, b, h, s0), sdv.z, krows, d, 1.0f, sLse, false, false);
    }
}

/* Backward, query side: work-group (g, bh) owns query block i = N-1-g (the longest first) and loops
 * over the key blocks j <= i of the launch's range [from, upto) (as the key side's; the launch has
 * the N - from work-groups whose query blocks reach the range):  dQ_i += sc dS K_j  with dS as in castle_causal_backward_kv, computed
 * transposed (S^T = K_j Q_i^T, dP^T = V_j dO_i^T: key rows x query columns, Q_i^T and dO_i^T staged
 * once when they fit), so that lse and Delta are per-lane vectors; dS^T goes to sD, from which it is
 * the k-major A operand of dS K_j (K_j staged row-major).  On the diagonal block row r takes only the
 * keys up to r (cc_product_until). */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_causal_backward_q(const int L, const int d, const int H, const float sc,
                              __global const float *q, const ulong4 sq,
                              __global const float *k, const ulong4 sk,
                              __global const float *v, const ulong4 sv,
                              __global const float *o, const ulong4 so,
                              __global const float *lse, const ulong4 slse,
                              __global const float *dO, const ulong4 sdo,
                              __global float *dq, const ulong4 sdq, const int from, const int upto,
                              BH0_PARAM)
{
    __local float T[CC_ST * BLK] LM_ALIGNED;
    __local float sD[BLK * BLK] LM_ALIGNED; /* dS^T[key * BLK + row] */
    __local float sLse[BLK] LM_ALIGNED, sDel[BLK] LM_ALIGNED;
    const int lid = get_local_id(0);
    const int N = (L + BLK - 1) / BLK, qb = N - 1 - (int)get_group_id(0), bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    const int q0 = qb * BLK, qrows = min(BLK, L - q0);
    __global const float *pq = q + tensor_offset(sq, b, h, 0);
    __global const float *pk = k + tensor_offset(sk, b, h, 0);
    __global const float *pv = v + tensor_offset(sv, b, h, 0);
    __global const float *pdo = dO + tensor_offset(sdo, b, h, 0);
    const vfloat lane = lane_index();
    const int dpad = (d + DT - 1) / DT * DT;
    const bool res = CC_RES(dpad);
    const int w1 = CC_W1(dpad), w2 = CC_W2(dpad, 1);
    __local float *R = T + (res ? 2 * dpad * BLK : 0); /* the dQ product's tile: K_j */
    if (res)
        cc_stage_b(T, dpad, d, pq, sq.z, pdo, sdo.z, q0, L);
    if (lid < BLK) { /* rows past L: lse = +inf makes their P 0 */
        const int t = q0 + lid;
        sDel[lid] = lid < qrows ? cc_row_dot(pdo + (ulong)t * sdo.z, o + tensor_offset(so, b, h, t), d) : 0.0f;
        sLse[lid] = lid < qrows ? lse[tensor_offset(slse, b, h, t)] : INFINITY;
    }
    vfloat acc[CF_NCH * FUPC * MT_ACC];
    for (int e = 0; e < CF_NCH * FUPC * MT_ACC; ++e)
        acc[e] = (vfloat)(0.0f);

    for (int kb = from; kb <= qb && kb < upto; ++kb) {
        const int s0 = kb * BLK;
        vfloat s[FUPT * MT_ACC], g[FUPT * MT_ACC];
        cc_scores(s, g, T, res, w1, dpad, d, pk, sk.z, pv, sv.z, s0, L, pq, sq.z, pdo, sdo.z, q0, L);
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            ACC_UNROLL for (int j = 0; j < TN; ++j) {
                const int c = col0 + j * VW;
                const vfloat lr = VLOAD(sLse + c), dr = VLOAD(sDel + c);
                ACC_UNROLL for (int i = 0; i < TM; ++i) {
                    const int e = m * MT_ACC + MT_E(i, j);
                    /* key s0 + row0 + i > query q0 + c + lane: compared as a small difference */
                    const vint masked = VISGREATER((vfloat)(float)clamp(s0 + row0 + i - q0 - c, -1, BLK), lane);
                    const vfloat x = s[e] * sc; /* rounded before lse is subtracted, as in the key side */
                    VSTORE(select(exp(x - lr) * (g[e] - dr), (vfloat)(0.0f), masked),
                           sD + (row0 + i) * BLK + c);
                }
            }
        }
        const bool diag = kb == qb; /* uniform */
        for (int cv = 0; cv < d; cv += w2) {
            const int w = min(w2, dpad - cv);
            stage_tile(R, pk, sk.z, s0, L, cv, w, d, false);
            barrier(CLK_LOCAL_MEM_FENCE); /* also publishes sD */
            CC_FOR_SLABS(ci, c0, cv, w) {
                ACC_UNROLL for (int m = 0; m < FUPC; ++m) {
                    const int u = lid + m * NT, row0 = MT_ROW0(u, DT), col0 = MT_COL0(u, DT);
                    vfloat *a = acc + (ci * FUPC + m) * MT_ACC;
                    if (diag) /* row row0 + i takes the keys kk <= row0 + i */
                        cc_product_until(a, sD + row0, BLK, R + c0 + col0, w, row0);
                    else
                        mt_product(a, sD + row0, BLK, R + c0 + col0, w, BLK);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
    cc_store_acc(acc, dq + tensor_offset(sdq, b, h, q0), sdq.z, qrows, d, sc, sLse, false, from > 0);
}

#endif /* CC_FORWARD_ONLY */
