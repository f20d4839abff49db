/*
 * cuda_driver.c — the CPU double of the one CUDA driver call collie's GPU
 * kit makes (tests only; built as libcuda.so.1 beside the runtime double):
 * cuStreamWaitValue32, which holds a stream until a 32-bit word in mapped
 * host memory reaches a value (the kit's "gate"). It is a host function on
 * the stream (the runtime double's cudaLaunchHostFunc) that polls the word.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define CLTEST_API __attribute__((visibility("default")))

enum { CU_STREAM_WAIT_VALUE_GEQ = 0, CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };

typedef struct dbl_wait {
    volatile uint32_t *addr;
    uint32_t value;
} dbl_wait;

static void dbl_wait_run(void *arg) {
    dbl_wait *w = arg;
    while (__atomic_load_n(w->addr, __ATOMIC_ACQUIRE) < w->value) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    free(w);
}

CLTEST_API int cuStreamWaitValue32_v2(cudaStream_t stream, unsigned long long addr,
                                      unsigned int value, unsigned int flags);
CLTEST_API int cuStreamWaitValue32_v2(cudaStream_t stream, unsigned long long addr,
                                      unsigned int value, unsigned int flags) {
    if (flags != CU_STREAM_WAIT_VALUE_GEQ || !addr) return CUDA_ERROR_INVALID_VALUE;
    dbl_wait *w = malloc(sizeof *w);
    if (!w) return CUDA_ERROR_INVALID_VALUE;
    w->addr = (volatile uint32_t *)(uintptr_t)addr;
    w->value = value;
    if (cudaLaunchHostFunc(stream, dbl_wait_run, w) != cudaSuccess) {
        free(w);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
