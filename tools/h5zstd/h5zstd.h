/* h5zstd: the Zstandard HDF5 filter (registered id 32015). */
#ifndef CKPT_H5ZSTD_H
#define CKPT_H5ZSTD_H

#include <hdf5.h>

/* The id registered with The HDF Group for Zstandard (as used by h5py's
 * hdf5plugin and HDF5's own filter collection).  cd_values[0], when
 * present, is the compression level as a signed int. */
#define CKPT_H5Z_FILTER_ZSTD 32015

/* The filter class; H5Zregister(ckpt_h5zstd_class) makes it available in
 * this process, the plugin (h5zstd_plugin.c) in any HDF5 program. */
extern const H5Z_class2_t ckpt_h5zstd_class[1];

#endif
