/* ckpt export: a checkpoint step as an HDF5 file. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "cli.h"
#include "h5util.h"
#include "h5zstd.h"

const cli_cmd cli_cmd_export = {
    "export", "Write a checkpoint step as an HDF5 file",
    "Every tensor becomes a dataset at its name ('a/b' creates group 'a') with\n"
    "its shape and an HDF5 type for its dtype; each dataset has a 'dtype'\n"
    "attribute with the libckpt dtype name.  bfloat16 is stored as 16-bit\n"
    "unsigned integers, float8 types and bytes as 8-bit unsigned integers,\n"
    "bool as h5py's enum, complex as compound {r, i}.  The root group has the\n"
    "attributes step, time, metadata (JSON), environment (JSON), codec and\n"
    "format.  --codec zstd writes chunks compressed with zstd straight into\n"
    "the file under HDF5 filter 32015; other programs read them with the\n"
    "h5zstd plugin on HDF5_PLUGIN_PATH; export names its directory (stderr,\n"
    "and hdf5_plugin_path with --json).  Default step: the newest valid one.\n"
    "OUT is written to a temporary name and renamed when complete; an existing\n"
    "OUT is kept unless --force is given.",
    1, cmd_export};

/* The h5zstd plugin's directory (tools/meson.build): the build tree's when
 * this ckpt runs from the build tree, else where `meson install` put it. */
static const char *h5zstd_plugin_dir(void)
{
    char exe[PATH_MAX], bdir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        if (realpath(CKPT_CLI_BUILD_DIR, bdir) && strcmp(exe, bdir) == 0)
            return CKPT_H5ZSTD_BUILD_DIR;
    }
    return CKPT_H5ZSTD_INSTALL_DIR;
}

/* Length of `dir` without trailing slashes ("/" stays "/"). */
static size_t dir_len(const char *dir, size_t len)
{
    while (len > 1 && dir[len - 1] == '/')
        len--;
    return len;
}

/* HDF5's plugin search path as any HDF5 program started with this
 * environment has it: $HDF5_PLUGIN_PATH when set (it replaces HDF5's
 * default directory; set but empty, nothing is searched), else the default
 * compiled into libhdf5 (Debian: /usr/lib/<triplet>/hdf5/serial/plugins).
 * ckpt never changes it.  Returns the ':'-joined entries in `path` and
 * whether `dir` is one of them. */
static int hdf5_searches(const char *dir, char *path, size_t size)
{
    unsigned int count = 0;
    int found = 0;
    size_t used = 0, want = dir_len(dir, strlen(dir));
    path[0] = '\0';
    if (H5PLsize(&count) < 0)
        return 0;
    for (unsigned int i = 0; i < count; i++) {
        char entry[PATH_MAX];
        ssize_t n = H5PLget(i, entry, sizeof entry);
        if (n <= 0 || (size_t)n >= sizeof entry)
            continue;
        if (dir_len(entry, (size_t)n) == want && strncmp(entry, dir, want) == 0)
            found = 1;
        int w = snprintf(path + used, size - used, "%s%s", used ? ":" : "", entry);
        if (w < 0 || (size_t)w >= size - used) {
            path[used] = '\0';
            break;
        }
        used += (size_t)w;
    }
    return found;
}

/* After writing a --codec zstd file: the HDF5_PLUGIN_PATH other HDF5
 * programs need (the plugin's directory first, then what HDF5 searches now,
 * which setting the variable would otherwise hide), on stderr unless HDF5
 * searches that directory already. */
static void zstd_plugin_note(const char *dir)
{
    char so[PATH_MAX], searched[4096], value[PATH_MAX + sizeof searched + 1];
    int found = hdf5_searches(dir, searched, sizeof searched);
    snprintf(value, sizeof value, "%s%s%s", dir, searched[0] ? ":" : "", searched);
    snprintf(so, sizeof so, "%s/libh5zstd.so", dir);
    if (access(so, R_OK) != 0)
        fprintf(stderr,
                "ckpt export: note: h5py, h5dump and other HDF5 programs read these zstd "
                "chunks (filter 32015) with the h5zstd plugin, which is not in %s: build "
                "and install tools/h5zstd%s%s\n",
                dir, found ? "" : ", then export HDF5_PLUGIN_PATH=", found ? "" : value);
    else if (!found)
        fprintf(stderr,
                "ckpt export: note: h5py, h5dump and other HDF5 programs read these zstd "
                "chunks (filter 32015) with the h5zstd plugin: export HDF5_PLUGIN_PATH=%s\n",
                value);
}

/* Chunk shape of about `target` bytes: trailing dimensions whole first. */
static void chunk_shape(const ckpt_tensor_info *ti, size_t esize, uint64_t target,
                        hsize_t *chunk)
{
    uint64_t inner = esize;
    int full = 1;
    for (int d = ti->ndim - 1; d >= 0; d--) {
        uint64_t dim = (uint64_t)ti->shape[d];
        if (!full) {
            chunk[d] = 1;
        } else if (inner * dim <= target) {
            chunk[d] = dim;
            inner *= dim;
        } else {
            uint64_t c = target / inner;
            chunk[d] = c ? c : 1;
            full = 0;
        }
        if (chunk[d] > UINT32_MAX)
            chunk[d] = UINT32_MAX;
    }
}

/* Write the chunks of rows [row0, row1) of the first dimension, whose
 * bytes are `data`, compressed with zstd (filter 32015).  row0 is a
 * multiple of chunk[0], and row1 too unless it is the last row: every
 * chunk written is whole. */
static int write_zstd_chunks(hid_t dset, const ckpt_tensor_info *ti, size_t esize,
                             const hsize_t *chunk, const unsigned char *data, hsize_t row0,
                             hsize_t row1, int level, cli_progress *prog, char *err,
                             size_t errlen)
{
    int nd = ti->ndim, rc = -1;
    hsize_t grid[CKPT_MAX_DIMS], idx[CKPT_MAX_DIMS] = {0}, off[CKPT_MAX_DIMS];
    hsize_t ext[CKPT_MAX_DIMS], cstride[CKPT_MAX_DIMS], tstride[CKPT_MAX_DIMS];
    size_t cbytes = esize;
    for (int d = 0; d < nd; d++) {
        grid[d] = ((hsize_t)ti->shape[d] + chunk[d] - 1) / chunk[d];
        cbytes *= chunk[d];
    }
    grid[0] = (row1 + chunk[0] - 1) / chunk[0]; /* the slab's chunks only */
    idx[0] = row0 / chunk[0];
    /* Element strides in the chunk and in the tensor. */
    for (int d = nd - 1; d >= 0; d--) {
        cstride[d] = d == nd - 1 ? 1 : cstride[d + 1] * chunk[d + 1];
        tstride[d] = d == nd - 1 ? 1 : tstride[d + 1] * (hsize_t)ti->shape[d + 1];
    }
    size_t zcap = ZSTD_compressBound(cbytes);
    unsigned char *cbuf = malloc(cbytes), *zbuf = malloc(zcap);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    if (!cbuf || !zbuf || !cctx) {
        snprintf(err, errlen, "out of memory for a %zu-byte chunk", cbytes);
        goto done;
    }
    for (;;) {
        int edge = 0;
        for (int d = 0; d < nd; d++) {
            off[d] = idx[d] * chunk[d];
            ext[d] = (hsize_t)ti->shape[d] - off[d] < chunk[d] ? (hsize_t)ti->shape[d] - off[d]
                                                               : chunk[d];
            edge |= ext[d] < chunk[d];
        }
        if (edge) /* HDF5 stores edge chunks whole; pad with zeros */
            memset(cbuf, 0, cbytes);
        /* Copy rows (the last dimension) of the chunk's extent. */
        hsize_t r[CKPT_MAX_DIMS] = {0};
        for (;;) {
            hsize_t ci = 0, ti_ = 0;
            for (int d = 0; d < nd - 1; d++) {
                ci += r[d] * cstride[d];
                ti_ += (off[d] + r[d]) * tstride[d];
            }
            ti_ += off[nd - 1];
            ti_ -= row0 * tstride[0]; /* data starts at row0 */
            memcpy(cbuf + ci * esize, data + ti_ * esize, ext[nd - 1] * esize);
            int d = nd - 2;
            while (d >= 0 && ++r[d] == ext[d])
                r[d--] = 0;
            if (d < 0)
                break;
        }
        size_t z = ZSTD_compressCCtx(cctx, zbuf, zcap, cbuf, cbytes, level);
        if (ZSTD_isError(z)) {
            snprintf(err, errlen, "zstd: %s", ZSTD_getErrorName(z));
            goto done;
        }
        if (H5Dwrite_chunk(dset, H5P_DEFAULT, 0, off, z, zbuf) < 0) {
            h5_reason(err, errlen);
            goto done;
        }
        hsize_t raw = esize;
        for (int d = 0; d < nd; d++)
            raw *= ext[d];
        cli_progress_add(prog, raw);
        int d = nd - 1;
        while (d > 0 && ++idx[d] == grid[d])
            idx[d--] = 0;
        if (d == 0 && ++idx[0] == grid[0])
            break;
    }
    rc = 0;
done:
    ZSTD_freeCCtx(cctx);
    free(cbuf);
    free(zbuf);
    return rc;
}

/* A tensor name must be a relative HDF5 path with no empty, "." or ".."
 * part (HDF5 gives ".." no meaning: such a name failed deep inside it). */
static int valid_h5_path(const char *name)
{
    const char *p = name;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        if (!slash)
            return 1;
        p = slash + 1;
    }
}

/* Whether `name`, or a path above it, is taken in `file` by an earlier
 * tensor: 1 with `why` saying which, else 0.  A path above it that is a
 * group (made for an earlier "a/x") is fine. */
static int h5_path_taken(hid_t file, const char *name, char *why, size_t len)
{
    char path[4096];
    if (strlen(name) >= sizeof path)
        return 0; /* HDF5 itself says what is wrong */
    snprintf(path, sizeof path, "%s", name);
    for (char *slash = path;; slash++) {
        slash = strchr(slash, '/');
        if (slash)
            *slash = '\0';
        if (H5Lexists(file, path, H5P_DEFAULT) <= 0)
            return 0; /* nothing there: neither here nor below */
        H5O_info_t info;
        int leaf = !slash;
        if (leaf || (H5Oget_info_by_name(file, path, &info, H5P_DEFAULT) >= 0 &&
                     info.type != H5O_TYPE_GROUP)) {
            snprintf(why, len, "'%.300s' is already %s", path,
                     leaf ? "taken (a group made for a tensor below it, or a tensor of "
                            "that name)"
                          : "a dataset (a tensor of that name)");
            return 1;
        }
        *slash = '/';
    }
}

typedef enum { CODEC_NONE, CODEC_DEFLATE, CODEC_ZSTD } h5_codec;

/* rename(2) that never replaces `to`: renameat2(RENAME_NOREPLACE), or on
 * a file system without it, link(2) and unlink(2).  -1 with errno EEXIST
 * when `to` exists. */
static int rename_noreplace(const char *from, const char *to)
{
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS)
        return -1;
    if (link(from, to) != 0)
        return -1;
    unlink(from);
    return 0;
}

/* A tensor is exported in slabs of about this many bytes (export_tensor). */
#define EXPORT_SLAB ((uint64_t)64 << 20)

/* Write `data`, rows [r0, r1) of the first dimension of `dset` (`nd`
 * dimensions `dims`), into their place in the dataset. */
static int write_rows(hid_t dset, hid_t type, int nd, const hsize_t *dims, hsize_t r0,
                      hsize_t r1, const void *data)
{
    hsize_t start[CKPT_MAX_DIMS] = {0}, count[CKPT_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        count[d] = dims[d];
    start[0] = r0;
    count[0] = r1 - r0;
    hid_t file_space = H5Dget_space(dset);
    hid_t mem_space = H5Screate_simple(nd, count, NULL);
    int rc = -1;
    if (file_space >= 0 && mem_space >= 0 &&
        H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
        H5Dwrite(dset, type, mem_space, file_space, H5P_DEFAULT, data) >= 0)
        rc = 0;
    if (mem_space >= 0)
        H5Sclose(mem_space);
    if (file_space >= 0)
        H5Sclose(file_space);
    return rc;
}

/* Returns 0, or -1 with `err` set and *lib_status the libckpt status when
 * reading the tensor failed (0 for HDF5 and other errors). */
static int export_tensor(hid_t file, hid_t lcpl, ckpt_checkpoint *ckpt,
                         const ckpt_tensor_info *ti, h5_codec codec, int level,
                         uint64_t chunk_target, cli_progress *prog, char *err, size_t errlen,
                         int *lib_status)
{
    int rc = -1;
    size_t esize = ckpt_dtype_size(ti->dtype);
    const char *dname = ckpt_dtype_name(ti->dtype);
    hid_t type = -1, space = -1, dcpl = -1, dset = -1;
    unsigned char *buf = NULL;
    hsize_t dims[CKPT_MAX_DIMS], chunk[CKPT_MAX_DIMS];
    uint64_t nelem = 1;
    char why[512];

    if (!esize || !dname || (type = h5_type_for(ti->dtype)) < 0) {
        snprintf(err, errlen, "tensor '%s': dtype %d has no HDF5 mapping", ti->name,
                 (int)ti->dtype);
        goto done;
    }
    if (!valid_h5_path(ti->name)) {
        snprintf(err, errlen,
                 "tensor '%s' cannot be an HDF5 dataset path (leading, trailing or doubled "
                 "'/', or a '.' or '..' component)",
                 ti->name);
        goto done;
    }
    for (int d = 0; d < ti->ndim; d++) {
        dims[d] = (hsize_t)ti->shape[d];
        nelem *= dims[d];
    }
    space = ti->ndim ? H5Screate_simple(ti->ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (space < 0 || dcpl < 0)
        goto h5fail;
    /* Scalars and empty tensors cannot be chunked: stored contiguous. */
    int chunked = codec != CODEC_NONE && ti->ndim > 0 && nelem > 0;
    if (chunked) {
        chunk_shape(ti, esize, chunk_target, chunk);
        if (H5Pset_chunk(dcpl, ti->ndim, chunk) < 0 ||
            H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0)
            goto h5fail;
        if (codec == CODEC_DEFLATE && H5Pset_deflate(dcpl, (unsigned)level) < 0)
            goto h5fail;
        if (codec == CODEC_ZSTD) {
            unsigned cd = (unsigned)level;
            if (H5Pset_filter(dcpl, CKPT_H5Z_FILTER_ZSTD, H5Z_FLAG_OPTIONAL, 1, &cd) < 0)
                goto h5fail;
        }
    }
    /* Tensors "a" and "a/b": HDF5 cannot make "a" both a dataset and a
     * group; say so rather than relay its "name already exists". */
    if (h5_path_taken(file, ti->name, why, sizeof why)) {
        snprintf(err, errlen, "tensor '%s' cannot be exported: %s (HDF5 paths cannot hold a "
                 "dataset and a group of one name); rename one of the tensors", ti->name, why);
        goto done;
    }
    dset = H5Dcreate2(file, ti->name, type, space, lcpl, dcpl, H5P_DEFAULT);
    if (dset < 0)
        goto h5fail;
    if (h5_set_str_attr(dset, "dtype", dname) < 0)
        goto h5fail;
    if (!nelem) {
        rc = 0;
        goto done;
    }
    /* The tensor is read and written a slab of rows of its first
     * dimension at a time, EXPORT_SLAB bytes or one row if that is more
     * (whole when it is smaller, or a scalar): a tensor larger than the
     * memory left is exported too.  A compressed dataset's slabs hold
     * whole chunks, so that HDF5 never compresses a chunk twice. */
    uint64_t rowbytes = ti->ndim ? ti->bytes / dims[0] : ti->bytes;
    hsize_t rows = ti->ndim ? dims[0] : 1, per = rows;
    if (ti->bytes > EXPORT_SLAB) {
        per = EXPORT_SLAB / rowbytes ? EXPORT_SLAB / rowbytes : 1;
        if (chunked)
            per = per < chunk[0] ? chunk[0] : per / chunk[0] * chunk[0];
        if (per > rows)
            per = rows;
    }
    if (!(buf = malloc((size_t)(per * rowbytes)))) {
        snprintf(err, errlen, "tensor '%s': out of memory for %" PRIu64 " bytes", ti->name,
                 (uint64_t)(per * rowbytes));
        goto done;
    }
    for (hsize_t r0 = 0; r0 < rows; r0 += per) {
        hsize_t r1 = rows - r0 < per ? rows : r0 + per;
        int st = ckpt_checkpoint_read_range(ckpt, ti->name, r0 * rowbytes, buf,
                                            (r1 - r0) * rowbytes);
        if (st != CKPT_OK) {
            *lib_status = st;
            snprintf(err, errlen, "cannot read tensor '%s': %s", ti->name, ckpt_error_last());
            goto done;
        }
        if (chunked && codec == CODEC_ZSTD) {
            if (write_zstd_chunks(dset, ti, esize, chunk, buf, r0, r1, level, prog, why,
                                  sizeof why) < 0) {
                snprintf(err, errlen, "tensor '%s': %s", ti->name, why);
                goto done;
            }
            continue;
        }
        if (per == rows) {
            if (H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
                goto h5fail;
        } else if (write_rows(dset, type, ti->ndim, dims, r0, r1, buf) < 0) {
            goto h5fail;
        }
        cli_progress_add(prog, (r1 - r0) * rowbytes);
    }
    rc = 0;
    goto done;
h5fail:
    snprintf(err, errlen, "tensor '%s': %s", ti->name, h5_reason(why, sizeof why));
done:
    free(buf);
    if (dset >= 0)
        H5Dclose(dset);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    if (space >= 0)
        H5Sclose(space);
    if (type >= 0)
        H5Tclose(type);
    return rc;
}

int cmd_export(cli_ctx *ctx, int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *codec_name = "none";
    int64_t step = CKPT_LATEST, level = -1000, chunk_kib = 1024;
    int force = 0;
    const cli_opt opts[] = {
        {CLI_OPT_ARG, "DIR", NULL, "checkpoint root", &dir, 1, 0, NULL},
        {CLI_OPT_ARG, "OUT.h5", NULL, "HDF5 file to write", &out, 1, 0, NULL},
        {CLI_OPT_INT, "step", "N", "step to export (default: newest valid)", &step, 0, 0, NULL},
        {CLI_OPT_STRING, "codec", "CODEC", "none (default), deflate or zstd", &codec_name, 0,
         0, NULL},
        {CLI_OPT_INT, "level", "L", "compression level (deflate 0-9, default 4; zstd, default 3)",
         &level, 0, -131072, NULL},
        {CLI_OPT_INT, "chunk-kib", "K", "chunk size for compressed datasets (default 1024)",
         &chunk_kib, 0, 1, NULL},
        {CLI_OPT_FLAG, "force", NULL, "replace OUT.h5 if it exists", &force, 0, 0, NULL},
        {CLI_OPT_END, NULL, NULL, NULL, NULL, 0, 0, NULL},
    };
    int ret = 0;
    if (cli_parse(ctx, &cli_cmd_export, opts, argc, argv, &ret))
        return ret;
    h5_codec codec;
    if (strcmp(codec_name, "none") == 0)
        codec = CODEC_NONE;
    else if (strcmp(codec_name, "deflate") == 0)
        codec = CODEC_DEFLATE;
    else if (strcmp(codec_name, "zstd") == 0)
        codec = CODEC_ZSTD;
    else
        return cli_usage(ctx, "--codec must be none, deflate or zstd, not '%s'", codec_name);
    if (level == -1000)
        level = codec == CODEC_ZSTD ? 3 : 4;
    if (codec == CODEC_DEFLATE && (level < 0 || level > 9))
        return cli_usage(ctx, "--level for deflate must be 0-9");
    if (codec == CODEC_ZSTD && (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()))
        return cli_usage(ctx, "--level for zstd must be %d-%d", ZSTD_minCLevel(),
                         ZSTD_maxCLevel());
    if (chunk_kib > 1024 * 1024)
        return cli_usage(ctx, "--chunk-kib must be at most 1048576 (1 GiB)");
    if (!force && access(out, F_OK) == 0)
        return cli_fail(ctx, CLI_EXIT_ERROR, 0, "%s exists (use --force to replace it)", out);

    ckpt_store *store = NULL;
    ckpt_checkpoint *ckpt = NULL;
    hid_t file = -1, lcpl = -1, root = -1;
    int created = 0; /* tmp is ours to remove */
    char *tmp = NULL, why[512], err[1024] = "";
    cli_progress prog = {0};
    int st;
    uint64_t raw = 0;
    size_t n = 0;

    if ((ret = cli_open_readonly(ctx, dir, &store)))
        goto done;
    if ((st = ckpt_checkpoint_open(&ckpt, store, step, CKPT_VERIFY_QUICK)) != CKPT_OK) {
        if (step == CKPT_LATEST)
            ret = cli_fail_lib(ctx, st == CKPT_ENOTFOUND ? CKPT_ENOCKPT : st,
                               "cannot open the latest checkpoint");
        else
            ret = cli_fail_lib(ctx, st, "cannot open step %" PRId64, step);
        goto done;
    }
    n = ckpt_checkpoint_tensor_count(ckpt);
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor_info ti;
        if (ckpt_checkpoint_tensor(ckpt, i, &ti) == CKPT_OK)
            raw += ti.bytes;
    }

    h5_setup();
    size_t tlen = strlen(out) + 32;
    tmp = malloc(tlen);
    if (!tmp) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, CKPT_ENOMEM, "out of memory");
        goto done;
    }
    /* Created exclusively (O_EXCL: a planted file or link at the name is
     * never opened, truncated or followed); a few names are tried. */
    file = -1;
    /* As private as the checkpoint's own files (0640 at most, 0600 in a
     * root whose group is shared; FORMAT.md): the export holds every
     * tensor and the environment record (the command line included), so
     * it takes the manifest's mode, never more than 0640.  HDF5 creates
     * with 0666 less the umask, so the umask is narrowed around the create
     * rather than the file chmod'ed after, when another user could already
     * have opened it. */
    mode_t allowed = 0640;
    {
        const char *stepdir = ckpt_checkpoint_path(ckpt);
        char mpath[PATH_MAX];
        struct stat ms;
        int len = stepdir ? snprintf(mpath, sizeof mpath, "%s/manifest.json", stepdir) : -1;
        if (len > 0 && len < (int)sizeof mpath && stat(mpath, &ms) == 0)
            allowed &= ms.st_mode & 0666;
    }
    mode_t umask_was = umask(0);
    umask(umask_was | 027 | (0666 & ~allowed));
    for (unsigned attempt = 0; file < 0 && attempt < 16; attempt++) {
        snprintf(tmp, tlen, "%s.tmp-%ld-%u", out, (long)getpid(), attempt);
        H5E_BEGIN_TRY { file = H5Fcreate(tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT); }
        H5E_END_TRY;
    }
    if (file < 0) /* once more, for HDF5's reason in the message */
        file = H5Fcreate(tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    umask(umask_was);
    created = file >= 0;
    if (file >= 0) {
        /* A default POSIX ACL of the directory replaces the umask (the
         * file would be 0666 less nothing): the mode is narrowed at once,
         * which also masks any named entries it brought. */
        void *handle = NULL;
        struct stat fs;
        if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) >= 0 && handle &&
            fstat(*(int *)handle, &fs) == 0 && (fs.st_mode & 0777 & ~allowed))
            (void)fchmod(*(int *)handle, fs.st_mode & allowed);
    }
    if (file < 0) {
        ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot create %s: %s", tmp,
                       h5_reason(why, sizeof why));
        goto done;
    }
    lcpl = H5Pcreate(H5P_LINK_CREATE);
    root = H5Gopen2(file, "/", H5P_DEFAULT);
    if (lcpl < 0 || root < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        H5Pset_char_encoding(lcpl, H5T_CSET_UTF8) < 0)
        goto h5fail;
    {
        int64_t s = ckpt_checkpoint_step(ckpt);
        double t = ckpt_checkpoint_time(ckpt);
        const char *meta = ckpt_checkpoint_metadata(ckpt), *env = ckpt_checkpoint_env(ckpt);
        if (h5_set_num_attr(root, "step", H5T_NATIVE_INT64, &s) < 0 ||
            h5_set_num_attr(root, "time", H5T_NATIVE_DOUBLE, &t) < 0 ||
            h5_set_str_attr(root, "metadata", meta ? meta : "null") < 0 ||
            h5_set_str_attr(root, "environment", env ? env : "{}") < 0 ||
            h5_set_str_attr(root, "codec", codec_name) < 0 ||
            h5_set_str_attr(root, "format", "libckpt-hdf5-1") < 0 ||
            h5_set_str_attr(root, "libckpt_version", ckpt_version_string()) < 0)
            goto h5fail;
    }
    cli_progress_start(&prog, "export", raw);
    for (size_t i = 0; i < n; i++) {
        ckpt_tensor_info ti;
        if ((st = ckpt_checkpoint_tensor(ckpt, i, &ti)) != CKPT_OK) {
            cli_progress_end(&prog);
            ret = cli_fail_lib(ctx, st, "cannot describe tensor %zu", i);
            goto done;
        }
        int lib_status = 0;
        if (export_tensor(file, lcpl, ckpt, &ti, codec, (int)level,
                          (uint64_t)chunk_kib * 1024, &prog, err, sizeof err, &lib_status) < 0) {
            cli_progress_end(&prog);
            /* A chunk that fails verification is exit 1, like verify. */
            ret = cli_fail(ctx, lib_status ? cli_exit_for(lib_status) : CLI_EXIT_ERROR,
                           lib_status, "export to %s failed: %s", out, err);
            goto done;
        }
    }
    cli_progress_end(&prog);
    H5Gclose(root);
    root = -1;
    if (H5Fclose(file) < 0) {
        file = -1;
        goto h5fail;
    }
    file = -1;
    /* Without --force, an OUT made while the export ran (by another
     * program) is kept, as one there at the start is. */
    if (force ? rename(tmp, out) != 0 : rename_noreplace(tmp, out) != 0) {
        if (!force && errno == EEXIST)
            ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "%s was created while exporting to it "
                           "(use --force to replace it); it is kept", out);
        else
            ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "cannot rename %s to %s: %s", tmp, out,
                           strerror(errno));
        goto done;
    }
    struct stat sb;
    uint64_t fbytes = stat(out, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    const char *plugin_dir = codec == CODEC_ZSTD ? h5zstd_plugin_dir() : NULL;
    if (ctx->json) {
        json_t *doc = json_pack("{s:s, s:s, s:I, s:s, s:I, s:I, s:I}", "file", out, "root",
                                ckpt_store_path(store), "step",
                                (json_int_t)ckpt_checkpoint_step(ckpt), "codec", codec_name,
                                "datasets", (json_int_t)n, "raw_bytes", (json_int_t)raw,
                                "file_bytes", (json_int_t)fbytes);
        if (doc && plugin_dir)
            json_object_set_new(doc, "hdf5_plugin_path", json_string(plugin_dir));
        cli_json_print(doc);
    } else {
        char b1[32], b2[32];
        printf("exported step %" PRId64 ": %zu datasets, %s raw, %s in %s\n",
               ckpt_checkpoint_step(ckpt), n, cli_fmt_bytes(raw, b1), cli_fmt_bytes(fbytes, b2),
               out);
    }
    if (plugin_dir) {
        fflush(stdout);
        zstd_plugin_note(plugin_dir);
    }
    ret = CLI_EXIT_OK;
    goto done;
h5fail:
    ret = cli_fail(ctx, CLI_EXIT_ERROR, 0, "export to %s failed: %s", out,
                   h5_reason(why, sizeof why));
done:
    if (root >= 0)
        H5Gclose(root);
    if (lcpl >= 0)
        H5Pclose(lcpl);
    if (file >= 0)
        H5Fclose(file);
    if (created && ret != CLI_EXIT_OK)
        unlink(tmp); /* ours: created exclusively above */
    free(tmp);
    ckpt_checkpoint_free(ckpt);
    ckpt_store_free(store);
    return ret;
}

