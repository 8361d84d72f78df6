/* castle-info: lists the OpenCL platforms and devices libcastle can see, what the library uses
 * of each (limits, extensions, the tuning entry it picks) and runs a small forward self-test
 * against the fp64 reference.
 *
 * Exit status: 0 every listed device passed, 1 some device failed (no castle context, failed
 * self-test), 2 bad usage (including a --device that names no device), 3 no OpenCL platform (or
 * no device at all). */
#define _POSIX_C_SOURCE 200809L

#include "castle/castle.h"

#include "harness.h"
#include "tool.h"
#include "tolerance.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_PASS 0
#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define EXIT_NO_PLATFORM 3

/* Same caps as castle_context_create_default, so that flat indices agree with the library. */
#define MAX_PLATFORMS 64
#define MAX_DEVICES 64

static const char *prog = "castle-info";

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: %s [--device P:D | --device N] [--no-self-test]\n"
            "       %s --table | --help | --version\n"
            "\n"
            "Lists every OpenCL platform and device, with what libcastle uses of each device (type,\n"
            "compute units, local/global memory, work-group and allocation limits, fp16/fp64 support,\n"
            "whether the tuning's register caps apply (NVIDIA's cl_nv_compiler_options), OpenCL and\n"
            "driver versions), the tuning entry the library picks for it and the device's loop limit\n"
            "(Mesa's llvmpipe ends a work-item's loops after 65535 iterations; CASTLE_LOOP_LIMIT), then\n"
            "runs a small forward self-test on each device against the fp64 reference (tolerance %.0e).\n"
            "\n"
            "Options:\n"
            "  --device P:D   only device D of platform P\n"
            "  --device N     only the N-th device counting across platforms (the index printed\n"
            "                 as #N; the same spec CASTLE_DEVICE and castle_context_create_default take)\n"
            "  --no-self-test list the devices only; do not run the self-test\n"
            "  --table        print the built-in tuning table, one entry per line in match order\n"
            "                 (NAME<tab>TUNING, the last entry the default; TUNING in CASTLE_TUNING's\n"
            "                 syntax), and exit without opening any device\n"
            "  --version      print the libcastle version and exit\n"
            "  -h, --help     print this help and exit\n"
            "\n"
            "Environment: CASTLE_TUNING overrides the tuning as in the library (shown as\n"
            "'environment'); OCL_ICD_VENDORS / POCL_DEVICES etc. are read by the OpenCL loader/driver.\n"
            "\n"
            "Exit status:\n"
            "  0  every listed device passed (with --no-self-test: a castle context could be created\n"
            "     on every listed device)\n"
            "  1  some device failed: no castle context could be created on it, or its self-test failed\n"
            "  2  bad usage: unknown option, malformed --device, or a --device that names no device\n"
            "  3  no OpenCL platform (or no OpenCL device at all) was found\n",
            prog, prog, FORWARD_TOL);
}

/* ---- small helpers --------------------------------------------------------------------------- */

static const char *cl_err_name(cl_int err)
{
    if (err == -1001)
        return "CL_PLATFORM_NOT_FOUND_KHR";
    return castle_status_string((castle_status)err);
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
}

/* A malloc'd device info string; "" on failure (never NULL unless out of memory). */
static char *dev_str(cl_device_id dev, cl_device_info what)
{
    size_t n = 0;
    if (clGetDeviceInfo(dev, what, 0, NULL, &n) != CL_SUCCESS || n == 0 || n > (1u << 24))
        return calloc(1, 1);
    char *s = calloc(n + 1, 1);
    if (!s)
        return NULL;
    if (clGetDeviceInfo(dev, what, n, s, NULL) != CL_SUCCESS)
        s[0] = '\0';
    trim(s);
    return s;
}

static char *plat_str(cl_platform_id p, cl_platform_info what)
{
    size_t n = 0;
    if (clGetPlatformInfo(p, what, 0, NULL, &n) != CL_SUCCESS || n == 0 || n > (1u << 24))
        return calloc(1, 1);
    char *s = calloc(n + 1, 1);
    if (!s)
        return NULL;
    if (clGetPlatformInfo(p, what, n, s, NULL) != CL_SUCCESS)
        s[0] = '\0';
    trim(s);
    return s;
}

static const char *or_unknown(const char *s) { return s && *s ? s : "(unknown)"; }

static void fmt_bytes(char *buf, size_t n, cl_ulong bytes, bool ok)
{
    if (!ok) {
        snprintf(buf, n, "(unknown)");
        return;
    }
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    if (u == 0)
        snprintf(buf, n, "%llu bytes", (unsigned long long)bytes);
    else if (v == floor(v))
        snprintf(buf, n, "%.0f %s (%llu bytes)", v, unit[u], (unsigned long long)bytes);
    else
        snprintf(buf, n, "%.1f %s (%llu bytes)", v, unit[u], (unsigned long long)bytes);
}

static void fmt_type(char *buf, size_t n, cl_device_type t, bool ok)
{
    buf[0] = '\0';
    if (!ok) {
        snprintf(buf, n, "(unknown)");
        return;
    }
    static const struct {
        cl_device_type bit;
        const char *name;
    } names[] = {{CL_DEVICE_TYPE_CPU, "CPU"},
                 {CL_DEVICE_TYPE_GPU, "GPU"},
                 {CL_DEVICE_TYPE_ACCELERATOR, "ACCELERATOR"},
                 {CL_DEVICE_TYPE_CUSTOM, "CUSTOM"},
                 {CL_DEVICE_TYPE_DEFAULT, "DEFAULT"}};
    size_t used = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
        if (!(t & names[i].bit))
            continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? "|" : "", names[i].name);
        if (w < 0 || (size_t)w >= n - used)
            return;
        used += (size_t)w;
    }
    if (!used)
        snprintf(buf, n, "0x%llx", (unsigned long long)t);
}

/* The reason for a failed library call: castle_last_error() (which already starts with the status
   name) or, when it is empty or about something else, the status name in front of it. */
static void fmt_reason(char *buf, size_t n, castle_status st, const char *fallback)
{
    const char *name = castle_status_string(st);
    const char *msg = castle_last_error();
    if (!msg || !*msg)
        snprintf(buf, n, "%s%s%s", name, fallback ? ": " : "", fallback ? fallback : "");
    else if (!strncmp(msg, name, strlen(name)))
        snprintf(buf, n, "%s", msg);
    else
        snprintf(buf, n, "%s: %s", name, msg);
}

/* "P:D" / "N" as the library reads them (castle_parse_device_spec); for "N", *p = N and *d = -1. */
static bool parse_spec(const char *spec, long *p, long *d, bool *flat)
{
    long plat, dev;
    if (castle_parse_device_spec(spec, &plat, &dev) != CASTLE_SUCCESS)
        return false;
    *flat = plat < 0;
    *p = *flat ? dev : plat;
    *d = *flat ? -1 : dev;
    return true;
}

/* ---- one device ------------------------------------------------------------------------------ */

static const char *layout_name(h_layout l) { return l == H_BLHD ? "BLHD" : l == H_PADDED ? "padded" : "BHLD"; }

/* Runs the self-test cases on ctx; prints the verdict.  Returns true on PASS. */
static bool self_test(castle_context *ctx, cl_context clc, cl_device_id dev)
{
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueue(clc, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    if (!q) {
        printf("    self-test: FAIL (clCreateCommandQueue failed: %s (%d))\n", cl_err_name(err), (int)err);
        return false;
    }
    static const h_fwd_case cases[] = {
        {.B = 2, .H = 2, .L = 70, .d = 16, .W = 0, .layout = H_BHLD, .mag = 1.0, .scale = 0, .seed = 11},
        {.B = 2, .H = 2, .L = 70, .d = 16, .W = 5, .layout = H_BLHD, .mag = 1.0, .scale = 0, .seed = 12},
        {.B = 1, .H = 3, .L = 45, .d = 24, .W = 2, .layout = H_PADDED, .mag = 1.0, .scale = 0, .seed = 13},
    };
    const size_t ncases = sizeof cases / sizeof cases[0];
    double worst = 0;
    bool pass = true;
    char reason[1400] = "";
    for (size_t i = 0; i < ncases && pass; ++i) {
        const h_fwd_case *c = &cases[i];
        char what[128];
        snprintf(what, sizeof what, "case B=%zu H=%zu L=%zu d=%zu W=%ld %s", c->B, c->H, c->L, c->d, c->W,
                 layout_name(c->layout));
        castle_tuning t;
        castle_context_get_tuning(ctx, &t); /* clears castle_last_error() so no stale message shows */
        h_fwd_out out;
        castle_status st = h_run_forward(ctx, q, c, true, false, &out);
        if (st != CASTLE_SUCCESS) {
            char r[1200];
            fmt_reason(r, sizeof r, st,
                       st == CASTLE_ERR_OUT_OF_HOST_MEMORY ? "the test buffers could not be allocated or written"
                                                           : NULL);
            snprintf(reason, sizeof reason, "%s: %s", what, r);
            pass = false;
            printf("    self-test: FAIL (%s)\n", reason);
            if (st == CASTLE_ERR_BUILD_FAILED)
                tool_print_build_log(stdout, ctx, TOOL_BUILD_LOG_LINES);
            break;
        }
        const double e = fmax(out.err_o, out.err_lse);
        if (!out.finite) {
            snprintf(reason, sizeof reason, "%s: non-finite output", what);
            pass = false;
        } else if (!out.guards_ok) {
            snprintf(
                reason, sizeof reason,
                "%s: guard violation (a write outside the O/lse elements or the workspace, or an input was modified)",
                what);
            pass = false;
        } else if (!(e <= FORWARD_TOL)) {
            snprintf(reason, sizeof reason, "%s: max error %.3g (O %.3g, lse %.3g) exceeds tolerance %.0e", what, e,
                     out.err_o, out.err_lse, FORWARD_TOL);
            pass = false;
        } else if (e > worst) {
            worst = e;
        }
        h_fwd_out_free(&out);
        if (!pass)
            printf("    self-test: FAIL (%s)\n", reason);
    }
    clReleaseCommandQueue(q);
    if (pass)
        printf("    self-test: PASS (max error %.1e)\n", worst);
    return pass;
}

/* Prints everything about one device and runs its self-test.  Returns true when the device is
   usable by the library (and passed the self-test, if run). */
static bool report_device(cl_device_id dev, cl_uint p, cl_uint d, long flat, bool run_test)
{
    char *name = dev_str(dev, CL_DEVICE_NAME);
    printf("  Device %u:%u (#%ld): %s\n", p, d, flat, or_unknown(name));
    free(name);

    char *vendor = dev_str(dev, CL_DEVICE_VENDOR);
    printf("    vendor: %s\n", or_unknown(vendor));
    free(vendor);

    char buf[128];
    cl_device_type type = 0;
    const bool type_ok = clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL) == CL_SUCCESS;
    fmt_type(buf, sizeof buf, type, type_ok);
    printf("    type: %s\n", buf);

    cl_uint cu = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL) == CL_SUCCESS)
        printf("    compute units: %u\n", cu);
    else
        printf("    compute units: (unknown)\n");

    cl_ulong v = 0;
    bool ok = clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof v, &v, NULL) == CL_SUCCESS;
    fmt_bytes(buf, sizeof buf, v, ok);
    printf("    local memory: %s\n", buf);

    size_t wg = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) == CL_SUCCESS)
        printf("    max work-group size: %zu\n", wg);
    else
        printf("    max work-group size: (unknown)\n");

    v = 0;
    ok = clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof v, &v, NULL) == CL_SUCCESS;
    fmt_bytes(buf, sizeof buf, v, ok);
    printf("    global memory: %s\n", buf);

    v = 0;
    ok = clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof v, &v, NULL) == CL_SUCCESS;
    fmt_bytes(buf, sizeof buf, v, ok);
    printf("    max allocation: %s\n", buf);

    char *ext = dev_str(dev, CL_DEVICE_EXTENSIONS);
    printf("    fp16: %s\n", ext && strstr(ext, "cl_khr_fp16") ? "yes" : "no");
    printf("    fp64: %s\n", ext && strstr(ext, "cl_khr_fp64") ? "yes" : "no");
    printf("    register caps (tuning regs, fregs): %s\n",
           ext && strstr(ext, "cl_nv_compiler_options") ? "yes (cl_nv_compiler_options)" : "no");
    free(ext);

    char *ver = dev_str(dev, CL_DEVICE_VERSION);
    printf("    OpenCL version: %s\n", or_unknown(ver));
    free(ver);
    char *drv = dev_str(dev, CL_DRIVER_VERSION);
    printf("    driver version: %s\n", or_unknown(drv));
    free(drv);
    fflush(stdout);

    cl_int err = CL_SUCCESS;
    cl_context clc = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    if (!clc) {
        printf("    tuning: unavailable (clCreateContext failed: %s (%d))\n", cl_err_name(err), (int)err);
        if (run_test)
            printf("    self-test: FAIL (clCreateContext failed: %s (%d))\n", cl_err_name(err), (int)err);
        return false;
    }
    castle_context *ctx = NULL;
    castle_status st = castle_context_create(clc, dev, &ctx);
    if (st != CASTLE_SUCCESS || !ctx) {
        char r[1200];
        fmt_reason(r, sizeof r, st, NULL);
        printf("    tuning: unavailable (castle_context_create failed: %s)\n", r);
        if (run_test)
            printf("    self-test: FAIL (castle_context_create failed: %s)\n", r);
        clReleaseContext(clc);
        return false;
    }
    castle_tuning t;
    char ts[256];
    if (castle_context_get_tuning(ctx, &t) == CASTLE_SUCCESS && castle_tuning_string(&t, ts, sizeof ts) == CASTLE_SUCCESS)
        printf("    tuning: %s (%s)\n", or_unknown(castle_context_tuning_name(ctx)), ts);
    else
        printf("    tuning: %s (unreadable)\n", or_unknown(castle_context_tuning_name(ctx)));
    const unsigned long limit = castle_context_loop_limit(ctx);
    if (limit)
        printf("    loop limit: %lu iterations per work-item (longer loops run in pieces: CASTLE_LOOP_LIMIT)\n", limit);
    else
        printf("    loop limit: none\n");
    fflush(stdout);

    bool pass = true;
    if (run_test)
        pass = self_test(ctx, clc, dev);
    fflush(stdout);
    castle_context_destroy(ctx);
    clReleaseContext(clc);
    return pass;
}

/* --table: the built-in tuning table, NAME<tab>TUNING per entry. */
static int print_table(void)
{
    size_t n = 0;
    castle_tuning_table_entry(0, NULL, NULL, &n);
    for (size_t i = 0; i < n; ++i) {
        const char *name = NULL;
        castle_tuning t;
        char ts[256];
        if (castle_tuning_table_entry(i, &name, &t, NULL) != CASTLE_SUCCESS ||
            castle_tuning_string(&t, ts, sizeof ts) != CASTLE_SUCCESS) {
            fprintf(stderr, "%s: tuning table entry %zu: %s\n", prog, i, castle_last_error());
            return EXIT_FAIL;
        }
        printf("%s\t%s\n", name, ts);
    }
    return EXIT_PASS;
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    const char *spec = NULL;
    bool run_test = true, version = false, table = false; /* acted on once every argument is read */
    enum { O_VERSION = 256, O_NO_SELF_TEST, O_DEVICE, O_TABLE };
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'},
                                             {"version", no_argument, NULL, O_VERSION},
                                             {"no-self-test", no_argument, NULL, O_NO_SELF_TEST},
                                             {"device", required_argument, NULL, O_DEVICE},
                                             {"table", no_argument, NULL, O_TABLE},
                                             {NULL, 0, NULL, 0}};
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return EXIT_PASS;
        } else if (c == O_VERSION) {
            version = true;
        } else if (c == O_TABLE) {
            table = true;
        } else if (c == O_NO_SELF_TEST) {
            run_test = false;
        } else if (c == O_DEVICE) {
            spec = optarg;
        } else if (c == ':') {
            fprintf(stderr, "%s: --device needs an argument (P:D or N); try '%s --help'\n", prog, prog);
            return EXIT_USAGE;
        } else {
            fprintf(stderr, "%s: unknown argument '%s'; try '%s --help'\n", prog, argv[optind - 1], prog);
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unknown argument '%s'; try '%s --help'\n", prog, argv[optind], prog);
        return EXIT_USAGE;
    }
    long sel_p = -1, sel_d = -1;
    bool sel_flat = false;
    if (spec && !parse_spec(spec, &sel_p, &sel_d, &sel_flat)) {
        fprintf(stderr, "%s: --device '%s' is malformed: expected P:D (platform:device) or N (flat index)\n", prog,
                spec);
        return EXIT_USAGE;
    }
    if (version) {
        printf("castle-info (libcastle) %s\n", castle_version_string());
        return EXIT_PASS;
    }
    if (table)
        return print_table();

    printf("castle-info: libcastle %s\n", castle_version_string());
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    if (err != CL_SUCCESS || np == 0) {
        fflush(stdout);
        fprintf(stderr,
                "%s: no OpenCL platform found (clGetPlatformIDs: %s (%d), %u platforms).\n"
                "Install an OpenCL ICD (driver), e.g. the portable CPU implementation PoCL\n"
                "(Debian/Ubuntu: 'apt install pocl-opencl-icd'), or your GPU vendor's OpenCL driver, and check\n"
                "that /etc/OpenCL/vendors lists it (or that OCL_ICD_VENDORS points at it).\n",
                prog, cl_err_name(err), (int)err, err == CL_SUCCESS ? np : 0u);
        return EXIT_NO_PLATFORM;
    }
    if (np > MAX_PLATFORMS) {
        printf("note: %u platforms found; libcastle only sees the first %d\n", np, MAX_PLATFORMS);
        np = MAX_PLATFORMS;
    }
    cl_platform_id plats[MAX_PLATFORMS];
    err = clGetPlatformIDs(np, plats, NULL);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "%s: clGetPlatformIDs failed: %s (%d)\n", prog, cl_err_name(err), (int)err);
        return EXIT_NO_PLATFORM;
    }

    long flat = 0;          /* flat index, as castle_context_create_default counts */
    long total_devices = 0; /* every device on every platform */
    int listed = 0, passed = 0;
    bool matched = false;
    for (cl_uint p = 0; p < np; ++p) {
        cl_uint nd = 0;
        cl_int derr = clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
        if (derr != CL_SUCCESS)
            nd = 0;
        cl_device_id devs[MAX_DEVICES];
        cl_uint nd_capped = nd > MAX_DEVICES ? MAX_DEVICES : nd;
        if (nd_capped && (derr = clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd_capped, devs, NULL)) != CL_SUCCESS)
            nd_capped = 0;

        /* With --device, only the platform holding the selected device is printed. */
        bool show_platform = true;
        if (spec) {
            if (sel_flat)
                show_platform = sel_p >= flat && sel_p < flat + (long)nd_capped;
            else
                show_platform = (long)p == sel_p && sel_d < (long)nd_capped;
        }
        if (show_platform) {
            char *pn = plat_str(plats[p], CL_PLATFORM_NAME);
            char *pv = plat_str(plats[p], CL_PLATFORM_VENDOR);
            char *pver = plat_str(plats[p], CL_PLATFORM_VERSION);
            printf("\nPlatform %u: %s\n", p, or_unknown(pn));
            printf("  vendor: %s\n", or_unknown(pv));
            printf("  version: %s\n", or_unknown(pver));
            free(pn);
            free(pv);
            free(pver);
            if (nd_capped == 0)
                printf("  (no devices: clGetDeviceIDs: %s (%d))\n", cl_err_name(derr), (int)derr);
            else if (nd > MAX_DEVICES)
                printf("  note: %u devices; libcastle only sees the first %d\n", nd, MAX_DEVICES);
        }
        for (cl_uint d = 0; d < nd_capped; ++d, ++flat) {
            ++total_devices;
            if (spec) {
                bool want = sel_flat ? flat == sel_p : ((long)p == sel_p && (long)d == sel_d);
                if (!want)
                    continue;
                matched = true;
            }
            ++listed;
            if (report_device(devs[d], p, d, flat, run_test))
                ++passed;
            fflush(stdout);
        }
    }

    if (spec && !matched) {
        fflush(stdout);
        fprintf(stderr,
                "%s: no OpenCL device '%s' (%ld device%s on %u platform%s; run %s without --device to list them)\n",
                prog, spec, total_devices, total_devices == 1 ? "" : "s", np, np == 1 ? "" : "s", prog);
        return EXIT_USAGE;
    }
    if (total_devices == 0) {
        fflush(stdout);
        fprintf(stderr,
                "%s: the OpenCL platforms report no devices.  Install a working OpenCL ICD, e.g.\n"
                "'apt install pocl-opencl-icd' (Debian/Ubuntu), or check your GPU driver.\n",
                prog);
        return EXIT_NO_PLATFORM;
    }

    if (run_test)
        printf("\n%s: %d device%s tested, %d passed, %d failed\n", prog, listed, listed == 1 ? "" : "s", passed,
               listed - passed);
    else
        printf("\n%s: %d device%s listed (self-test skipped), %d usable, %d without a castle context\n", prog, listed,
               listed == 1 ? "" : "s", passed, listed - passed);
    return passed == listed ? EXIT_PASS : EXIT_FAIL;
}
