/**
 * @file kernel_trace.c
 * @brief Every kernel's start and end as it really ran, also inside CUDA graphs: a timeline of
 *        a decode step without serializing it.
 *
 * Nsight Compute measures one kernel at a time: it serializes the launches, so a kernel's
 * duration there leaves out what programmatic dependent launch overlaps, and the sum of a
 * step's durations is not the step.  This library records the kernels of an unmodified run by
 * CUPTI's activity API (the records the driver writes for each kernel: start and end on the
 * GPU's clock, the stream, the graph and graph node it came from, its grid), the way a timeline
 * profiler does, and writes one CSV line per kernel when the program exits.  The records cost a
 * little time per kernel; the order and the overlaps are the run's.
 *
 * The driver loads it into any CUDA program named by CUDA_INJECTION64_PATH and calls
 * InitializeInjection() before the program's first CUDA call:
 *
 *     gcc -std=c11 -O2 -shared -fPIC -Wall -Wextra -Werror -I/usr/local/cuda/include \
 *         -o /tmp/libkernel_trace.so tools/kernel_trace.c -L/usr/local/cuda/lib64 -lcupti
 *     CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so MMOE_KERNEL_TRACE=/tmp/k.csv ./megamoe ...
 *     python3 tools/kernel_trace.py /tmp/k.csv
 *
 * (the CUPTI library must be on the loader's path: LD_LIBRARY_PATH=/usr/local/cuda/lib64 or the
 * toolkit's extras/CUPTI/lib64).  Columns: start and end in ns (the GPU's timestamps), stream,
 * graph id and graph node id (0 outside a graph), correlation id (the API call that launched it:
 * one graph launch for all of its nodes), grid and block sizes, dynamic shared memory, the
 * kernel's (mangled) name.  MMOE_KERNEL_TRACE names the output (required: nothing is traced
 * without it); the file is written whole at exit, through a temporary name and a rename.
 * Not part of the project's build.
 */
#define _GNU_SOURCE
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/** Size of one activity buffer handed to CUPTI. */
#define TRACE_BUF_BYTES (8u << 20)
/** Alignment CUPTI requires of a buffer. */
#define TRACE_BUF_ALIGN 8

/** The output being written: opened at the first completed buffer, closed and renamed at exit. */
typedef struct trace_out {
    char path[4096];
    char tmp[4200];
    FILE *f;
    unsigned long long kernels;
    unsigned long long dropped;
} trace_out;

/* CUPTI's callbacks carry no user pointer, so the one output lives here (the library's only state). */
static trace_out g_out;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(TRACE_BUF_ALIGN, TRACE_BUF_BYTES);
    *size = *buf ? TRACE_BUF_BYTES : 0;
    *max_records = 0;
}

static void write_kernel(const CUpti_ActivityKernel10 *k)
{
    if (!g_out.f)
        return;
    fprintf(g_out.f, "%llu,%llu,%u,%u,%llu,%u,%d,%d,%d,%d,%d,%d,%d,\"%s\"\n", (unsigned long long)k->start,
            (unsigned long long)k->end, k->streamId, k->graphId, (unsigned long long)k->graphNodeId, k->correlationId,
            k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ, k->dynamicSharedMemory,
            k->name ? k->name : "?");
    g_out.kernels++;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            write_kernel((const CUpti_ActivityKernel10 *)rec);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        g_out.dropped += dropped;
    free(buf);
}

/** Before a context goes, its buffers are flushed: the program may destroy it before exit. */
static void CUPTIAPI on_resource(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void *data)
{
    (void)user;
    (void)data;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

static void trace_finish(void)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (!g_out.f)
        return;
    const int bad = ferror(g_out.f) | fclose(g_out.f);
    g_out.f = NULL;
    if (bad || rename(g_out.tmp, g_out.path) != 0) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", g_out.path);
        remove(g_out.tmp);
        return;
    }
    fprintf(stderr, "kernel_trace: %llu kernels (%llu records dropped) -> %s\n", g_out.kernels, g_out.dropped,
            g_out.path);
}

/** Called by the driver before the program's first CUDA call (CUDA_INJECTION64_PATH). */
int InitializeInjection(void)
{
    const char *path = getenv("MMOE_KERNEL_TRACE");
    if (!path || !*path || strlen(path) >= sizeof g_out.path) {
        fprintf(stderr, "kernel_trace: set MMOE_KERNEL_TRACE to the output's path; tracing nothing\n");
        return 1;
    }
    strcpy(g_out.path, path);
    snprintf(g_out.tmp, sizeof g_out.tmp, "%s.part", path);
    g_out.f = fopen(g_out.tmp, "w");
    if (!g_out.f) {
        fprintf(stderr, "kernel_trace: cannot create %s\n", g_out.tmp);
        return 1;
    }
    fprintf(g_out.f, "start,end,stream,graph,node,corr,gx,gy,gz,bx,by,bz,dsmem,name\n");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity\n");
        fclose(g_out.f);
        g_out.f = NULL;
        remove(g_out.tmp);
        return 1;
    }
    CUpti_SubscriberHandle sub;
    if (cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_resource, NULL) == CUPTI_SUCCESS)
        cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
    atexit(trace_finish);
    return 1;
}
