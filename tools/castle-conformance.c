/* castle-conformance: runs libcastle's conformance case table (conformance/table.c, the table the
 * ctest suites run), or cases drawn at random (conformance/random.c), on one OpenCL device or on
 * every device, against the fp64 reference, and prints one line per device and operation.
 *
 * Exit status: 0 every case passed on every device tested, 1 a case failed or a device could not be
 * used, 2 bad usage. */
#define _POSIX_C_SOURCE 200809L
#include "castle/castle.h"
#include "conformance.h"
#include "tool.h"

#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: castle-conformance [--device P:D | --all] [--quick | --random N [--seed S]] [--ops LIST] [--json]\n"
    "                          [--verbose]\n"
    "\n"
    "Runs the conformance case table of libcastle (forward, backward, decode one token and several tokens\n"
    "per call, CASTLE and CASTLE-SWL, the causal baseline's forward, backward and decode; the layouts and\n"
    "ragged lengths the test suites use) on a device and compares every output with the fp64 reference.\n"
    "Prints one line per device and operation:\n"
    "  device=0:0 op=forward cases=35 worst_err=2.3e-07 tol=1e-05 result=PASS seconds=12.3\n"
    "(worst_err: the case nearest its tolerance, tol: that case's tolerance).\n"
    "\n"
    "options:\n"
    "  --device P:D   the device (default: $CASTLE_DEVICE, else 0:0); a flat index N also works\n"
    "  --all          every device of every OpenCL platform\n"
    "  --quick        the quick tier: small shapes, every operation (under a minute on a CPU device once\n"
    "                 its kernels are compiled); default: the full table, as the ctest suites run it\n"
    "  --random N     instead of the table, N cases per operation drawn at random within the ranges the\n"
    "                 table spans (B, H up to 3, L up to 300, d 1..256, windows, layouts, scales, ragged\n"
    "                 and empty prompts, chunks); a failed case is named by its number K: --seed S\n"
    "                 --random K+1 runs it again (with every case before it)\n"
    "  --seed S       the draw's seed, a whole number (default 1): the same seed gives the same cases on\n"
    "                 every machine\n"
    "  --ops LIST     comma list of forward,backward,decode,decode_chunked,causal_forward,\n"
    "                 causal_backward,causal_decode (default: all)\n"
    "  --json         one JSON object: per device its name, vendor, driver version, the tuning in force,\n"
    "                 and per operation the counts, worst error, tolerance, time and failures\n"
    "  --verbose      also one line per case (on stderr)\n"
    "  -h, --help     this text\n"
    "\n"
    "exit status: 0 every case passed, 1 a case failed or a device could not be used, 2 bad usage\n";

typedef struct options {
    const char *device;
    bool all, quick, json, verbose;
    bool ops[CONF_NOPS];
    unsigned long long random, seed; /* random: cases per op drawn from seed instead of the table (0: the table) */
} options;

/* The run's mode as printed: "quick", "full" or "random". */
static const char *mode_name(const options *o) { return o->random ? "random" : o->quick ? "quick" : "full"; }

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "castle-conformance: %s '%s'\n(run castle-conformance --help for usage)\n", msg, arg);
    return 2;
}

static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->seed = 1;
    bool seed_given = false;
    for (int k = 0; k < CONF_NOPS; ++k)
        o->ops[k] = true;
    enum { O_DEVICE = 256, O_ALL, O_QUICK, O_OPS, O_JSON, O_VERBOSE, O_RANDOM, O_SEED };
    static const struct option longopts[] = {{"device", required_argument, NULL, O_DEVICE},
                                             {"all", no_argument, NULL, O_ALL},
                                             {"quick", no_argument, NULL, O_QUICK},
                                             {"ops", required_argument, NULL, O_OPS},
                                             {"json", no_argument, NULL, O_JSON},
                                             {"verbose", no_argument, NULL, O_VERBOSE},
                                             {"random", required_argument, NULL, O_RANDOM},
                                             {"seed", required_argument, NULL, O_SEED},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    opterr = 0;
    int c;
    long unused;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            fputs(usage, stdout);
            exit(0);
        case O_DEVICE:
            if (castle_parse_device_spec(optarg, &unused, &unused) != CASTLE_SUCCESS)
                return usage_error("--device takes P:D or a flat index N, got", optarg);
            o->device = optarg;
            break;
        case O_ALL:
            o->all = true;
            break;
        case O_QUICK:
            o->quick = true;
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_VERBOSE:
            o->verbose = true;
            break;
        case O_RANDOM: /* a case count that fits a size_t, and not 0: a run that checks nothing must not pass */
            if (!tool_parse_whole(optarg, SIZE_MAX, &o->random) || !o->random)
                return usage_error("--random takes a whole number of cases, 1 or more, got", optarg);
            break;
        case O_SEED:
            if (!tool_parse_whole(optarg, UINT64_MAX, &o->seed))
                return usage_error("--seed takes a whole number, got", optarg);
            seed_given = true;
            break;
        case O_OPS: {
            char bad[256];
            if (!tool_parse_names(optarg, conf_op_names, CONF_NOPS, o->ops, bad, sizeof bad))
                return bad[0] ? usage_error("unknown operation in --ops:", bad)
                       : strlen(optarg) >= 256 ? usage_error("--ops is too long:", optarg)
                                               /* a run that checks nothing must not pass */
                                               : usage_error("--ops names no operation or has an empty element:",
                                                             optarg);
            break;
        }
        case ':':
            return usage_error("missing value for", argv[optind - 1]);
        default:
            return usage_error("unknown option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument", argv[optind]);
    if (o->all && o->device)
        return usage_error("--all and --device exclude each other; got --device", o->device);
    if (o->random && o->quick)
        return usage_error("--quick and --random exclude each other; got", "--quick");
    if (seed_given && !o->random)
        return usage_error("--seed goes with --random; got --seed without it:", "--seed");
    return 0;
}

/* A device info string (malloc'd, "" when unavailable). */
static char *dev_str(cl_device_id dev, cl_device_info what)
{
    size_t n = 0;
    char *s = NULL;
    if (clGetDeviceInfo(dev, what, 0, NULL, &n) == CL_SUCCESS && n > 0 && n < (1u << 20) && (s = calloc(n + 1, 1)))
        if (clGetDeviceInfo(dev, what, n, s, NULL) != CL_SUCCESS)
            s[0] = '\0';
    return s ? s : calloc(1, 1);
}

static void json_string(const char *s)
{
    putchar('"');
    for (; s && *s; ++s) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* Runs the selected ops on the device `spec`; prints its lines (or its JSON object).  Returns true when
   every case passed. */
/* Runs the table on the device `open` names (NULL: CASTLE_DEVICE, else 0:0, as the library reads
   them, so that its messages name where a bad spec came from); `spec` is the name printed. */
static bool run_device(const options *o, const char *open, const char *spec, bool first)
{
    castle_context *ctx = NULL;
    if (tool_open_device("castle-conformance", open, &ctx)) {
        if (o->json) {
            printf("%s\n  {\"device\": ", first ? "" : ",");
            json_string(spec);
            printf(", \"error\": ");
            json_string(castle_last_error());
            printf(", \"pass\": false}");
        } else {
            printf("device=%s error=could-not-open result=FAIL\n", spec);
        }
        return false;
    }
    cl_device_id dev = castle_context_device(ctx);
    char *name = dev_str(dev, CL_DEVICE_NAME), *vendor = dev_str(dev, CL_DEVICE_VENDOR),
         *driver = dev_str(dev, CL_DRIVER_VERSION);
    castle_tuning t;
    memset(&t, 0, sizeof t);
    castle_context_get_tuning(ctx, &t);
    const char *tname = castle_context_tuning_name(ctx);
    if (o->json) {
        printf("%s\n  {\"device\": ", first ? "" : ",");
        json_string(spec);
        printf(", \"name\": ");
        json_string(name);
        printf(", \"vendor\": ");
        json_string(vendor);
        printf(", \"driver_version\": ");
        json_string(driver);
        printf(", \"tuning\": {\"name\": ");
        json_string(tname);
#define JSON_PARAM_(field, macro, lo, hi, flags, help) printf(", \"" #field "\": %u", t.field);
        CASTLE_TUNING_PARAMS(JSON_PARAM_)
#undef JSON_PARAM_
        printf("}, \"mode\": \"%s\", \"ops\": [", mode_name(o));
    } else {
        char ts[256] = "?";
        castle_tuning_string(&t, ts, sizeof ts);
        char mode[96];
        if (o->random)
            snprintf(mode, sizeof mode, "random, %llu cases per operation, seed %llu", o->random, o->seed);
        else
            snprintf(mode, sizeof mode, "%s", mode_name(o));
        printf("# device %s: %s (%s, driver %s), tuning %s (%s), %s\n", spec, name, vendor, driver, tname ? tname : "?",
               ts, mode);
    }
    fflush(stdout);
    bool all_pass = true, first_op = true;
    for (int op = 0; op < CONF_NOPS; ++op) {
        if (!o->ops[op])
            continue;
        size_t ran = 0, failed = 0;
        double worst_ratio = -1, worst_err = 0, worst_tol = 0, seconds = 0;
        char fail_lines[4][600];
        const size_t cases = o->random ? (size_t)o->random : conf_ncases((conf_op)op);
        for (size_t i = 0; i < cases; ++i) {
            if (!o->random && o->quick && !conf_is_quick((conf_op)op, i))
                continue;
            conf_case c;
            if (o->random)
                conf_random_case((conf_op)op, o->seed, i, &c);
            else
                conf_table_case((conf_op)op, i, &c);
            conf_result r;
            conf_run_case(ctx, &c, &r);
            if (o->random) { /* the case's number first, to run it again */
                char prefix[32];
                const size_t np = (size_t)snprintf(prefix, sizeof prefix, "case %zu: ", i);
                size_t len = strlen(r.what);
                len = len < sizeof r.what - 1 - np ? len : sizeof r.what - 1 - np;
                memmove(r.what + np, r.what, len);
                memcpy(r.what, prefix, np);
                r.what[np + len] = '\0';
            }
            ++ran;
            seconds += r.seconds;
            const double ratio = r.err / r.tol;
            if (!(ratio <= worst_ratio)) { /* NaN and INFINITY count as the worst */
                worst_ratio = ratio;
                worst_err = r.err;
                worst_tol = r.tol;
            }
            if (o->verbose)
                fprintf(stderr, "%s %s %s: err=%.3g tol=%.3g %s%s%s (%.2f s)\n", spec, conf_op_names[op], r.what,
                        r.err, r.tol, r.pass ? "PASS" : "FAIL", r.pass ? "" : ": ", r.why, r.seconds);
            if (!r.pass) {
                if (failed < 4)
                    snprintf(fail_lines[failed], sizeof fail_lines[0], "%s: %s", r.what, r.why);
                ++failed;
            }
        }
        all_pass = all_pass && !failed;
        if (o->json) {
            printf("%s\n    {\"op\": \"%s\", \"cases\": %zu, \"failed\": %zu, \"worst_err\": %.3e, \"tol\": %.1e, "
                   "\"pass\": %s, \"seconds\": %.2f, \"failures\": [",
                   first_op ? "" : ",", conf_op_names[op], ran, failed, isfinite(worst_err) ? worst_err : 1e308,
                   worst_tol, failed ? "false" : "true", seconds);
            for (size_t k = 0; k < failed && k < 4; ++k) {
                printf("%s", k ? ", " : "");
                json_string(fail_lines[k]);
            }
            printf("]}");
        } else {
            printf("device=%s op=%s cases=%zu worst_err=%.2e tol=%.0e result=%s seconds=%.1f\n", spec,
                   conf_op_names[op], ran, worst_err, worst_tol, failed ? "FAIL" : "PASS", seconds);
            for (size_t k = 0; k < failed && k < 4; ++k)
                printf("  FAIL %s\n", fail_lines[k]);
            if (failed > 4)
                printf("  ... and %zu more failed cases\n", failed - 4);
        }
        fflush(stdout);
        first_op = false;
    }
    if (o->json)
        printf("\n  ], \"pass\": %s}", all_pass ? "true" : "false");
    free(name);
    free(vendor);
    free(driver);
    tool_close_device(ctx);
    return all_pass;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    bool pass = true;
    int tested = 0;
    if (o.json) {
        printf("{\"mode\": \"%s\", ", mode_name(&o));
        if (o.random)
            printf("\"random\": %llu, \"seed\": %llu, ", o.random, o.seed);
        printf("\"devices\": [");
    }
    if (o.all) { /* every device, as P:D */
        cl_uint np = 0;
        cl_platform_id plats[64];
        if (clGetPlatformIDs(64, plats, &np) != CL_SUCCESS)
            np = 0;
        for (cl_uint p = 0; p < np && p < 64; ++p) {
            cl_uint nd = 0;
            if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS)
                continue;
            for (cl_uint d = 0; d < nd && d < 64; ++d) {
                char spec[32];
                snprintf(spec, sizeof spec, "%u:%u", p, d);
                pass = run_device(&o, spec, spec, tested++ == 0) && pass;
            }
        }
        if (!tested) {
            fprintf(stderr, "castle-conformance: no OpenCL device found (is an OpenCL driver installed?)\n");
            pass = false;
        }
    } else {
        const char *spec = o.device ? o.device : getenv("CASTLE_DEVICE");
        pass = run_device(&o, o.device, spec && *spec ? spec : "0:0", true);
        tested = 1;
    }
    if (o.json)
        printf("\n], \"pass\": %s}\n", pass ? "true" : "false");
    else
        printf("castle-conformance: %d device%s, %s\n", tested, tested == 1 ? "" : "s", pass ? "PASS" : "FAIL");
    return pass ? 0 : 1;
}
