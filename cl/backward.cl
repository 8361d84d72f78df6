/* backward.cl: the blockwise CASTLE backward pass (docs/algorithm.md section 4).
 *
 * One launch per anti-diagonal, in reverse (k = N-1 .. 0; k > 0 by castle_backward_off where the
 * program has it); work-group (j, bh) handles the block pair (i = j + k, j) of batch entry
 * b = bh / H, head h = bh % H:
 *   G = G[T_j, T_i];  D_j^(k) = D_j^(k+1) - VU[T_i]^T G^T      (rolled back as a hi/lo pair)
 *   SU, A as in the forward;  P = exp(A - lse);  dA = P * (dO VC^T - Delta)
 *   dSU = -SiLU'(SU) dA;  dY = (dSU G) masked;  dG = dSU^T Y + dD_j^T VU[T_i]^T;  dZ = dG G (1 - G)
 * Row block i receives dQC, dVU, dKU and its sum of dY (multiplied out at k = 0); column block j
 * receives dKC, dVC, dQU and dD_j.  No two work-groups of a launch write the same memory: no
 * atomics, bitwise reproducible.
 * Row block i is first touched at k = i (j = 0), column block j at i = N-1: those work-groups
 * initialise the gradients instead of accumulating.
 * Workspace regions (floats, per batch entry x head): the forward's D hi/lo (read at a column's first
 * touch), the working copy W hi/lo of D_j^(k) (rolled back here, so the forward's state survives and
 * the backward can run again), dD (gradient of D_j^(k+1)), Delta (rowsum(dO * O), written by the
 * first touch of each row block and read by its later pairs), X (the forward's scaled masked X
 * blocks and their transposes), dY (the gradient of each X block, summed over its row block's
 * pairs), and the block-transposed copies (common.cl) of QU, KU, QC, KC as the forward wrote them
 * and of VU, VC, dO (castle_transpose_blocks, launched before the wavefront). */

#if (NT % BLK) != 0 && (BLK % NT) != 0
#error "backward.cl: NT must be a multiple or a divisor of BLK"
#endif

/* Mapping: the forward's (common.cl, "Register micro-tiles").  Every product of a block pair is
   split into micro-tiles of TM rows x TN vectors of VW columns, BLK x BLK products and BLK x BW_SL
   slabs of d-wide outputs alike (BW_SL: DT, or wider where DT would leave a work-item without a
   micro-tile, as 2 x 4 tiles on 128 work-items of a 32 x 16 slab would); work-item lid owns
   micro-tiles lid + m NT.  NT may be smaller than BLK
   (the CPU entries' bthreads = 16: PoCL keeps a copy per work-item of each value that lives across
   a barrier, so fewer work-items with more micro-tiles each carry less): the per-row work (Delta,
   lse) takes rows lid + q NT, q < BW_ROWS, its sums in registers as before (summed in local
   memory instead, the folded kernel came out wrong on PoCL under NT > BLK, though Oclgrind found
   no race).  Operand A of every product is staged k-major (contraction index first), so each
   matrix is kept in the orientation(s) its products read (under MT_AM_ROWS, the CPU mappings, a
   matrix that is only an A operand is read row-major instead: MT_AM, common.cl); of the d tiles
   (stage_cols, stage_tile_t: vector loads), those that are A operands are staged as MT_AT says
   (row-major when TM = 1).  The gate logits, the scores and the D update are recomputed
   with the forward's mt_* calls on the same operands (one chain per sum, its terms in ascending
   order however d is chunked: mt_product), so P = exp(A - lse) uses exactly the A the forward
   normalised (P <= 1, also capped at 1) and D_j is rolled back by exactly what the forward added,
   whatever the two passes' chunks of d (dchunk, fdchunk).
   Causally masked entries never enter a product: a contraction stops where its mask does (per row
   of a micro-tile, and per column for dSU^T Y; mt_product_lower, _below, _from), masked results are
   selected, never multiplied by a zero mask, and rows beyond L are zeros in the tiles; so a NaN or
   Inf in a row reaches only the gradient rows that depend on it.  Gate entries outside the
   CASTLE-SWL window are skipped where they weight rows of another input (dZ QU, dZ KU, G^T dD_j:
   mt_product_band); they are exact zeros of G in the products the forward also takes over the
   whole block (X G^T, the D update) and in dSU G.
   No barrier of this kernel is inside a branch, and each loop over d (d >= 1) leaves right after the
   last barrier of its last step, not through a test before its first barrier: PoCL replicates the
   code after a barrier that a branch may skip (barrier tail replication), which made the kernel's
   compile several times longer; the work a block pair does not need is skipped between the barriers
   instead. */
/* FU, FUPT: common.cl. */

/* Local memory: eight BLK x BLK matrices (row stride BLK), seven BLK x DT tiles (row-major,
   t[r * DT + c], or k-major, t[c * BLK + r]: stage_tile), Delta and lse of the rows; phases A, B,
   D1 and D2 lay wider tiles over the matrices they do not keep (BW_WA, BW_WB, BW_WD1, BW_WD2 below). */
#define BW_ROWS ((BLK + NT - 1) / NT) /* rows of Delta and lse per work-item (1 when NT >= BLK) */
#define BW_MATS 8 /* the matrices come first (CASTLE_LM_BACKWARD counts the same parts) */
#define LM_BW CASTLE_LM_BACKWARD(BLK, DT) /* local_memory.h: the host checks the same formula */
/* Columns of d staged per step, phase by phase: the phases that keep fewer matrices stage wider
   tiles in the room the others leave, so that d takes fewer steps (and barriers).  Phase A (four
   tiles, before any matrix is written) has the matrices' area and the tiles' (BW_AREA); phase B
   (seven tiles beside Gt, Yt, G and Y, M0-M3) the area from M4 on; phase D1 (five tiles beside six
   of the matrices: dSU and dSUt are not read at the diagonal, Y and dYt not elsewhere) BLK columns
   where two tiles fit in those two matrices' places and three in the tiles' area (BW_D1_WIDE), else
   the tiles' area, DT columns; phase D2 (two tiles beside dZ and dZt, M1 and M4) the area from M5
   on.  A step stages whole slabs (BW_SL columns); its products over d take DT terms per
   call, in one chain per sum (mt_product), so neither the step's width nor DT changes a result. */
#define BW_AREA (BW_MATS * BLK * BLK + 7 * BLK * DT)
#define BW_SL CASTLE_BW_SLAB(BLK, DT, NT, TM, MT_COLS) /* local_memory.h: DT, or wider for bigger tiles */
#define BW_D1_WIDE CASTLE_BW_D1_WIDE(BLK, DT)
#if BW_SL > DT && !BW_D1_WIDE
#error "backward.cl: a slab wider than DT needs phase D1's wide step (host/tuning.c refuses such a shape)"
#endif
#define BW_FUPS (CASTLE_MT_TILES(BLK, BW_SL, TM, MT_COLS) / NT) /* a work-item's micro-tiles of a slab */
/* the widest whole number of slabs that ntiles tiles fit from offset from on */
#define BW_FIT(from, ntiles) ((BW_AREA - (from)) / ((ntiles) * BLK) / BW_SL * BW_SL)
#define BW_WA BW_FIT(0, 4)
#define BW_WB BW_FIT(4 * BLK * BLK, 7)
#define BW_WD1 (BW_D1_WIDE ? BLK : DT)
#define BW_WD2 BW_FIT(5 * BLK * BLK, 2)
/* The columns of d a phase's steps cover: d rounded up to a multiple of c, DT or the slab (zeros beyond d). */
#define BW_PAD(c) ((d + (c) - 1) / (c) * (c))

/* SiLU'(x) from g = sigmoid(x), the value castle_silu_g(x, g) is computed from (one exp for both),
   with its limits 0 at x = -inf and 1 at +inf (where the product is 0 x inf = NaN): x is held to
   the finite range first, as castle_silu_g does (a NaN x leaves g NaN; finite x: bitwise as before). */
inline vfloat castle_silu_grad_g(vfloat x, vfloat g)
{
    const vfloat xf = fmin(fmax(x, (vfloat)(-FLT_MAX)), (vfloat)(FLT_MAX));
    return g * ((vfloat)(1.0f) + xf * ((vfloat)(1.0f) - g));
}

/* out = (first ? 0 : out) + v over the first n (<= VW) floats at p. */
__attribute__((always_inline)) inline void accumulate(__global float *p, int n, bool first, vfloat v)
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
    const ulong ws_dlo, const ulong ws_whi, const ulong ws_wlo, const ulong ws_dd, const ulong ws_delta, \
    const ulong ws_x, const ulong2 ws_t, const ulong ws_dy
#define BACKWARD_BLOCK_ARGS \
    L, d, H, W, sc, qu, squ, ku, sku, vu, svu, qc, sqc, kc, skc, vc, svc, o, so, lse, slse, dout, sdo, \
    dqu, sdqu, dku, sdku, dvu, sdvu, dqc, sdqc, dkc, sdkc, dvc, sdvc, ws, ws_dlo, ws_whi, ws_wlo, \
    ws_dd, ws_delta, ws_x, ws_t, ws_dy

/* Which pairs a kernel computes (backward_block's argument which, a constant in each kernel): those
   off the diagonal (k > 0) or any, as k says.  The diagonal pair's triangular products need more
   registers than the rest of a block pair (under 2 x 4 tiles on 128 work-items, clang's PTX: 168
   against 127), so the pairs off the diagonal have a kernel compiled without them
   (castle_backward_off, launched for k > 0), and castle_backward_block, which computes any pair, is
   launched for k = 0.  (It computes every k where a program has no castle_backward_off: kernels
   from an earlier revision's cl/, CASTLE_CL_DIR.) */
#define BW_OFF 0 /* k > 0 only */
#define BW_ANY 1 /* k decides */

/* The block pair (i = j + k, j) of batch entry x head bh, computed by the whole work-group. */
inline void backward_block(__local float *lm, const int k, const int j, const int bh, const int which,
                           BACKWARD_BLOCK_PARAMS)
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
    const bool diag = which == BW_ANY && k == 0; /* false, a constant, in castle_backward_off */
    const int kb = k * BLK, Wb = min(W, Lpad); /* T_i starts kb rows after T_j; the window, bounded */
    const vfloat lane = lane_index();

    __global const float *pqu = qu + tensor_offset(squ, b, h, 0);
    __global const float *pku = ku + tensor_offset(sku, b, h, 0);
    __global const float *pvu = vu + tensor_offset(svu, b, h, 0);
    __global const float *pqc = qc + tensor_offset(sqc, b, h, 0);
    __global const float *pkc = kc + tensor_offset(skc, b, h, 0);
    __global const float *po = o + tensor_offset(so, b, h, 0);
    __global const float *pdo = dout + tensor_offset(sdo, b, h, 0);
    const ulong bhd = (ulong)bh * Lpad * d;
    __global const float *Dsrc_hi = first_col ? ws + bhd : ws + ws_whi + bhd;
    __global const float *Dsrc_lo = first_col ? ws + ws_dlo + bhd : ws + ws_wlo + bhd;
    __global float *Whi = ws + ws_whi + bhd;
    __global float *Wlo = ws + ws_wlo + bhd;
    __global float *dD = ws + ws_dd + bhd;
    __global float *Delta = ws + ws_delta + (ulong)bh * Lpad; /* per row, written at the row's first touch */
    __global const float *X = ws + ws_x + ((ulong)bh * N + i) * (2 * BLK * BLK);
    __global float *dYsum = ws + ws_dy + ((ulong)bh * N + i) * (BLK * BLK); /* row block i's dY so far */
    /* block-transposed copies of the inputs (common.cl, castle_transpose_blocks) */
    __global const float *xqu = tcopy(ws, ws_t, CASTLE_T_QU, bh, Lpad, d);
    __global const float *xku = tcopy(ws, ws_t, CASTLE_T_KU, bh, Lpad, d);
    __global const float *xqc = tcopy(ws, ws_t, CASTLE_T_QC, bh, Lpad, d);
    __global const float *xkc = tcopy(ws, ws_t, CASTLE_T_KC, bh, Lpad, d);
    __global const float *xvu = tcopy(ws, ws_t, CASTLE_T_VU, bh, Lpad, d);
    __global const float *xvc = tcopy(ws, ws_t, CASTLE_T_VC, bh, Lpad, d);
    __global const float *xdo = tcopy(ws, ws_t, CASTLE_T_DO, bh, Lpad, d);

    /* Matrices, m[row * BLK + col] ("rm") or transposed ("Xt": X's column index first):
         M0 Gt [j'][s]  (scores)  -> P [t][s] (from phase B2 on)
         M1 Yt [j'][t]  (scores)  -> dA [t][s]  -> dZ [s][j'] (after D1)
         M2 G [s][j'], M3 Y [t][j'] -> dY [t][j'] (after C), M4 dAt [s][t] -> dZt [j'][s] (after D1),
         M5 dSU [t][s], M6 dSUt [s][t], M7 dYt [j'][t].
       The transposed copies that serve only as A operands (Yt, dAt, dSUt, dYt, dZt) are not
       written under MT_AM_ROWS (CPU mappings, common.cl): there the products read Y, dA, dSU, dY
       and dZ row-major through MT_AM. */
    __local float *sGt = lm, *sYt = lm + BLK * BLK, *sG = lm + 2 * BLK * BLK, *sY = lm + 3 * BLK * BLK;
    __local float *sdAt = lm + 4 * BLK * BLK, *sdSU = lm + 5 * BLK * BLK, *sdSUt = lm + 6 * BLK * BLK;
    __local float *sdYt = lm + 7 * BLK * BLK;
    __local float *sP = sGt, *sdA = sYt, *sdY = sY, *sdZ = sYt, *sdZt = sdAt;
    __local float *sDelta = lm + BW_AREA, *sLse = sDelta + BLK; /* after the matrices and the tiles */

    /* Per micro-tile m of a BLK x BLK product: the gate logits, then dG (rows s, columns j'); the
       dD_j VU[T_i]^T part of dG until the logits are done (G itself is kept in local memory only,
       sG, from which dZ reads it back: one array fewer live through phases B to D1); the products
       QC KC^T, QC D^T, dO VC^T (rows t, columns s). */
    vfloat g[FUPT][MT_ACC], gv[FUPT][MT_ACC], s1[FUPT][MT_ACC], s2[FUPT][MT_ACC], ap[FUPT][MT_ACC];
    ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
        mt_zero(g[m]);
        mt_zero(gv[m]);
        mt_zero(s1[m]);
        mt_zero(s2[m]);
        mt_zero(ap[m]);
    }

    /* Prefetches (common.cl; tuning prefetch = 1, CPUs), a phase ahead, of the rows that work-items
       read and write micro-tile by micro-tile (the tiles are staged front to back, which the hardware
       prefetches): here the forward's X block (read into Y after phase A) and the D_j rows that
       phase B rolls back.  Their conditions are in the row counts, not in branches around them: with an if around
       each, PoCL compiled this kernel for over 16 minutes (80 s without). */
    prefetch_rows(X, BLK, 0, gate ? BLK : 0, BLK);
    prefetch_rows(Dsrc_hi, (ulong)d, s0, !diag ? L : 0, d);
    prefetch_rows(Dsrc_lo, (ulong)d, s0, !diag ? L : 0, d);

    /* Phase A: the gate logits QU[T_j] KU[T_i]^T (the forward's KU[T_i] QU[T_j]^T transposed: the same
       products summed in the same order, so the same floats) and, in gv until the logits are done,
       the dD_j VU[T_i]^T part of dG (dD_j: the gradient of D_j^(k+1), 0 at the first touch);
       then G, Gt, Y and Yt (Y: the forward's masked X block, row-major (t, j') in the workspace).
       Tiles (BW_WA columns each, in the whole area: lm on): the A operands A0 QU[T_j] and A2 dD_j as
       MT_AT says, the B operands A1 KU[T_i] and A3 VU[T_i] k-major. */
    {
        __local float *A0 = lm, *A1 = A0 + BLK * BW_WA, *A2 = A1 + BLK * BW_WA, *A3 = A2 + BLK * BW_WA;
        for (int c0 = 0;; c0 += BW_WA) { /* d >= 1 */
            const int cols = min(BW_WA, BW_PAD(DT) - c0); /* the columns this step stages */
            if (gate) {
                stage_cols_a(A0, BLK, BW_WA, xqu, pqu, squ.z, j, L, c0, cols, d);
                stage_tile_t(A1, BLK, xku, i, c0, cols, d);
                if (!first_col) {
                    stage_cols(A2, BLK, BW_WA, dD, (ulong)d, s0, L, c0, cols, d, MT_AT);
                    stage_tile_t(A3, BLK, xvu, i, c0, cols, d);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            if (gate)
                for (int c = 0; c < cols; c += DT)
                    ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
                        const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
                        mt_product(g[m], MT_A(A0, row0, BW_WA, c), A1 + c * BLK + col0, BLK, DT);
                        if (!first_col)
                            mt_product(gv[m], MT_A(A2, row0, BW_WA, c), A3 + c * BLK + col0, BLK, DT);
                    }
            barrier(CLK_LOCAL_MEM_FENCE);
            if (c0 + BW_WA >= d)
                break;
        }
    }
    if (gate)
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
                const vfloat gg = castle_gate_v(g[m][e], sc, s0 + rr, (float)(t0 + cv) + lane, L, W);
                g[m][e] = gv[m][e]; /* dG so far; G is read back from sG where dZ needs it */
                gv[m][e] = gg;      /* gv is spent: the tile of G, for its k-major copy */
                VSTORE(gg, sG + rr * BLK + cv);
                VSTORE(GVLOAD(X + rr * BLK + cv), sY + rr * BLK + cv); /* rows t, columns j' */
            }
            store_tile_t(sGt, row0, col0, gv[m]);
        }
#if !MT_AM_ROWS /* else Y is read row-major (MT_AM) */
    if (gate) { /* Yt: the forward's X^T, stored after X */
        __global const float *XT = X + BLK * BLK;
        FOR_SHARE(e, BLK * BLK / VW)
            VSTORE(GVLOAD(XT + e * VW), sYt + e * VW);
    }
#endif
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase B: roll D_j back to D_j^(k) (into W and the k-major tile B6: exactly the D_j the forward
       read), Delta = rowsum(dO * O) (at the row block's first touch; later pairs read it from the
       workspace) and the products QC KC^T, QC D_j^(k)T, dO VC^T.  Delta and
       dO VC^T are one FMA chain each in the same order, so that dA = P (dP - Delta) is exactly 0
       where the two agree exactly (a row with a single key: O = VC).  Tiles (BW_WB columns each, from
       M4 on): the A operands B0 QC[T_i] and B2 dO[T_i] as MT_AT says, the B operands B1 KC[T_j] and
       B3 VC[T_j] k-major, B4 O[T_i] as MT_AT says, B5 VU[T_i] row-major, B6 D_j^(k) k-major. */
    float delta[BW_ROWS]; /* Delta of rows lid + q NT, summed chunk by chunk */
    for (int q = 0; q < BW_ROWS; ++q)
        delta[q] = 0.0f;
    __local float *B0 = lm + 4 * BLK * BLK, *B1 = B0 + BLK * BW_WB, *B2 = B1 + BLK * BW_WB, *B3 = B2 + BLK * BW_WB;
    __local float *B4 = B3 + BLK * BW_WB, *B5 = B4 + BLK * BW_WB, *B6 = B5 + BLK * BW_WB;
    for (int c0 = 0;; c0 += BW_WB) { /* d >= 1 */
        const int cols = min(BW_WB, BW_PAD(BW_SL) - c0);
        stage_cols_a(B0, BLK, BW_WB, xqc, pqc, sqc.z, i, L, c0, cols, d);
        stage_tile_t(B1, BLK, xkc, j, c0, cols, d);
        stage_cols_a(B2, BLK, BW_WB, xdo, pdo, sdo.z, i, L, c0, cols, d);
        stage_tile_t(B3, BLK, xvc, j, c0, cols, d);
        if (first_row) /* O, for Delta (read by the row's first pair only: staged from O itself) */
            stage_cols(B4, BLK, BW_WB, po, so.z, t0, L, c0, cols, d, MT_AT);
        if (gate && !diag)
            stage_cols(B5, BLK, BW_WB, pvu, svu.z, t0, L, c0, cols, d, false);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (!diag)
            for (int c = 0; c < cols; c += BW_SL) /* the micro-tiles of each BLK x BW_SL slab */
                ACC_UNROLL for (int m = 0; m < BW_FUPS; ++m) {
                    const int u = lid + m * NT, row0 = MT_ROW0(u, BW_SL), col0 = MT_COL0(u, BW_SL);
                    vfloat dv[MT_ACC];
                    mt_zero(dv);
                    if (gate) /* the forward's D update G[T_j,T_i] VU[T_i] */
                        mt_product(dv, sGt + row0, BLK, B5 + c + col0, BW_WB, BLK);
                    ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                        const int rr = MT_EROW(row0, e), cv = MT_ECOL(c + col0, e), gc = c0 + cv;
                        const int s = s0 + rr;
                        vfloat hi = (vfloat)(0.0f);
                        if (s < L && gc < d) {
                            const ulong off = (ulong)s * d + gc;
                            const int n = min(VW, d - gc);
                            vfloat lo;
                            hi = gload_part(Dsrc_hi + off, n);
                            lo = gload_part(Dsrc_lo + off, n);
                            if (gate)
                                pair_add_v(&hi, &lo, -dv[e]);
                            gstore_part(hi, Whi + off, n);
                            gstore_part(lo, Wlo + off, n);
                        }
                        dv[e] = hi; /* dv[e] is spent: the tile of D_j^(k), for its k-major copy */
                    }
                    store_tile_t(B6, row0, c + col0, dv); /* a tile's rows in one store per column */
                }
        /* global fence too: phase D1 reads W rows other work-items wrote */
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        if (first_row) /* in mt_product's order: one chain, c ascending */
            for (int q = 0; q < BW_ROWS; ++q) {
                const int r = lid + q * NT;
                int c = 0;
                /* row-major tiles (TM = 1): four columns per pair of vector loads, the same chain */
                if (!MT_AT)
                    for (; c + 4 <= cols && r < BLK; c += 4) {
                        const float4 x = vload4(0, B2 + MT_AOFF(r, BW_WB, c));
                        const float4 y = vload4(0, B4 + MT_AOFF(r, BW_WB, c));
                        delta[q] += x.s0 * y.s0;
                        delta[q] += x.s1 * y.s1;
                        delta[q] += x.s2 * y.s2;
                        delta[q] += x.s3 * y.s3;
                    }
                for (; c < cols && r < BLK; ++c)
                    delta[q] += B2[MT_AOFF(r, BW_WB, c)] * B4[MT_AOFF(r, BW_WB, c)];
            }
        for (int c = 0; c < cols; c += DT) {
            ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
                const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
                if (MT_SHARE && !diag) { /* QC KC^T and QC D^T: QC's fragments loaded once for both */
                    mt_product_2b(s1[m], s2[m], MT_A(B0, row0, BW_WB, c), B1 + c * BLK + col0,
                                  B6 + c * BLK + col0, BLK, DT);
                } else {
                    mt_product(s1[m], MT_A(B0, row0, BW_WB, c), B1 + c * BLK + col0, BLK, DT);
                    if (!diag)
                        mt_product(s2[m], MT_A(B0, row0, BW_WB, c), B6 + c * BLK + col0, BLK, DT);
                }
                mt_product(ap[m], MT_A(B2, row0, BW_WB, c), B3 + c * BLK + col0, BLK, DT);
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (c0 + BW_WB >= d)
            break;
    }
    for (int q = 0; q < BW_ROWS; ++q) {
        const int r = lid + q * NT;
        if (r < BLK) {
            const bool row = t0 + r < L;
            if (first_row && row)
                Delta[t0 + r] = delta[q];
            sDelta[r] = first_row ? delta[q] : row ? Delta[t0 + r] : 0.0f;
            sLse[r] = row ? lse[tensor_offset(slse, b, h, t0 + r)] : 0.0f;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* the gradient rows phase D1 updates */
    prefetch_rows(dvc + tensor_offset(sdvc, b, h, 0), sdvc.z, s0, first_col ? 0 : L, d);
    prefetch_rows(dkc + tensor_offset(sdkc, b, h, 0), sdkc.z, s0, first_col ? 0 : L, d);
    prefetch_rows(dqc + tensor_offset(sdqc, b, h, 0), sdqc.z, t0, first_row ? 0 : L, d);
    prefetch_rows(dvu + tensor_offset(sdvu, b, h, 0), sdvu.z, t0, first_row ? 0 : L, d);

    /* Phase B2: SU and A as the forward computes them, P = min(exp(A - lse), 1), dA, dSU (rows t,
       columns s; masked entries 0), kept in registers until every work-item has read Gt and Yt. */
    ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
        const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
        vfloat su[MT_ACC];
        ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) su[e] = !diag ? sc * s2[m][e] : (vfloat)(0.0f);
        if (gate) /* X[t][j'] = 0 beyond j' = t */
            mt_product_lower(su, MT_AM(sY, sYt, row0), sGt + col0, BLK, row0);
        ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
            const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
            const int t = t0 + rr;
            const vfloat gs = castle_sigmoid_v(su[e]); /* the forward's castle_silu_v(su) = castle_silu_g(su, gs) */
            const vfloat a = sc * s1[m][e] - castle_silu_g(su[e], gs);
            const vfloat sv = (float)(s0 + cv) + lane;
            const vint masked = VISGREATEREQ(sv, (vfloat)(float)L) |
                                (diag ? VISGREATER(sv, (vfloat)(float)t) : VFALSE) | (t >= L ? VTRUE : VFALSE);
            const vfloat p = select(fmin(exp(a - sLse[rr]), (vfloat)(1.0f)), (vfloat)(0.0f), masked);
            const vfloat da = select(p * (ap[m][e] - sDelta[rr]), (vfloat)(0.0f), masked);
            s1[m][e] = p;
            ap[m][e] = da;
            s2[m][e] = select(-castle_silu_grad_g(su[e], gs) * da, (vfloat)(0.0f), masked);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* every read of Gt and Yt is done */
    ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
        const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
        ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
            const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
            VSTORE(s1[m][e], sP + rr * BLK + cv);
            VSTORE(ap[m][e], sdA + rr * BLK + cv);
            VSTORE(s2[m][e], sdSU + rr * BLK + cv);
        }
        if (!MT_AM_ROWS) {
            store_tile_t(sdAt, row0, col0, ap[m]);
            store_tile_t(sdSUt, row0, col0, s2[m]);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase C: this pair's part of dY = (dSU G) masked j' <= t, and the dSU^T Y part of dG (rows s,
       columns j'; Y[t][j'] is masked for t < j', dSU[t][s] for t < s at k = 0).  Y = X[T_i, T_i] is
       one block for every pair of row block i, so its gradient is summed over those pairs in the
       workspace (dYsum: written at the row's first touch, k = i, added to at later steps) and
       multiplied out once, by the row's last pair (the diagonal, k = 0): dQC += sc dY VU and
       dVU += sc dY^T QC cost two d-long products per row block instead of per pair.  Only the
       diagonal keeps dY in local memory (Y's place, and dYt). */
    vfloat dy[FUPT][MT_ACC]; /* 0 for a pair without gate work (beyond the window), whose first touch
                                of a row still writes the sum */
    ACC_UNROLL for (int m = 0; m < FUPT; ++m)
        mt_zero(dy[m]);
    if (gate)
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            if (diag)
                mt_product_lower(dy[m], MT_AM(sdSU, sdSUt, row0), sG + col0, BLK, row0);
            else
                mt_product(dy[m], MT_AM(sdSU, sdSUt, row0), sG + col0, BLK, BLK);
            ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
                dy[m][e] = select((vfloat)(0.0f), dy[m][e], VISLESSEQ((float)cv + lane, (vfloat)(float)rr));
            }
            mt_product_from(g[m], sdSU + row0, BLK, sY + col0, BLK, row0, diag ? 0 : -1, col0, true, lane);
        }
    if (!(diag && first_row) && (gate || first_row)) /* i = 0 has one pair: nothing to sum */
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                __global float *p = dYsum + MT_EROW(row0, e) * BLK + MT_ECOL(col0, e);
                const vfloat v = first_row ? dy[m][e] : GVLOAD(p) + dy[m][e];
                if (diag)
                    dy[m][e] = v; /* the whole dY of row block i */
                else
                    GVSTORE(v, p);
            }
        }
    barrier(CLK_LOCAL_MEM_FENCE); /* every read of Y is done */
    if (diag)
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
                VSTORE(dy[m][e], sdY + rr * BLK + cv);
            }
            if (!MT_AM_ROWS)
                store_tile_t(sdYt, row0, col0, dy[m]);
        }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* the gradient rows phase D2 updates */
    prefetch_rows(dku + tensor_offset(sdku, b, h, 0), sdku.z, t0, gate && !first_row ? L : 0, d);
    prefetch_rows(dqu + tensor_offset(sdqu, b, h, 0), sdqu.z, s0, gate && !first_col ? L : 0, d);

    /* Phase D1: the d-wide products, BW_WD1 columns of d per step (in slabs of BW_SL: BW_FUPS
       micro-tiles each).  Row-major tiles: DQ QC[T_i], DK KC[T_j], DO dO[T_i], DV VU[T_i] at the diagonal and
       D_j^(k) (W, written in phase B) elsewhere, DD dD_j (gradient of D_j^(k+1); 0 at the first
       touch).  Under BW_D1_WIDE DQ and DK take the places of two matrices this phase does not read
       (dSU and dSUt at the diagonal, Y and dYt elsewhere), the others the tiles' area. */
    __local float *DQ, *DK, *DO, *DV, *DD;
    {
        __local float *t = lm + BW_MATS * BLK * BLK, *t1 = t + BLK * BW_WD1;
        DQ = BW_D1_WIDE ? lm + (diag ? 5 : 3) * BLK * BLK : t;
        DK = BW_D1_WIDE ? lm + (diag ? 6 : 7) * BLK * BLK : t1;
        DO = BW_D1_WIDE ? t : t1 + BLK * BW_WD1;
        DV = DO + BLK * BW_WD1;
        DD = DV + BLK * BW_WD1;
    }
    for (int c0 = 0;; c0 += BW_WD1) { /* d >= 1 */
        const int cols = min(BW_WD1, BW_PAD(BW_SL) - c0);
        stage_cols(DQ, BLK, BW_WD1, pqc, sqc.z, t0, L, c0, cols, d, false);
        stage_cols(DK, BLK, BW_WD1, pkc, skc.z, s0, L, c0, cols, d, false);
        stage_cols(DO, BLK, BW_WD1, pdo, sdo.z, t0, L, c0, cols, d, false);
        if (diag)
            stage_cols(DV, BLK, BW_WD1, pvu, svu.z, t0, L, c0, cols, d, false);
        else
            stage_cols(DV, BLK, BW_WD1, Whi, (ulong)d, s0, L, c0, cols, d, false);
        if (first_col) {
            for (int e = lid; e < BLK * BW_WD1; e += NT)
                DD[e] = 0.0f;
        } else {
            stage_cols(DD, BLK, BW_WD1, dD, (ulong)d, s0, L, c0, cols, d, false);
        }
        /* global fence too: below, other work-items overwrite the dD_j entries just read */
        barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        for (int c = 0; c < cols; c += BW_SL) /* the micro-tiles of each BLK x BW_SL slab */
            ACC_UNROLL for (int m = 0; m < BW_FUPS; ++m) {
                const int u = lid + m * NT, row0 = MT_ROW0(u, BW_SL), col0 = c + MT_COL0(u, BW_SL);
                /* row block i, rows t: dQC = dA KC + dSU D^T + dY VU; rows j': dVU = G^T dD + sc dY^T QC
                   (the dY terms at k = 0 only, for all the row block's pairs: phase C) */
                vfloat vq[MT_ACC], vv[MT_ACC], w[MT_ACC];
                mt_zero(vq);
                mt_zero(vv);
                if (diag)
                    mt_product_lower(vq, MT_AM(sdA, sdAt, row0), DK + col0, BW_WD1, row0);
                else
                    mt_product(vq, MT_AM(sdA, sdAt, row0), DK + col0, BW_WD1, BLK);
                if (!diag)
                    mt_product(vq, MT_AM(sdSU, sdSUt, row0), DV + col0, BW_WD1, BLK);
                if (diag) /* dY: the whole row block's (phase C) */
                    mt_product_lower(vq, MT_AM(sdY, sdYt, row0), DV + col0, BW_WD1, row0);
                if (gate) {
                    if (W) /* G[s][j'] = 0 unless j' - W <= s < j' */
                        mt_product_band(vv, sG + row0, BLK, DD + col0, BW_WD1, row0, kb - Wb, kb);
                    else if (diag)
                        mt_product_below(vv, sG + row0, BLK, DD + col0, BW_WD1, row0);
                    else
                        mt_product(vv, sG + row0, BLK, DD + col0, BW_WD1, BLK);
                }
                if (diag) {
                    mt_zero(w);
                    mt_product_from(w, sdY + row0, BLK, DQ + col0, BW_WD1, row0, 0, 0, false, lane);
                    ACC_UNROLL for (int e = 0; e < MT_ACC; ++e)
                        vv[e] += sc * w[e];
                }
                ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                    const int rr = MT_EROW(row0, e), gc = MT_ECOL(c0 + col0, e);
                    const int t = t0 + rr;
                    if (t < L && gc < d) {
                        const int n = min(VW, d - gc);
                        accumulate(dqc + tensor_offset(sdqc, b, h, t) + gc, n, first_row, sc * vq[e]);
                        accumulate(dvu + tensor_offset(sdvu, b, h, t) + gc, n, first_row, vv[e]);
                    }
                }
                /* column block j, rows s: dVC = P^T dO, dKC = sc dA^T QC, dD_j += sc dSU^T QC (t >= s) */
                vfloat vc_[MT_ACC];
                mt_zero(vc_);
                mt_zero(vq);
                mt_zero(vv);
                mt_product_from(vc_, sP + row0, BLK, DO + col0, BW_WD1, row0, diag ? 0 : -1, 0, false, lane);
                if (MT_SHARE && !diag) { /* dA^T QC and dSU^T QC: QC's fragments loaded once for both */
                    mt_product_2a(vq, vv, sdA + row0, sdSU + row0, BLK, DQ + col0, BW_WD1, BLK);
                } else {
                    mt_product_from(vq, sdA + row0, BLK, DQ + col0, BW_WD1, row0, diag ? 0 : -1, 0, false, lane);
                    if (!diag)
                        mt_product(vv, sdSU + row0, BLK, DQ + col0, BW_WD1, BLK);
                }
                ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                    const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e), gc = c0 + cv;
                    const int s = s0 + rr;
                    if (s < L && gc < d) {
                        const int n = min(VW, d - gc);
                        accumulate(dvc + tensor_offset(sdvc, b, h, s) + gc, n, first_col, vc_[e]);
                        accumulate(dkc + tensor_offset(sdkc, b, h, s) + gc, n, first_col, sc * vq[e]);
                        if (!diag) /* the gradient of D_j^(k), for iteration k - 1 */
                            gstore_part(VLOAD(DD + rr * BW_WD1 + cv) + sc * vv[e], dD + (ulong)s * d + gc, n);
                    }
                }
            }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (c0 + BW_WD1 >= d)
            break;
    }

    /* dZ = dG G (1 - G) on the allowed gate entries (0 elsewhere), into dA's and dAt's places. */
    if (gate)
        ACC_UNROLL for (int m = 0; m < FUPT; ++m) {
            const int u = lid + m * NT, row0 = MT_ROW0(u, BLK), col0 = MT_COL0(u, BLK);
            ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                const int rr = MT_EROW(row0, e), cv = MT_ECOL(col0, e);
                const vfloat gg = VLOAD(sG + rr * BLK + cv);
                const vfloat dz = select((vfloat)(0.0f), g[m][e] * gg * ((vfloat)(1.0f) - gg),
                                         isnotequal(gg, (vfloat)(0.0f)));
                VSTORE(dz, sdZ + rr * BLK + cv);
                g[m][e] = dz; /* dG is spent: the tile of dZ, for its k-major copy */
            }
            if (!MT_AM_ROWS)
                store_tile_t(sdZt, row0, col0, g[m]);
        }
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Phase D2: dKU[T_i] += sc dZ^T QU[T_j], dQU[T_j] += sc dZ KU[T_i], each over the allowed gate
       entries of its row (s < j', and j' <= s + W for CASTLE-SWL).  Tiles (BW_WD2 columns each, from
       M5 on, beside dZ and dZt): E0 QU[T_j], E1 KU[T_i], row-major. */
    const bool d2 = gate || first_row || first_col; /* anything to add or to initialise */
    __local float *E0 = lm + 5 * BLK * BLK, *E1 = E0 + BLK * BW_WD2; /* QU[T_j], KU[T_i] row-major */
    for (int c0 = 0;; c0 += BW_WD2) { /* d >= 1 */
        const int cols = min(BW_WD2, BW_PAD(BW_SL) - c0);
        if (gate) {
            stage_cols(E0, BLK, BW_WD2, pqu, squ.z, s0, L, c0, cols, d, false);
            stage_cols(E1, BLK, BW_WD2, pku, sku.z, t0, L, c0, cols, d, false);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int c = 0; c < cols && d2; c += BW_SL)
            for (int m = 0; m < BW_FUPS; ++m) {
                const int u = lid + m * NT, row0 = MT_ROW0(u, BW_SL), col0 = c + MT_COL0(u, BW_SL);
                vfloat vk[MT_ACC], vq[MT_ACC];
                mt_zero(vk);
                mt_zero(vq);
                if (gate) {
                    if (W) { /* j' - W <= s < j' */
                        mt_product_band(vk, sdZ + row0, BLK, E0 + col0, BW_WD2, row0, kb - Wb, kb);
                        mt_product_band(vq, MT_AM(sdZ, sdZt, row0), E1 + col0, BW_WD2, row0, 1 - kb, Wb + 1 - kb);
                    } else if (diag) {
                        mt_product_below(vk, sdZ + row0, BLK, E0 + col0, BW_WD2, row0);
                        mt_product_from(vq, MT_AM(sdZ, sdZt, row0), E1 + col0, BW_WD2, row0, 1, 0, false, lane);
                    } else {
                        mt_product(vk, sdZ + row0, BLK, E0 + col0, BW_WD2, BLK);
                        mt_product(vq, MT_AM(sdZ, sdZt, row0), E1 + col0, BW_WD2, BLK);
                    }
                }
                ACC_UNROLL for (int e = 0; e < MT_ACC; ++e) {
                    const int rr = MT_EROW(row0, e), gc = MT_ECOL(c0 + col0, e);
                    if (gc >= d)
                        continue;
                    const int n = min(VW, d - gc);
                    if (t0 + rr < L && (gate || first_row))
                        accumulate(dku + tensor_offset(sdku, b, h, t0 + rr) + gc, n, first_row, sc * vk[e]);
                    if (s0 + rr < L && (gate || first_col))
                        accumulate(dqu + tensor_offset(sdqu, b, h, s0 + rr) + gc, n, first_col, sc * vq[e]);
                }
            }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (c0 + BW_WD2 >= d)
            break;
    }
}

/* One launch per anti-diagonal k: work-group (j, bh); any k (the host launches it for k = 0). */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_backward_block(const int k, BACKWARD_BLOCK_PARAMS, BH0_PARAM)
{
    __local float lm[LM_BW] LM_ALIGNED;
    backward_block(lm, k, get_group_id(0), BH_INDEX, BW_ANY, BACKWARD_BLOCK_ARGS);
}

/* As castle_backward_block for k > 0 only: every pair computed as one off the diagonal. */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_backward_off(const int k, BACKWARD_BLOCK_PARAMS, BH0_PARAM)
{
    __local float lm[LM_BW] LM_ALIGNED;
    backward_block(lm, k, get_group_id(0), BH_INDEX, BW_OFF, BACKWARD_BLOCK_ARGS);
}

/* All anti-diagonals in one launch, for short sequences: work-group (0, bh) walks the block pairs
   of its batch entry and head in wavefront order, a barrier between pairs making each pair's
   global writes visible to the next (the dependencies never cross batch entries or heads).  The
   first argument is unused (the per-diagonal kernel's k).  The pair is a call (FOLD_PAIR, common.cl). */
FOLD_PAIR void backward_pair(__local float *lm LM_ALIGNED_PARAM, const int k, const int j, const int bh,
                             BACKWARD_BLOCK_PARAMS)
{
    backward_block(lm, k, j, bh, BW_ANY, BACKWARD_BLOCK_ARGS);
}
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_backward_fold(const int unused, BACKWARD_BLOCK_PARAMS, BH0_PARAM)
{
    __local float lm[LM_BW] LM_ALIGNED;
    const int N = (L + BLK - 1) / BLK;
    (void)unused;
    for (int k = N - 1; k >= 0; --k)
        for (int j = 0; j + k < N; ++j) {
            backward_pair(lm, k, j, BH_INDEX, BACKWARD_BLOCK_ARGS);
            barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
        }
}
