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
 * accumulated with pair_add), X (BH x N x BLK x BLK, the scaled masked X[T_i,T_i] written at k = 0),
 * ML (BH x Lpad x 2: running max m and sum l per row).
 * Row block i is finished at k = i by work-group j = 0, which writes O = acc / l and lse = m + log l. */

#if (NT % BLK) != 0 || ((BLK * BLK) % NT) != 0 || ((BLK * DT) % NT) != 0 || NT < BLK
#error "forward.cl: NT must be a multiple of BLK that divides BLK*BLK and BLK*DT"
#endif

/* Mapping.  Every BLK x BLK matrix of a block pair is split into units of one row x VW consecutive
   columns, and every BLK x DT slab of outputs into units of one row x VW columns of d; work-item lid
   owns units lid + m NT.  Each unit is a vector along the dimension that stays contiguous in local
   memory, so products are broadcast-scalar x vector FMAs: SIMD on CPUs without reassociating a sum,
   plain scalar code on GPUs (VW = 1).  Operands read as vectors are staged "transposed" (contraction
   index first, stride BLK); operands read as scalars row-major (stride TS). */
#define FU (BLK * BLK / VW)   /* units of a BLK x BLK matrix */
#define FUC (BLK * DT / VW)   /* units of a BLK x DT slab */
#define FQ (BLK / VW)         /* units per row of a BLK x BLK matrix */
#define FQC (DT / VW)         /* units per row of a BLK x DT slab */
#if (FU % NT) != 0 || (FUC % NT) != 0
#error "forward.cl: NT x VW must divide BLK*BLK and BLK*DT"
#endif
#define FUPT (FU / NT)        /* matrix units per work-item */
#define FUPC (FUC / NT)       /* slab units per work-item */

#define LM_P1 (2 * BLK * TS + 4 * DT * BLK)
#define LM_P2 (4 * BLK * BLK + 2 * BLK + 2 * BLK * DT)
#define LM_SIZE (LM_P1 > LM_P2 ? LM_P1 : LM_P2)

/* The kernels' shared parameters (after the launch index k) and the matching argument list. */
#define FORWARD_BLOCK_PARAMS \
    const int L, const int d, const int H, const int W, const float sc, __global const float *qu, \
    const ulong4 squ, __global const float *ku, const ulong4 sku, __global const float *vu, \
    const ulong4 svu, __global const float *qc, const ulong4 sqc, __global const float *kc, \
    const ulong4 skc, __global const float *vc, const ulong4 svc, __global float *o, const ulong4 so, \
    __global float *lse, const ulong4 slse, __global float *ws, const ulong ws_dlo, const ulong ws_x, \
    const ulong ws_ml
#define FORWARD_BLOCK_ARGS \
    L, d, H, W, sc, qu, squ, ku, sku, vu, svu, qc, sqc, kc, skc, vc, svc, o, so, lse, slse, ws, ws_dlo, \
    ws_x, ws_ml

/* Lane e of the result holds e (lane indices for masks). */
inline vfloat lane_index(void)
{
#if VW == 1
    return 0.0f;
#elif VW == 4
    return (float4)(0, 1, 2, 3);
#elif VW == 8
    return (float8)(0, 1, 2, 3, 4, 5, 6, 7);
#else
    return (float16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#endif
}

/* sum_c x[c] t[c * BLK .. + VW), c < DT: scalars of a row-major tile row against a transposed tile. */
__attribute__((always_inline)) inline vfloat row_x_tile(__local const float *x, __local const float *t)
{
    vfloat y0 = (vfloat)(0.0f), y1 = (vfloat)(0.0f);
    for (int c = 0; c < DT; c += 2) {
        y0 += x[c] * VLOAD(t + c * BLK);
        y1 += x[c + 1] * VLOAD(t + (c + 1) * BLK);
    }
    return y0 + y1;
}

/* sum_q w[q] t[q * ts .. + VW), q < BLK: a row of weights against the rows of a tile (row stride ts). */
__attribute__((always_inline)) inline vfloat weights_x_rows(__local const float *w, __local const float *t, int ts)
{
    vfloat y0 = (vfloat)(0.0f), y1 = (vfloat)(0.0f);
    for (int q = 0; q < BLK; q += 2) {
        y0 += w[q] * VLOAD(t + q * ts);
        y1 += w[q + 1] * VLOAD(t + (q + 1) * ts);
    }
    return y0 + y1;
}

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
    const bool need_d = k > 0; /* D_j^(0) = 0 */
    const bool need_x = gate && k == 0;
    const vfloat lane = lane_index();

    __global const float *pqu = qu + tensor_offset(squ, b, h, 0);
    __global const float *pku = ku + tensor_offset(sku, b, h, 0);
    __global const float *pvu = vu + tensor_offset(svu, b, h, 0);
    __global const float *pqc = qc + tensor_offset(sqc, b, h, 0);
    __global const float *pkc = kc + tensor_offset(skc, b, h, 0);
    __global const float *pvc = vc + tensor_offset(svc, b, h, 0);
    __global float *D = ws + (ulong)bh * Lpad * d;
    __global float *Dlo = ws + ws_dlo + (ulong)bh * Lpad * d;
    __global float *X = ws + ws_x + ((ulong)bh * N + i) * (BLK * BLK);
    __global float *ML = ws + ws_ml + (ulong)bh * Lpad * 2;

    /* Phase 1: the BLK x BLK x d products, d staged through local memory in chunks of DT. */
    vfloat s1[FUPT], s2[FUPT], gl[FUPT], xv[FUPT];
    for (int m = 0; m < FUPT; ++m)
        s1[m] = s2[m] = gl[m] = xv[m] = (vfloat)(0.0f);
    __local float *tQC = lm, *tQU = lm + BLK * TS; /* row-major BLK x TS */
    __local float *tKC = lm + 2 * BLK * TS, *tD = tKC + DT * BLK, *tKU = tD + DT * BLK, *tVU = tKU + DT * BLK;
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile(tQC, pqc, sqc.z, t0, L, c0, d);
        load_tile_tb(tKC, pkc, skc.z, s0, L, c0, d);
        if (need_d)
            load_tile_tb(tD, D, (ulong)d, s0, L, c0, d);
        if (gate) {
            load_tile(tQU, pqu, squ.z, s0, L, c0, d);
            load_tile_tb(tKU, pku, sku.z, t0, L, c0, d);
        }
        if (need_x)
            load_tile_tb(tVU, pvu, svu.z, t0, L, c0, d);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row = u / FQ, cv = (u % FQ) * VW;
            s1[m] += row_x_tile(tQC + row * TS, tKC + cv);
            if (need_d)
                s2[m] += row_x_tile(tQC + row * TS, tD + cv);
            if (need_x) /* rows: t in T_i, columns: j' in T_i */
                xv[m] += row_x_tile(tQC + row * TS, tVU + cv);
            if (gate) /* rows: s in T_j, columns: j' in T_i */
                gl[m] += row_x_tile(tQU + row * TS, tKU + cv);
        }
        /* global fence too: phase 5 overwrites D_j rows that other work-items read here */
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    }

    /* Phase 2: the gate block G[T_j, T_i] (row-major and transposed) and the masked X[T_i, T_i]. */
    __local float *sG = lm, *sGt = lm + BLK * BLK, *sX = lm + 2 * BLK * BLK, *sA = lm + 3 * BLK * BLK;
    __local float *sAlpha = lm + 4 * BLK * BLK, *sL = sAlpha + BLK;
    __local float *tV = sL + BLK, *tW = tV + BLK * DT; /* row-major BLK x DT */
    if (gate) {
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, rr = u / FQ, cv = (u % FQ) * VW;
            const int s = s0 + rr;
            const vfloat jp = (float)(t0 + cv) + lane; /* j' of each lane */
            const vfloat sf = (float)s;
            /* allowed: s < L, j' < L, s < j', and j' <= s + W for CASTLE-SWL */
            vfloat g = castle_sigmoid_v(sc * gl[m]);
            g = select((vfloat)(0.0f), g,
                       VISLESS(jp, (vfloat)(float)L) & VISLESS(sf, jp) &
                           (W == 0 ? VTRUE : VISLESSEQ(jp, sf + (float)W)));
            if (s >= L)
                g = (vfloat)(0.0f);
            VSTORE(g, sG + rr * BLK + cv);
            float gs[VW];
            VLANES(g, gs);
            for (int e = 0; e < VW; ++e)
                sGt[(cv + e) * BLK + rr] = gs[e];
            vfloat x;
            if (k == 0) { /* rows t = rr, columns j': masked j' <= t, j' < L */
                x = select((vfloat)(0.0f), sc * xv[m],
                           VISLESSEQ(lane + (float)cv, (vfloat)(float)rr) & VISLESS(jp, (vfloat)(float)L));
                VSTORE(x, X + rr * BLK + cv);
            } else {
                x = VLOAD(X + rr * BLK + cv);
            }
            VSTORE(x, sX + rr * BLK + cv);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase 3: SU and the scores A[T_i, T_j] (rows t, vectors of s). */
    for (int m = 0; m < FUPT; ++m) {
        const int u = lid + m * NT, rr = u / FQ, cv = (u % FQ) * VW;
        const int t = t0 + rr;
        vfloat su = sc * s2[m];
        if (gate)
            su += weights_x_rows(sX + rr * BLK, sGt + cv, BLK);
        vfloat a = sc * s1[m] - castle_silu_v(su);
        const vfloat sv = (float)(s0 + cv) + lane;
        a = select(a, (vfloat)(-INFINITY), VISGREATEREQ(sv, (vfloat)(float)L) |
                                               (k == 0 ? VISGREATER(sv, (vfloat)(float)t) : VFALSE));
        VSTORE(a, sA + rr * BLK + cv);
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase 4: online softmax per row; A becomes P = exp(A - m_new). */
    if (lid < BLK) {
        const int t = t0 + lid;
        __local float *row = sA + lid * BLK;
        if (t < L) {
            float m_old = -INFINITY, l_old = 0.0f;
            if (k > 0) {
                m_old = ML[2 * t];
                l_old = ML[2 * t + 1];
            }
            vfloat vm = (vfloat)(-INFINITY);
            for (int s = 0; s < BLK; s += VW)
                vm = fmax(vm, VLOAD(row + s));
            const float mx = fmax(m_old, vmax(vm));
            /* mx is finite: the diagonal key of row t was seen at k = 0. */
            const float alpha = (k > 0) ? exp(m_old - mx) : 0.0f;
            vfloat vs = (vfloat)(0.0f);
            for (int s = 0; s < BLK; s += VW) {
                const vfloat p = exp(VLOAD(row + s) - mx);
                VSTORE(p, row + s);
                vs += p;
            }
            const float l_new = l_old * alpha + vsum(vs);
            sAlpha[lid] = alpha;
            sL[lid] = l_new;
            ML[2 * t] = mx;
            ML[2 * t + 1] = l_new;
            if (j == 0)
                lse[tensor_offset(slse, b, h, t)] = mx + log(l_new);
        } else {
            for (int s = 0; s < BLK; ++s)
                row[s] = 0.0f;
            sAlpha[lid] = 0.0f;
            sL[lid] = 1.0f;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase 5: acc[T_i] = alpha acc[T_i] + P VC[T_j] (the accumulator lives in O; normalised by
       work-group j = 0, the last to touch row block i), and D_j += VU[T_i]^T G[T_j,T_i]^T. */
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile_rb(tV, pvc, svc.z, s0, L, c0, d);
        if (gate)
            load_tile_rb(tW, pvu, svu.z, t0, L, c0, d);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int m = 0; m < FUPC; ++m) {
            const int u = lid + m * NT, rr = u / FQC, cv = (u % FQC) * VW, gc = c0 + cv;
            const int t = t0 + rr;
            if (t < L && gc < d) {
                const vfloat acc = weights_x_rows(sA + rr * BLK, tV + cv, DT);
                __global float *po = o + tensor_offset(so, b, h, t) + gc;
                const int n = min(VW, d - gc);
                vfloat v = (k > 0) ? gload_part(po, n) * sAlpha[rr] + acc : acc;
                if (j == 0)
                    v /= sL[rr];
                gstore_part(v, po, n);
            }
            if (gate && gc < d) { /* here rr indexes s in T_j */
                const vfloat dv = weights_x_rows(sG + rr * BLK, tW + cv, DT);
                const ulong off = (ulong)(s0 + rr) * d + gc;
                const int n = min(VW, d - gc);
                vfloat hi = dv, lo = (vfloat)(0.0f);
                if (k > 0) {
                    hi = gload_part(D + off, n);
                    lo = gload_part(Dlo + off, n);
                    pair_add_v(&hi, &lo, dv);
                }
                gstore_part(hi, D + off, n);
                gstore_part(lo, Dlo + off, n);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

/* One launch per anti-diagonal k: work-group (j, bh). */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_forward_block(const int k, FORWARD_BLOCK_PARAMS)
{
    __local float lm[LM_SIZE];
    forward_block(lm, k, get_group_id(0), get_group_id(1), FORWARD_BLOCK_ARGS);
}

/* All anti-diagonals in one launch, for short sequences: work-group (0, bh) walks the block pairs
   of its batch entry and head in wavefront order, a barrier between pairs making each pair's
   global writes visible to the next (the dependencies never cross batch entries or heads).  The
   first argument is unused (the per-diagonal kernel's k). */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_forward_fold(const int unused, FORWARD_BLOCK_PARAMS)
{
    __local float lm[LM_SIZE];
    const int N = (L + BLK - 1) / BLK;
    (void)unused;
    for (int k = 0; k < N; ++k)
        for (int j = 0; j + k < N; ++j) {
            forward_block(lm, k, j, get_group_id(1), FORWARD_BLOCK_ARGS);
            barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        }
}
