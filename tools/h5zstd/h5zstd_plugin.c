/* h5zstd_plugin: entry points HDF5 looks for in $HDF5_PLUGIN_PATH. */
#include <H5PLextern.h>

#include "h5zstd.h"

H5PL_type_t H5PLget_plugin_type(void)
{
    return H5PL_TYPE_FILTER;
}

const void *H5PLget_plugin_info(void)
{
    return ckpt_h5zstd_class;
}
