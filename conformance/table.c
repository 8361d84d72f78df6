/* The conformance case table, defined once (conformance/conformance.h): the ctest suites run all of
 * it, castle-conformance all of it or the cases marked quick (Q). */
#include "conformance.h"

#define Q true

/* Forward and backward: every L of the table meets several d, windows and all three layouts; B, H > 1
   throughout.  The block size is 32 unless CASTLE_TUNING says otherwise: windows 32 and the lengths
   63/64/65 sit on either side of a block edge, 130, 257 and 1000 end in ragged blocks. */
const conf_fwd_case conf_shapes[] = {
    /* B  H  L     d    W    layout     mag  scale seed quick */
    {{2, 3, 1, 1, 0, H_BHLD, 1, 0, 1}, Q},
    {{2, 2, 1, 64, 1, H_BLHD, 1, 0, 2}, false},
    {{2, 3, 2, 8, 0, H_BHLD, 1, 0, 3}, false},
    {{3, 2, 2, 33, 1, H_PADDED, 1, 0, 4}, Q},
    {{2, 2, 7, 16, 3, H_BLHD, 1, 0, 5}, Q},
    {{2, 3, 7, 1, 0, H_BHLD, 1, 0, 6}, false},
    {{1, 2, 7, 256, 100, H_BHLD, 1, 0, 7}, Q},
    {{2, 2, 63, 64, 0, H_BHLD, 1, 0, 8}, false},
    {{2, 2, 63, 33, 32, H_BLHD, 1, 0, 9}, Q},
    {{2, 3, 63, 8, 3, H_PADDED, 1, 0, 10}, false},
    {{2, 2, 64, 16, 0, H_BLHD, 1, 0, 11}, false},
    {{2, 2, 64, 128, 1, H_BHLD, 1, 0, 12}, false},
    {{2, 1, 64, 64, 32, H_BHLD, 1, 0, 13}, false},
    {{2, 2, 65, 64, 0, H_BHLD, 1, 0, 14}, Q},
    {{2, 2, 65, 1, 3, H_BLHD, 1, 0, 15}, Q},
    {{1, 2, 65, 256, 65, H_PADDED, 1, 0, 16}, false},
    {{2, 2, 130, 33, 0, H_BLHD, 1, 0, 17}, false},
    {{2, 2, 130, 64, 100, H_BHLD, 1, 0, 18}, false},
    {{1, 3, 130, 8, 1, H_BHLD, 1, 0, 19}, Q},
    {{2, 2, 130, 128, 32, H_PADDED, 1, 0, 20}, false},
    {{2, 2, 257, 64, 0, H_BHLD, 1, 0, 21}, false},
    {{2, 2, 257, 16, 3, H_BLHD, 1, 0, 22}, false},
    {{1, 2, 257, 256, 100, H_BHLD, 1, 0, 23}, false},
    {{2, 1, 257, 1, 32, H_BHLD, 1, 0, 24}, false},
    {{2, 2, 257, 33, 1000, H_BLHD, 1, 0, 25}, false},
    {{1, 2, 1000, 64, 0, H_BHLD, 1, 0, 26}, false},
    {{1, 2, 1000, 128, 100, H_BLHD, 1, 0, 27}, false},
    {{2, 1, 1000, 16, 32, H_BHLD, 1, 0, 28}, false},
    {{1, 2, 1000, 8, 1, H_BLHD, 1, 0, 29}, false},
    {{1, 1, 1000, 256, 0, H_BHLD, 1, 0, 30}, false},
    {{1, 2, 1000, 33, 3, H_PADDED, 1, 0, 31}, false},
    {{2, 2, 100, 64, 0, H_BHLD, 1, 0.3f, 32}, Q}, /* explicit scale */
};
const size_t conf_nshapes = sizeof conf_shapes / sizeof conf_shapes[0];

/* Forward only, after h_shapes: entries of size 10 and more (scores in the thousands, saturated gates),
   against LARGE_TOL. */
const conf_fwd_case conf_forward_large[] = {
    {{2, 2, 65, 64, 0, H_BHLD, 10, 0, 101}, Q},
    {{1, 2, 130, 33, 3, H_BLHD, 10, 0, 102}, false},
    {{1, 1, 257, 128, 0, H_BHLD, 20, 0, 103}, false},
};
const size_t conf_nforward_large = sizeof conf_forward_large / sizeof conf_forward_large[0];

/* Backward: conf_shapes up to L = CONF_BACKWARD_MAX_L, where the O(L^3) reference gradients stay fast
   (test_backward's test_long covers long sequences with the O(L^2 d) reference), then these. */
const conf_fwd_case conf_backward_extra[] = {
    {{1, 2, 70, 32, 0, H_BHLD, 10, 0, 33}, Q}, /* large magnitude: BACKWARD_LARGE_TOL */
};
const size_t conf_nbackward_extra = sizeof conf_backward_extra / sizeof conf_backward_extra[0];

/* The UQ-KV cache: CASTLE and SWL (windows 1, 5, 100, and one past the capacity), d 1 to 256, three
   layouts, ragged prompts (sequences of one batch of different lengths), decoding from an empty cache,
   one token per call or chunks of 3 and 7, with and without lse. */
const conf_dec_case conf_decode_cases[] = {
    /* B  H  d   W    P          n    chunk cap layout   lse    seed quick */
    {2, 2, 16, 0, {5, 5}, 35, 1, 0, H_BHLD, true, 1, Q},
    {2, 2, 64, 5, {32, 32}, 38, 3, 0, H_BLHD, true, 2, Q},
    {2, 1, 1, 1, {33, 1}, 40, 7, 3, H_BHLD, false, 3, Q},
    {2, 2, 64, 100, {70, 33}, 60, 1, 17, H_PADDED, true, 4, Q},
    {1, 3, 16, 0, {1}, 45, 7, 0, H_BHLD, true, 5, false},
    {2, 2, 64, 0, {1, 70}, 30, 3, 0, H_BHLD, false, 6, false},
    {2, 2, 64, 5, {100, 37}, 200, 1, 0, H_BHLD, true, 7, false},
    {2, 1, 16, 100, {33, 20}, 12, 7, 0, H_BLHD, true, 8, false}, /* window past the capacity: plain CASTLE */
    {2, 2, 64, 0, {70, 70}, 230, 7, 0, H_BHLD, false, 9, false},
    {1, 2, 16, 5, {32}, 1, 1, 0, H_PADDED, true, 10, false},
    {1, 2, 16, 0, {400}, 9, 3, 0, H_BHLD, true, 11, false}, /* several work-groups per sequence, chunks of 3 */
    {2, 2, 16, 3, {0, 0}, 40, 3, 5, H_BHLD, true, 21, Q}, /* from an empty cache */
    /* d = 33: whole float4s and a tail column per cache row (the GPU decode's register-staged rows) */
    {2, 1, 33, 5, {20, 9}, 24, 3, 0, H_PADDED, true, 24, Q},
    {1, 2, 128, 0, {20}, 30, 1, 0, H_BLHD, true, 22, false}, /* wider heads: d 128 and 256 */
    {1, 2, 256, 7, {9}, 20, 3, 0, H_BHLD, true, 23, false},
};
const size_t conf_ndecode_cases = sizeof conf_decode_cases / sizeof conf_decode_cases[0];

/* The causal baseline: every L meets several d and every d several L, all three layouts.  The default
   block is 32: 63, 64, 65 sit on a block edge, 257 and 1000 end in ragged blocks. */
const conf_fwd_case conf_causal_forward_cases[] = {
    /* B  H  L     d    W  layout    mag scale seed quick */
    {{2, 3, 1, 1, 0, H_BHLD, 1, 0, 1}, Q},
    {{2, 2, 1, 256, 0, H_BLHD, 1, 0, 2}, false},
    {{2, 2, 7, 16, 0, H_BLHD, 1, 0, 3}, Q},
    {{3, 2, 7, 33, 0, H_BHLD, 1, 0, 4}, false},
    {{2, 2, 7, 1, 0, H_PADDED, 1, 0, 5}, Q},
    {{2, 2, 63, 64, 0, H_BHLD, 1, 0, 6}, false},
    {{2, 3, 63, 1, 0, H_BLHD, 1, 0, 7}, false},
    {{2, 2, 63, 128, 0, H_PADDED, 1, 0, 8}, false},
    {{2, 2, 64, 33, 0, H_BLHD, 1, 0, 9}, false},
    {{2, 2, 64, 256, 0, H_BHLD, 1, 0, 10}, false},
    {{2, 2, 65, 16, 0, H_BHLD, 1, 0, 11}, false},
    {{2, 2, 65, 64, 0, H_BLHD, 1, 0, 12}, Q},
    {{2, 2, 257, 128, 0, H_BLHD, 1, 0, 13}, false},
    {{2, 2, 257, 33, 0, H_BHLD, 1, 0, 14}, false},
    {{2, 2, 257, 256, 0, H_PADDED, 1, 0, 15}, false},
    {{2, 2, 1000, 64, 0, H_BHLD, 1, 0, 16}, false},
    {{2, 2, 1000, 16, 0, H_BLHD, 1, 0, 17}, false},
    {{2, 2, 1000, 256, 0, H_BLHD, 1, 0, 18}, false},
    {{2, 2, 100, 64, 0, H_BHLD, 1, 0.3f, 19}, Q}, /* explicit scale */
    {{2, 2, 130, 64, 0, H_BHLD, 10, 0, 31}, Q},   /* magnitudes 10 and 20: CAUSAL_LARGE_TOL */
    {{2, 2, 257, 128, 0, H_BLHD, 20, 0, 32}, false},
};
const size_t conf_ncausal_forward_cases = sizeof conf_causal_forward_cases / sizeof conf_causal_forward_cases[0];

const conf_fwd_case conf_causal_backward_cases[] = {
    {{2, 2, 1, 16, 0, H_BHLD, 1, 0, 51}, Q},
    {{2, 3, 7, 1, 0, H_BLHD, 1, 0, 52}, Q},
    {{2, 2, 7, 256, 0, H_BHLD, 1, 0, 53}, false},
    {{2, 2, 63, 33, 0, H_BLHD, 1, 0, 54}, false},
    {{2, 2, 64, 64, 0, H_PADDED, 1, 0, 55}, Q},
    {{2, 2, 65, 128, 0, H_BHLD, 1, 0, 56}, false},
    {{2, 2, 65, 16, 0, H_BLHD, 1, 0, 57}, Q},
    {{2, 2, 257, 64, 0, H_BLHD, 1, 0, 58}, false},
    {{2, 2, 257, 256, 0, H_BHLD, 1, 0, 59}, false},
    {{2, 2, 1000, 64, 0, H_BHLD, 1, 0, 60}, false},
    {{2, 2, 1000, 33, 0, H_BLHD, 1, 0, 61}, false},
    {{2, 2, 100, 128, 0, H_BHLD, 1, 0.3f, 62}, Q}, /* explicit scale */
};
const size_t conf_ncausal_backward_cases = sizeof conf_causal_backward_cases / sizeof conf_causal_backward_cases[0];

/* Prefill P, then the rest in chunks: 4 is the most rows castle_causal_decode takes, 5 and 40 go to
   the block kernel (40: two blocks of new rows); from an empty cache. */
const conf_causal_dec_case conf_causal_decode_cases[] = {
    /*  B  H  L     d    W  layout    mag scale seed   P    chunk lse   quick */
    {{2, 2, 65, 16, 0, H_BHLD, 1, 0, 81}, 33, 1, true, Q},
    {{2, 2, 70, 64, 0, H_BLHD, 1, 0, 82}, 1, 3, true, Q},
    {{2, 3, 100, 33, 0, H_PADDED, 1, 0, 83}, 64, 4, false, Q},
    {{2, 2, 130, 1, 0, H_BHLD, 1, 0, 84}, 65, 5, true, Q},
    {{2, 2, 257, 128, 0, H_BLHD, 1, 0, 85}, 100, 7, true, false},
    {{2, 2, 200, 256, 0, H_BHLD, 1, 0, 86}, 63, 40, true, false},
    {{2, 2, 40, 64, 0, H_BHLD, 1, 0, 87}, 0, 1, true, Q},
    {{2, 2, 257, 16, 0, H_BLHD, 1, 0.3f, 88}, 256, 1, true, false},
};
const size_t conf_ncausal_decode_cases = sizeof conf_causal_decode_cases / sizeof conf_causal_decode_cases[0];
