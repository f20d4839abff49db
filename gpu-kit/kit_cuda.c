/*
 * kit_cuda.c — the CUDA runtime, the driver's stream memory operations and
 * NCCL, opened at run time.
 *
 * Design notes
 *  - dlopen, as the NCCL plugin does: the same binary runs on a GPU, on a
 *    host without one (kit_cuda_open says why and every GPU check SKIPs) and
 *    against the CPU test double (it exports cltest_cuda_double).
 *  - The gate needs cuStreamWaitValue32 from the driver (libcuda.so.1) and
 *    mapped host memory; without them kit_drv.why says why and the checks
 *    that need a gate SKIP.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "gpu_check.h"

kit_cuda kit_cu;
kit_driver kit_drv;
kit_nccl_lib kit_nccl;

static void *kit_must_sym(void *h, const char *name, char *why, size_t len) {
    void *p = dlsym(h, name);
    if (!p && why[0] == '\0') snprintf(why, len, "%s lacks %s", "libcudart.so.13", name);
    return p;
}

/* Open the runtime and NCCL; "" or why not. */
void kit_cuda_open(char *why, size_t len) {
    why[0] = '\0';
    void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(why, len, "cannot open libcudart.so.13: %s", dlerror());
        return;
    }
#define REQ(f, n) *(void **)&kit_cu.f = kit_must_sym(h, n, why, len)
#define OPT(f, n) *(void **)&kit_cu.f = dlsym(h, n)
    REQ(GetDeviceCount, "cudaGetDeviceCount");
    REQ(SetDevice, "cudaSetDevice");
    REQ(Malloc, "cudaMalloc");
    REQ(Free, "cudaFree");
    REQ(Memcpy, "cudaMemcpy");
    REQ(StreamCreate, "cudaStreamCreate");
    REQ(StreamDestroy, "cudaStreamDestroy");
    REQ(StreamSynchronize, "cudaStreamSynchronize");
    REQ(EventCreate, "cudaEventCreate");
    REQ(EventDestroy, "cudaEventDestroy");
    REQ(EventRecord, "cudaEventRecord");
    REQ(EventQuery, "cudaEventQuery");
    REQ(StreamBeginCapture, "cudaStreamBeginCapture");
    REQ(StreamEndCapture, "cudaStreamEndCapture");
    REQ(GetErrorString, "cudaGetErrorString");
    OPT(MemcpyAsync, "cudaMemcpyAsync");
    OPT(GetDeviceProperties, "cudaGetDeviceProperties");
    OPT(DriverGetVersion, "cudaDriverGetVersion");
    OPT(RuntimeGetVersion, "cudaRuntimeGetVersion");
    OPT(MemGetInfo, "cudaMemGetInfo");
    OPT(HostAlloc, "cudaHostAlloc");
    OPT(HostGetDevicePointer, "cudaHostGetDevicePointer");
    OPT(FreeHost, "cudaFreeHost");
    OPT(GraphDestroy, "cudaGraphDestroy");
#undef REQ
#undef OPT
    kit_cu.double_ = dlsym(h, "cltest_cuda_double") != NULL;
    if (why[0]) return;
    void *n = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!n) {
        snprintf(why, len, "cannot open libnccl.so.2: %s", dlerror());
        return;
    }
    *(void **)&kit_nccl.GetVersion = dlsym(n, "ncclGetVersion");
    *(void **)&kit_nccl.GetUniqueId = dlsym(n, "ncclGetUniqueId");
    *(void **)&kit_nccl.CommInitRank = dlsym(n, "ncclCommInitRank");
    *(void **)&kit_nccl.AllReduce = dlsym(n, "ncclAllReduce");
    *(void **)&kit_nccl.CommDestroy = dlsym(n, "ncclCommDestroy");
    if (!kit_nccl.GetVersion || !kit_nccl.GetUniqueId || !kit_nccl.CommInitRank ||
        !kit_nccl.AllReduce || !kit_nccl.CommDestroy) {
        snprintf(why, len, "libnccl.so.2 lacks an entry point collie uses");
        return;
    }
    Dl_info di;
    if (dladdr((void *)kit_nccl.GetVersion, &di) && di.dli_fname)
        snprintf(kit_nccl.path, sizeof kit_nccl.path, "%s", di.dli_fname);
    /* the gate: the driver's stream memory operations */
    void *d = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!d) {
        snprintf(kit_drv.why, sizeof kit_drv.why, "no CUDA driver API (libcuda.so.1: %s)",
                 dlerror());
        return;
    }
    *(void **)&kit_drv.WaitValue32 = dlsym(d, "cuStreamWaitValue32_v2");
    if (!kit_drv.WaitValue32) *(void **)&kit_drv.WaitValue32 = dlsym(d, "cuStreamWaitValue32");
    if (!kit_drv.WaitValue32)
        snprintf(kit_drv.why, sizeof kit_drv.why, "libcuda.so.1 lacks cuStreamWaitValue32");
    else if (!kit_cu.HostAlloc || !kit_cu.HostGetDevicePointer || !kit_cu.FreeHost)
        snprintf(kit_drv.why, sizeof kit_drv.why, "libcudart.so.13 lacks cudaHostAlloc");
}

const char *kit_cuerr(int e) { return kit_cu.GetErrorString ? kit_cu.GetErrorString(e) : "?"; }
