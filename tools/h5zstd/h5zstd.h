/* h5zstd: the Zstandard HDF5 filter (registered id 32015). */
#ifndef CKPT_H5ZSTD_H
#define CKPT_H5ZSTD_H

#include <hdf5.h>

/* The id registered with The HDF Group for Zstandard (as used by h5py's
 * hdf5plugin and HDF5's own filter collection).  cd_values[0], when
 * present, is the compression level as a signed int; cd_values[1], set
 * when a dataset is made with it, the size of a chunk in bytes, which a
 * decoded frame must have (h5zstd_filter.c). */
#define CKPT_H5Z_FILTER_ZSTD 32015

/* The filter class; H5Zregister(ckpt_h5zstd_class) makes it available in
 * this process, the plugin (h5zstd_plugin.c) in any HDF5 program. */
extern const H5Z_class2_t ckpt_h5zstd_class[1];

/* For a program with the filter compiled in (not the plugin): the size in
 * bytes of a chunk of the dataset about to be read, which every decoded
 * frame must have when the dataset's filter does not record it (a file
 * another program wrote); 0 when none is known.  One dataset at a time:
 * process-wide, not thread-safe. */
void ckpt_h5zstd_expect(size_t chunk_bytes);

#endif
