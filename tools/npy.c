/*
 * npy.c - strict reader/writer for NumPy .npy files holding float32 arrays.
 *
 * Format reference (numpy.lib.format / NEP 1):
 *   bytes 0-5   magic "\x93NUMPY"
 *   byte  6,7   major, minor version (1.0, 2.0 or 3.0)
 *   then        header length HLEN: uint16 LE (v1) or uint32 LE (v2, v3)
 *   then        HLEN bytes of header: a Python dict literal with exactly the
 *               keys 'descr', 'fortran_order', 'shape', padded with spaces and
 *               terminated by '\n' (latin-1 for v1/v2, UTF-8 for v3)
 *   then        the raw array data.
 *
 * The reader never trusts the header: every length is checked against the
 * bytes actually present, buffers grow only as data really arrives (so a
 * header claiming terabytes cannot trigger a huge allocation for a small
 * file), and all size arithmetic is overflow-checked.  Nothing is printed.
 */
#include "npy.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(CHAR_BIT == 8, "8-bit bytes required");
_Static_assert(sizeof(float) == 4, "float must be 32 bits wide");
_Static_assert(FLT_RADIX == 2 && FLT_MANT_DIG == 24 && FLT_MAX_EXP == 128,
               "float must be IEEE-754 binary32");

#if defined(__GNUC__)
#define NPY_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#define NPY_PRINTF(fmt_idx, arg_idx)
#endif

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64
/* numpy (>= 1.24) leaves room in the header so shape[0] can grow in place */
#define NPY_GROWTH_AXIS_MAX_DIGITS 21
/* initial buffer size when the file size is unknown (pipes etc.) */
#define NPY_INITIAL_CHUNK ((size_t)1 << 20)

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static int host_is_little_endian(void)
{
    const uint32_t one = 1u;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

static void swap4_inplace(unsigned char *p, size_t count)
{
    for (size_t i = 0; i < count; i++, p += 4) {
        unsigned char t0 = p[0], t1 = p[1];
        p[0] = p[3];
        p[1] = p[2];
        p[2] = t1;
        p[3] = t0;
    }
}

typedef struct npy_ctx {
    const char *path;
    char *err;
    size_t errlen;
} npy_ctx;

/* Writes "<path>: <message>" into the error buffer; the result is always
 * NUL-terminated and kept on one line (control characters become '?'). */
static void npy_fail(const npy_ctx *c, const char *fmt, ...) NPY_PRINTF(2, 3);
static void npy_fail(const npy_ctx *c, const char *fmt, ...)
{
    if (c->err == NULL || c->errlen == 0)
        return;
    c->err[0] = '\0';
    int n = snprintf(c->err, c->errlen, "%s: ", c->path ? c->path : "(null path)");
    if (n >= 0 && (size_t)n < c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    c->err[c->errlen - 1] = '\0';
    for (char *p = c->err; *p; p++) {
        unsigned char u = (unsigned char)*p;
        if (u < 0x20 || u == 0x7f)
            *p = '?';
    }
}

/* Copies up to ~max bytes of s into dst as printable ASCII, escaping other
 * bytes Python-style (\xNN) and appending "..." when cut short. */
static void printable(char *dst, size_t cap, const unsigned char *s, size_t n, size_t max)
{
    size_t o = 0;
    if (cap == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        char tmp[8];
        size_t tl;
        if (i >= max) {
            tmp[0] = tmp[1] = tmp[2] = '.';
            tl = 3;
            i = n; /* stop after this */
        } else if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\') {
            tmp[0] = (char)s[i];
            tl = 1;
        } else {
            static const char hex[] = "0123456789abcdef";
            tmp[0] = '\\';
            tmp[1] = 'x';
            tmp[2] = hex[s[i] >> 4];
            tmp[3] = hex[s[i] & 15];
            tl = 4;
        }
        if (o + tl >= cap)
            break;
        memcpy(dst + o, tmp, tl);
        o += tl;
    }
    dst[o] = '\0';
}

/* Formats a shape like Python's repr of a tuple: (), (5,), (2, 3). */
static void format_shape(char *buf, size_t cap, const size_t *shape, int ndim)
{
    size_t o = 0;
    int n;
    if (cap == 0)
        return;
    buf[0] = '\0';
#define NPY_APPEND(...)                                                      \
    do {                                                                     \
        if (o < cap) {                                                       \
            n = snprintf(buf + o, cap - o, __VA_ARGS__);                     \
            if (n < 0)                                                       \
                return;                                                      \
            o += (size_t)n;                                                  \
        }                                                                    \
    } while (0)
    NPY_APPEND("(");
    for (int i = 0; i < ndim; i++)
        NPY_APPEND(i == 0 ? "%zu" : ", %zu", shape[i]);
    NPY_APPEND(ndim == 1 ? ",)" : ")");
#undef NPY_APPEND
}

static int mul_overflows(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 1;
    *out = a * b;
    return 0;
}

enum { RD_OK = 0, RD_NOMEM, RD_IOERR };

/* Reads up to `want` bytes into a freshly malloc'd buffer (at least 1 byte is
 * allocated, so *pbuf is non-NULL on success).  The buffer starts at
 * min(want, initial) bytes and doubles only as data keeps arriving, so the
 * allocation never exceeds about twice what the file really holds.
 * *pgot receives the number of bytes read (< want means end of file). */
static int read_grow(FILE *fp, size_t want, size_t initial, unsigned char **pbuf,
                     size_t *pgot, int *perrno)
{
    size_t cap = initial < want ? initial : want;
    size_t got = 0;
    unsigned char *buf;

    if (cap == 0)
        cap = 1;
    buf = malloc(cap);
    if (buf == NULL)
        return RD_NOMEM;
    while (got < want) {
        if (got == cap) {
            size_t ncap = cap > want / 2 ? want : cap * 2;
            unsigned char *nb = realloc(buf, ncap);
            if (nb == NULL) {
                free(buf);
                return RD_NOMEM;
            }
            buf = nb;
            cap = ncap;
        }
        size_t chunk = cap - got;
        errno = 0;
        size_t n = fread(buf + got, 1, chunk, fp);
        got += n;
        if (n < chunk) {
            if (ferror(fp)) {
                *perrno = errno;
                free(buf);
                return RD_IOERR;
            }
            break; /* end of file */
        }
    }
    *pbuf = buf;
    *pgot = got;
    return RD_OK;
}

static const char *errno_text(int e)
{
    return e != 0 ? strerror(e) : "unknown I/O error";
}

/* ------------------------------------------------------------------------ */
/* Header dict parser                                                        */
/* ------------------------------------------------------------------------ */

typedef struct npy_lex {
    const unsigned char *s;
    size_t n;
    size_t i;
} npy_lex;

static int lex_is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

static void lex_skip_ws(npy_lex *L)
{
    while (L->i < L->n && lex_is_ws(L->s[L->i]))
        L->i++;
}

static int lex_peek(const npy_lex *L)
{
    return L->i < L->n ? (int)L->s[L->i] : -1;
}

static int lex_is_ident(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
}

/* Describes the token at the current position for error messages: the run of
 * characters up to a delimiter, or the single offending character. */
static void lex_token(const npy_lex *L, char *dst, size_t cap)
{
    size_t j = L->i;
    if (j >= L->n) {
        snprintf(dst, cap, "end of header");
        return;
    }
    while (j < L->n && !lex_is_ws(L->s[j]) && L->s[j] != ',' && L->s[j] != ')' &&
           L->s[j] != '}' && L->s[j] != ']' && L->s[j] != ':')
        j++;
    if (j == L->i)
        j = L->i + 1;
    char tok[80];
    printable(tok, sizeof tok, L->s + L->i, j - L->i, 24);
    /* quote like Python's repr: double quotes if the token has a ' in it */
    char q = strchr(tok, '\'') ? '"' : '\'';
    snprintf(dst, cap, "%c%s%c", q, tok, q);
}

/* Python string literal (single or double quotes, no prefix).  Escapes are
 * kept verbatim; the header keys and float32 descr never contain any.
 * Returns 0 on success, -1 if no string starts here, -2 if unterminated. */
static int lex_string(npy_lex *L, const unsigned char **start, size_t *len)
{
    int q = lex_peek(L);
    if (q != '\'' && q != '"')
        return -1;
    size_t j = L->i + 1;
    while (j < L->n) {
        unsigned char c = L->s[j];
        if (c == (unsigned char)q)
            break;
        if (c == '\n' || c == '\r')
            return -2;
        j += (c == '\\') ? 2 : 1;
    }
    if (j >= L->n)
        return -2;
    *start = L->s + L->i + 1;
    *len = j - (L->i + 1);
    L->i = j + 1;
    return 0;
}

static int str_is(const unsigned char *s, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n == m && memcmp(s, lit, m) == 0;
}

typedef struct npy_header {
    int have_descr, have_fortran, have_shape;
    const unsigned char *descr;
    size_t descr_len;
    int fortran;
    int ndim;
    size_t shape[NPY_MAX_DIMS];
} npy_header;

/* Parses the shape tuple.  Returns 0 or -1 (after reporting). */
static int parse_shape(npy_lex *L, npy_header *h, const npy_ctx *c)
{
    char tok[96];
    int nd = 0;
    int ch = lex_peek(L);

    if (ch == '[') {
        npy_fail(c, "header 'shape' is a list; it must be a tuple such as (2, 3)");
        return -1;
    }
    if (ch != '(') {
        lex_token(L, tok, sizeof tok);
        npy_fail(c, "header 'shape' must be a tuple of non-negative integers, found %s", tok);
        return -1;
    }
    L->i++;
    lex_skip_ws(L);
    if (lex_peek(L) == ')') {
        L->i++;
        h->ndim = 0;
        return 0;
    }
    for (;;) {
        size_t v = 0;
        size_t start;

        lex_skip_ws(L);
        ch = lex_peek(L);
        if (ch == '-' || ch == '+' || ch < '0' || ch > '9') {
            lex_token(L, tok, sizeof tok);
            if (ch == '-')
                npy_fail(c, "negative dimension %s in header 'shape'", tok);
            else
                npy_fail(c, "header 'shape' entry %s is not a non-negative integer", tok);
            return -1;
        }
        start = L->i;
        while (L->i < L->n && L->s[L->i] >= '0' && L->s[L->i] <= '9') {
            unsigned d = (unsigned)(L->s[L->i] - '0');
            if (v > (SIZE_MAX - d) / 10) {
                L->i = start;
                lex_token(L, tok, sizeof tok);
                npy_fail(c, "header 'shape' dimension %s is too large (overflows size_t)", tok);
                return -1;
            }
            v = v * 10 + d;
            L->i++;
        }
        /* Python 2 era numpy wrote long integers as e.g. 3L */
        if (L->i < L->n && (L->s[L->i] == 'L' || L->s[L->i] == 'l'))
            L->i++;
        ch = lex_peek(L);
        if (ch != ',' && ch != ')' && !(ch >= 0 && lex_is_ws((unsigned char)ch))) {
            L->i = start;
            lex_token(L, tok, sizeof tok);
            npy_fail(c, "header 'shape' entry %s is not a non-negative integer", tok);
            return -1;
        }
        if (nd == NPY_MAX_DIMS) {
            npy_fail(c, "header 'shape' has more than %d dimensions (not supported)",
                     NPY_MAX_DIMS);
            return -1;
        }
        h->shape[nd++] = v;

        lex_skip_ws(L);
        ch = lex_peek(L);
        if (ch == ')') {
            L->i++;
            if (nd == 1) {
                npy_fail(c, "header 'shape' (%zu) is not a tuple (a 1-D shape is written "
                         "(%zu,))", v, v);
                return -1;
            }
            break;
        }
        if (ch != ',') {
            lex_token(L, tok, sizeof tok);
            npy_fail(c, "malformed header 'shape': expected ',' or ')' but found %s "
                     "(header offset %zu)", tok, L->i);
            return -1;
        }
        L->i++;
        lex_skip_ws(L);
        if (lex_peek(L) == ')') {
            L->i++;
            break;
        }
    }
    h->ndim = nd;
    return 0;
}

/* Parses the header dict.  Returns 0 or -1 (after reporting). */
static int parse_header(const unsigned char *s, size_t n, npy_header *h, const npy_ctx *c)
{
    npy_lex L = {s, n, 0};
    char tok[96];

    memset(h, 0, sizeof *h);
    lex_skip_ws(&L);
    if (lex_peek(&L) != '{') {
        lex_token(&L, tok, sizeof tok);
        npy_fail(c, "malformed header: expected a Python dict starting with '{', found %s",
                 tok);
        return -1;
    }
    L.i++;
    for (;;) {
        const unsigned char *key;
        size_t key_len;
        int rc;

        lex_skip_ws(&L);
        if (lex_peek(&L) == '}') {
            L.i++;
            break;
        }
        rc = lex_string(&L, &key, &key_len);
        if (rc != 0) {
            if (rc == -2) {
                npy_fail(c, "malformed header: unterminated string (header offset %zu)", L.i);
            } else {
                lex_token(&L, tok, sizeof tok);
                npy_fail(c, "malformed header: expected a quoted key or '}' but found %s "
                         "(header offset %zu)", tok, L.i);
            }
            return -1;
        }
        lex_skip_ws(&L);
        if (lex_peek(&L) != ':') {
            lex_token(&L, tok, sizeof tok);
            npy_fail(c, "malformed header: expected ':' after a key but found %s "
                     "(header offset %zu)", tok, L.i);
            return -1;
        }
        L.i++;
        lex_skip_ws(&L);

        if (str_is(key, key_len, "descr")) {
            if (h->have_descr)
                goto duplicate;
            h->have_descr = 1;
            rc = lex_string(&L, &h->descr, &h->descr_len);
            if (rc == -2) {
                npy_fail(c, "malformed header: unterminated string (header offset %zu)", L.i);
                return -1;
            }
            if (rc != 0) {
                if (lex_peek(&L) == '[') {
                    npy_fail(c, "structured dtypes are not supported (need float32 '<f4')");
                } else {
                    lex_token(&L, tok, sizeof tok);
                    npy_fail(c, "header 'descr' must be a dtype string such as '<f4', "
                             "found %s", tok);
                }
                return -1;
            }
        } else if (str_is(key, key_len, "fortran_order")) {
            size_t j = L.i;
            if (h->have_fortran)
                goto duplicate;
            h->have_fortran = 1;
            while (j < L.n && lex_is_ident(L.s[j]))
                j++;
            if (str_is(L.s + L.i, j - L.i, "True")) {
                h->fortran = 1;
            } else if (str_is(L.s + L.i, j - L.i, "False")) {
                h->fortran = 0;
            } else {
                lex_token(&L, tok, sizeof tok);
                npy_fail(c, "header 'fortran_order' must be True or False, found %s", tok);
                return -1;
            }
            L.i = j;
        } else if (str_is(key, key_len, "shape")) {
            if (h->have_shape)
                goto duplicate;
            h->have_shape = 1;
            if (parse_shape(&L, h, c) != 0)
                return -1;
        } else {
            char k[80];
            printable(k, sizeof k, key, key_len, 24);
            npy_fail(c, "header has unexpected key '%s' (expected only 'descr', "
                     "'fortran_order', 'shape')", k);
            return -1;
        }

        lex_skip_ws(&L);
        if (lex_peek(&L) == ',') {
            L.i++;
            continue;
        }
        if (lex_peek(&L) == '}') {
            L.i++;
            break;
        }
        lex_token(&L, tok, sizeof tok);
        npy_fail(c, "malformed header: expected ',' or '}' but found %s (header offset %zu)",
                 tok, L.i);
        return -1;

    duplicate: {
            char k[80];
            printable(k, sizeof k, key, key_len, 24);
            npy_fail(c, "header has duplicate key '%s'", k);
            return -1;
        }
    }
    lex_skip_ws(&L);
    if (L.i != L.n) {
        lex_token(&L, tok, sizeof tok);
        npy_fail(c, "malformed header: unexpected %s after the closing '}' "
                 "(header offset %zu)", tok, L.i);
        return -1;
    }
    if (!h->have_descr || !h->have_fortran || !h->have_shape) {
        npy_fail(c, "header is missing key '%s'",
                 !h->have_descr ? "descr" : !h->have_fortran ? "fortran_order" : "shape");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Reader                                                                    */
/* ------------------------------------------------------------------------ */

int npy_read_f32(const char *path, npy_array *out, char *err, size_t errlen)
{
    const npy_ctx ctx = {path, err, errlen};
    const npy_ctx *c = &ctx;
    FILE *fp = NULL;
    unsigned char *hdr = NULL;
    unsigned char *buf = NULL;
    unsigned char pre[12];
    size_t hint = NPY_INITIAL_CHUNK; /* bytes expected to remain in the file */
    int have_size = 0;
    size_t file_size = 0;
    size_t n, hlen, got, lensize, count, want;
    npy_header h;
    char shp[256];
    int e, rc;
    int result = 1;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (out == NULL) {
        npy_fail(c, "internal error: output array pointer is NULL");
        return 1;
    }
    memset(out, 0, sizeof *out);
    if (path == NULL) {
        npy_fail(c, "no file name given");
        return 1;
    }

    errno = 0;
    fp = fopen(path, "rb");
    if (fp == NULL) {
        e = errno;
        npy_fail(c, "cannot open file: %s", errno_text(e));
        return 1;
    }

    /* The file size, when it can be determined, only sizes the first buffer
     * allocation; every check below relies on the bytes actually read. */
    if (fseek(fp, 0, SEEK_END) == 0) {
        long sz = ftell(fp);
        if (fseek(fp, 0, SEEK_SET) != 0) {
            e = errno;
            npy_fail(c, "read error: cannot seek: %s", errno_text(e));
            goto done;
        }
        if (sz >= 0 && (unsigned long)sz <= SIZE_MAX) {
            have_size = 1;
            file_size = (size_t)sz;
        }
    }
    clearerr(fp);

    /* Magic string and version. */
    errno = 0;
    n = fread(pre, 1, 8, fp);
    if (n < 8 && ferror(fp)) {
        e = errno;
        npy_fail(c, "read error: %s", errno_text(e));
        goto done;
    }
    if (n == 0) {
        npy_fail(c, "file is empty (0 bytes); not a .npy file");
        goto done;
    }
    if (memcmp(pre, NPY_MAGIC, n < NPY_MAGIC_LEN ? n : NPY_MAGIC_LEN) != 0) {
        npy_fail(c, "not a NumPy .npy file (bad magic string; expected \\x93NUMPY)");
        goto done;
    }
    if (n < 8) {
        npy_fail(c, "file too short (%zu bytes): truncated .npy preamble", n);
        goto done;
    }
    if ((pre[6] != 1 && pre[6] != 2 && pre[6] != 3) || pre[7] != 0) {
        npy_fail(c, "unsupported .npy format version %u.%u (supported: 1.0, 2.0, 3.0)",
                 (unsigned)pre[6], (unsigned)pre[7]);
        goto done;
    }

    /* Header length. */
    lensize = pre[6] == 1 ? 2 : 4;
    errno = 0;
    n = fread(pre + 8, 1, lensize, fp);
    if (n < lensize) {
        if (ferror(fp)) {
            e = errno;
            npy_fail(c, "read error: %s", errno_text(e));
        } else {
            npy_fail(c, "file too short (%zu bytes): truncated .npy header length field",
                     8 + n);
        }
        goto done;
    }
    hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    if (lensize == 4)
        hlen |= ((size_t)pre[10] << 16) | ((size_t)((uint32_t)pre[11] << 24));
    if (hlen == 0) {
        npy_fail(c, "header length is 0 (corrupt header)");
        goto done;
    }

    /* Header. */
    if (have_size)
        hint = file_size > 8 + lensize ? file_size - (8 + lensize) : 0;
    rc = read_grow(fp, hlen, hint, &hdr, &got, &e);
    if (rc == RD_NOMEM) {
        npy_fail(c, "out of memory reading a %zu-byte header", hlen);
        goto done;
    }
    if (rc == RD_IOERR) {
        npy_fail(c, "read error: %s", errno_text(e));
        goto done;
    }
    if (got < hlen) {
        npy_fail(c, "header length %zu exceeds file size (%zu bytes)", hlen, 8 + lensize + got);
        goto done;
    }
    if (hdr[hlen - 1] != '\n') {
        npy_fail(c, "header does not end with a newline (corrupt header or wrong header "
                 "length %zu)", hlen);
        goto done;
    }
    if (parse_header(hdr, hlen, &h, c) != 0)
        goto done;

    /* Semantic checks. */
    if (!(str_is(h.descr, h.descr_len, "<f4") ||
          (host_is_little_endian() && str_is(h.descr, h.descr_len, "=f4")))) {
        char d[80];
        printable(d, sizeof d, h.descr, h.descr_len, 24);
        npy_fail(c, "dtype '%s' is not supported (need float32 '<f4')", d);
        goto done;
    }
    if (h.fortran) {
        npy_fail(c, "Fortran order not supported; save with C order");
        goto done;
    }
    format_shape(shp, sizeof shp, h.shape, h.ndim);
    count = 1;
    for (int i = 0; i < h.ndim; i++) {
        if (h.shape[i] == 0) {
            count = 0;
            break;
        }
    }
    for (int i = 0; count != 0 && i < h.ndim; i++) {
        if (mul_overflows(count, h.shape[i], &count)) {
            npy_fail(c, "shape %s has too many elements (size overflows size_t)", shp);
            goto done;
        }
    }
    if (mul_overflows(count, sizeof(float), &want)) {
        npy_fail(c, "shape %s has too many elements (byte size overflows size_t)", shp);
        goto done;
    }

    /* Data: exactly `want` bytes must follow the header. */
    free(hdr);
    hdr = NULL;
    if (have_size) {
        size_t off = 8 + lensize + hlen;
        hint = file_size > off ? file_size - off : 0;
    } else {
        hint = NPY_INITIAL_CHUNK;
    }
    rc = read_grow(fp, want, hint, &buf, &got, &e);
    if (rc == RD_NOMEM) {
        npy_fail(c, "out of memory allocating %zu bytes for shape %s", want, shp);
        goto done;
    }
    if (rc == RD_IOERR) {
        npy_fail(c, "read error: %s", errno_text(e));
        goto done;
    }
    if (got < want) {
        npy_fail(c, "truncated: expected %zu bytes of data, found %zu (shape %s, float32)",
                 want, got, shp);
        goto done;
    }
    {
        unsigned char scratch[4096];
        uintmax_t extra = 0;
        for (;;) {
            errno = 0;
            n = fread(scratch, 1, sizeof scratch, fp);
            extra += n;
            if (n < sizeof scratch) {
                if (ferror(fp)) {
                    e = errno;
                    npy_fail(c, "read error: %s", errno_text(e));
                    goto done;
                }
                break;
            }
        }
        if (extra != 0) {
            npy_fail(c, "file has %ju bytes of data but shape needs %zu (header disagrees "
                     "with file size; shape %s, float32)",
                     (uintmax_t)want + extra, want, shp);
            goto done;
        }
    }

    if (!host_is_little_endian())
        swap4_inplace(buf, count);

    out->ndim = h.ndim;
    for (int i = 0; i < h.ndim; i++)
        out->shape[i] = h.shape[i];
    out->count = count;
    out->data = (float *)(void *)buf;
    buf = NULL;
    result = 0;

done:
    free(hdr);
    free(buf);
    if (fp != NULL)
        fclose(fp);
    if (result != 0)
        memset(out, 0, sizeof *out);
    else if (err != NULL && errlen > 0)
        err[0] = '\0';
    return result;
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                    */
/* ------------------------------------------------------------------------ */

int npy_write_f32(const char *path, const float *data, int ndim, const size_t *shape,
                  char *err, size_t errlen)
{
    const npy_ctx ctx = {path, err, errlen};
    const npy_ctx *c = &ctx;
    char shp[256];
    char dict[512];
    unsigned char hdr[10 + sizeof dict + NPY_ALIGN];
    size_t count = 1, nbytes, dlen, hlen, padlen, total;
    FILE *fp;
    int e = 0;
    int ok;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (path == NULL) {
        npy_fail(c, "no file name given");
        return 1;
    }
    if (ndim < 0 || ndim > NPY_MAX_DIMS) {
        npy_fail(c, "cannot write %d-dimensional array (supported: 0 to %d dimensions)", ndim,
                 NPY_MAX_DIMS);
        return 1;
    }
    if (ndim > 0 && shape == NULL) {
        npy_fail(c, "internal error: shape is NULL for a %d-dimensional array", ndim);
        return 1;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0)
            count = 0;
    }
    format_shape(shp, sizeof shp, shape, ndim);
    for (int i = 0; count != 0 && i < ndim; i++) {
        if (mul_overflows(count, shape[i], &count)) {
            npy_fail(c, "cannot write shape %s: element count overflows size_t", shp);
            return 1;
        }
    }
    if (mul_overflows(count, sizeof(float), &nbytes)) {
        npy_fail(c, "cannot write shape %s: byte size overflows size_t", shp);
        return 1;
    }
    if (data == NULL && count != 0) {
        npy_fail(c, "internal error: data is NULL for shape %s", shp);
        return 1;
    }

    /* Header exactly as numpy's format.write_array_header_1_0 lays it out. */
    {
        int m = snprintf(dict, sizeof dict,
                         "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", shp);
        if (m < 0 || (size_t)m >= sizeof dict - NPY_GROWTH_AXIS_MAX_DIGITS) {
            npy_fail(c, "internal error: header too long");
            return 1;
        }
        dlen = (size_t)m;
    }
    if (ndim > 0) {
        size_t digits = 1;
        for (size_t v = shape[0]; v >= 10; v /= 10)
            digits++;
        while (digits < NPY_GROWTH_AXIS_MAX_DIGITS) {
            dict[dlen++] = ' ';
            digits++;
        }
    }
    hlen = dlen + 1; /* + '\n' */
    padlen = NPY_ALIGN - ((NPY_MAGIC_LEN + 2 + 2 + hlen) % NPY_ALIGN);
    total = NPY_MAGIC_LEN + 2 + 2 + hlen + padlen;
    memcpy(hdr, NPY_MAGIC, NPY_MAGIC_LEN);
    hdr[6] = 1;
    hdr[7] = 0;
    hdr[8] = (unsigned char)((hlen + padlen) & 0xff);
    hdr[9] = (unsigned char)((hlen + padlen) >> 8);
    memcpy(hdr + 10, dict, dlen);
    memset(hdr + 10 + dlen, ' ', padlen);
    hdr[total - 1] = '\n';

    errno = 0;
    fp = fopen(path, "wb");
    if (fp == NULL) {
        e = errno;
        npy_fail(c, "cannot create file: %s", errno_text(e));
        return 1;
    }
    errno = 0;
    ok = fwrite(hdr, 1, total, fp) == total;
    if (ok && count != 0) {
        if (host_is_little_endian()) {
            ok = fwrite(data, sizeof(float), count, fp) == count;
        } else {
            unsigned char tmp[4096];
            const unsigned char *src = (const unsigned char *)data;
            size_t left = nbytes;
            while (ok && left > 0) {
                size_t chunk = left < sizeof tmp ? left : sizeof tmp;
                memcpy(tmp, src, chunk);
                swap4_inplace(tmp, chunk / 4);
                ok = fwrite(tmp, 1, chunk, fp) == chunk;
                src += chunk;
                left -= chunk;
            }
        }
    }
    if (!ok)
        e = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        npy_fail(c, "write failed: %s", errno_text(e));
        remove(path);
        return 1;
    }
    return 0;
}

void npy_free(npy_array *a)
{
    if (a == NULL)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}
