/* cache.cl: prefill and decode with the UQ-KV cache (docs/algorithm.md section 5).
 *
 * The cache of one batch entry and head (bh = b * H + h) holds, row s for each cached token s:
 *   U  (cap x d)  lookahead keys u_s = sum_{s < j < len, and j <= s + W if W > 0} G[s,j] vU_j
 *   KC (cap x d), VC (cap x d)
 *   QU (R x d)    a ring: token s in row s % R; R = W for CASTLE-SWL (rows older than t - W are never
 *                 read again), R = cap for CASTLE
 * all packed, base (bh * rows) * d.  lens[b] is the sequence's length after its prefill; a decode
 * call's token i of sequence b sits at position t = lens[b] + pos0 + i (pos0 = tokens decoded since
 * the prefill), so sequences of different lengths advance together without a host round trip.
 *
 * Prefill (after the forward pass wrote the prompt's outputs):
 *   castle_cache_prefill_store  copies KC, VC and the QU ring rows, and U from the forward's D
 *                               (D_j final = U of the prompt, docs/algorithm.md section 3) when every sequence
 *                               has the descriptor's length;
 *   castle_cache_prefill_u      otherwise computes U by a flash-style pass: per row block T_s,
 *                               U[T_s] = sum over key blocks T_j of sigmoid-gated VU[T_j] (no softmax).
 * Decode of n tokens (two launches, whatever n):
 *   castle_cache_decode_attend  work-group (g, bh) owns rows [g * S, g * S + S) of the cache and of
 *                               the n appended tokens; CT tokens at a time it computes the gates of
 *                               its rows, the scores (the block of new tokens is a forward pass with
 *                               the cached U as D), an online softmax per token, and the update of
 *                               U; it appends kC, vC, U of the new tokens it owns; it writes the
 *                               partial (acc[d], m, l) of each token (split-K decoding), or the
 *                               outputs when it is the only work-group of its sequence;
 *   castle_cache_decode_combine work-group (i, bh) merges token i's partials into o and lse and
 *                               writes qU of the last R tokens into the ring (after every reader of
 *                               the rows they replace has run).
 * Every row of U, KC, VC is written by exactly one work-group per launch: no atomics. */

#if (NT % BLK) != 0 || ((BLK * BLK) % NT) != 0 || ((BLK * DT) % NT) != 0 || NT < BLK
#error "cache.cl: NT must be a multiple of BLK that divides BLK*BLK and BLK*DT"
#endif
#if !CASTLE_CHECK_FUC
#error "cache.cl: NT x TM x TN x VW must divide BLK*DT (common.cl FUPC)"
#endif

/* Shared with the C host, defined once there and passed as -D options (host/program.c). */
#ifndef CASTLE_MAX_HEAD_DIM
#error "cache.cl: CASTLE_MAX_HEAD_DIM comes from the host (-D, host/program.c)"
#endif
#define MAXD CASTLE_MAX_HEAD_DIM
/* ---- prefill --------------------------------------------------------------------------------- */

/* Work-item (e, bh) copies element (s = e / d, c = e % d) of the prompt into the cache when
   s < lens[b].  use_d: U[s] = D_hi[s] + D_lo[s] from the forward's workspace (rows Lpad apart). */
__kernel void castle_cache_prefill_store(const int P, const int d, const int H, const int R, const int cap,
                                         __global const int *lens,
                                         __global const float *qu, const ulong4 squ,
                                         __global const float *kc, const ulong4 skc,
                                         __global const float *vc, const ulong4 svc,
                                         __global const float *ws, const ulong ws_hi, const ulong ws_lo,
                                         const int Lpad, const int use_d,
                                         __global float *cu, __global float *cqu, __global float *ckc,
                                         __global float *cvc, BH0_PARAM)
{
    const ulong e = get_global_id(0);
    const int bh = BH_INDEX;
    if (e >= (ulong)P * d)
        return;
    const uint b = bh / H, h = bh % H;
    const int s = (int)(e / d), c = (int)(e % d);
    const int len = lens[b];
    if (s >= len)
        return;
    const ulong row = ((ulong)bh * cap + s) * d + c;
    ckc[row] = kc[tensor_offset(skc, b, h, s) + c];
    cvc[row] = vc[tensor_offset(svc, b, h, s) + c];
    if (s >= len - R)
        cqu[((ulong)bh * R + s % R) * d + c] = qu[tensor_offset(squ, b, h, s) + c];
    if (use_d) {
        const ulong dr = ((ulong)bh * Lpad + s) * d + c;
        cu[row] = ws[ws_hi + dr] + ws[ws_lo + dr];
    }
}

/* Work-group (row block sb, bh): U[T_s] = sum_j G[T_s, T_j] VU[T_j] over the key blocks T_j that
   meet the gate of T_s (j from sb up to the window's end) and lie in the launch's range [jfrom, jupto)
   (every block in one launch, unless the device limits a work-item's loops: host/loops.c; the block
   jb = sb writes U[T_s], the others add to it), gate rows s < j < lens[b], j <= s + W.
   The forward's mapping and operands (cl/forward.cl, phases 1, 2 and 5): gl = QU[T_s] KU[T_j]^T on
   micro-tiles, d staged DT columns at a time (QU as MT_AT says, KU k-major, row stride KS; both from
   the block-transposed copies the prefill's forward left in its workspace at ws_t, whose rows past a
   prompt's length are outside the gate and never reach U), then
   G = castle_gate_v(gl) stored k-major (G^T), and U[T_s] += G VU[T_j] slab by slab of DT columns
   (VU row-major), added to U in global memory (the work-group owns rows T_s of U).  The gate is
   computed exactly as the forward computes it; the product takes, per row s of a micro-tile, only
   the keys s < j <= s + W (mt_product_band): a row of VU outside the gate is never read, so whatever
   it holds cannot reach U through a zero weight. */
#define PU_LM CASTLE_LM_MAX_(2 * KS * DT, BLK * BLK + BLK * DT)
#if PU_LM > CASTLE_LM_FORWARD(BLK, DT)
#error "cache.cl: castle_cache_prefill_u must fit the forward's local memory (the host checks that)"
#endif

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_cache_prefill_u(const int d, const int H, const int W, const int cap, const float sc,
                            __global const int *lens,
                            __global const float *qu, const ulong4 squ,
                            __global const float *ku, const ulong4 sku, /* read through its copy in ws */
                            __global const float *vu, const ulong4 svu,
                            __global float *cu, __global float *ws, const ulong2 ws_t, const int Lpad,
                            const int jfrom, const int jupto, BH0_PARAM)
{
    __local float lm[PU_LM] LM_ALIGNED;
    __local float *tQU = lm, *tKU = lm + KS * DT;  /* phase 1: k-major, row stride KS */
    __local float *sGt = lm, *tV = lm + BLK * BLK; /* then: G^T [j * BLK + s], VU row-major (DT) */
    __local float *sG = sGt; /* G row-major [s * BLK + j] instead, under MT_AM_ROWS (common.cl) */
    const int lid = get_local_id(0);
    const int sb = get_group_id(0), bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    const int P = lens[b];
    const int s0 = sb * BLK;
    if (s0 >= P) /* uniform over the work-group */
        return;
    const int smax = min(s0 + BLK, P) - 1;
    const int jlast = smax + (W == 0 ? P - 1 - smax : min(W, P - 1 - smax)); /* no int overflow */
    __global const float *pqu = qu + tensor_offset(squ, b, h, 0);
    __global const float *pvu = vu + tensor_offset(svu, b, h, 0);
    __global float *U = cu + (ulong)bh * cap * d;
    const vfloat lane = lane_index();

    for (int jb = max(sb, jfrom); jb * BLK <= jlast && jb < jupto; ++jb) {
        const int j0 = jb * BLK;
        vfloat gl[FUPT][MT_ACC];
        #pragma unroll
        for (int m = 0; m < FUPT; ++m)
            mt_zero(gl[m]);
        for (int c0 = 0; c0 < d; c0 += DT) {
            stage_cols_a(tQU, KS, DT, tcopy(ws, ws_t, CASTLE_T_QU, bh, Lpad, d), pqu, squ.z, sb, P, c0, DT, d);
            stage_tile_t(tKU, KS, tcopy(ws, ws_t, CASTLE_T_KU, bh, Lpad, d), jb, c0, DT, d);
            barrier(CLK_LOCAL_MEM_FENCE);
            #pragma unroll
            for (int m = 0; m < FUPT; ++m) {
                const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
                mt_product(gl[m], MT_A_KS(tQU, row0, DT, 0, KS), tKU + col0, KS, DT);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        #pragma unroll
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            #pragma unroll
            for (int e = 0; e < MT_ACC; ++e) {
                const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
                const vfloat g = castle_gate_v(gl[m][e], sc, s0 + rr, (float)(j0 + cv) + lane, P, W);
                if (MT_AM_ROWS)
                    VSTORE(g, sG + rr * BLK + cv);
                gl[m][e] = g; /* the logits are spent: the tile of G, for its k-major copy */
            }
            if (!MT_AM_ROWS)
                store_tile_t(sGt, row0, col0, gl[m]);
        }
        /* Row s0 + r takes the keys j0 + kk with s0 + r < j0 + kk <= s0 + r + W: r + lo <= kk < r + hi
           (hi bounded by BLK: no int overflow for any W). */
        const int lo = s0 - j0 + 1;
        const int hi = W == 0 ? BLK : (int)min((long)W + 1 + s0 - j0, (long)BLK);
        for (int c0 = 0; c0 < d; c0 += DT) {
            stage_tile(tV, pvu, svu.z, j0, P, c0, DT, d, false);
            barrier(CLK_LOCAL_MEM_FENCE);
            #pragma unroll
            for (int m = 0; m < FUPC; ++m) {
                const int u = lid + m * NT, row0 = MT_ROW0(u, DT), col0 = MT_COL0(u, DT);
                vfloat acc[MT_ACC];
                mt_zero(acc);
                mt_product_band(acc, MT_AM(sG, sGt, row0), tV + col0, DT, row0, lo, hi);
                #pragma unroll
                for (int e = 0; e < MT_ACC; ++e) {
                    const int rr = MT_EROW(row0, e), gc = MT_ECOL(c0 + col0, e);
                    if (s0 + rr < P && gc < d) {
                        __global float *pu = U + (ulong)(s0 + rr) * d + gc;
                        const int n = min(VW, d - gc);
                        gstore_part(jb == sb ? acc[e] : gload_part(pu, n) + acc[e], pu, n);
                    }
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
}

/* Decode: a work-group of DNT work-items is TEAMS teams of DLN lanes; a team handles one cache row
   at a time.  Under the tuning's decode mapping 1 (SIMD CPUs, DEC) a work-item is an iteration of a
   loop: each takes whole rows, float4 at a time.  Under mapping 2 (GPUs) work-groups of 128 to 256
   work-items (NT, raised to 128: an H200 decoded B=2 H=16 d=64 t=32768 in 1.72 ms with 64 work-items,
   one lane to a row, against 0.81 ms with 128) give a row 4 lanes (8 for heads wider than 64),
   adjacent lanes on adjacent float4s, and a team takes DRP = 2 rows per pass, loaded before the
   pass's first barrier (DPRE, below).  On the H200 at that shape, with those loads and the cache
   rows read as float4 (gload4), one run, 2026-11-27, ms: 4 lanes x 2 rows 0.433, 4 x 1 0.429, 8 x 2
   0.651, 8 x 4 0.673, 8 x 1 0.561, 16 x 2 0.667, 2 x 2 0.663, 4 x 4 0.900, 4 x 2 with 256
   work-items 0.480 (CASTLE-SWL, W = 512: 4 x 2 0.294, 4 x 1 0.318, 8 x 2 0.369).  Before the float4
   reads (an earlier run): 8 x 2 0.590, 4 x 2 0.663.  The host reads DNT back from the compiled
   kernel.  DNT, DLN, DRP and DPRE may be predefined to try other shapes (docs/performance.md,
   "Decode shapes").
   Local memory stays below 24 KiB. */
#if DEC == 1
#define DNT (NT > 64 ? 64 : NT)
#define DLN 1
#else
#ifndef DNT
#define DNT (NT > 256 ? 256 : NT < 128 ? 128 : NT)
#endif
#ifndef DLN
#define DLN (DACC <= 64 ? 4 : 8) /* 8 lanes for wider heads: a lane's quads as at 64 with 4 (not timed) */
#endif
#endif
#define TEAMS (DNT / DLN)
/* Rows a team takes per pass between two barriers: 2 where lanes share a row (GPUs), for twice the
   loads in flight; 1 on SIMD CPUs, where a work-item's rows are a loop anyway. */
#if DEC == 1
#define DRP 1
#elif !defined(DRP)
#define DRP 2
#endif

/* ---- decode ---------------------------------------------------------------------------------- */

/* The DLN partials of a team (p: the team's first), summed in lane order: one float4 load where a
   team has 4 lanes (the arrays are 16-byte aligned, and r DNT + team DLN is a multiple of 4), the same sum. */
inline float team_sum(__local const float *p)
{
#if DLN == 4
    const float4 v = *(__local const float4 *)p;
    return ((0.0f + v.x) + v.y + v.z) + v.w;
#else
    float s = 0.0f;
    for (int i = 0; i < DLN; ++i)
        s += p[i];
    return s;
#endif
}

/* A lane's columns: quads q = lane + DLN i (float4; adjacent lanes on adjacent quads) below d / 4,
   then the d % 4 tail columns 4 (d / 4) + lane + DLN i.  Loops run to the compile-time bounds ACCQ,
   ACCT (and break), so that a GPU keeps a lane's accumulators in registers; under accum = 2 those
   bounds are the head-dimension class's, not the widest head's (common.cl, ACC). */
#define ACCQ ((DACC / 4 + DLN - 1) / DLN) /* quads per lane (DACC: common.cl) */
#define ACCT ((3 + DLN - 1) / DLN)        /* tail columns per lane */
#define MB 64                             /* columns per block of the team merge */
/* DPRE: a pass loads its rows of U, KC and VC (the quads of each lane) into registers before its
   first barrier, with the qU rows of the gates, so that the pass waits on memory once rather than
   once per phase (gates; scores and the update of U; the softmax over VC).  GPUs only (decode
   mapping 2), and only while DRP ACCQ quads of each of the three fit DEC_PRE_QUADS (common.cl). */
#ifndef DPRE
#define DPRE (DEC == 2 && DRP * ACCQ <= DEC_PRE_QUADS)
#endif
#if DPRE
#define DQUAD(arr, r, i, q, row, al) arr[r][i]
#else
#define DQUAD(arr, r, i, q, row, al) gload4(q, row, al)
#endif

/* Work-group (g, bh) owns rows [g S, g S + S) of sequence bh, cached or appended by the call, and
   takes the call's tokens i = 0 .. n-1 (position t = lens[b] + pos0 + i) one after the other: rows
   s in [g S, min(g S + S, t + 1)), TEAMS rows per pass (team j: row pass start + j), merged at the
   end through local memory.  Token t's updates of U (and the rows it appends) are in place before
   token t + 1 reads them, so the tokens of one call behave as the same tokens decoded one per call.
   part: (BH x n x ngroups x (d + 2)) floats, the group's acc[0..d) then m, l for each token; with
   one group per sequence (ngroups = 1) the work-group writes o and lse itself. */
__kernel __attribute__((reqd_work_group_size(DNT, 1, 1)))
void castle_cache_decode_attend(const int pos0, const int n, const int S, const int d, const int H, const int W,
                                const int R, const int cap, const float sc, __global const int *lens,
                                __global const float *qu, const ulong4 squ,
                                __global const float *ku, const ulong4 sku,
                                __global const float *vu, const ulong4 svu,
                                __global const float *qc, const ulong4 sqc,
                                __global const float *kc, const ulong4 skc,
                                __global const float *vc, const ulong4 svc,
                                __global float *cu, __global const float *cqu, __global float *ckc,
                                __global float *cvc, __global float *part,
                                __global float *o, const ulong4 so, __global float *lse, const ulong4 slse,
                                const int want_lse, BH0_PARAM)
{
    __local float lq[MAXD] LM_ALIGNED, lk[MAXD] LM_ALIGNED, lv[MAXD] LM_ALIGNED; /* qC_t, kU_t, vU_t */
    /* per-lane partial dot products */
    __local float rg[DRP * DNT] LM_ALIGNED, rx[DRP * DNT] LM_ALIGNED, rk[DRP * DNT] LM_ALIGNED;
    __local float tm[TEAMS] LM_ALIGNED, tl[TEAMS] LM_ALIGNED, tacc[TEAMS * MB] LM_ALIGNED;
    const int lid = get_local_id(0), lane = lid % DLN, team = lid / DLN;
    const int chunk = get_group_id(0), bh = BH_INDEX, ngroups = get_num_groups(0);
    const uint b = bh / H, h = bh % H;
    const int P = lens[b] + pos0; /* the sequence's length before the call */
    const int s0 = chunk * S;
    const int nq = d >> 2;
    __global float *U = cu + (ulong)bh * cap * d;
    __global float *KC = ckc + (ulong)bh * cap * d;
    __global float *VC = cvc + (ulong)bh * cap * d;
    __global const float *QU = cqu + (ulong)bh * R * d;
    __global const float *in_qu = qu + tensor_offset(squ, b, h, 0); /* qU of rows >= P (not in the ring yet) */
    const bool al = (d & 3) == 0 && GALIGNED(cu) && GALIGNED(ckc) && GALIGNED(cvc); /* the rows of U, KC, VC */
    const bool al_ring = (d & 3) == 0 && GALIGNED(cqu), al_qu = GALIGNED(in_qu) && (squ.z & 3) == 0; /* of qU */
    for (int e = lid; e < TEAMS * MB; e += DNT) /* the merge reads whole quads, past d too (below) */
        tacc[e] = 0.0f;
    /* the tokens t >= s0 (the earlier ones see none of this group's rows); uniform bounds */
    for (int row = max(0, s0 - P); row < n; ++row) {
        const int t = P + row;
        const int s1 = min(s0 + S, t + 1); /* no overflow: the host keeps ngroups S <= INT_MAX */
        __global const float *in_kc = kc + tensor_offset(skc, b, h, row);
        __global const float *in_vc = vc + tensor_offset(svc, b, h, row);
        const bool al_in = GALIGNED(in_vc);
        {
            __global const float *in_qc = qc + tensor_offset(sqc, b, h, row);
            __global const float *in_ku = ku + tensor_offset(sku, b, h, row);
            __global const float *in_vu = vu + tensor_offset(svu, b, h, row);
            for (int c = lid; c < d; c += DNT) {
                lq[c] = in_qc[c];
                lk[c] = in_ku[c];
                lv[c] = in_vu[c];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const int wlo = W > 0 ? max(0, t - W) : 0; /* rows [wlo, t) take the rank-1 update */

        float m = -INFINITY, l = 0.0f;
#if DPRE
        float4 du[DRP][ACCQ], dk[DRP][ACCQ], dv[DRP][ACCQ]; /* the pass's rows: U, KC, VC */
#endif
        float4 acc4[ACCQ];
        float acct[ACCT];
        for (int i = 0; i < ACCQ; ++i)
            acc4[i] = (float4)(0.0f);
        for (int i = 0; i < ACCT; ++i)
            acct[i] = 0.0f;
        for (int sb = s0; sb < s1; sb += TEAMS * DRP) {
            /* Team j takes rows sb + j + TEAMS r, r < DRP: the same rows, in the same order, as DRP
               passes of one row would give it, with DRP rows' loads in flight between barriers. */
            /* G[s,t] = sigmoid(sc qU_s . kU_t).  (The barriers are unconditional: some compilers
               mishandle barriers under a condition inside a loop, even a uniform one.) */
            ACC_UNROLL for (int r = 0; r < DRP; ++r) {
                const int s = sb + team + TEAMS * r;
                const bool upd = s < s1 && s >= wlo && s < t;
#if DPRE
                if (s < s1) {
                    __global const float *vrow = s == t ? in_vc : VC + (ulong)s * d;
                    ACC_UNROLL for (int i = 0; i < ACCQ; ++i) {
                        const int q = lane + DLN * i;
                        if (q < nq) {
                            dv[r][i] = gload4(q, vrow, s == t ? al_in : al);
                            if (s < t) {
                                du[r][i] = gload4(q, U + (ulong)s * d, al);
                                dk[r][i] = gload4(q, KC + (ulong)s * d, al);
                            }
                        }
                    }
                }
#endif
                __global const float *qrow = s < P ? QU + (ulong)(s % R) * d : in_qu + (ulong)(s - P) * squ.z;
                rg[r * DNT + lid] = upd ? lane_dot(qrow, s < P ? al_ring : al_qu, lk, lane, DLN, d) : 0.0f;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            ACC_UNROLL for (int r = 0; r < DRP; ++r) {
                const int s = sb + team + TEAMS * r;
                const bool valid = s < s1;
                const bool upd = valid && s >= wlo && s < t;
                const float g = team_sum(rg + r * DNT + team * DLN);
                const float gate = upd ? castle_sigmoid(sc * g) : 0.0f;
                float px = 0.0f, pk = 0.0f; /* qC_t . u_s and qC_t . kC_s, this lane's columns */
                if (valid && s == t) {      /* the new token: u_t = 0, append kC_t and vC_t */
                    __global float *urow = U + (ulong)s * d, *krow = KC + (ulong)s * d, *vrow = VC + (ulong)s * d;
                    for (int c = lane; c < d; c += DLN) {
                        urow[c] = 0.0f;
                        krow[c] = in_kc[c];
                        vrow[c] = in_vc[c];
                    }
                    pk = lane_dot(in_kc, GALIGNED(in_kc), lq, lane, DLN, d);
                } else if (valid) {
                    __global float *urow = U + (ulong)s * d;
                    __global const float *krow = KC + (ulong)s * d;
                    float4 x4 = (float4)(0.0f), k4 = (float4)(0.0f);
                    ACC_UNROLL for (int i = 0; i < ACCQ; ++i) {
                        const int q = lane + DLN * i;
                        if (q >= nq)
                            ACC_SKIP;
                        float4 u = DQUAD(du, r, i, q, urow, al);
                        const float4 qq = vload4(q, lq);
                        if (upd) {
                            u += gate * vload4(q, lv);
                            gstore4(u, q, urow, al);
                        }
                        x4 += qq * u;
                        k4 += qq * DQUAD(dk, r, i, q, krow, al);
                    }
                    px = (x4.x + x4.y) + (x4.z + x4.w);
                    pk = (k4.x + k4.y) + (k4.z + k4.w);
                    for (int i = 0; i < ACCT; ++i) {
                        const int c = 4 * nq + lane + DLN * i;
                        if (c >= d)
                            break;
                        float u = urow[c];
                        if (upd) {
                            u += gate * lv[c];
                            urow[c] = u;
                        }
                        px += lq[c] * u;
                        pk += lq[c] * krow[c];
                    }
                }
                rx[r * DNT + lid] = px;
                rk[r * DNT + lid] = pk;
            }
            /* Two barriers per pass: each separates one buffer's writes from its reads, and the other
               barrier separates those reads from the next pass's writes. */
            barrier(CLK_LOCAL_MEM_FENCE);
            ACC_UNROLL for (int r = 0; r < DRP; ++r) {
                const int s = sb + team + TEAMS * r;
                if (s >= s1)
                    ACC_SKIP;
                /* the team's online softmax, its rows in increasing order */
                const float x = team_sum(rx + r * DNT + team * DLN), k = team_sum(rk + r * DNT + team * DLN);
                const float a = sc * k - castle_silu(sc * x);
                const float mn = fmax(m, a);
                const float alpha = exp(m - mn); /* 0 while m = -inf */
                const float p = exp(a - mn);
                l = l * alpha + p;
                __global const float *vrow = (s == t) ? in_vc : VC + (ulong)s * d;
                ACC_UNROLL for (int i = 0; i < ACCQ; ++i) {
                    const int q = lane + DLN * i;
                    if (q >= nq)
                        ACC_SKIP;
                    acc4[i] = acc4[i] * alpha + p * DQUAD(dv, r, i, q, vrow, s == t ? al_in : al);
                }
                for (int i = 0; i < ACCT; ++i) {
                    const int c = 4 * nq + lane + DLN * i;
                    if (c >= d)
                        break;
                    acct[i] = acct[i] * alpha + p * vrow[c];
                }
                m = mn;
            }
        }

        /* Merge the teams, MB columns at a time: acc = sum_j acc_j exp(m_j - max m). */
        if (lane == 0) {
            tm[team] = m;
            tl[team] = l;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float mx = -INFINITY;
        for (int i = 0; i < TEAMS; ++i)
            mx = fmax(mx, tm[i]);
        const float scale = exp(m - mx); /* 0 for a team that saw no row */
        float sum = 0.0f;
        for (int i = 0; i < TEAMS; ++i)
            sum += tl[i] * exp(tm[i] - mx);
        const bool direct = ngroups == 1;
        __global float *pp = direct ? o + tensor_offset(so, b, h, row)
                                    : part + (((ulong)bh * n + row) * ngroups + chunk) * (d + 2);
        for (int cb = 0; cb < d; cb += MB) {
            for (int i = 0; i < ACCQ; ++i) {
                const int q = lane + DLN * i, c = 4 * q;
                if (q >= nq)
                    break;
                if (c >= cb && c < cb + MB) /* MB is a multiple of 4: quads never straddle blocks */
                    vstore4(acc4[i] * scale, 0, tacc + team * MB + (c - cb));
            }
            for (int i = 0; i < ACCT; ++i) {
                const int c = 4 * nq + lane + DLN * i;
                if (c >= d)
                    break;
                if (c >= cb && c < cb + MB)
                    tacc[team * MB + (c - cb)] = acct[i] * scale;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            /* four columns per work-item, each summed over the teams in order (float4 loads: tacc is
               16-byte aligned, MB and c - cb multiples of 4; columns at or past d hold zeros or an
               earlier block's values, and are not stored) */
            for (int c = cb + 4 * lid; c < min(cb + MB, d); c += 4 * DNT) {
                float4 a = (float4)(0.0f);
                for (int i = 0; i < TEAMS; ++i)
                    a += *(__local const float4 *)(tacc + i * MB + (c - cb));
                if (direct)
                    a /= sum;
                if (c + 4 <= d) {
                    vstore4(a, 0, pp + c);
                } else {
                    float a1[4];
                    vstore4(a, 0, a1);
                    for (int e = 0; c + e < d; ++e)
                        pp[c + e] = a1[e];
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (lid == 0 && direct && want_lse)
            lse[tensor_offset(slse, b, h, row)] = mx + log(sum);
        if (lid == 0 && !direct) {
            pp[d] = mx;
            pp[d + 1] = sum;
        }
        /* global too: the next token reads the rows of U, KC, VC this one wrote (other work-items' columns) */
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    }
}

/* Work-group (i, bh), token t = lens[b] + pos0 + i: o_t (and lse_t when want_lse) from the partials
   of the groups that saw it (g <= t / S; none when ngroups = 1: the attend kernel wrote o and lse),
   then qU_t into ring row t % R when t is among the call's last R tokens (after every reader of the
   row it replaces, token t - R, has run). */
__kernel __attribute__((reqd_work_group_size(DNT, 1, 1)))
void castle_cache_decode_combine(const int pos0, const int n, const int S, const int ngroups, const int d,
                                 const int H, const int R, __global const int *lens,
                                 __global const float *qu, const ulong4 squ, __global float *cqu,
                                 __global const float *part,
                                 __global float *o, const ulong4 so,
                                 __global float *lse, const ulong4 slse, const int want_lse, BH0_PARAM)
{
    const int lid = get_local_id(0), row = get_group_id(0), bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    const int t = lens[b] + pos0 + row;
    if (ngroups > 1) {
        const int nch = t / S + 1;
        __global const float *pp = part + ((ulong)bh * n + row) * ngroups * (d + 2);
        float mx = -INFINITY;
        for (int g = 0; g < nch; ++g)
            mx = fmax(mx, pp[g * (d + 2) + d]);
        float sum = 0.0f;
        for (int g = 0; g < nch; ++g)
            sum += pp[g * (d + 2) + d + 1] * exp(pp[g * (d + 2) + d] - mx);
        __global float *po = o + tensor_offset(so, b, h, row);
        for (int c = lid; c < d; c += DNT) {
            float a = 0.0f;
            for (int g = 0; g < nch; ++g)
                a += pp[g * (d + 2) + c] * exp(pp[g * (d + 2) + d] - mx);
            po[c] = a / sum;
        }
        if (want_lse && lid == 0)
            lse[tensor_offset(slse, b, h, row)] = mx + log(sum);
    }
    if (row + R >= n) {
        __global const float *in_qu = qu + tensor_offset(squ, b, h, row);
        __global float *qrow = cqu + ((ulong)bh * R + t % R) * d;
        for (int c = lid; c < d; c += DNT)
            qrow[c] = in_qu[c];
    }
}
