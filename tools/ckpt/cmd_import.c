/* ckpt import: an HDF5 file's datasets as a checkpoint step. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "h5util.h"
#include "h5zstd.h"

/* zstd's best case is about 32,000 to 1 (a frame of zeros); anything
 * claiming more is a forged or sparse file. */
#define IMPORT_MAX_RATIO 65536

/* HDF5 parses the file in a child process, under a CPU-time limit: HDF5
 * crashes on some damaged files (a SIGSEGV in 1.10's metadata reader) and
 * loops for ever on others, and a file from someone else may be made to.
 * Seconds of CPU for opening and listing the file (plus one per MB of
 * it), then for reading the data (plus one per 16 MB declared: inflating
 * runs at hundreds of MB/s); CKPT_IMPORT_CPU_LIMIT replaces the first. */
#define IMPORT_PARSE_CPU_S 60
#define IMPORT_READ_CPU_S 60

const cli_cmd cli_cmd_import = {
    "import", "Store an HDF5 file's datasets as a checkpoint step",
    "Every dataset becomes a tensor named by its path without the leading '/'\n"
    "(groups joined with '/').  HDF5 integer, float (16, 32, 64 bit), h5py\n"
    "bool, complex ({r, i} compound), enum (as its base integer) and opaque\n"
    "(as bytes) types are supported; a 'dtype' attribute written by export\n"
    "restores bfloat16, float8 and bytes.  The step defaults to the file's\n"
    "'step' attribute; the root 'metadata' attribute, when it holds JSON, is\n"
    "kept as the step's metadata.  Strings, variable-length, reference and\n"
    "array types are refused with an error naming the dataset.  A step that\n"
    "exists is replaced.  Other steps are removed only with --rewind: those\n"
    "above the imported step, once it commits (the output names them).",
    1, cmd_import};

typedef struct imp_tensor {
    char *name;
    ckpt_dtype dtype;
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];
    uint64_t bytes;
    hid_t memtype; /* what H5Dread converts to: exactly the tensor's bytes */
    void *data;
} imp_tensor;

typedef struct imp_list {
    imp_tensor *v;
    size_t n, cap;
    hid_t file;
    char err[1024];
} imp_list;

static const char *class_name(H5T_class_t c)
{
    switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_TIME: return "time";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown";
    }
}

static ckpt_dtype int_dtype(size_t size, int is_signed)
{
    switch (size) {
    case 1: return is_signed ? CKPT_I8 : CKPT_U8;
    case 2: return is_signed ? CKPT_I16 : CKPT_U16;
    case 4: return is_signed ? CKPT_I32 : CKPT_U32;
    case 8: return is_signed ? CKPT_I64 : CKPT_U64;
    default: return CKPT_DTYPE_INVALID;
    }
}

/* h5py's bool: a 1-byte enum {FALSE = 0, TRUE = 1}. */
static int is_bool_enum(hid_t ft)
{
    if (H5Tget_size(ft) != 1 || H5Tget_nmembers(ft) != 2)
        return 0;
    int8_t v;
    int ok = 1;
    for (unsigned i = 0; i < 2 && ok; i++) {
        char *name = H5Tget_member_name(ft, i);
        int8_t want = strcmp(name ? name : "", "TRUE") == 0 ? 1 : 0;
        ok = name && (strcmp(name, "TRUE") == 0 || strcmp(name, "FALSE") == 0) &&
             H5Tget_member_value(ft, i, &v) >= 0 && v == want;
        if (name)
            H5free_memory(name);
    }
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

/* The dtype and the memory type to read a dataset of file type `ft` with.
 * Sets *extra_dim to the bytes per element for opaque types (the shape
 * gains that dimension). */
static ckpt_dtype map_type(hid_t ft, hid_t *memtype, hsize_t *extra_dim, char *why,
                           size_t whylen)
{
    H5T_class_t cls = H5Tget_class(ft);
    size_t size = H5Tget_size(ft);
    *memtype = -1;
    *extra_dim = 0;

    switch (cls) {
    case H5T_INTEGER: {
        ckpt_dtype dt = int_dtype(size, H5Tget_sign(ft) == H5T_SGN_2);
        if (dt == CKPT_DTYPE_INVALID)
            break;
        *memtype = h5_type_for(dt);
        return dt;
    }
    case H5T_FLOAT: {
        if (size == 4 || size == 8) {
            ckpt_dtype dt = size == 4 ? CKPT_F32 : CKPT_F64;
            *memtype = h5_type_for(dt);
            return dt;
        }
        if (size == 2) {
            size_t spos, epos, esize, mpos, msize;
            if (H5Tget_fields(ft, &spos, &epos, &esize, &mpos, &msize) < 0)
                break;
            /* The bits are copied as they are: only IEEE half and bfloat16
             * themselves (sign, exponent and mantissa where they are, their
             * biases) hold the values the file means. */
            size_t bias = H5Tget_ebias(ft);
            int std = spos == 15 && mpos == 0 && epos == msize && H5Tget_offset(ft) == 0 &&
                      H5Tget_precision(ft) == 16 && H5Tget_norm(ft) == H5T_NORM_IMPLIED;
            ckpt_dtype dt = std && esize == 5 && msize == 10 && bias == 15 ? CKPT_F16
                            : std && esize == 8 && msize == 7 && bias == 127 ? CKPT_BF16
                                                                           : CKPT_DTYPE_INVALID;
            if (dt == CKPT_DTYPE_INVALID) {
                snprintf(why, whylen, "a 16-bit float that is neither IEEE half nor bfloat16 "
                         "(sign bit %zu, exponent bits %zu..%zu with bias %zu, mantissa bits "
                         "%zu..%zu): its values would be misread", spos, epos,
                         epos + esize - 1, bias, mpos, mpos + msize - 1);
                return CKPT_DTYPE_INVALID;
            }
            /* Read the bit pattern as it is, in native byte order. */
            *memtype = H5Tcopy(ft);
            if (*memtype >= 0)
                H5Tset_order(*memtype, H5Tget_order(H5T_NATIVE_UINT16));
            return dt;
        }
        break;
    }
    case H5T_ENUM:
        if (is_bool_enum(ft)) {
            *memtype = h5_type_for(CKPT_BOOL);
            return CKPT_BOOL;
        } else {
            hid_t base = H5Tget_super(ft);
            ckpt_dtype dt = base >= 0 ? int_dtype(H5Tget_size(base),
                                                  H5Tget_sign(base) == H5T_SGN_2)
                                      : CKPT_DTYPE_INVALID;
            if (base >= 0)
                H5Tclose(base);
            if (dt == CKPT_DTYPE_INVALID)
                break;
            /* Read as the integers it holds, into the dtype's own size:
             * H5Tget_native_type would go by the base's precision, which
             * may be fewer bits than its bytes (16 of 64: a 2-byte type,
             * elements packed into a buffer sized for 8 bytes each). */
            *memtype = h5_type_for(dt);
            return dt;
        }
    case H5T_BITFIELD: {
        ckpt_dtype dt = int_dtype(size, 0);
        if (dt == CKPT_DTYPE_INVALID)
            break;
        /* As for enums: a native bitfield of the dtype's size, not of the
         * type's precision (H5Tget_native_type). */
        *memtype = H5Tcopy(size == 1 ? H5T_NATIVE_B8 : size == 2 ? H5T_NATIVE_B16
                           : size == 4 ? H5T_NATIVE_B32 : H5T_NATIVE_B64);
        return dt;
    }
    case H5T_OPAQUE:
        *memtype = H5Tcopy(ft);
        *extra_dim = size;
        return CKPT_BYTES;
    case H5T_COMPOUND: {
        /* complex: two float members of one size, the real part first. */
        if (H5Tget_nmembers(ft) != 2)
            break;
        hid_t m0 = H5Tget_member_type(ft, 0), m1 = H5Tget_member_type(ft, 1);
        size_t s0 = m0 >= 0 ? H5Tget_size(m0) : 0;
        int ok = m0 >= 0 && m1 >= 0 && H5Tget_class(m0) == H5T_FLOAT &&
                 H5Tget_class(m1) == H5T_FLOAT && s0 == H5Tget_size(m1) &&
                 (s0 == 4 || s0 == 8) && H5Tget_member_offset(ft, 0) == 0 &&
                 H5Tget_member_offset(ft, 1) == s0;
        if (m0 >= 0)
            H5Tclose(m0);
        if (m1 >= 0)
            H5Tclose(m1);
        if (!ok)
            break;
        /* Complex only as h5py (and ckpt export) writes it: members "r"
         * and "i", in either order (compound conversion matches them by
         * name, so the real part lands first).  Two floats of other names
         * ({x, y}, {mean, std}) are not a complex number. */
        char *n0 = H5Tget_member_name(ft, 0), *n1 = H5Tget_member_name(ft, 1);
        int named = n0 && n1 && ((!strcmp(n0, "r") && !strcmp(n1, "i")) ||
                                 (!strcmp(n0, "i") && !strcmp(n1, "r")));
        if (n0)
            H5free_memory(n0);
        if (n1)
            H5free_memory(n1);
        if (!named) {
            snprintf(why, whylen, "a compound of two floats whose members are not named "
                     "\"r\" and \"i\" (h5py's complex numbers): not read as complex");
            return CKPT_DTYPE_INVALID;
        }
        hid_t part = s0 == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
        hid_t mt = H5Tcreate(H5T_COMPOUND, 2 * s0);
        if (mt >= 0 && H5Tinsert(mt, "r", 0, part) >= 0 && H5Tinsert(mt, "i", s0, part) >= 0) {
            *memtype = mt;
        } else if (mt >= 0) {
            H5Tclose(mt);
        }
        if (*memtype < 0)
            break;
        return s0 == 4 ? CKPT_C64 : CKPT_C128;
    }
    default:
        break;
    }
    snprintf(why, whylen, "unsupported HDF5 type (%s, %zu bytes)", class_name(cls), size);
    return CKPT_DTYPE_INVALID;
}

/* The bytes of a chunk of `dset` when zstd is among its filters (what
 * every zstd frame of it must decode to: ckpt_h5zstd_expect), else 0. */
static size_t zstd_chunk_bytes(hid_t dset)
{
    hid_t dcpl = H5Dget_create_plist(dset), ft = H5Dget_type(dset);
    size_t bytes = 0;
    hsize_t dims[H5S_MAX_RANK];
    int nd = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED
                 ? H5Pget_chunk(dcpl, H5S_MAX_RANK, dims) : -1;
    unsigned flags;
    size_t n = 0;
    if (nd > 0 && ft >= 0 &&
        H5Pget_filter_by_id2(dcpl, CKPT_H5Z_FILTER_ZSTD, &flags, &n, NULL, 0, NULL, NULL) >= 0) {
        bytes = H5Tget_size(ft);
        for (int d = 0; d < nd; d++)
            bytes = dims[d] && bytes > SIZE_MAX / dims[d] ? 0 : bytes * (size_t)dims[d];
    }
    if (ft >= 0)
        H5Tclose(ft);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    H5Eclear2(H5E_DEFAULT);
    return bytes;
}

/* A filter of `dset` this HDF5 cannot run (a compression whose plugin is
 * not installed): named now, rather than HDF5's "can't open directory" of
 * its plugin search when the data is read.  1 with `err` set, or 0. */
static int filter_missing(hid_t dset, const char *name, char *err, size_t errlen)
{
    hid_t dcpl = H5Dget_create_plist(dset);
    int n = dcpl >= 0 ? H5Pget_nfilters(dcpl) : 0, missing = 0;
    for (int i = 0; i < n && !missing; i++) {
        unsigned flags;
        size_t nv = 0;
        char fname[64] = "";
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &nv, NULL, sizeof fname,
                                         fname, NULL);
        if (id >= 0 && H5Zfilter_avail(id) <= 0) {
            snprintf(err, errlen, "dataset '%s' needs HDF5 filter %d%s%s%s, which this "
                     "HDF5 does not have (install its plugin and set HDF5_PLUGIN_PATH)",
                     name, (int)id, *fname ? " (" : "", fname, *fname ? ")" : "");
            missing = 1;
        }
    }
    if (dcpl >= 0)
        H5Pclose(dcpl);
    H5Eclear2(H5E_DEFAULT);
    return missing;
}

/* Whether `dset` keeps its data outside the input file: HDF5 external
 * storage (a list of raw files, read by path as the caller) or a virtual
 * dataset (mapped from other files).  HDF5 would open those for us, as
 * whoever runs the import: root importing another user's file would copy
 * /etc/shadow into a checkpoint that user reads, and a FIFO named there
 * would block.  Only the input file is read: 1 with `err` set. */
static int stored_elsewhere(hid_t dset, const char *name, char *err, size_t errlen)
{
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) {
        char why[512];
        snprintf(err, errlen, "dataset '%s': %s", name, h5_reason(why, sizeof why));
        return 1;
    }
    int external = H5Pget_external_count(dcpl);
    H5D_layout_t layout = H5Pget_layout(dcpl);
    char file[256] = "";
    off_t offset;
    hsize_t size;
    if (external > 0 && H5Pget_external(dcpl, 0, sizeof file, file, &offset, &size) < 0)
        snprintf(file, sizeof file, "?");
    H5Pclose(dcpl);
    H5Eclear2(H5E_DEFAULT);
    if (external > 0) {
        snprintf(err, errlen, "dataset '%s' stores its data in %d external file%s ('%s'%s), "
                 "not in the input file: refused (ckpt import reads nothing but the file "
                 "it is given)", name, external, external > 1 ? "s" : "", file,
                 external > 1 ? ", ..." : "");
        return 1;
    }
    if (layout == H5D_VIRTUAL) {
        snprintf(err, errlen, "dataset '%s' is a virtual dataset (its data is mapped from "
                 "other files): refused (ckpt import reads nothing but the file it is "
                 "given)", name);
        return 1;
    }
    if (external < 0 || layout < 0) {
        snprintf(err, errlen, "dataset '%s': cannot read its storage layout", name);
        return 1;
    }
    return filter_missing(dset, name, err, errlen);
}

static int imp_add(imp_list *l, const char *name, hid_t dset)
{
    imp_tensor t;
    char why[512] = "";
    hid_t ft = -1, sp = -1;
    char *hint = NULL;
    memset(&t, 0, sizeof t);
    t.memtype = -1;

    if (strlen(name) > 255) {
        snprintf(l->err, sizeof l->err, "dataset '%s': name longer than 255 bytes", name);
        return -1;
    }
    ft = H5Dget_type(dset);
    sp = H5Dget_space(dset);
    if (ft < 0 || sp < 0) {
        snprintf(l->err, sizeof l->err, "dataset '%s': %s", name, h5_reason(why, sizeof why));
        goto fail;
    }
    if (stored_elsewhere(dset, name, l->err, sizeof l->err))
        goto fail;
    hsize_t extra;
    t.dtype = map_type(ft, &t.memtype, &extra, why, sizeof why);
    if (t.dtype == CKPT_DTYPE_INVALID || t.memtype < 0) {
        snprintf(l->err, sizeof l->err, "dataset '%s': %s", name,
                 *why ? why : "cannot build a memory type");
        goto fail;
    }
    /* Export stores these as unsigned integers with a "dtype" attribute. */
    hint = h5_get_str_attr(dset, "dtype");
    if (hint) {
        ckpt_dtype h = ckpt_dtype_from_name(hint);
        if (((h == CKPT_BF16 || h == CKPT_F16) && t.dtype == CKPT_U16) ||
            ((h == CKPT_F8_E4M3 || h == CKPT_F8_E5M2 || h == CKPT_BYTES) &&
             t.dtype == CKPT_U8))
            t.dtype = h;
    }
    H5S_class_t sc = H5Sget_simple_extent_type(sp);
    int nd = sc == H5S_SIMPLE ? H5Sget_simple_extent_ndims(sp) : 0;
    if (sc == H5S_NULL || sc == H5S_NO_CLASS || nd < 0) {
        snprintf(l->err, sizeof l->err, "dataset '%s': has no dataspace (null or unknown)",
                 name);
        goto fail;
    }
    if (nd + (extra ? 1 : 0) > CKPT_MAX_DIMS) {
        snprintf(l->err, sizeof l->err, "dataset '%s': %d dimensions%s, more than %d", name,
                 nd + (extra ? 1 : 0), extra ? " with the opaque element's bytes" : "",
                 CKPT_MAX_DIMS);
        goto fail;
    }
    hsize_t dims[H5S_MAX_RANK];
    if (nd > 0 && H5Sget_simple_extent_dims(sp, dims, NULL) < 0) {
        snprintf(l->err, sizeof l->err, "dataset '%s': %s", name, h5_reason(why, sizeof why));
        goto fail;
    }
    uint64_t elems = 1, esize = ckpt_dtype_size(t.dtype);
    for (int d = 0; d < nd; d++) {
        t.shape[d] = (int64_t)dims[d];
        if (dims[d] > INT64_MAX || (dims[d] && elems > UINT64_MAX / dims[d])) {
            snprintf(l->err, sizeof l->err, "dataset '%s': dimensions overflow", name);
            goto fail;
        }
        elems *= dims[d];
    }
    t.ndim = nd;
    if (extra) {
        t.shape[t.ndim++] = (int64_t)extra;
        esize = extra;
    }
    if (esize && elems > UINT64_MAX / esize) {
        snprintf(l->err, sizeof l->err, "dataset '%s': size overflows", name);
        goto fail;
    }
    t.bytes = elems * esize;
    /* The declared size is what import allocates: bound it by what the file
     * stores, so that a tiny file cannot ask for gigabytes.  No codec
     * expands data by more than IMPORT_MAX_RATIO; a dataset that stores
     * nothing (never written: fill values only) is refused. */
    hsize_t stored = H5Dget_storage_size(dset);
    if (t.bytes > 0 && stored == 0) {
        snprintf(l->err, sizeof l->err, "dataset '%s': declares %" PRIu64 " bytes but "
                 "stores none (never written)", name, t.bytes);
        goto fail;
    }
    if (t.bytes / IMPORT_MAX_RATIO > (uint64_t)stored) {
        snprintf(l->err, sizeof l->err, "dataset '%s': declares %" PRIu64 " bytes but "
                 "stores only %llu (more than %d times less: not a real dataset)", name,
                 t.bytes, (unsigned long long)stored, IMPORT_MAX_RATIO);
        goto fail;
    }
    if (!(t.name = strdup(name)))
        goto oom;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        imp_tensor *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            goto oom;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = t;
    free(hint);
    H5Tclose(ft);
    H5Sclose(sp);
    return 0;
oom:
    snprintf(l->err, sizeof l->err, "out of memory");
fail:
    free(t.name);
    free(hint);
    if (t.memtype >= 0)
        H5Tclose(t.memtype);
    if (ft >= 0)
        H5Tclose(ft);
    if (sp >= 0)
        H5Sclose(sp);
    return -1;
}

static herr_t visit_cb(hid_t group, const char *name, const h5_link_info *info, void *data)
{
    imp_list *l = data;
    char why[512];
    if (info->type != H5L_TYPE_HARD) {
        cli_note("ckpt import: skipping link '%s' (not a hard link)", name);
        return 0;
    }
    hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
    if (obj < 0) {
        snprintf(l->err, sizeof l->err, "cannot open '%s': %s", name,
                 h5_reason(why, sizeof why));
        return -1;
    }
    int rc = 0;
    if (H5Iget_type(obj) == H5I_DATASET)
        rc = imp_add(l, name, obj);
    H5Oclose(obj);
    return rc < 0 ? -1 : 0;
}

static void imp_free(imp_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].name);
        free(l->v[i].data);
        if (l->v[i].memtype >= 0)
            H5Tclose(l->v[i].memtype);
    }
    free(l->v);
}

/* The soft CPU limit the user set (RLIM_INFINITY: none), never raised. */
static rlim_t g_user_cpu = RLIM_INFINITY;

/* Allow the calling process `extra` more seconds of CPU from now (the soft
 * limit: SIGXCPU beyond it), within the user's own limit. */
static void cpu_allow(uint64_t extra)
{
    struct rusage ru;
    struct rlimit rl;
    if (getrusage(RUSAGE_SELF, &ru) != 0 || getrlimit(RLIMIT_CPU, &rl) != 0)
        return;
    rlim_t want = (rlim_t)ru.ru_utime.tv_sec + (rlim_t)ru.ru_stime.tv_sec + 1 + (rlim_t)extra;
    if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max)
        want = rl.rlim_max;
    if (g_user_cpu != RLIM_INFINITY && want > g_user_cpu)
        want = g_user_cpu;
    rl.rlim_cur = want;
    setrlimit(RLIMIT_CPU, &rl);
}

static int import_run(cli_ctx *ctx, const char *in, const char *dir, int64_t step,
                      int have_step, uint64_t parse_cpu);

/* The import in a child (see IMPORT_PARSE_CPU_S); the child's exit status,
 * or a failure naming how HDF5 died on the file. */
static int import_isolated(cli_ctx *ctx, const char *in, const char *dir, int64_t step,
                           int have_step)
{
    uint64_t parse_cpu = IMPORT_PARSE_CPU_S;
    const char *env = getenv("CKPT_IMPORT_CPU_LIMIT");
    int fixed = 0;
    if (env && *env) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(env, &end, 10);
        if (errno || *end || v == 0)
            return cli_usage(ctx, "CKPT_IMPORT_CPU_LIMIT=%s: a whole number of seconds "
                             "above 0 is expected", env);
        parse_cpu = v;
        fixed = 1;
    }
    struct stat sb;
    if (!fixed && stat(in, &sb) == 0 && S_ISREG(sb.st_mode))
        parse_cpu += (uint64_t)sb.st_size >> 20;
    struct rlimit cpu;
    if (getrlimit(RLIMIT_CPU, &cpu) == 0)
        g_user_cpu = cpu.rlim_cur;
    fflush(NULL); /* nothing buffered is written twice */
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot import %s: fork: %s", in,
                        strerror(errno));
    if (pid == 0) {
        /* A job script's `kill` of the ckpt it started must not leave the
         * import going on (and committing) behind its back. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(CLI_EXIT_ERROR);
        /* A crash or the CPU limit would dump a core the size of the data */
        struct rlimit none = { 0, 0 };
        setrlimit(RLIMIT_CORE, &none);
        cpu_allow(parse_cpu);
        int rc = import_run(ctx, in, dir, step, have_step, fixed ? parse_cpu : 0);
        fflush(NULL);
        _exit(rc);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot import %s: waitpid: %s", in,
                            strerror(errno));
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    int sig = WTERMSIG(status);
    if (sig == SIGXCPU)
        return cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot import %s: HDF5 was still reading it "
                        "at its CPU-time limit (%" PRIu64 " s to open and list it, then more "
                        "per MB declared to read it; CKPT_IMPORT_CPU_LIMIT=SECONDS sets "
                        "both): a damaged or crafted file makes it loop; nothing was saved",
                        in, parse_cpu);
    if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGABRT)
        return cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot import %s: the HDF5 library crashed "
                        "reading it (signal %d, %s): the file is damaged or crafted; nothing "
                        "was saved", in, sig, strsignal(sig));
    /* Killed from outside: the OOM killer (the data is held in memory),
     * an administrator, a job's time limit. */
    return cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot import %s: the process reading it was "
                    "killed (signal %d, %s%s); nothing was saved", in, sig, strsignal(sig),
                    sig == SIGKILL ? ": out of memory? the datasets are held in memory "
                    "while they are saved" : "");
}

int cmd_import(cli_ctx *ctx, int argc, char **argv)
{
    const char *in = NULL, *dir = NULL;
    int64_t step = -1;
    int have_step = 0;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "IN.h5", NULL, "HDF5 file to read", &in, 1, 0, NULL},
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root (created if missing)", &dir, 1, 0, NULL},
        {CLI_OPT_INT, "step", "N", "step to write (default: the file's 'step' attribute)",
         &step, 0, 0, &have_step},
        {CLI_OPT_FLAG, "rewind", NULL, "allow a step below the newest committed one (the "
         "steps above it are retired once it commits)", &ctx->rewind, 0, 0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_import, opts, argc, argv, &ret))
        return ret;
    return import_isolated(ctx, in, dir, step, have_step);
}

/* The import itself (in the child).  parse_cpu: the CPU seconds given for
 * the data too (CKPT_IMPORT_CPU_LIMIT), or 0 for IMPORT_READ_CPU_S plus
 * one per 16 MB declared. */
static int import_run(cli_ctx *ctx, const char *in, const char *dir, int64_t step,
                      int have_step, uint64_t parse_cpu)
{
    int ret = 0;
    imp_list l;
    memset(&l, 0, sizeof l);
    l.file = -1;
    ckpt_store *store = NULL;
    ckpt_tensor *tensors = NULL;
    ckpt_save *save = NULL;
    int64_t *before = NULL; /* the steps before a --rewind import */
    size_t nbefore = 0;
    char *meta = NULL, why[512];
    cli_progress prog = {0};
    uint64_t raw = 0;
    int st, in_fd = -1;

    h5_setup();
    /* Opened without blocking and checked before HDF5 sees it: a FIFO (or
     * a device) planted at the name would block HDF5's open forever.  HDF5
     * then opens this very file through /proc/self/fd, so it cannot be
     * swapped for another in between. */
    in_fd = open(in, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    if (in_fd < 0 || fstat(in_fd, &sb) != 0) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot read %s: %s", in, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "%s is not a regular file (a %s): an HDF5 "
                       "file is expected", in, S_ISFIFO(sb.st_mode) ? "FIFO"
                       : S_ISDIR(sb.st_mode) ? "directory" : "device or socket");
        goto done;
    }
    char via[64];
    snprintf(via, sizeof via, "/proc/self/fd/%d", in_fd);
    const char *h5path = access(via, R_OK) == 0 ? via : in; /* no /proc: the name */
    if (H5Fis_hdf5(h5path) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "%s is not an HDF5 file (no HDF5 signature)", in);
        goto done;
    }
    l.file = H5Fopen(h5path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (l.file < 0) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot open %s: %s", in,
                       h5_reason(why, sizeof why));
        goto done;
    }
    if (!have_step) {
        hid_t a = H5Aexists(l.file, "step") > 0 ? H5Aopen(l.file, "step", H5P_DEFAULT) : -1;
        hid_t at = a >= 0 ? H5Aget_type(a) : -1, as = a >= 0 ? H5Aget_space(a) : -1;
        /* One integer (an array would be read over `step`), read as what it
         * is: HDF5 would clamp an unsigned one above INT64_MAX. */
        int one = as >= 0 && H5Sget_simple_extent_npoints(as) == 1;
        int integer = at >= 0 && H5Tget_class(at) == H5T_INTEGER && H5Tget_size(at) <= 8;
        if (one && integer && H5Tget_sign(at) == H5T_SGN_NONE) {
            uint64_t u = 0;
            if (H5Aread(a, H5T_NATIVE_UINT64, &u) >= 0 && u <= (uint64_t)CKPT_STEP_MAX)
                step = (int64_t)u, have_step = 1;
        } else if (one && integer) {
            int64_t v = -1;
            if (H5Aread(a, H5T_NATIVE_INT64, &v) >= 0 && v >= 0)
                step = v, have_step = 1;
        }
        if (as >= 0)
            H5Sclose(as);
        if (at >= 0)
            H5Tclose(at);
        if (a >= 0)
            H5Aclose(a);
        H5Eclear2(H5E_DEFAULT);
        if (!have_step) {
            ret = cli_usage(ctx, "%s has no 'step' attribute holding one integer in "
                            "0..%lld: give --step N", in, (long long)CKPT_STEP_MAX);
            goto done;
        }
    }
    if (H5Lvisit(l.file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &l) < 0) {
        if (!*l.err)
            snprintf(l.err, sizeof l.err, "%s", h5_reason(why, sizeof why));
        ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot import %s: %s", in, l.err);
        goto done;
    }
    if (!l.n) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot import %s: it has no datasets", in);
        goto done;
    }
    meta = h5_get_str_attr(l.file, "metadata");
    if (meta) {
        json_t *v = json_loads(meta, JSON_DECODE_ANY, NULL);
        if (!v) { /* not JSON: keep the text as a JSON string */
            json_t *str = json_string(meta);
            if (!str) { /* not UTF-8 either (Latin-1, say): kept, escaped */
                size_t len = strlen(meta);
                char *esc = malloc(4 * len + 1), *o = esc;
                for (const unsigned char *p = (unsigned char *)meta; esc && *p; p++)
                    o += *p < 0x80 ? sprintf(o, "%c", *p) : sprintf(o, "\\x%02x", *p);
                str = esc ? json_string(esc) : NULL;
                free(esc);
                if (str)
                    fprintf(stderr, "ckpt import: %s: its 'metadata' attribute is not UTF-8 "
                            "text: kept with bytes above 0x7f written as \\xNN\n", in);
            }
            char *text = str ? json_dumps(str, JSON_ENCODE_ANY) : NULL;
            json_decref(str);
            free(meta);
            meta = text;
        }
        json_decref(v);
    }
    for (size_t i = 0; i < l.n; i++)
        raw += l.v[i].bytes;
    /* Per dataset the stored bytes bound the declared ones; links to one
     * dataset (or datasets sharing chunks) would multiply them: the whole
     * is bound by the file's size the same way. */
    if (raw / IMPORT_MAX_RATIO > (uint64_t)sb.st_size) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot import %s: its datasets declare %"
                       PRIu64 " bytes together, more than %d times the file's %lld bytes "
                       "(links to one dataset, or shared chunks: not a real state)", in, raw,
                       IMPORT_MAX_RATIO, (long long)sb.st_size);
        goto done;
    }
    cpu_allow(parse_cpu ? parse_cpu : IMPORT_READ_CPU_S + (raw >> 24));
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0 && raw > (uint64_t)pages * (uint64_t)psz) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, CKPT_ENOMEM, "%s holds %" PRIu64 " bytes of "
                       "tensors, more than this machine's memory (%" PRIu64 " bytes)", in,
                       raw, (uint64_t)pages * (uint64_t)psz);
        goto done;
    }
    if (!(tensors = calloc(l.n, sizeof *tensors))) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, CKPT_ENOMEM, "out of memory");
        goto done;
    }
    cli_progress_start(&prog, "import", raw);
    for (size_t i = 0; i < l.n; i++) {
        imp_tensor *t = &l.v[i];
        /* zeroed: should a read ever fill less than the dtype says, no
         * leftover heap of this process goes into the checkpoint */
        t->data = calloc(1, t->bytes ? t->bytes : 1);
        if (!t->data) {
            cli_progress_end(&prog);
            ret = cli_fail(ctx, CLI_EXIT_ERROR, CKPT_ENOMEM,
                           "out of memory for dataset '%s' (%" PRIu64 " bytes)", t->name,
                           t->bytes);
            goto done;
        }
        if (t->bytes) {
            hid_t d = H5Dopen2(l.file, t->name, H5P_DEFAULT);
            size_t zchunk = d >= 0 ? zstd_chunk_bytes(d) : 0;
            ckpt_h5zstd_expect(zchunk);
            herr_t r = d >= 0 ? H5Dread(d, t->memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data)
                              : -1;
            ckpt_h5zstd_expect(0);
            if (r < 0) {
                h5_reason(why, sizeof why);
                if (zchunk) /* the frame's size is the likely cause: said */
                    snprintf(why + strlen(why), sizeof why - strlen(why), "; a zstd chunk "
                             "must decode to the chunk's %zu bytes, and a damaged or crafted "
                             "one is refused", zchunk);
                if (d >= 0)
                    H5Dclose(d);
                cli_progress_end(&prog);
                ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot read dataset '%s' of %s: %s",
                               t->name, in, why);
                goto done;
            }
            H5Dclose(d);
        }
        cli_progress_add(&prog, t->bytes);
        tensors[i].name = t->name;
        tensors[i].data = t->data;
        tensors[i].bytes = t->bytes;
        tensors[i].dtype = t->dtype;
        tensors[i].ndim = t->ndim;
        tensors[i].shape = t->shape;
        tensors[i].memory = CKPT_MEM_HOST;
    }
    cli_progress_end(&prog);

    if ((ret = cli_open_writer(ctx, dir, &store)))
        goto done;
    if (ctx->rewind && ckpt_store_steps(store, &before, &nbefore) != CKPT_OK) {
        before = NULL; /* only for naming what --rewind retires */
        nbefore = 0;
    }
    ckpt_save_options so = CKPT_SAVE_OPTIONS_INIT;
    so.metadata_json = meta;
    st = ckpt_save_begin(&save, store, step, tensors, l.n, &so);
    if (st == CKPT_OK)
        st = ckpt_save_wait(save);
    if (st != CKPT_OK) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, st, "cannot save step %" PRId64 " in %s: %s", step,
                       dir, *ckpt_error_last() ? ckpt_error_last() : ckpt_strerror(st));
        goto done;
    }
    /* With --rewind, the steps above it are retired after the commit:
     * said, since nothing else tells the user they are gone; and one that
     * could not be (a refused rename, another user's step: the event log
     * says why) is an error, since restore goes on choosing it. */
    json_t *retired = json_array();
    int64_t *after = NULL, left = -1;
    size_t nafter = 0;
    /* (when the root cannot be listed again, nothing is claimed either way) */
    int known = nbefore && ckpt_store_steps(store, &after, &nafter) == CKPT_OK;
    for (size_t i = 0; known && i < nbefore; i++) {
        if (before[i] <= step)
            continue;
        int still = 0;
        for (size_t j = 0; j < nafter && !still; j++)
            still = after[j] == before[i];
        if (still)
            left = before[i];
        else
            json_array_append_new(retired, json_integer(before[i]));
    }
    ckpt_free(after);
    if (ctx->json && left >= 0) {
        json_decref(retired); /* the error document below says it all */
    } else if (ctx->json) {
        cli_json_print(json_pack("{s:s, s:s, s:I, s:I, s:I, s:o}", "file", in, "root",
                                 ckpt_store_path(store), "step", (json_int_t)step, "tensors",
                                 (json_int_t)l.n, "raw_bytes", (json_int_t)raw, "retired",
                                 retired));
    } else {
        char b1[32];
        printf("imported %zu tensors (%s) from %s as step %" PRId64 " in %s\n", l.n,
               cli_fmt_bytes(raw, b1), in, step, dir);
        size_t k;
        json_t *v;
        json_array_foreach(retired, k, v)
            printf("%s %" PRId64 "%s", k ? "," : "retired the steps above it (--rewind):",
                   (int64_t)json_integer_value(v),
                   k + 1 == json_array_size(retired) ? "\n" : "");
        json_decref(retired);
    }
    ret = CLI_EXIT_OK;
    if (left >= 0)
        ret = cli_fail(ctx, CLI_EXIT_ERROR, CKPT_EIO, "step %" PRId64 " was imported, but "
                       "step %" PRId64 " above it could not be retired ('ckpt log %s' says "
                       "why): restore goes on choosing it until it is removed", step, left,
                       dir);
done:
    ckpt_free(before);
    ckpt_save_free(save);
    ckpt_store_free(store);
    free(tensors);
    free(meta);
    if (l.file >= 0)
        H5Fclose(l.file);
    if (in_fd >= 0)
        close(in_fd);
    imp_free(&l);
    return ret;
}
