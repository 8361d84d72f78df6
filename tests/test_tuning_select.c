/* The built-in tuning's choice for devices that no test machine has: castle__tuning_select on
 * made-up device descriptions (linked against the static library, whose internal symbols this reads).
 * A GPU whose work-groups hold fewer than 128 work-items (embedded GPUs; OpenCL 1.2 requires one)
 * gets a shrunk tuning that passes castle__tuning_check, with the decode mapping of one work-item a
 * row (the teams of decode = 2 need 128); it was refused (CASTLE_ERR_DEVICE_UNSUPPORTED) whatever
 * CASTLE_TUNING said. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "device.h"
#include "tuning.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static castle_device_info made_up(const char *vendor, cl_device_type type, size_t max_wg, cl_ulong local)
{
    castle_device_info d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "made-up %s device", vendor);
    snprintf(d.vendor, sizeof d.vendor, "%s", vendor);
    d.type = type;
    d.compute_units = 4;
    d.local_mem_size = local;
    d.max_work_group_size = max_wg;
    d.global_mem_size = d.max_alloc_size = 1ull << 30;
    d.cl_major = 1, d.cl_minor = 2;
    return d;
}

static const char *const vendors[] = {"NVIDIA Corporation", "Advanced Micro Devices, Inc.", "Intel(R) Corporation",
                                      "ARM"};
static const size_t groups[] = {32, 64};

START_TEST(test_small_work_groups)
{
    unsetenv("CASTLE_TUNING");
    setenv("CASTLE_TUNING_FILE", "/nonexistent/castle-tuning.tsv", 1);
    const castle_device_info d = made_up(vendors[_i % 4], CL_DEVICE_TYPE_GPU, groups[_i / 4], 32768);
    castle_tuning t;
    const char *name = NULL;
    castle_status st = castle__tuning_select(&d, &t, &name);
    ck_assert_msg(st == CASTLE_SUCCESS, "%s, work-groups of %zu: %s", d.vendor, d.max_work_group_size,
                  castle_last_error());
    ck_assert_msg(castle__tuning_check(&t, &d) == CASTLE_SUCCESS, "%s: the chosen tuning fails its check: %s", d.vendor,
                  castle_last_error());
    ck_assert_msg(t.decode == 1 && t.threads <= d.max_work_group_size && t.bthreads <= d.max_work_group_size &&
                      t.fthreads <= d.max_work_group_size,
                  "%s, %zu: decode=%u threads=%u bthreads=%u fthreads=%u", d.vendor, d.max_work_group_size, t.decode,
                  t.threads, t.bthreads, t.fthreads);
    ck_assert_str_eq(name, "shrunk");
    /* and CASTLE_TUNING over it is taken where it fits */
    setenv("CASTLE_TUNING", "block=16,threads=32,dchunk=16,decode=1,bthreads=32,fthreads=32", 1);
    st = castle__tuning_select(&d, &t, &name);
    unsetenv("CASTLE_TUNING");
    ck_assert_msg(st == CASTLE_SUCCESS && t.block == 16 && t.threads == 32, "CASTLE_TUNING: %s", castle_last_error());
    ck_assert_str_eq(name, "environment");
}
END_TEST

/* A device no built-in shape fits (work-groups of 4 work-items; 1 KiB of local memory): refused with
   the reason, unless CASTLE_TUNING names a tuning that fits it (none does at 1 KiB: then its own
   check's message). */
START_TEST(test_nothing_fits)
{
    unsetenv("CASTLE_TUNING");
    setenv("CASTLE_TUNING_FILE", "/nonexistent/castle-tuning.tsv", 1);
    const castle_device_info d = made_up("NVIDIA Corporation", CL_DEVICE_TYPE_GPU, 64, 1024);
    castle_tuning t;
    const char *name = NULL;
    ck_assert_int_eq(castle__tuning_select(&d, &t, &name), CASTLE_ERR_DEVICE_UNSUPPORTED);
    ck_assert_msg(strstr(castle_last_error(), "too little local memory (1024 bytes)"), "%s", castle_last_error());
    setenv("CASTLE_TUNING", "block=8,threads=8,dchunk=4,decode=1", 1);
    ck_assert_int_eq(castle__tuning_select(&d, &t, &name), CASTLE_ERR_BAD_TUNING);
    unsetenv("CASTLE_TUNING");
    ck_assert_msg(strstr(castle_last_error(), "bytes of local memory; the device has 1024"), "%s", castle_last_error());
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tuning_select");
    TCase *tc = tcase_create("made_up");
    tcase_add_loop_test(tc, test_small_work_groups, 0, 8);
    tcase_add_test(tc, test_nothing_fits);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    const int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
