/* forward.cl: the blockwise CASTLE forward pass (SPEC section 3).
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

#define LM_P1 (6 * BLK * TS)
#define LM_P2 (3 * BLK * BP + 2 * BLK + 2 * DT * BP)
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

    const int col = lid % BLK, row0 = lid / BLK;

    /* Phase 1: the BLK x BLK x d products, d staged through local memory in chunks of DT; within a
       chunk each entry accumulates in VW lanes, summed into a scalar at the chunk's end (so no vector
       state lives across the barriers: CPU compilers keep such state in memory per work-item). */
    float s1[EPT], s2[EPT], gl[EPT], xv[EPT];
    for (int r = 0; r < EPT; ++r)
        s1[r] = s2[r] = gl[r] = xv[r] = 0.0f;
    __local float *tQC = lm, *tKC = lm + BLK * TS, *tD = lm + 2 * BLK * TS;
    __local float *tQU = lm + 3 * BLK * TS, *tKU = lm + 4 * BLK * TS, *tVU = lm + 5 * BLK * TS;
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile(tQC, pqc, sqc.z, t0, L, c0, d);
        load_tile(tKC, pkc, skc.z, s0, L, c0, d);
        if (need_d)
            load_tile(tD, D, (ulong)d, s0, L, c0, d);
        if (gate) {
            load_tile(tQU, pqu, squ.z, s0, L, c0, d);
            load_tile(tKU, pku, sku.z, t0, L, c0, d);
        }
        if (need_x)
            load_tile(tVU, pvu, svu.z, t0, L, c0, d);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            s1[r] += ldot(tQC + rr * TS, tKC + col * TS, DT);
            if (need_d)
                s2[r] += ldot(tQC + rr * TS, tD + col * TS, DT);
            if (need_x) /* rows: t in T_i, columns: j' in T_i */
                xv[r] += ldot(tQC + rr * TS, tVU + col * TS, DT);
            if (gate) /* rows: s in T_j, columns: j' in T_i */
                gl[r] += ldot(tQU + rr * TS, tKU + col * TS, DT);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* Phase 2: the gate block G[T_j, T_i] and the masked X[T_i, T_i] into local memory. */
    __local float *sG = lm, *sX = lm + BLK * BP, *sA = lm + 2 * BLK * BP;
    __local float *sAlpha = lm + 3 * BLK * BP, *sL = sAlpha + BLK;
    __local float *tV = sL + BLK, *tW = tV + DT * BP; /* transposed (DT x BP): contiguous in s, j' */
    if (gate) {
        for (int r = 0; r < EPT; ++r) {
            const int rr = row0 + r * RSTEP;
            const int s = s0 + rr, jp = t0 + col;
            const bool allowed = s < L && jp < L && s < jp && (W == 0 || jp <= s + W);
            sG[rr * BP + col] = allowed ? castle_sigmoid(sc * gl[r]) : 0.0f;
            float x;
            if (k == 0) {
                x = (col <= rr && jp < L) ? sc * xv[r] : 0.0f;
                X[rr * BLK + col] = x;
            } else {
                x = X[rr * BLK + col];
            }
            sX[rr * BP + col] = x;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase 3: SU and the scores A[T_i, T_j]. */
    for (int r = 0; r < EPT; ++r) {
        const int rr = row0 + r * RSTEP;
        const int t = t0 + rr, s = s0 + col;
        float su = sc * s2[r];
        if (gate)
            su += ldot(sX + rr * BP, sG + col * BP, BLK);
        float a = sc * s1[r] - castle_silu(su);
        if (s >= L || (k == 0 && s > t))
            a = -INFINITY;
        sA[rr * BP + col] = a;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase 4: online softmax per row; A becomes P = exp(A - m_new). */
    if (lid < BLK) {
        const int t = t0 + lid;
        if (t < L) {
            float m_old = -INFINITY, l_old = 0.0f;
            if (k > 0) {
                m_old = ML[2 * t];
                l_old = ML[2 * t + 1];
            }
            __local float *row = sA + lid * BP;
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
            const float sum = vsum(vs);
            const float l_new = l_old * alpha + sum;
            sAlpha[lid] = alpha;
            sL[lid] = l_new;
            ML[2 * t] = mx;
            ML[2 * t + 1] = l_new;
            if (j == 0)
                lse[tensor_offset(slse, b, h, t)] = mx + log(l_new);
        } else {
            for (int s = 0; s < BLK; ++s)
                sA[lid * BP + s] = 0.0f;
            sAlpha[lid] = 0.0f;
            sL[lid] = 1.0f;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase 5: acc[T_i] = alpha acc[T_i] + P VC[T_j] (the accumulator lives in O; normalised by
       work-group j = 0, the last to touch row block i), and D_j += VU[T_i]^T G[T_j,T_i]^T. */
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile_t(tV, pvc, svc.z, s0, L, c0, d);
        if (gate)
            load_tile_t(tW, pvu, svu.z, t0, L, c0, d);
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = 0; e < EPC; ++e) {
            const int idx = lid + e * NT;
            const int rr = idx / DT, c = idx % DT, gc = c0 + c;
            const int t = t0 + rr;
            if (t < L && gc < d) {
                const float acc = ldot(sA + rr * BP, tV + c * BP, BLK);
                __global float *po = o + tensor_offset(so, b, h, t) + gc;
                float v = (k > 0) ? *po * sAlpha[rr] + acc : acc;
                if (j == 0)
                    v /= sL[rr];
                *po = v;
            }
            if (gate && gc < d) { /* here rr indexes s in T_j */
                const float dv = ldot(sG + rr * BP, tW + c * BP, BLK);
                const ulong off = (ulong)(s0 + rr) * d + gc;
                float hi = dv, lo = 0.0f;
                if (k > 0) {
                    hi = D[off];
                    lo = Dlo[off];
                    pair_add(&hi, &lo, dv);
                }
                D[off] = hi;
                Dlo[off] = lo;
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
