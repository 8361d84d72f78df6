/*
 * test_npy.c - Check tests for tools/npy.{h,c} (float32 .npy reader/writer).
 *
 * Every malformed input is crafted byte by byte here, written to a temporary
 * file made with mkstemp under /tmp, and fed to npy_read_f32.
 */
#include "../tools/npy.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

#define ERRLEN 512

/* Creates an empty temporary file and returns its path in buf. */
static void tmp_path(char buf[64])
{
    strcpy(buf, "/tmp/test_npy_XXXXXX");
    int fd = mkstemp(buf);
    ck_assert_msg(fd >= 0, "mkstemp failed");
    close(fd);
}

static void write_bytes(const char *path, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    if (n > 0)
        ck_assert_uint_eq(fwrite(bytes, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}

/* Reads a whole file into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
        size_t got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0)
            break;
    }
    fclose(fp);
    *n = len;
    return buf;
}

/* Builds a .npy image: magic, version major.0, header length field, the dict
 * text padded with spaces + '\n' so that the preamble+header is a multiple of
 * `align` (0 = no padding, just '\n'), then `ndata` data bytes (0x00..).
 * Returns the total length; buf must be large enough. */
static size_t build_npy(unsigned char *buf, int major, const char *dict, size_t align,
                        size_t ndata)
{
    size_t lensize = major == 1 ? 2 : 4;
    size_t pre = 8 + lensize;
    size_t dl = strlen(dict);
    size_t hlen = dl + 1;
    if (align != 0 && (pre + hlen) % align != 0)
        hlen += align - (pre + hlen) % align;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)((hlen >> 8) & 0xff);
    if (lensize == 4) {
        buf[10] = (unsigned char)((hlen >> 16) & 0xff);
        buf[11] = (unsigned char)((hlen >> 24) & 0xff);
    }
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hlen - dl - 1);
    buf[pre + hlen - 1] = '\n';
    for (size_t i = 0; i < ndata; i++)
        buf[pre + hlen + i] = (unsigned char)i;
    return pre + hlen + ndata;
}

static int is_zeroed(const npy_array *a)
{
    if (a->ndim != 0 || a->count != 0 || a->data != NULL)
        return 0;
    for (int i = 0; i < NPY_MAX_DIMS; i++)
        if (a->shape[i] != 0)
            return 0;
    return 1;
}

/* Writes bytes to a temp file, reads it back and expects a clean failure
 * whose message names the file and contains `phrase`. */
static void expect_fail_bytes(const void *bytes, size_t n, const char *phrase)
{
    char path[64];
    char err[ERRLEN];
    npy_array a;
    tmp_path(path);
    write_bytes(path, bytes, n);
    memset(&a, 0xAB, sizeof a); /* garbage in: must come back zeroed */
    memset(err, 'Z', sizeof err);
    int rc = npy_read_f32(path, &a, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc != 0, "expected failure containing \"%s\", got success", phrase);
    ck_assert_msg(is_zeroed(&a), "array not zeroed on failure");
    ck_assert_msg(memchr(err, '\0', sizeof err) != NULL, "err not NUL-terminated");
    ck_assert_msg(strstr(err, path) != NULL, "message does not name the file: %s", err);
    ck_assert_msg(strstr(err, phrase) != NULL, "message \"%s\" lacks \"%s\"", err, phrase);
    ck_assert_msg(strchr(err, '\n') == NULL, "message is not one line: %s", err);
}

static void expect_fail_dict(int major, const char *dict, size_t ndata, const char *phrase)
{
    unsigned char buf[4096];
    size_t n = build_npy(buf, major, dict, 64, ndata);
    expect_fail_bytes(buf, n, phrase);
}

/* Builds a file from dict + ndata bytes, expects success with the shape. */
static void expect_ok_dict(int major, const char *dict, size_t align, size_t ndata, int ndim,
                           const size_t *shape)
{
    unsigned char buf[4096];
    char path[64];
    char err[ERRLEN];
    npy_array a;
    size_t n = build_npy(buf, major, dict, align, ndata);
    tmp_path(path);
    write_bytes(path, buf, n);
    int rc = npy_read_f32(path, &a, err, sizeof err);
    unlink(path);
    ck_assert_msg(rc == 0, "dict %s: unexpected failure: %s", dict, err);
    ck_assert_str_eq(err, "");
    ck_assert_int_eq(a.ndim, ndim);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        ck_assert_uint_eq(a.shape[i], shape[i]);
        count *= shape[i];
    }
    ck_assert_uint_eq(a.count, count);
    ck_assert_ptr_nonnull(a.data);
    ck_assert_uint_eq(count * 4, ndata);
    if (ndata > 0)
        ck_assert_mem_eq(a.data, buf + n - ndata, ndata); /* little-endian host */
    npy_free(&a);
    ck_assert(is_zeroed(&a));
}

static void roundtrip(int ndim, const size_t *shape)
{
    char path[64];
    char err[ERRLEN];
    size_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= shape[i];
    float *data = malloc((count ? count : 1) * sizeof(float));
    ck_assert_ptr_nonnull(data);
    for (size_t i = 0; i < count; i++)
        data[i] = (float)i * 0.5f - 3.25f;
    if (count > 2) {
        data[1] = -0.0f;
        data[2] = 1e-40f; /* denormal */
    }
    tmp_path(path);
    ck_assert_msg(npy_write_f32(path, data, ndim, shape, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(err, "");

    /* File layout: 64-byte aligned header, exact data size. */
    size_t flen;
    unsigned char *bytes = slurp(path, &flen);
    ck_assert_uint_ge(flen, 10);
    size_t hlen = (size_t)bytes[8] | ((size_t)bytes[9] << 8);
    ck_assert_uint_eq((10 + hlen) % 64, 0);
    ck_assert_uint_eq(flen, 10 + hlen + count * 4);
    ck_assert_int_eq(bytes[10 + hlen - 1], '\n');
    free(bytes);

    npy_array a;
    ck_assert_msg(npy_read_f32(path, &a, err, sizeof err) == 0, "%s", err);
    unlink(path);
    ck_assert_int_eq(a.ndim, ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_uint_eq(a.shape[i], shape[i]);
    for (int i = ndim; i < NPY_MAX_DIMS; i++)
        ck_assert_uint_eq(a.shape[i], 0);
    ck_assert_uint_eq(a.count, count);
    ck_assert_ptr_nonnull(a.data);
    if (count > 0)
        ck_assert_mem_eq(a.data, data, count * sizeof(float));
    npy_free(&a);
    ck_assert(is_zeroed(&a));
    free(data);
}

/* ------------------------------------------------------------------------ */
/* Round trips and writer format                                             */
/* ------------------------------------------------------------------------ */

START_TEST(test_roundtrip_ndim0)
{
    roundtrip(0, NULL);
}
END_TEST

START_TEST(test_roundtrip_ndim1)
{
    const size_t s1[] = {5};
    const size_t s2[] = {1};
    const size_t s3[] = {1000};
    roundtrip(1, s1);
    roundtrip(1, s2);
    roundtrip(1, s3);
}
END_TEST

START_TEST(test_roundtrip_ndim2)
{
    const size_t s[] = {2, 3};
    const size_t s2[] = {17, 31};
    roundtrip(2, s);
    roundtrip(2, s2);
}
END_TEST

START_TEST(test_roundtrip_ndim4)
{
    const size_t s[] = {2, 3, 5, 7};
    const size_t s2[] = {1, 4, 16, 8};
    roundtrip(4, s);
    roundtrip(4, s2);
}
END_TEST

START_TEST(test_roundtrip_ndim8)
{
    const size_t s[] = {2, 1, 2, 1, 2, 1, 2, 3};
    roundtrip(8, s);
}
END_TEST

START_TEST(test_roundtrip_empty)
{
    const size_t s1[] = {0};
    const size_t s2[] = {3, 0, 2};
    const size_t s3[] = {2, 0};
    roundtrip(1, s1);
    roundtrip(3, s2);
    roundtrip(2, s3);
}
END_TEST

/* What numpy 1.x / 2.x np.save writes for np.zeros((2,3), np.float32) + data:
 * magic, version 1.0, header length 0x0076 = 118 ('v'), the dict, spaces up to
 * byte 127 which is '\n' (10 + 118 = 128, a multiple of 64). */
START_TEST(test_writer_bytes_match_numpy_2x3)
{
    static const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    unsigned char expect[128 + 24];
    memcpy(expect, "\x93NUMPY\x01\x00v\x00", 10);
    memcpy(expect + 10, dict, sizeof dict - 1);
    memset(expect + 10 + sizeof dict - 1, ' ', 128 - 10 - (sizeof dict - 1));
    expect[127] = '\n';
    const float vals[6] = {1.0f, 2.0f, -2.0f, 0.5f, 0.0f, 3.0f};
    static const unsigned char le[24] = {
        0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0xc0,
        0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x40,
    };
    memcpy(expect + 128, le, 24);

    char path[64], err[ERRLEN];
    const size_t shape[] = {2, 3};
    tmp_path(path);
    ck_assert_msg(npy_write_f32(path, vals, 2, shape, err, sizeof err) == 0, "%s", err);
    size_t n;
    unsigned char *got = slurp(path, &n);
    unlink(path);
    ck_assert_uint_eq(n, sizeof expect);
    ck_assert_mem_eq(got, expect, sizeof expect);
    free(got);
}
END_TEST

/* Header text for other ranks, checked against numpy's layout rules:
 * repr of the shape tuple, 21 - len(str(shape[0])) growth spaces when ndim>0,
 * then spaces so that 10 + len(header) is a multiple of 64, then '\n'. */
static void check_header_text(int ndim, const size_t *shape, const char *shape_repr)
{
    char path[64], err[ERRLEN];
    char dict[256];
    size_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= shape[i];
    float *data = calloc(count ? count : 1, sizeof(float));
    ck_assert_ptr_nonnull(data);
    tmp_path(path);
    ck_assert_msg(npy_write_f32(path, data, ndim, shape, err, sizeof err) == 0, "%s", err);
    free(data);
    size_t n;
    unsigned char *got = slurp(path, &n);
    unlink(path);

    int dl = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }",
                      shape_repr);
    size_t hl = (size_t)dl;
    if (ndim > 0) {
        char first[32];
        int fl = snprintf(first, sizeof first, "%zu", shape[0]);
        hl += (size_t)(21 - fl);
    }
    hl += 1;
    hl += 64 - ((10 + hl) % 64); /* numpy pads even when already aligned */
    ck_assert_uint_eq(n, 10 + hl + count * 4);
    ck_assert_mem_eq(got, "\x93NUMPY\x01\x00", 8);
    ck_assert_uint_eq((size_t)got[8] | ((size_t)got[9] << 8), hl);
    ck_assert_mem_eq(got + 10, dict, (size_t)dl);
    for (size_t i = 10 + (size_t)dl; i < 10 + hl - 1; i++)
        ck_assert_int_eq(got[i], ' ');
    ck_assert_int_eq(got[10 + hl - 1], '\n');
    free(got);
}

START_TEST(test_writer_header_text)
{
    const size_t s1[] = {5};
    const size_t s3[] = {4, 1, 2};
    const size_t s4[] = {2, 3, 5, 7};
    const size_t sbig[] = {123456789, 0}; /* long first axis, no data */
    check_header_text(0, NULL, "()");
    check_header_text(1, s1, "(5,)");
    check_header_text(3, s3, "(4, 1, 2)");
    check_header_text(4, s4, "(2, 3, 5, 7)");
    check_header_text(2, sbig, "(123456789, 0)");
    /* 10 + len(dict) + 1 is already a multiple of 64 here: numpy then adds a
     * full 64 bytes of padding (192-byte header), and so must we */
    const size_t s8[] = {0, 1000, 1000, 1000, 1000, 1000, 1000, 100};
    check_header_text(8, s8, "(0, 1000, 1000, 1000, 1000, 1000, 1000, 100)");
}
END_TEST

START_TEST(test_writer_bad_directory)
{
    char err[ERRLEN];
    const float v[1] = {1.0f};
    const size_t s[] = {1};
    const char *path = "/tmp/test_npy_no_such_dir_9f3a/out.npy";
    ck_assert_int_ne(npy_write_f32(path, v, 1, s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, path) != NULL, "%s", err);
    ck_assert_msg(strstr(err, "cannot create file") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "No such file or directory") != NULL, "%s", err);
}
END_TEST

START_TEST(test_writer_bad_args)
{
    char err[ERRLEN];
    char path[64];
    const size_t s[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    const size_t huge[] = {SIZE_MAX / 2, 3};
    const float v[1] = {0.0f};
    tmp_path(path);
    ck_assert_int_ne(npy_write_f32(path, v, 9, s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "9-dimensional") != NULL, "%s", err);
    ck_assert_int_ne(npy_write_f32(path, v, -1, s, err, sizeof err), 0);
    ck_assert_int_ne(npy_write_f32(path, NULL, 1, s, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "data is NULL") != NULL, "%s", err);
    ck_assert_int_ne(npy_write_f32(path, v, 2, NULL, err, sizeof err), 0);
    ck_assert_int_ne(npy_write_f32(path, v, 2, huge, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "overflows") != NULL, "%s", err);
    ck_assert_int_ne(npy_write_f32(NULL, v, 1, s, err, sizeof err), 0);
    /* NULL data is fine for an empty array */
    const size_t z[] = {0, 4};
    ck_assert_int_eq(npy_write_f32(path, NULL, 2, z, err, sizeof err), 0);
    npy_array a;
    ck_assert_int_eq(npy_read_f32(path, &a, err, sizeof err), 0);
    ck_assert_uint_eq(a.count, 0);
    ck_assert_int_eq(a.ndim, 2);
    ck_assert_ptr_nonnull(a.data);
    npy_free(&a);
    unlink(path);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Reader: accepted variants                                                 */
/* ------------------------------------------------------------------------ */

START_TEST(test_read_versions_2_and_3)
{
    const size_t s[] = {2, 3};
    const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    expect_ok_dict(1, d, 64, 24, 2, s);
    expect_ok_dict(2, d, 64, 24, 2, s);
    expect_ok_dict(3, d, 64, 24, 2, s);
}
END_TEST

START_TEST(test_read_header_variants)
{
    const size_t s23[] = {2, 3};
    const size_t s5[] = {5};
    const size_t s4d[] = {1, 2, 1, 3};
    /* trailing comma in tuple, no spaces */
    expect_ok_dict(1, "{'descr':'<f4','fortran_order':False,'shape':(2,3,)}", 64, 24, 2, s23);
    /* lots of whitespace, tabs, keys in another order, double quotes */
    expect_ok_dict(1, "{ \"shape\" :\t( 2 ,\t3 ) , 'fortran_order' : False ,\"descr\": \"<f4\" }",
                   64, 24, 2, s23);
    /* 16-byte alignment (old numpy) and no alignment at all are tolerated */
    expect_ok_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 16, 20, 1,
                   s5);
    expect_ok_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 0, 20, 1, s5);
    /* native byte order '=f4' on a little-endian host */
    expect_ok_dict(1, "{'descr': '=f4', 'fortran_order': False, 'shape': (5,), }", 64, 20, 1,
                   s5);
    /* Python 2 style long integers */
    expect_ok_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 64, 24,
                   2, s23);
    /* 0-d and 4-d */
    expect_ok_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 64, 4, 0, NULL);
    expect_ok_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 1, 3)}", 64, 24,
                   4, s4d);
    /* newline inside the dict (Python allows it inside braces) */
    expect_ok_dict(1, "{'descr': '<f4',\n 'fortran_order': False,\n 'shape': (5,)}", 64, 20, 1,
                   s5);
}
END_TEST

START_TEST(test_free_null_and_zeroed)
{
    npy_array a;
    memset(&a, 0, sizeof a);
    npy_free(NULL);
    npy_free(&a);
    npy_free(&a);
    ck_assert(is_zeroed(&a));
}
END_TEST

START_TEST(test_err_buffer_edge_cases)
{
    npy_array a;
    char small[12];
    /* NULL err / zero length must not crash */
    ck_assert_int_ne(npy_read_f32("/tmp/test_npy_definitely_missing.npy", &a, NULL, 0), 0);
    ck_assert(is_zeroed(&a));
    /* short buffer: truncated but NUL-terminated, no overflow */
    memset(small, 'Z', sizeof small);
    ck_assert_int_ne(npy_read_f32("/tmp/test_npy_definitely_missing.npy", &a, small,
                                  sizeof small), 0);
    ck_assert_int_eq(small[sizeof small - 1], '\0');
    ck_assert_uint_eq(strlen(small), sizeof small - 1);
    /* NULL out / NULL path */
    char err[ERRLEN];
    ck_assert_int_ne(npy_read_f32("/tmp/x.npy", NULL, err, sizeof err), 0);
    ck_assert_int_ne(npy_read_f32(NULL, &a, err, sizeof err), 0);
    ck_assert(is_zeroed(&a));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Reader: malformed files                                                    */
/* ------------------------------------------------------------------------ */

START_TEST(test_read_missing_file)
{
    char err[ERRLEN];
    npy_array a;
    const char *p = "/tmp/test_npy_no_such_file_71c2.npy";
    ck_assert_int_ne(npy_read_f32(p, &a, err, sizeof err), 0);
    ck_assert(is_zeroed(&a));
    ck_assert_msg(strstr(err, p) != NULL, "%s", err);
    ck_assert_msg(strstr(err, "cannot open file") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "No such file") != NULL, "%s", err);
}
END_TEST

START_TEST(test_read_directory)
{
    char err[ERRLEN];
    npy_array a;
    ck_assert_int_ne(npy_read_f32("/tmp", &a, err, sizeof err), 0);
    ck_assert(is_zeroed(&a));
    ck_assert_msg(strstr(err, "/tmp: ") == err, "%s", err);
}
END_TEST

START_TEST(test_read_empty_file)
{
    expect_fail_bytes("", 0, "file is empty");
}
END_TEST

START_TEST(test_read_bad_magic)
{
    static const char zip[] = "PK\x03\x04 this is a zip";
    expect_fail_bytes(zip, sizeof zip - 1, "bad magic");
    expect_fail_bytes("\x93NUMPZ\x01\x00\x10\x00", 10, "bad magic");
    expect_fail_bytes("x", 1, "bad magic");
}
END_TEST

START_TEST(test_read_truncated_preamble)
{
    expect_fail_bytes("\x93NUM", 4, "truncated .npy preamble");
    expect_fail_bytes("\x93NUMPY\x01", 7, "truncated .npy preamble");
    expect_fail_bytes("\x93NUMPY\x01\x00\x76", 9, "truncated .npy header length field");
    expect_fail_bytes("\x93NUMPY\x02\x00\x76\x00\x00", 11, "truncated .npy header length field");
}
END_TEST

START_TEST(test_read_bad_version)
{
    unsigned char buf[256];
    size_t n = build_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                         64, 4);
    buf[6] = 4;
    expect_fail_bytes(buf, n, "unsupported .npy format version 4.0");
    buf[6] = 0;
    expect_fail_bytes(buf, n, "unsupported .npy format version 0.0");
    buf[6] = 1;
    buf[7] = 1;
    expect_fail_bytes(buf, n, "unsupported .npy format version 1.1");
}
END_TEST

START_TEST(test_read_header_len_exceeds_file)
{
    unsigned char buf[256];
    size_t n = build_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                         64, 4);
    buf[8] = 0xff;
    buf[9] = 0xff;
    expect_fail_bytes(buf, n, "header length 65535 exceeds file size (132 bytes)");
    /* version 2: absurd 4-byte length */
    n = build_npy(buf, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 64, 4);
    buf[8] = buf[9] = buf[10] = buf[11] = 0xff;
    expect_fail_bytes(buf, n, "header length 4294967295 exceeds file size");
    /* zero length */
    n = build_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 64, 4);
    buf[8] = buf[9] = 0;
    expect_fail_bytes(buf, n, "header length is 0");
}
END_TEST

START_TEST(test_read_header_no_newline)
{
    unsigned char buf[256];
    size_t n = build_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                         64, 4);
    /* header length one short: last header byte is a space, not '\n' */
    buf[8] = (unsigned char)(buf[8] - 1);
    expect_fail_bytes(buf, n, "does not end with a newline");
    /* header length one long: last header byte is data */
    n = build_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 64, 4);
    buf[8] = (unsigned char)(buf[8] + 1);
    expect_fail_bytes(buf, n, "does not end with a newline");
}
END_TEST

START_TEST(test_read_bad_dtype)
{
    expect_fail_dict(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16,
                     "dtype '<f8' is not supported (need float32 '<f4')");
    expect_fail_dict(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8,
                     "dtype '>f4' is not supported");
    expect_fail_dict(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8,
                     "dtype '<i4' is not supported");
    expect_fail_dict(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (8,), }", 8,
                     "dtype '|u1' is not supported");
    expect_fail_dict(1, "{'descr': '|f4', 'fortran_order': False, 'shape': (2,), }", 8,
                     "dtype '|f4' is not supported");
    expect_fail_dict(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", 8,
                     "dtype '<f2' is not supported");
    expect_fail_dict(1, "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", 8,
                     "dtype '|O' is not supported");
    expect_fail_dict(1, "{'descr': '', 'fortran_order': False, 'shape': (1,), }", 4,
                     "dtype '' is not supported");
    expect_fail_dict(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4,
                     "structured dtypes are not supported");
    expect_fail_dict(1, "{'descr': 4, 'fortran_order': False, 'shape': (1,), }", 4,
                     "'descr' must be a dtype string");
    /* non-printable bytes are escaped in the message */
    expect_fail_dict(1, "{'descr': '<f\x01', 'fortran_order': False, 'shape': (1,), }", 4,
                     "dtype '<f\\x01' is not supported");
}
END_TEST

START_TEST(test_read_fortran_order)
{
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24,
                     "Fortran order not supported; save with C order");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", 24,
                     "'fortran_order' must be True or False, found '0'");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2, 3), }", 24,
                     "'fortran_order' must be True or False");
}
END_TEST

START_TEST(test_read_shape_negative)
{
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", 24,
                     "negative dimension '-3'");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 0,
                     "negative dimension");
}
END_TEST

START_TEST(test_read_shape_non_integer)
{
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2.5, 3), }", 24,
                     "entry '2.5' is not a non-negative integer");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 24,
                     "entry 'x' is not a non-negative integer");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1e3,), }", 24,
                     "entry '1e3' is not a non-negative integer");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0x10,), }", 24,
                     "not a non-negative integer");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': ('2',), }", 24,
                     "not a non-negative integer");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (,), }", 0,
                     "not a non-negative integer");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", 24,
                     "expected ',' or ')'");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,,), }", 24,
                     "not a non-negative integer");
}
END_TEST

START_TEST(test_read_shape_not_tuple)
{
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5), }", 20,
                     "is not a tuple");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", 24,
                     "is a list");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': 6, }", 24,
                     "must be a tuple");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': None, }", 24,
                     "must be a tuple");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, }", 24,
                     "not a non-negative integer");
}
END_TEST

START_TEST(test_read_shape_too_many_dims)
{
    expect_fail_dict(1,
                     "{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }",
                     4, "more than 8 dimensions");
}
END_TEST

START_TEST(test_read_shape_overflow)
{
    /* a single dimension beyond size_t */
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, "
                        "'shape': (99999999999999999999999,), }",
                     4, "is too large (overflows size_t)");
    /* product overflows */
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, "
                        "'shape': (4294967296, 4294967296, 2), }",
                     4, "has too many elements");
    /* element count fits but byte count does not */
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, "
                        "'shape': (4611686018427387904,), }",
                     4, "byte size overflows");
    /* huge but zero-sized: valid, empty */
    const size_t s[] = {4294967296u, 4294967296u, 0};
    expect_ok_dict(1, "{'descr': '<f4', 'fortran_order': False, "
                      "'shape': (4294967296, 4294967296, 0), }",
                   64, 0, 3, s);
}
END_TEST

START_TEST(test_read_huge_shape_small_file)
{
    /* claims 4 GiB of data; must report truncation without allocating it */
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1073741824,), }",
                     16, "truncated: expected 4294967296 bytes of data, found 16");
}
END_TEST

START_TEST(test_read_missing_keys)
{
    expect_fail_dict(1, "{'fortran_order': False, 'shape': (2,), }", 8,
                     "missing key 'descr'");
    expect_fail_dict(1, "{'descr': '<f4', 'shape': (2,), }", 8, "missing key 'fortran_order'");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, }", 8, "missing key 'shape'");
    expect_fail_dict(1, "{}", 8, "missing key 'descr'");
}
END_TEST

START_TEST(test_read_unexpected_and_duplicate_keys)
{
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8,
                     "unexpected key 'x'");
    expect_fail_dict(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                        "'shape': (2,)}",
                     8, "duplicate key 'descr'");
}
END_TEST

START_TEST(test_read_unparseable_dict)
{
    expect_fail_dict(1, "not a dict", 8, "expected a Python dict");
    expect_fail_dict(1, "", 8, "expected a Python dict");
    expect_fail_dict(1, "{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", 8,
                     "expected ':'");
    expect_fail_dict(1, "{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", 8,
                     "expected ',' or '}'");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", 8,
                     "expected ',' or '}'");
    expect_fail_dict(1, "{'descr: '<f4', 'fortran_order': False, 'shape': (2,)}", 8,
                     "malformed header");
    expect_fail_dict(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", 8,
                     "malformed header");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", 8,
                     "after the closing '}'");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}}", 8,
                     "after the closing '}'");
    expect_fail_dict(1, "{descr: '<f4', 'fortran_order': False, 'shape': (2,)}", 8,
                     "expected a quoted key");
    expect_fail_dict(1, "{'descr': '<f4',, 'fortran_order': False, 'shape': (2,)}", 8,
                     "expected a quoted key");
    {
        /* an embedded NUL byte inside the dict */
        unsigned char buf[256];
        size_t n = build_npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)@}",
                             64, 8);
        unsigned char *at = memchr(buf, '@', n);
        ck_assert_ptr_nonnull(at);
        *at = 0;
        expect_fail_bytes(buf, n, "expected ',' or '}' but found '\\x00'");
    }
    /* unterminated string at the very end of the header */
    expect_fail_dict(1, "{'descr", 8, "unterminated string");
}
END_TEST

START_TEST(test_read_data_truncated)
{
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20,
                     "truncated: expected 24 bytes of data, found 20");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0,
                     "truncated: expected 24 bytes of data, found 0");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 3,
                     "truncated: expected 4 bytes of data, found 3");
}
END_TEST

START_TEST(test_read_data_extra)
{
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 28,
                     "file has 28 bytes of data but shape needs 24 (header disagrees with file "
                     "size");
    expect_fail_dict(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", 4,
                     "file has 4 bytes of data but shape needs 0");
    /* more extra data than one internal scratch buffer */
    unsigned char *big = malloc(200000);
    ck_assert_ptr_nonnull(big);
    size_t n = build_npy(big, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 64,
                         0);
    memset(big + n, 0, 100000);
    expect_fail_bytes(big, n + 100000, "file has 100000 bytes of data but shape needs 8");
    free(big);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Fuzz-ish: truncations and header byte corruption                          */
/* ------------------------------------------------------------------------ */

/* Reads `path` after writing bytes; returns rc.  On success checks the
 * result is self-consistent and frees it. */
static int read_bytes_at(const char *path, const unsigned char *bytes, size_t n, size_t full_len)
{
    char err[ERRLEN];
    npy_array a;
    write_bytes(path, bytes, n);
    memset(err, 'Z', sizeof err);
    int rc = npy_read_f32(path, &a, err, sizeof err);
    ck_assert_msg(memchr(err, '\0', sizeof err) != NULL, "err not NUL-terminated");
    if (rc != 0) {
        ck_assert(is_zeroed(&a));
        ck_assert_msg(strncmp(err, path, strlen(path)) == 0, "message lacks path: %s", err);
        ck_assert_msg(strlen(err) > strlen(path) + 2, "empty message");
    } else {
        ck_assert_ptr_nonnull(a.data);
        ck_assert_int_ge(a.ndim, 0);
        ck_assert_int_le(a.ndim, NPY_MAX_DIMS);
        size_t count = 1;
        for (int i = 0; i < a.ndim; i++)
            count *= a.shape[i];
        ck_assert_uint_eq(count, a.count);
        ck_assert_uint_le(a.count * 4, full_len);
        volatile float sink = 0.0f;
        for (size_t i = 0; i < a.count; i++)
            sink += a.data[i]; /* touch every element (valgrind checks bounds) */
        (void)sink;
        npy_free(&a);
    }
    return rc;
}

static void fuzz_file(const char *path, const unsigned char *valid, size_t len)
{
    unsigned char *work = malloc(len);
    ck_assert_ptr_nonnull(work);

    /* Sanity: the pristine file reads. */
    ck_assert_int_eq(read_bytes_at(path, valid, len, len), 0);

    /* Every truncation must fail cleanly. */
    for (size_t cut = 0; cut < len; cut++)
        ck_assert_msg(read_bytes_at(path, valid, cut, len) != 0, "truncation at %zu accepted",
                      cut);

    /* Corrupt each preamble/header byte to several values: never crash. */
    static const unsigned char vals[] = {0x00, 0xff, ' ', '\n', '0', '9', '(', ')', ',',
                                         '\'', '-', '}', '{', ':', 'L', 0x80};
    size_t hdr_end = 10 + ((size_t)valid[8] | ((size_t)valid[9] << 8));
    ck_assert_uint_le(hdr_end, len);
    for (size_t i = 0; i < hdr_end; i++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            if (valid[i] == vals[v])
                continue;
            memcpy(work, valid, len);
            work[i] = vals[v];
            (void)read_bytes_at(path, work, len, len);
        }
    }

    /* Pseudo-random multi-byte corruption of the header (fixed seed). */
    uint32_t seed = 12345u;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(work, valid, len);
        int nflip = 1 + iter % 4;
        for (int k = 0; k < nflip; k++) {
            seed = seed * 1664525u + 1013904223u;
            size_t pos = (seed >> 8) % hdr_end;
            seed = seed * 1664525u + 1013904223u;
            work[pos] = (unsigned char)(seed >> 24);
        }
        seed = seed * 1664525u + 1013904223u;
        size_t n = (iter % 3 == 0) ? (seed >> 8) % (len + 1) : len;
        (void)read_bytes_at(path, work, n, len);
    }
    free(work);
}

START_TEST(test_fuzz_truncate_and_corrupt)
{
    char path[64], src[64], err[ERRLEN];
    const size_t s2[] = {2, 3};
    float v[12];
    for (int i = 0; i < 12; i++)
        v[i] = (float)i - 5.5f;
    tmp_path(path);
    tmp_path(src);

    /* a file as written by our writer (numpy layout) */
    ck_assert_msg(npy_write_f32(src, v, 2, s2, err, sizeof err) == 0, "%s", err);
    size_t len;
    unsigned char *valid = slurp(src, &len);
    fuzz_file(path, valid, len);
    free(valid);

    /* a compact hand-made 4-D file with no padding */
    unsigned char buf[512];
    size_t n = build_npy(buf, 1, "{'descr':'<f4','fortran_order':False,'shape':(2,1,3,2)}", 0,
                         48);
    fuzz_file(path, buf, n);

    unlink(path);
    unlink(src);
}
END_TEST

/* ------------------------------------------------------------------------ */

static Suite *npy_suite(void)
{
    Suite *s = suite_create("npy");
    TCase *tc;

    tc = tcase_create("roundtrip");
    tcase_add_test(tc, test_roundtrip_ndim0);
    tcase_add_test(tc, test_roundtrip_ndim1);
    tcase_add_test(tc, test_roundtrip_ndim2);
    tcase_add_test(tc, test_roundtrip_ndim4);
    tcase_add_test(tc, test_roundtrip_ndim8);
    tcase_add_test(tc, test_roundtrip_empty);
    suite_add_tcase(s, tc);

    tc = tcase_create("writer");
    tcase_add_test(tc, test_writer_bytes_match_numpy_2x3);
    tcase_add_test(tc, test_writer_header_text);
    tcase_add_test(tc, test_writer_bad_directory);
    tcase_add_test(tc, test_writer_bad_args);
    suite_add_tcase(s, tc);

    tc = tcase_create("reader_ok");
    tcase_add_test(tc, test_read_versions_2_and_3);
    tcase_add_test(tc, test_read_header_variants);
    tcase_add_test(tc, test_free_null_and_zeroed);
    tcase_add_test(tc, test_err_buffer_edge_cases);
    suite_add_tcase(s, tc);

    tc = tcase_create("reader_malformed");
    tcase_add_test(tc, test_read_missing_file);
    tcase_add_test(tc, test_read_directory);
    tcase_add_test(tc, test_read_empty_file);
    tcase_add_test(tc, test_read_bad_magic);
    tcase_add_test(tc, test_read_truncated_preamble);
    tcase_add_test(tc, test_read_bad_version);
    tcase_add_test(tc, test_read_header_len_exceeds_file);
    tcase_add_test(tc, test_read_header_no_newline);
    tcase_add_test(tc, test_read_bad_dtype);
    tcase_add_test(tc, test_read_fortran_order);
    tcase_add_test(tc, test_read_shape_negative);
    tcase_add_test(tc, test_read_shape_non_integer);
    tcase_add_test(tc, test_read_shape_not_tuple);
    tcase_add_test(tc, test_read_shape_too_many_dims);
    tcase_add_test(tc, test_read_shape_overflow);
    tcase_add_test(tc, test_read_huge_shape_small_file);
    tcase_add_test(tc, test_read_missing_keys);
    tcase_add_test(tc, test_read_unexpected_and_duplicate_keys);
    tcase_add_test(tc, test_read_unparseable_dict);
    tcase_add_test(tc, test_read_data_truncated);
    tcase_add_test(tc, test_read_data_extra);
    suite_add_tcase(s, tc);

    tc = tcase_create("fuzz");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_fuzz_truncate_and_corrupt);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(npy_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
