/* h5util: HDF5 helpers shared by ckpt export and import. */
#ifndef CKPT_CLI_H5UTIL_H
#define CKPT_CLI_H5UTIL_H

#include <stddef.h>

#include <hdf5.h>

#include "ckpt.h"

#if !H5_VERSION_GE(1, 10, 3)
#error "HDF5 >= 1.10.3 is needed (H5Dwrite_chunk)"
#endif

#if H5_VERSION_GE(1, 12, 0)
typedef H5L_info2_t h5_link_info;
#else
typedef H5L_info_t h5_link_info;
#endif

/* Silence HDF5's own error printing and register the zstd filter (32015)
 * in this process, so no plugin search is needed. */
void h5_setup(void);
/* The HDF5 error stack of the call that just failed, as one phrase in
 * `buf`; clears the stack. */
const char *h5_reason(char *buf, size_t len);

/* The HDF5 type `dt` is exported as (docs/CLI.md); its memory layout is
 * exactly the tensor's bytes.  -1 for an unknown dtype; H5Tclose it. */
hid_t h5_type_for(ckpt_dtype dt);

/* Scalar attributes: a UTF-8 variable-length string, a number of `type`. */
int h5_set_str_attr(hid_t obj, const char *name, const char *value);
int h5_set_num_attr(hid_t obj, const char *name, hid_t type, const void *value);
/* A scalar string attribute as malloc'd text; NULL when absent or not one. */
char *h5_get_str_attr(hid_t obj, const char *name);

#endif
