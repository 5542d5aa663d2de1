/* A stand-in for the CUDA driver, libcuda.so.1, for a program whose CUDA
 * runtime is linked statically (nvcc's default): the driver is then the
 * only sign of CUDA in the process.  It answers cuPointerGetAttribute's
 * memory type from a classifier the test installs (the test's "device
 * memory" is memory no host code may touch). */
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

static int (*g_is_device)(const void *p);

EXPORT void mock_libcuda_set_classifier(int (*is_device)(const void *p))
{
    g_is_device = is_device;
}

/* CUresult cuPointerGetAttribute(void *data, CUpointer_attribute, CUdeviceptr) */
EXPORT int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
    if (attribute != 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    if (!g_is_device || !g_is_device((const void *)(uintptr_t)ptr))
        return 1; /* pageable host memory: not CUDA's */
    *(unsigned int *)data = 2; /* CU_MEMORYTYPE_DEVICE */
    return 0;
}
