/* cuda_loader: dlopen the CUDA runtime once per process (see cuda_loader.h). */
#include "cuda_loader.h"

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"

/* Newest first: a runtime newer than the driver fails with
 * cudaErrorInsufficientDriver (common on nodes with R550/R570 drivers and a
 * CUDA 13 toolkit), and the next older one is tried. */
static const char *const k_sonames[] = { "libcudart.so.13", "libcudart.so.12",
                                         "libcudart.so.11.0" };
static const char *const k_resident[] = { "libcudart.so.13", "libcudart.so.12",
                                          "libcudart.so.11.0", "libcudart.so" };
/* cudaErrorStubLibrary, cudaErrorInsufficientDriver: this runtime cannot
 * run on this driver, an older one may. */
#define CU_ERR_STUB_LIBRARY 34
#define CU_ERR_INSUFFICIENT_DRIVER 35

/* The runtime loader's state, the library's one global (STYLE.md).  Written
 * under g_mu by load(): once, and again only while no runtime has been
 * found and the process has loaded more objects since the last look (an
 * application that imports its GPU framework after asking libckpt).
 * g_api and g_library are final once g_status is CKPT_OK (release). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static cuda_api g_api;
static atomic_int g_status = CKPT_ENODEVICE;
static char g_msg[2048];     /* under g_mu */
static char g_library[1024];
static atomic_int g_done;    /* a look has been made (release) */
static pid_t g_pid;          /* the process that loaded it: final with g_api */
/* Runtimes load() opened itself and refused (too old, too new for the
 * driver, no device), left loaded because unloading a runtime is unsafe:
 * not the application's, so find_resident() passes over them.  Appended
 * under g_mu, read without it (count published with release). */
#define MAX_REFUSED 16
static void *_Atomic g_refused[MAX_REFUSED];
static atomic_size_t g_nrefused;
static unsigned long long g_retry_at; /* under g_mu: after a look that found no
                                         runtime, the loaded-object count then
                                         (plus 1); 0: no second look */

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

static void resolve_driver(void *h, cuda_api *a);

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
    *(void **)(&a->PeekAtLastError) = dlsym(h, "cudaPeekAtLastError");
    /* Optional (CUDA 10+): without it a capturing stream cannot be told. */
    *(void **)(&a->StreamIsCapturing) = dlsym(h, "cudaStreamIsCapturing");
    *(void **)(&a->ThreadExchangeStreamCaptureMode) =
        dlsym(h, "cudaThreadExchangeStreamCaptureMode");
    *(void **)(&a->GetDeviceProperties) = dlsym(h, "cudaGetDeviceProperties_v2");
    if (!a->GetDeviceProperties)
        *(void **)(&a->GetDeviceProperties) = dlsym(h, "cudaGetDeviceProperties");
    resolve_driver(h, a);
    return 0;
}

/* The few driver functions the runtime does not offer.  The runtime loads
 * libcuda.so.1 itself, so opening it here adds a reference, not a library;
 * a runtime stand-in (the test mock) may export them itself, and is asked
 * first.  Absent ones stay NULL. */
static int resolve_driver_in(void *drv, cuda_api *a)
{
    *(void **)(&a->DrvDeviceGet) = dlsym(drv, "cuDeviceGet");
    *(void **)(&a->DrvPrimaryCtxGetState) = dlsym(drv, "cuDevicePrimaryCtxGetState");
    *(void **)(&a->DrvCtxGetCurrent) = dlsym(drv, "cuCtxGetCurrent");
    *(void **)(&a->DrvMemGetAddressRange) = dlsym(drv, "cuMemGetAddressRange_v2");
    *(void **)(&a->DrvPointerGetAttribute) = dlsym(drv, "cuPointerGetAttribute");
    return a->DrvDeviceGet && a->DrvPrimaryCtxGetState;
}

static void resolve_driver(void *h, cuda_api *a)
{
    if (resolve_driver_in(h, a)) /* h may be RTLD_DEFAULT */
        return;
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); /* kept: see above */
    if (!drv || !resolve_driver_in(drv, a)) {
        a->DrvDeviceGet = NULL;
        a->DrvPrimaryCtxGetState = NULL;
        a->DrvCtxGetCurrent = NULL;
        a->DrvMemGetAddressRange = NULL;
        a->DrvPointerGetAttribute = NULL;
    }
}

/* A runtime the process already has: a library loaded by the application,
 * or (for statically linked ones that export it) a global symbol.  *h gets
 * the handle to resolve with (RTLD_DEFAULT, which is NULL, for the latter). */
static int refused_by_us(void *h)
{
    size_t n = atomic_load_explicit(&g_nrefused, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (atomic_load_explicit(&g_refused[i], memory_order_relaxed) == h)
            return 1;
    return 0;
}

/* g_mu held: remember `h` as refused (see g_refused). */
static void note_refused(void *h)
{
    size_t n = atomic_load_explicit(&g_nrefused, memory_order_relaxed);
    if (!h || n == MAX_REFUSED || refused_by_us(h))
        return;
    atomic_store_explicit(&g_refused[n], h, memory_order_relaxed);
    atomic_store_explicit(&g_nrefused, n + 1, memory_order_release);
}

static int find_resident(void **h, const char **what)
{
    for (size_t i = 0; i < sizeof k_resident / sizeof k_resident[0]; i++) {
        *h = dlopen(k_resident[i], RTLD_NOW | RTLD_NOLOAD);
        if (*h && refused_by_us(*h)) {
            dlclose(*h); /* ours, refused: drop the reference NOLOAD took */
            *h = NULL;
        }
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

/* The CUDA driver is in the process: something started CUDA, perhaps a
 * runtime linked statically into the program (nvcc's default), which
 * exports nothing find_resident could see.  Its device pointers are as
 * real as any: AUTO must load a runtime to classify them, never memcpy. */
static int driver_in_process(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h)
        dlclose(h); /* drop the reference NOLOAD took */
    return h != NULL;
}

int cuda_loader_driver_says_device(const void *p)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return 0;
    int (*get)(void *data, int attribute, unsigned long long ptr);
    *(void **)(&get) = dlsym(h, "cuPointerGetAttribute");
    unsigned int type = 0; /* CUmemorytype */
    int res = get ? get(&type, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */,
                        (unsigned long long)(uintptr_t)p)
                  : -1;
    dlclose(h);
    /* Pageable host memory is CUDA_ERROR_INVALID_VALUE; registered or
     * pinned host memory CU_MEMORYTYPE_HOST (1), device and managed memory
     * CU_MEMORYTYPE_DEVICE (2) */
    return res == 0 && type == 2;
}

static int runtime_in_process(void)
{
    const char *what;
    void *h;
    if (!find_resident(&h, &what))
        return driver_in_process();
    if (h != RTLD_DEFAULT)
        dlclose(h); /* drop the reference NOLOAD took */
    return 1;
}

/* Open and resolve one candidate; 0 and *h on success, else a note in
 * `tried`. */
static int open_candidate(const char *name, const char *label, void **h, cuda_api *a,
                          char *tried, size_t tried_len)
{
    char why[256];
    *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!*h) {
        const char *e = dlerror(); /* starts with the path */
        msg_append(tried, tried_len, "; %s: %s", label, e ? e : "not found");
        return -1;
    }
    if (resolve(*h, a, why, sizeof why) != 0) {
        msg_append(tried, tried_len, "; %s: %s", label, why);
        dlclose(*h);
        *h = NULL;
        memset(a, 0, sizeof *a);
        return -1;
    }
    return 0;
}

/* Count devices; 1 when this runtime is too new for the driver (the caller
 * tries an older one), 0 otherwise (count or error in *err). */
static int too_new(cuda_api *a, int *count, cu_err *err)
{
    *count = 0;
    *err = a->GetDeviceCount(count);
    return *err == CU_ERR_INSUFFICIENT_DRIVER || *err == CU_ERR_STUB_LIBRARY;
}

/* 1 when no NVIDIA driver is installed: a runtime reports that as
 * cudaErrorInsufficientDriver, as it does for an old driver, but
 * cudaDriverGetVersion then gives 0 (the runtime API's documented answer). */
static int no_driver(const cuda_api *a)
{
    int v = -1;
    if (!a->DriverGetVersion || a->DriverGetVersion(&v) != CU_SUCCESS) {
        a->GetLastError();
        return 0;
    }
    return v == 0;
}

#define NO_DRIVER_MSG "no NVIDIA driver is installed (cudaDriverGetVersion gives 0; " \
                      "libcuda.so.1 missing): device tensors need one, host " \
                      "tensors need no CUDA"

/* Runtimes before 11.0 lay out cudaPointerAttributes differently (and call
 * plain host memory an error): their answers would be misread. */
static int too_old(const cuda_api *a, int *version)
{
    *version = 0;
    if (a->RuntimeGetVersion(version) != CU_SUCCESS) {
        a->GetLastError();
        return 0;
    }
    return *version > 0 && *version < 11000;
}

static void load(int *resident)
{
    char tried[1536] = "", buf[256];
    const char *what = NULL;
    void *h = NULL;
    cuda_api a;
    memset(&a, 0, sizeof a);
    int count = 0;
    cu_err err = CU_SUCCESS;
    int app_clean = 0; /* the application's runtime had no error pending */

    *resident = 0;
    if (find_resident(&h, &what)) {
        char why[256];
        *resident = 1;
        if (resolve(h, &a, why, sizeof why) != 0) {
            snprintf(g_msg, sizeof g_msg,
                     "the CUDA runtime already in the process (%s) is unusable: %s",
                     what, why);
            return;
        }
        snprintf(g_library, sizeof g_library, "%s", what);
        app_clean = a.PeekAtLastError && a.PeekAtLastError() == CU_SUCCESS;
        int v;
        if (too_old(&a, &v)) {
            snprintf(g_msg, sizeof g_msg, "the CUDA runtime already in the process (%s) "
                     "is version %d.%d; libckpt needs 11.0 or newer", what, v / 1000,
                     (v % 1000) / 10);
            return;
        }
        if (too_new(&a, &count, &err) && no_driver(&a)) { /* the application's choice */
            a.GetLastError();
            snprintf(g_msg, sizeof g_msg, "CUDA runtime loaded (%s) but " NO_DRIVER_MSG,
                     g_library);
            return;
        }
    } else {
        /* $CKPT_CUDART_LIBRARY: one path, or several separated by ':' tried
         * in order as the built-in names are. */
        const char *env = getenv("CKPT_CUDART_LIBRARY");
        char list[1024];
        const char *names[16];
        size_t n = 0;
        msg_append(tried, sizeof tried, "the process");
        if (env && *env) {
            snprintf(list, sizeof list, "%s", env);
            for (char *save = NULL, *t = strtok_r(list, ":", &save); t && n < 16;
                 t = strtok_r(NULL, ":", &save))
                names[n++] = t;
        } else {
            for (; n < sizeof k_sonames / sizeof k_sonames[0]; n++)
                names[n] = k_sonames[n];
        }
        int driverless = 0, refused = 0, v;
        for (size_t i = 0; i < n && !h; i++) {
            if (open_candidate(names[i], names[i], &h, &a, tried, sizeof tried) != 0)
                continue;
            if (too_old(&a, &v)) {
                msg_append(tried, sizeof tried, "; %s: version %d.%d, before 11.0", names[i],
                           v / 1000, (v % 1000) / 10);
                note_refused(h);
                h = NULL; /* left loaded, as below */
                refused = 1;
                memset(&a, 0, sizeof a);
                continue;
            }
            if (too_new(&a, &count, &err)) {
                driverless = driverless || no_driver(&a);
                msg_append(tried, sizeof tried, "; %s: %s", names[i],
                           cuda_loader_errstr(&a, err, buf, sizeof buf));
                /* Left loaded (RTLD_LOCAL, so its symbols stay apart):
                 * unloading a runtime is unsafe. */
                note_refused(h);
                h = NULL;
                memset(&a, 0, sizeof a);
                continue;
            }
            snprintf(g_library, sizeof g_library, "%s", names[i]);
        }
        if (!h) {
            if (driverless)
                snprintf(g_msg, sizeof g_msg, "no usable CUDA runtime (tried %s): "
                         NO_DRIVER_MSG, tried);
            else if (err == CU_SUCCESS)
                snprintf(g_msg, sizeof g_msg, "no %sCUDA runtime found (tried %s)",
                         refused ? "usable " : "", tried);
            else
                snprintf(g_msg, sizeof g_msg, "no usable CUDA runtime (tried %s): the "
                         "driver is older than every runtime found; install a runtime "
                         "matching it (nvidia-smi shows its CUDA version)", tried);
            return;
        }
    }

    if (err != CU_SUCCESS || count <= 0) {
        if (err != CU_SUCCESS)
            cuda_loader_errstr(&a, err, buf, sizeof buf);
        else
            snprintf(buf, sizeof buf, "device count is 0");
        if (!what || app_clean)
            a.GetLastError(); /* leave no error behind (the application's
                                 runtime: none that it had not already) */
        if (!what)
            note_refused(h);
        snprintf(g_msg, sizeof g_msg, "CUDA runtime loaded (%s) but no device: %s",
                 g_library, buf);
        return; /* keep the library loaded: unloading a runtime is unsafe */
    }
    a.library = g_library;
    a.device_count = count;
    g_pid = getpid();
    too_old(&a, &a.runtime_version);
    g_api = a;
    atomic_store_explicit(&g_status, CKPT_OK, memory_order_release);
}

static unsigned long long loaded_objects(void);

/* Look for the runtime unless a look has been made that stays true: one
 * that found a usable runtime, or an unusable one in the process, or
 * found none while the process has loaded nothing since. */
static void ensure_loaded(void)
{
    if (atomic_load_explicit(&g_status, memory_order_acquire) == CKPT_OK)
        return;
    pthread_mutex_lock(&g_mu);
    int look = !atomic_load_explicit(&g_done, memory_order_relaxed);
    if (!look && g_retry_at && atomic_load_explicit(&g_status, memory_order_relaxed)) {
        unsigned long long now = loaded_objects();
        look = now && now != g_retry_at;
    }
    if (look) {
        int resident;
        g_msg[0] = 0;
        load(&resident);
        g_retry_at = atomic_load_explicit(&g_status, memory_order_relaxed) && !resident
                         ? loaded_objects() : 0;
        atomic_store_explicit(&g_done, 1, memory_order_release);
    }
    pthread_mutex_unlock(&g_mu);
}

int cuda_loader_get(const cuda_api **api)
{
    ensure_loaded();
    int st = atomic_load_explicit(&g_status, memory_order_acquire);
    if (st == CKPT_OK && g_pid != getpid()) {
        /* Loading counted the devices, which started CUDA in the parent:
         * a child made by fork() inherits none of it, and every call
         * would fail (cudaErrorInitializationError). */
        *api = NULL;
        return ckpt_seterr(CKPT_ENODEVICE, "CUDA was started in process %ld, and this "
                           "process is a child it made with fork(): CUDA does not survive "
                           "fork, so device memory cannot be used here (host tensors "
                           "can); start the child with spawn (Python's "
                           "multiprocessing.set_start_method(\"spawn\")) to use the GPU",
                           (long)g_pid);
    }
    if (st != CKPT_OK) {
        *api = NULL;
        pthread_mutex_lock(&g_mu);
        ckpt_seterr(st, "%s", g_msg);
        pthread_mutex_unlock(&g_mu);
        return st;
    }
    *api = &g_api;
    return CKPT_OK;
}

/* The dynamic linker's count of objects loaded so far (dlpi_adds, made for
 * caching what a search of the loaded objects found). */
static int count_adds(struct dl_phdr_info *info, size_t size, void *arg)
{
    if (size < offsetof(struct dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds)
        return -1;
    *(unsigned long long *)arg = info->dlpi_adds;
    return 1; /* the first object tells */
}

/* The dynamic linker's count of loaded objects plus 1; 0 when unknown. */
static unsigned long long loaded_objects(void)
{
    unsigned long long adds = 0;
    return dl_iterate_phdr(count_adds, &adds) == 1 ? adds + 1 : 0;
}

/* runtime_in_process(), remembering an absence until another object is
 * loaded: the search (dlopen of each name, a global symbol lookup) costs
 * tens of microseconds, and CKPT_MEM_AUTO asks once per tensor. */
static int runtime_in_process_cached(void)
{
    static atomic_ullong absent_at; /* dlpi_adds + 1 when last found absent */
    unsigned long long adds = 0;
    int known = dl_iterate_phdr(count_adds, &adds) == 1;
    if (known && atomic_load_explicit(&absent_at, memory_order_relaxed) == adds + 1)
        return 0;
    if (runtime_in_process()) /* counted before the search: a later load */
        return 1;             /* changes the count and searches again     */
    if (known)
        atomic_store_explicit(&absent_at, adds + 1, memory_order_relaxed);
    return 0;
}

const cuda_api *cuda_loader_peek(void)
{
    /* loaded: the common case of a GPU process, asked once per tensor */
    if (atomic_load_explicit(&g_status, memory_order_acquire) == CKPT_OK)
        return &g_api;
    const char *env = getenv("CKPT_CUDART_LIBRARY");
    if ((env && *env) || runtime_in_process_cached()) {
        ensure_loaded(); /* looks again if a runtime came since a failed look */
        return atomic_load_explicit(&g_status, memory_order_acquire) == CKPT_OK ? &g_api
                                                                               : NULL;
    }
    return NULL;
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
