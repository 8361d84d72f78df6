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

/* Mapping: the forward's (cl/forward.cl).  Every BLK x BLK matrix is split into units of one row x
   VW consecutive columns, every BLK x DT slab of d-wide outputs into units of one row x VW columns
   of d; work-item lid owns units lid + m NT.  Products are broadcast-scalar x vector FMAs along the
   dimension that is contiguous in local memory: row_x_tile contracts over d (a row-major tile row
   against a transposed tile), weights_x_rows over a block index (a matrix row against the rows of
   a tile or matrix).  The scores are recomputed with the forward's products in the forward's
   operation order, so P = exp(A - lse) uses exactly the A the forward normalised (P <= 1).
   Masked entries never enter a product: a product's contraction range stops where its mask does
   (rows beyond L are zeros in the tiles, never data), and masked results are selected, never
   multiplied by a zero mask, so a NaN or Inf in a row reaches only the gradient rows that depend
   on it. */
#define FU (BLK * BLK / VW)   /* units of a BLK x BLK matrix */
#define FUC (BLK * DT / VW)   /* units of a BLK x DT slab */
#define FQ (BLK / VW)         /* units per row of a BLK x BLK matrix */
#define FQC (DT / VW)         /* units per row of a BLK x DT slab */
#if (FU % NT) != 0 || (FUC % NT) != 0
#error "backward.cl: NT x VW must divide BLK*BLK and BLK*DT"
#endif
#define FUPT (FU / NT)        /* matrix units per work-item */
#define FUPC (FUC / NT)       /* slab units per work-item */

/* Local memory: eight BLK x BLK matrices (row stride BLK), seven BLK x DT tiles (row-major "rb",
   t[r * DT + c], or transposed "tb", t[c * BLK + r]), Delta and lse of the rows. */
#define BW_MATS 8 /* the matrices come first (CASTLE_LM_BACKWARD counts the same parts) */
#define LM_BW CASTLE_LM_BACKWARD(BLK, DT) /* local_memory.h: the host checks the same formula */

/* sum_c x[c] t[c * BLK .. + VW), c < DT, in cl/forward.cl's order (even and odd c apart). */
__attribute__((always_inline)) inline vfloat row_x_tile(__local const float *x, __local const float *t)
{
    vfloat y0 = (vfloat)(0.0f), y1 = (vfloat)(0.0f);
    for (int c = 0; c < DT; c += 2) {
        y0 += x[c] * VLOAD(t + c * BLK);
        y1 += x[c + 1] * VLOAD(t + (c + 1) * BLK);
    }
    return y0 + y1;
}

/* x . y over DT floats in row_x_tile's order: equal to row_x_tile's lane for equal operands. */
inline float row_dot(__local const float *x, __local const float *y)
{
    float y0 = 0.0f, y1 = 0.0f;
    for (int c = 0; c < DT; c += 2) {
        y0 += x[c] * y[c];
        y1 += x[c + 1] * y[c + 1];
    }
    return y0 + y1;
}

/* sum_{q0 <= q < q1} w[q] t[q * ts .. + VW): cl/forward.cl's weights_x_rows restricted to the
   unmasked range, even and odd q summed apart as there (the skipped terms are exact zeros, so
   over finite data the result equals the full sum). */
__attribute__((always_inline)) inline vfloat weights_x_rows(__local const float *w, __local const float *t, int ts,
                                                           int q0, int q1)
{
    vfloat y0 = (vfloat)(0.0f), y1 = (vfloat)(0.0f);
    int q = q0;
    if ((q & 1) && q < q1) {
        y1 += w[q] * VLOAD(t + q * ts);
        ++q;
    }
    for (; q + 1 < q1; q += 2) {
        y0 += w[q] * VLOAD(t + q * ts);
        y1 += w[q + 1] * VLOAD(t + (q + 1) * ts);
    }
    if (q < q1)
        y0 += w[q] * VLOAD(t + q * ts);
    return y0 + y1;
}

/* As weights_x_rows over q >= q0, but lane e of the unit whose first column is cv takes only
   q >= cv + e: the product dSU^T Y, where Y[t][j'] is masked for t < j'. */
inline vfloat weights_x_rows_upper(__local const float *w, __local const float *t, int ts, int q0, int cv,
                                   vfloat lane)
{
    vfloat y = (vfloat)(0.0f);
    for (int q = q0; q < BLK; ++q) {
        vfloat wq = (vfloat)(w[q]);
        if (q - cv < VW - 1)
            wq = select((vfloat)(0.0f), wq, VISLESSEQ(lane, (vfloat)(float)(q - cv)));
        y += wq * VLOAD(t + q * ts);
    }
    return y;
}

inline vfloat castle_silu_grad_v(vfloat x)
{
    const vfloat g = castle_sigmoid_v(x);
    return g * ((vfloat)(1.0f) + x * ((vfloat)(1.0f) - g));
}

/* Lanes of v into column cv.. of row r of a BLK-stride matrix stored transposed: m[(cv + e) BLK + r]. */
inline void store_transposed(__local float *m, int r, int cv, vfloat v)
{
    float e[VW];
    VLANES(v, e);
    for (int q = 0; q < VW; ++q)
        m[(cv + q) * BLK + r] = e[q];
}

/* out = (first ? 0 : out) + v over the first n (<= VW) floats at p. */
inline void accumulate(__global float *p, int n, bool first, vfloat v)
{
    gstore_part(first ? v : gload_part(p, n) + v, p, n);
}

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
    const bool diag = k == 0;
    const vfloat lane = lane_index();

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

    /* Matrices (row index first): G [s][j'], Gt [j'][s], Y [t][j'], Pt [s][t], dA [t][s], dAt [s][t],
       dSU [t][s], dSUt [s][t].  After phase C, Y and G are dead: dY [t][j'] takes Y's place and
       dYt [j'][t] G's; after phase D1, dZ [s][j'] takes dA's place and dZt [j'][s] dAt's. */
    __local float *sG = lm, *sGt = lm + BLK * BLK, *sY = lm + 2 * BLK * BLK, *sPt = lm + 3 * BLK * BLK;
    __local float *sdA = lm + 4 * BLK * BLK, *sdAt = lm + 5 * BLK * BLK, *sdSU = lm + 6 * BLK * BLK;
    __local float *sdSUt = lm + 7 * BLK * BLK;
    __local float *sdY = sY, *sdYt = sG, *sdZ = sdA, *sdZt = sdAt;
    __local float *T0 = lm + BW_MATS * BLK * BLK, *T1 = T0 + BLK * DT, *T2 = T1 + BLK * DT;
    __local float *T3 = T2 + BLK * DT, *T4 = T3 + BLK * DT, *T5 = T4 + BLK * DT, *T6 = T5 + BLK * DT;
    __local float *sDelta = T6 + BLK * DT, *sLse = sDelta + BLK;

    /* Per matrix unit m: gate logits, then dG (s rows, j' columns); the gate G; the products
       QC KC^T, QC D^T, dO VC^T (t rows, s columns). */
    vfloat g[FUPT], gv[FUPT], s1[FUPT], s2[FUPT], ap[FUPT];
    for (int m = 0; m < FUPT; ++m)
        g[m] = gv[m] = s1[m] = s2[m] = ap[m] = (vfloat)(0.0f);

    /* Phase A: the gate logits QU[T_j] KU[T_i]^T (as the forward), then G, Gt and Y (the forward's
       masked X block). */
    if (gate) {
        for (int c0 = 0; c0 < d; c0 += DT) {
            load_tile_rb(T0, pqu, squ.z, s0, L, c0, d);
            load_tile_tb(T1, pku, sku.z, t0, L, c0, d);
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int m = 0; m < FUPT; ++m) {
                const int u = lid + m * NT, row = u / FQ, cv = (u % FQ) * VW;
                g[m] += row_x_tile(T0 + row * DT, T1 + cv);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, rr = u / FQ, cv = (u % FQ) * VW;
            const int s = s0 + rr;
            const vfloat jp = (float)(t0 + cv) + lane; /* j' of each lane */
            const vfloat sf = (float)s;
            /* allowed: s < L, j' < L, s < j', and j' <= s + W for CASTLE-SWL (as the forward) */
            vfloat gg = castle_sigmoid_v(sc * g[m]);
            gg = select((vfloat)(0.0f), gg,
                        VISLESS(jp, (vfloat)(float)L) & VISLESS(sf, jp) &
                            (W == 0 ? VTRUE : VISLESSEQ(jp, sf + (float)W)));
            if (s >= L)
                gg = (vfloat)(0.0f);
            gv[m] = gg;
            g[m] = (vfloat)(0.0f);
            VSTORE(gg, sG + rr * BLK + cv);
            store_transposed(sGt, rr, cv, gg);
            VSTORE(VLOAD(X + rr * BLK + cv), sY + rr * BLK + cv); /* rows t, columns j' */
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase B: roll D_j back to D_j^(k) (into W and the transposed tile T6, exactly the D_j the
       forward read), Delta = rowsum(dO * O) and the products QC KC^T, QC D_j^(k)T, dO VC^T.
       Delta and dO VC^T are summed in the same order, so that dA = P (dP - Delta) is exactly 0
       where the two agree exactly (a row with a single key: O = VC). */
    float delta = 0.0f;
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile_rb(T0, pqc, sqc.z, t0, L, c0, d);
        load_tile_tb(T1, pkc, skc.z, s0, L, c0, d);
        load_tile_rb(T2, pdo, sdo.z, t0, L, c0, d);
        load_tile_tb(T3, pvc, svc.z, s0, L, c0, d);
        load_tile_rb(T4, po, so.z, t0, L, c0, d);
        if (gate && k > 0)
            load_tile_rb(T5, pvu, svu.z, t0, L, c0, d);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k > 0)
            for (int m = 0; m < FUPC; ++m) {
                const int u = lid + m * NT, rr = u / FQC, cv = (u % FQC) * VW, gc = c0 + cv;
                const int s = s0 + rr;
                vfloat hi = (vfloat)(0.0f);
                if (s < L && gc < d) {
                    const ulong off = (ulong)s * d + gc;
                    const int n = min(VW, d - gc);
                    vfloat lo;
                    hi = gload_part(Dsrc_hi + off, n);
                    lo = gload_part(Dsrc_lo + off, n);
                    if (gate) { /* the forward's D update VU[T_i]^T G^T, over the window of row s */
                        const int q1 = W ? clamp(s + W + 1 - t0, 0, BLK) : BLK;
                        pair_add_v(&hi, &lo, -weights_x_rows(sG + rr * BLK, T5 + cv, DT, 0, q1));
                    }
                    gstore_part(hi, Whi + off, n);
                    gstore_part(lo, Wlo + off, n);
                }
                store_transposed(T6, rr, cv, hi);
            }
        /* global fence too: the loads below and phase D1 read W rows other work-items wrote */
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        if (lid < BLK)
            delta += row_dot(T2 + lid * DT, T4 + lid * DT);
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row = u / FQ, cv = (u % FQ) * VW;
            s1[m] += row_x_tile(T0 + row * DT, T1 + cv);
            if (k > 0)
                s2[m] += row_x_tile(T0 + row * DT, T6 + cv);
            ap[m] += row_x_tile(T2 + row * DT, T3 + cv);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < BLK) {
        sDelta[lid] = delta;
        sLse[lid] = (t0 + lid < L) ? lse[tensor_offset(slse, b, h, t0 + lid)] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase B2: SU and A as the forward computes them, P = min(exp(A - lse), 1), dA, dSU
       (rows t, vectors of s); masked entries are 0. */
    for (int m = 0; m < FUPT; ++m) {
        const int u = lid + m * NT, rr = u / FQ, cv = (u % FQ) * VW;
        const int t = t0 + rr;
        vfloat su = sc * s2[m];
        if (gate) /* X[t][j'] = 0 beyond j' = t */
            su += weights_x_rows(sY + rr * BLK, sGt + cv, BLK, 0, rr + 1);
        const vfloat a = sc * s1[m] - castle_silu_v(su);
        const vfloat sv = (float)(s0 + cv) + lane;
        const vint masked = VISGREATEREQ(sv, (vfloat)(float)L) | (diag ? VISGREATER(sv, (vfloat)(float)t) : VFALSE) |
                            (t >= L ? VTRUE : VFALSE);
        const vfloat p = select(fmin(exp(a - sLse[rr]), (vfloat)(1.0f)), (vfloat)(0.0f), masked);
        const vfloat da = select(p * (ap[m] - sDelta[rr]), (vfloat)(0.0f), masked);
        const vfloat dsu = select(-castle_silu_grad_v(su) * da, (vfloat)(0.0f), masked);
        store_transposed(sPt, rr, cv, p);
        VSTORE(da, sdA + rr * BLK + cv);
        store_transposed(sdAt, rr, cv, da);
        VSTORE(dsu, sdSU + rr * BLK + cv);
        store_transposed(sdSUt, rr, cv, dsu);
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase C: dY = (dSU G) masked j' <= t (into Y's and G's places), and the dSU^T Y part of dG
       (units of s rows, j' columns). */
    if (gate) {
        vfloat dy[FUPT];
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, rr = u / FQ, cv = (u % FQ) * VW;
            const vfloat jp = (float)cv + lane;
            dy[m] = select((vfloat)(0.0f), weights_x_rows(sdSU + rr * BLK, sG + cv, BLK, 0, diag ? rr + 1 : BLK),
                           VISLESSEQ(jp, (vfloat)(float)rr));
            g[m] = weights_x_rows_upper(sdSUt + rr * BLK, sY + cv, BLK, diag ? max(rr, cv) : cv, cv, lane);
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* every read of G and Y is done */
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, rr = u / FQ, cv = (u % FQ) * VW;
            VSTORE(dy[m], sdY + rr * BLK + cv);
            store_transposed(sdYt, rr, cv, dy[m]);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase D1: the d-wide products.  Tiles: T0 QC[T_i], T1 KC[T_j], T2 dO[T_i], T3 VU[T_i],
       T5 dD_j (gradient of D_j^(k+1); 0 at the first touch), T6 D_j^(k) (W, written in phase B),
       all row-major; T4 VU[T_i] transposed. */
    for (int c0 = 0; c0 < d; c0 += DT) {
        load_tile_rb(T0, pqc, sqc.z, t0, L, c0, d);
        load_tile_rb(T1, pkc, skc.z, s0, L, c0, d);
        load_tile_rb(T2, pdo, sdo.z, t0, L, c0, d);
        if (gate) {
            load_tile_rb(T3, pvu, svu.z, t0, L, c0, d);
            load_tile_tb(T4, pvu, svu.z, t0, L, c0, d);
        }
        if (k > 0)
            load_tile_rb(T6, Whi, (ulong)d, s0, L, c0, d);
        if (first_col) {
            for (int e = lid; e < BLK * DT; e += NT)
                T5[e] = 0.0f;
        } else {
            load_tile_rb(T5, dD, (ulong)d, s0, L, c0, d);
        }
        /* global fence too: below, other work-items overwrite the dD_j entries just read */
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        if (gate) /* dG += dD_j VU[T_i]^T (units of s rows, j' columns) */
            for (int m = 0; m < FUPT; ++m) {
                const int u = lid + m * NT, row = u / FQ, cv = (u % FQ) * VW;
                g[m] += row_x_tile(T5 + row * DT, T4 + cv);
            }
        for (int m = 0; m < FUPC; ++m) {
            const int u = lid + m * NT, rr = u / FQC, cv = (u % FQC) * VW, gc = c0 + cv;
            if (gc >= d)
                continue;
            const int n = min(VW, d - gc);
            /* row block i: rr is t (dQC) or j' (dVU) */
            const int t = t0 + rr;
            if (t < L) {
                vfloat vq = weights_x_rows(sdA + rr * BLK, T1 + cv, DT, 0, diag ? rr + 1 : BLK), vv = (vfloat)(0.0f);
                if (k > 0)
                    vq += weights_x_rows(sdSU + rr * BLK, T6 + cv, DT, 0, BLK);
                if (gate) {
                    /* G[s][j'] is 0 unless j' - W <= s < j' */
                    const int q0 = W ? clamp(t - W - s0, 0, BLK) : 0, q1 = diag ? rr : BLK;
                    vq += weights_x_rows(sdY + rr * BLK, T3 + cv, DT, 0, rr + 1);
                    vv = weights_x_rows(sGt + rr * BLK, T5 + cv, DT, q0, q1) +
                         sc * weights_x_rows(sdYt + rr * BLK, T0 + cv, DT, rr, BLK);
                }
                accumulate(dqc + tensor_offset(sdqc, b, h, t) + gc, n, first_row, sc * vq);
                accumulate(dvu + tensor_offset(sdvu, b, h, t) + gc, n, first_row, vv);
            }
            /* column block j: rr is s */
            const int s = s0 + rr;
            if (s < L) {
                const int q0 = diag ? rr : 0; /* t >= s */
                accumulate(dvc + tensor_offset(sdvc, b, h, s) + gc, n, first_col,
                           weights_x_rows(sPt + rr * BLK, T2 + cv, DT, q0, BLK));
                accumulate(dkc + tensor_offset(sdkc, b, h, s) + gc, n, first_col,
                           sc * weights_x_rows(sdAt + rr * BLK, T0 + cv, DT, q0, BLK));
                if (k > 0) /* the gradient of D_j^(k), for iteration k - 1 */
                    gstore_part(VLOAD(T5 + rr * DT + cv) + sc * weights_x_rows(sdSUt + rr * BLK, T0 + cv, DT, 0, BLK),
                                dD + (ulong)s * d + gc, n);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* dZ = dG G (1 - G) on the allowed gate entries (0 elsewhere), into dA's and dAt's places. */
    if (gate)
        for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, rr = u / FQ, cv = (u % FQ) * VW;
            const vfloat dz = select((vfloat)(0.0f), g[m] * gv[m] * ((vfloat)(1.0f) - gv[m]),
                                     isnotequal(gv[m], (vfloat)(0.0f)));
            VSTORE(dz, sdZ + rr * BLK + cv);
            store_transposed(sdZt, rr, cv, dz);
        }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase D2: dKU[T_i] += sc dZ^T QU[T_j], dQU[T_j] += sc dZ KU[T_i], each over the allowed gate
       entries of its row. */
    for (int c0 = 0; c0 < d && (gate || first_row || first_col); c0 += DT) {
        if (gate) {
            load_tile_rb(T0, pqu, squ.z, s0, L, c0, d);
            load_tile_rb(T1, pku, sku.z, t0, L, c0, d);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int m = 0; m < FUPC; ++m) {
            const int u = lid + m * NT, rr = u / FQC, cv = (u % FQC) * VW, gc = c0 + cv;
            if (gc >= d)
                continue;
            const int n = min(VW, d - gc);
            vfloat vk = (vfloat)(0.0f), vq = (vfloat)(0.0f);
            if (gate) {
                const int jp = t0 + rr, s = s0 + rr; /* j' - W <= s < j' */
                vk = weights_x_rows(sdZt + rr * BLK, T0 + cv, DT, W ? clamp(jp - W - s0, 0, BLK) : 0, diag ? rr : BLK);
                vq = weights_x_rows(sdZ + rr * BLK, T1 + cv, DT, diag ? rr + 1 : 0,
                                    W ? clamp(s + W + 1 - t0, 0, BLK) : BLK);
            }
            if (t0 + rr < L && (gate || first_row))
                accumulate(dku + tensor_offset(sdku, b, h, t0 + rr) + gc, n, first_row, sc * vk);
            if (s0 + rr < L && (gate || first_col))
                accumulate(dqu + tensor_offset(sdqu, b, h, s0 + rr) + gc, n, first_col, sc * vq);
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
