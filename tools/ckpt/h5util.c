/* h5util: what ckpt export and import share: HDF5 error text, the dtype
 * to HDF5 type mapping and string attributes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h5util.h"
#include "h5zstd.h"

/* ------------------------------------------------------ HDF5 errors */

typedef struct h5_err {
    char top[240];  /* the API call that failed          */
    char root[240]; /* the deepest, most specific reason */
} h5_err;

static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *data)
{
    h5_err *err = data;
    if (n == 0)
        snprintf(err->top, sizeof err->top, "%s: %s", e->func_name, e->desc ? e->desc : "");
    snprintf(err->root, sizeof err->root, "%s", e->desc ? e->desc : "");
    return 0;
}

/* The HDF5 error stack of the failed call, as one phrase. */
const char *h5_reason(char *buf, size_t len)
{
    h5_err err = {"", ""};
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &err);
    H5Eclear2(H5E_DEFAULT);
    if (!*err.top)
        snprintf(buf, len, "HDF5 error");
    else if (!*err.root || strstr(err.top, err.root))
        snprintf(buf, len, "%s", err.top);
    else
        snprintf(buf, len, "%s (%s)", err.top, err.root);
    return buf;
}

void h5_setup(void)
{
    /* No library teardown at exit: a file whose close failed (a full disk
     * while flushing compressed chunks) stays open inside HDF5, and its
     * teardown then crashed flushing it again (SIGSEGV in H5F__close_cb
     * after the error was reported).  Every file is closed explicitly
     * before; the exit frees the rest. */
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* In this process zstd chunks read without a plugin search, and
     * through this filter, whatever plugin HDF5_PLUGIN_PATH holds: it
     * checks each frame's size (ckpt_h5zstd_expect). */
    H5Zregister(ckpt_h5zstd_class);
    H5Eclear2(H5E_DEFAULT);
}

/* ------------------------------------------------------------ types */

/* The HDF5 type a dtype is exported as; its memory layout is exactly the
 * tensor's bytes (native order, little-endian on the hosts libckpt runs on). */
hid_t h5_type_for(ckpt_dtype dt)
{
    hid_t t = -1;
    switch (dt) {
    case CKPT_BOOL: {
        /* h5py's bool: enum of int8 {FALSE = 0, TRUE = 1}. */
        int8_t f = 0, v = 1;
        t = H5Tenum_create(H5T_NATIVE_INT8);
        if (t >= 0 && (H5Tenum_insert(t, "FALSE", &f) < 0 || H5Tenum_insert(t, "TRUE", &v) < 0)) {
            H5Tclose(t);
            t = -1;
        }
        return t;
    }
    case CKPT_U8: return H5Tcopy(H5T_NATIVE_UINT8);
    case CKPT_I8: return H5Tcopy(H5T_NATIVE_INT8);
    case CKPT_U16: return H5Tcopy(H5T_NATIVE_UINT16);
    case CKPT_I16: return H5Tcopy(H5T_NATIVE_INT16);
    case CKPT_U32: return H5Tcopy(H5T_NATIVE_UINT32);
    case CKPT_I32: return H5Tcopy(H5T_NATIVE_INT32);
    case CKPT_U64: return H5Tcopy(H5T_NATIVE_UINT64);
    case CKPT_I64: return H5Tcopy(H5T_NATIVE_INT64);
    case CKPT_F16:
        /* IEEE half as h5py defines it (HDF5 1.10 has no predefined one). */
        t = H5Tcopy(H5T_IEEE_F32LE);
        if (t >= 0 && (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_size(t, 2) < 0 ||
                       H5Tset_ebias(t, 15) < 0)) {
            H5Tclose(t);
            t = -1;
        }
        return t;
    case CKPT_BF16: return H5Tcopy(H5T_NATIVE_UINT16);
    case CKPT_F32: return H5Tcopy(H5T_NATIVE_FLOAT);
    case CKPT_F64: return H5Tcopy(H5T_NATIVE_DOUBLE);
    case CKPT_C64:
    case CKPT_C128: {
        hid_t part = dt == CKPT_C64 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
        size_t sz = H5Tget_size(part);
        t = H5Tcreate(H5T_COMPOUND, 2 * sz);
        if (t >= 0 && (H5Tinsert(t, "r", 0, part) < 0 || H5Tinsert(t, "i", sz, part) < 0)) {
            H5Tclose(t);
            t = -1;
        }
        return t;
    }
    case CKPT_F8_E4M3:
    case CKPT_F8_E5M2:
    case CKPT_BYTES: return H5Tcopy(H5T_NATIVE_UINT8);
    default: return -1;
    }
}

int h5_set_str_attr(hid_t obj, const char *name, const char *value)
{
    hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate(H5S_SCALAR), a = -1;
    int ok = t >= 0 && s >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0 &&
             H5Tset_cset(t, H5T_CSET_UTF8) >= 0 &&
             (a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
             H5Awrite(a, t, &value) >= 0;
    if (a >= 0)
        H5Aclose(a);
    if (s >= 0)
        H5Sclose(s);
    if (t >= 0)
        H5Tclose(t);
    return ok ? 0 : -1;
}

int h5_set_num_attr(hid_t obj, const char *name, hid_t type, const void *value)
{
    hid_t s = H5Screate(H5S_SCALAR), a = -1;
    int ok = s >= 0 && (a = H5Acreate2(obj, name, type, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
             H5Awrite(a, type, value) >= 0;
    if (a >= 0)
        H5Aclose(a);
    if (s >= 0)
        H5Sclose(s);
    return ok ? 0 : -1;
}

/* A string attribute as malloc'd text, or NULL when absent / not a string. */
char *h5_get_str_attr(hid_t obj, const char *name)
{
    char *out = NULL;
    if (H5Aexists(obj, name) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return NULL;
    }
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t ft = a >= 0 ? H5Aget_type(a) : -1;
    hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
    if (ft < 0 || sp < 0 || H5Tget_class(ft) != H5T_STRING || H5Sget_simple_extent_npoints(sp) != 1)
        goto done;
    if (H5Tis_variable_str(ft) > 0) {
        hid_t mt = H5Tcopy(H5T_C_S1);
        char *v = NULL;
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(ft));
        if (H5Aread(a, mt, &v) >= 0 && v) {
            out = strdup(v);
            H5free_memory(v);
        }
        H5Tclose(mt);
    } else {
        size_t n = H5Tget_size(ft);
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, n + 1);
        H5Tset_cset(mt, H5Tget_cset(ft));
        out = calloc(1, n + 1);
        if (out && H5Aread(a, mt, out) < 0) {
            free(out);
            out = NULL;
        }
        H5Tclose(mt);
    }
done:
    if (sp >= 0)
        H5Sclose(sp);
    if (ft >= 0)
        H5Tclose(ft);
    if (a >= 0)
        H5Aclose(a);
    H5Eclear2(H5E_DEFAULT);
    return out;
}

