/* version: the library's version and its one general-purpose free. */
#include <stdlib.h>

#include "ckpt.h"

CKPT_API int ckpt_version_number(void)
{
    return CKPT_VERSION_NUMBER;
}

CKPT_API const char *ckpt_version_string(void)
{
    return CKPT_VERSION_STRING;
}

CKPT_API void ckpt_free(void *ptr)
{
    free(ptr);
}
