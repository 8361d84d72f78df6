/* libFuzzer harness for the .npy reader (tools/npy.c), built by tests/sanitize/fuzz_npy.sh with
 * clang -fsanitize=fuzzer,address,undefined.  Each input is written to a file and read with
 * npy_read_f32, as castle-run reads its inputs.  Beyond the sanitizers' checks, the reader's
 * contract is checked: on failure *out is zeroed and the message is one non-empty line naming the
 * file; on success data is non-NULL, count is the product of the shape, the data is the file's last
 * count floats, and writing the array and reading it back gives the same shape and the same bits. */
#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char in_path[64], out_path[64];

/* On tmpfs where there is one: the harness writes a file per input. */
static void make_path(char *buf, const char *tag)
{
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(buf, 64, "%s/castle_fuzz_npy_%s_XXXXXX", dir, tag);
    int fd = mkstemp(buf);
    if (fd < 0)
        abort();
    close(fd);
}

static void cleanup(void)
{
    remove(in_path);
    remove(out_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    make_path(in_path, "in");
    make_path(out_path, "out");
    atexit(cleanup);
    return 0;
}

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "fuzz_npy: contract broken: %s (line %d)\n", #cond, __LINE__);                            \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(in_path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);

    npy_array a;
    char err[512];
    memset(&a, 0x5a, sizeof a); /* the reader must overwrite it either way */
    if (npy_read_f32(in_path, &a, err, sizeof err) != 0) {
        CHECK(a.data == NULL && a.ndim == 0 && a.count == 0);
        for (int i = 0; i < NPY_MAX_DIMS; ++i)
            CHECK(a.shape[i] == 0);
        CHECK(err[0] != '\0' && strchr(err, '\n') == NULL && strstr(err, in_path) == err);
        return 0;
    }
    CHECK(err[0] == '\0' && a.data != NULL && a.ndim >= 0 && a.ndim <= NPY_MAX_DIMS);
    size_t count = 1;
    for (int i = 0; i < a.ndim; ++i)
        count *= a.shape[i];
    for (int i = a.ndim; i < NPY_MAX_DIMS; ++i)
        CHECK(a.shape[i] == 0);
    CHECK(count == a.count && count * sizeof(float) <= size);
    /* the data is exactly the file's last count floats (little-endian hosts: no byte swap) */
    const uint16_t one = 1;
    if (*(const unsigned char *)&one == 1)
        CHECK(count == 0 || !memcmp(a.data, data + size - count * sizeof(float), count * sizeof(float)));

    /* round trip */
    CHECK(npy_write_f32(out_path, a.data, a.ndim, a.ndim ? a.shape : NULL, err, sizeof err) == 0);
    npy_array b;
    CHECK(npy_read_f32(out_path, &b, err, sizeof err) == 0);
    CHECK(b.ndim == a.ndim && b.count == a.count && !memcmp(b.shape, a.shape, sizeof a.shape));
    CHECK(!memcmp(b.data, a.data, a.count * sizeof(float)));
    npy_free(&b);
    npy_free(&a);
    npy_free(&a); /* documented as harmless */
    return 0;
}
