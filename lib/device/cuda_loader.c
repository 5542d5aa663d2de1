/* cuda_loader: dlopen the CUDA runtime once per process (see cuda_loader.h). */
#include "cuda_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char *const k_sonames[] = { "libcudart.so.13", "libcudart.so.12" };
static const char *const k_resident[] = { "libcudart.so.13", "libcudart.so.12",
                                          "libcudart.so" };

/* Written once under g_once, read-only afterwards. */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cuda_api g_api;
static int g_status = CKPT_ENODEVICE;
static char g_msg[2048];
static char g_library[1024];
static atomic_int g_done; /* set (release) once the fields above are final */

static void msg_append(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void msg_append(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* Resolve every symbol; on a miss name it in `why`. */
static int resolve(void *h, cuda_api *a, char *why, size_t why_len)
{
#define SYM(field, name)                                                     \
    do {                                                                     \
        *(void **)(&a->field) = dlsym(h, name);                              \
        if (!a->field) {                                                     \
            snprintf(why, why_len, "it lacks %s", name);                     \
            return -1;                                                       \
        }                                                                    \
    } while (0)
    SYM(GetDeviceCount, "cudaGetDeviceCount");
    SYM(GetDevice, "cudaGetDevice");
    SYM(SetDevice, "cudaSetDevice");
    SYM(PointerGetAttributes, "cudaPointerGetAttributes");
    SYM(StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    SYM(StreamDestroy, "cudaStreamDestroy");
    SYM(StreamWaitEvent, "cudaStreamWaitEvent");
    SYM(StreamSynchronize, "cudaStreamSynchronize");
    SYM(EventCreateWithFlags, "cudaEventCreateWithFlags");
    SYM(EventRecord, "cudaEventRecord");
    SYM(EventSynchronize, "cudaEventSynchronize");
    SYM(EventQuery, "cudaEventQuery");
    SYM(EventDestroy, "cudaEventDestroy");
    SYM(MemcpyAsync, "cudaMemcpyAsync");
    SYM(HostAlloc, "cudaHostAlloc");
    SYM(FreeHost, "cudaFreeHost");
    SYM(Malloc, "cudaMalloc");
    SYM(Free, "cudaFree");
    SYM(MemGetInfo, "cudaMemGetInfo");
    SYM(GetErrorString, "cudaGetErrorString");
    SYM(GetErrorName, "cudaGetErrorName");
    SYM(GetLastError, "cudaGetLastError");
    SYM(DriverGetVersion, "cudaDriverGetVersion");
    SYM(RuntimeGetVersion, "cudaRuntimeGetVersion");
#undef SYM
    /* CUDA 12 exports the current layout as _v2 (the plain name keeps the
     * CUDA 11 layout); CUDA 13 has only the plain name.  `name` is first in
     * all of them. */
    *(void **)(&a->GetDeviceProperties) = dlsym(h, "cudaGetDeviceProperties_v2");
    if (!a->GetDeviceProperties)
        *(void **)(&a->GetDeviceProperties) = dlsym(h, "cudaGetDeviceProperties");
    return 0;
}

/* A runtime the process already has: a library loaded by the application,
 * or (for statically linked ones that export it) a global symbol.  *h gets
 * the handle to resolve with (RTLD_DEFAULT, which is NULL, for the latter). */
static int find_resident(void **h, const char **what)
{
    for (size_t i = 0; i < sizeof k_resident / sizeof k_resident[0]; i++) {
        *h = dlopen(k_resident[i], RTLD_NOW | RTLD_NOLOAD);
        if (*h) {
            *what = k_resident[i];
            return 1;
        }
    }
    if (dlsym(RTLD_DEFAULT, "cudaGetDeviceCount")) {
        *h = RTLD_DEFAULT;
        *what = "(in process)";
        return 1;
    }
    return 0;
}

static int runtime_in_process(void)
{
    const char *what;
    void *h;
    if (!find_resident(&h, &what))
        return 0;
    if (h != RTLD_DEFAULT)
        dlclose(h); /* drop the reference NOLOAD took */
    return 1;
}

static void load(void)
{
    char tried[1536] = "";
    char why[256];
    const char *what = NULL;
    void *h = NULL;
    cuda_api a;
    memset(&a, 0, sizeof a);

    if (find_resident(&h, &what)) {
        if (resolve(h, &a, why, sizeof why) != 0) {
            snprintf(g_msg, sizeof g_msg,
                     "the CUDA runtime already in the process (%s) is unusable: %s",
                     what, why);
            return;
        }
        snprintf(g_library, sizeof g_library, "%s", what);
    } else {
        const char *env = getenv("CKPT_CUDART_LIBRARY");
        msg_append(tried, sizeof tried, "the process");
        if (env && *env) {
            h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                const char *e = dlerror();
                /* dlerror() starts with the path */
                msg_append(tried, sizeof tried, "; $CKPT_CUDART_LIBRARY: %s",
                           e ? e : env);
            } else if (resolve(h, &a, why, sizeof why) != 0) {
                msg_append(tried, sizeof tried, "; $CKPT_CUDART_LIBRARY: %s: %s", env, why);
                dlclose(h);
                h = NULL;
            } else {
                snprintf(g_library, sizeof g_library, "%s", env);
            }
        } else {
            for (size_t i = 0; i < sizeof k_sonames / sizeof k_sonames[0] && !h; i++) {
                h = dlopen(k_sonames[i], RTLD_NOW | RTLD_LOCAL);
                if (!h) {
                    msg_append(tried, sizeof tried, "; %s: not found", k_sonames[i]);
                } else if (resolve(h, &a, why, sizeof why) != 0) {
                    msg_append(tried, sizeof tried, "; %s: %s", k_sonames[i], why);
                    dlclose(h);
                    h = NULL;
                    memset(&a, 0, sizeof a);
                } else {
                    snprintf(g_library, sizeof g_library, "%s", k_sonames[i]);
                }
            }
        }
        if (!h) {
            snprintf(g_msg, sizeof g_msg, "no CUDA runtime found (tried %s)", tried);
            return;
        }
    }

    int count = 0;
    cu_err err = a.GetDeviceCount(&count);
    if (err != CU_SUCCESS || count <= 0) {
        char buf[256];
        if (err != CU_SUCCESS)
            cuda_loader_errstr(&a, err, buf, sizeof buf);
        else
            snprintf(buf, sizeof buf, "device count is 0");
        a.GetLastError(); /* do not leave the error for the application */
        snprintf(g_msg, sizeof g_msg, "CUDA runtime loaded (%s) but no device: %s",
                 g_library, buf);
        return; /* keep the library loaded: unloading a runtime is unsafe */
    }
    a.library = g_library;
    a.device_count = count;
    g_api = a;
    g_status = CKPT_OK;
}

static void load_once(void)
{
    load();
    atomic_store_explicit(&g_done, 1, memory_order_release);
}

int cuda_loader_get(const cuda_api **api)
{
    pthread_once(&g_once, load_once);
    if (g_status != CKPT_OK) {
        *api = NULL;
        return ckpt_seterr(g_status, "%s", g_msg);
    }
    *api = &g_api;
    return CKPT_OK;
}

const cuda_api *cuda_loader_peek(void)
{
    const char *env = getenv("CKPT_CUDART_LIBRARY");
    if ((env && *env) || runtime_in_process()) {
        pthread_once(&g_once, load_once);
        return g_status == CKPT_OK ? &g_api : NULL;
    }
    /* Someone may already have loaded it through cuda_loader_get(). */
    if (!atomic_load_explicit(&g_done, memory_order_acquire))
        return NULL;
    return g_status == CKPT_OK ? &g_api : NULL;
}

const char *cuda_loader_errstr(const cuda_api *api, cu_err err, char *buf, size_t len)
{
    const char *name = api && api->GetErrorName ? api->GetErrorName(err) : NULL;
    const char *str = api && api->GetErrorString ? api->GetErrorString(err) : NULL;
    snprintf(buf, len, "%s (%s)", name ? name : "cudaError", str ? str : "unknown error");
    if (!name)
        snprintf(buf, len, "CUDA error %d (%s)", err, str ? str : "unknown error");
    return buf;
}
