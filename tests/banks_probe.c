/* banks_probe: runs five kernels whose local-memory requests have known costs on 32 four-byte banks,
   for tests/oclgrind_banks.sh to check tools/oclgrind-banks.sh's counts against.  One work-group of
   64 work-items (two warps) on the first device of the first platform (under Oclgrind, its own).
   Each kernel stores to local memory once per work-item, then loads once (after a barrier), so each
   makes 2 load and 2 store requests (one per warp):
     banks_linear     a[lid]:            1 wavefront per request (32 consecutive words)
     banks_stride2    a[2 lid]:          2 (two words in each of 16 banks)
     banks_stride32   a[32 lid]:         32 (all in one bank)
     banks_broadcast  stores a[lid], loads a[0]: stores 1, loads 1 (one word, broadcast)
     banks_float4     float4 at 4 lid:   4 (512 bytes)
   Exit status 0 when every kernel ran, else 1 with a message. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>

/* K's kernel reads its float4 back through one lane, in a dot product: where all four lanes are
   summed, Oclgrind's compiler splits the load into four scalar loads (four requests of 32 words four
   apart), which is no longer the pattern under test. */
static const char source[] =
    "#define K(name, T, st, ld) __kernel void name(__global float *out) {"
    " __local T a[64 * 32]; const int l = get_local_id(0);"
    " a[st] = (T)(l); barrier(CLK_LOCAL_MEM_FENCE); T x = a[ld];"
    " out[l] = dot((float4)(1.0f), (float4)(0.0f) + (float4)(x.s0)); }\n"
    "#define S(name, st, ld) __kernel void name(__global float *out) {"
    " __local float a[64 * 32]; const int l = get_local_id(0);"
    " a[st] = (float)l; barrier(CLK_LOCAL_MEM_FENCE); out[l] = a[ld]; }\n"
    "S(banks_linear, l, l)\n"
    "S(banks_stride2, 2 * l, 2 * l)\n"
    "S(banks_stride32, 32 * l, 32 * l)\n"
    "S(banks_broadcast, l, 0)\n"
    "K(banks_float4, float4, l, l)\n";

static const char *const kernels[] = {"banks_linear", "banks_stride2", "banks_stride32", "banks_broadcast",
                                      "banks_float4"};

static int fail(const char *what, cl_int err)
{
    fprintf(stderr, "banks_probe: %s failed (%d)\n", what, (int)err);
    return 1;
}

int main(void)
{
    cl_platform_id platform;
    cl_device_id device;
    cl_int err = clGetPlatformIDs(1, &platform, NULL);
    if (err != CL_SUCCESS)
        return fail("clGetPlatformIDs", err);
    if ((err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL)) != CL_SUCCESS)
        return fail("clGetDeviceIDs", err);
    cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (!ctx)
        return fail("clCreateContext", err);
    cl_command_queue q = clCreateCommandQueue(ctx, device, 0, &err);
    if (!q)
        return fail("clCreateCommandQueue", err);
    const char *src = source;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (!prog)
        return fail("clCreateProgramWithSource", err);
    if ((err = clBuildProgram(prog, 1, &device, "", NULL, NULL)) != CL_SUCCESS)
        return fail("clBuildProgram", err);
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64 * sizeof(float), NULL, &err);
    if (!out)
        return fail("clCreateBuffer", err);
    const size_t global = 64, local = 64;
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; ++i) {
        cl_kernel k = clCreateKernel(prog, kernels[i], &err);
        if (!k)
            return fail(kernels[i], err);
        if ((err = clSetKernelArg(k, 0, sizeof out, &out)) != CL_SUCCESS ||
            (err = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL)) != CL_SUCCESS ||
            (err = clFinish(q)) != CL_SUCCESS)
            return fail(kernels[i], err);
        clReleaseKernel(k);
    }
    clReleaseMemObject(out);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
