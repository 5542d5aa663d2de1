/* dtype: element sizes and names of the dtypes. */
#include <string.h>

#include "ckpt.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[CKPT_DTYPE_COUNT_] = {
    [CKPT_BOOL] = {"bool", 1},       [CKPT_U8] = {"uint8", 1},
    [CKPT_I8] = {"int8", 1},         [CKPT_U16] = {"uint16", 2},
    [CKPT_I16] = {"int16", 2},       [CKPT_U32] = {"uint32", 4},
    [CKPT_I32] = {"int32", 4},       [CKPT_U64] = {"uint64", 8},
    [CKPT_I64] = {"int64", 8},       [CKPT_F16] = {"float16", 2},
    [CKPT_BF16] = {"bfloat16", 2},   [CKPT_F32] = {"float32", 4},
    [CKPT_F64] = {"float64", 8},     [CKPT_C64] = {"complex64", 8},
    [CKPT_C128] = {"complex128", 16}, [CKPT_F8_E4M3] = {"float8_e4m3fn", 1},
    [CKPT_F8_E5M2] = {"float8_e5m2", 1}, [CKPT_BYTES] = {"bytes", 1},
};

CKPT_API size_t ckpt_dtype_size(ckpt_dtype dtype)
{
    if ((int)dtype <= 0 || dtype >= CKPT_DTYPE_COUNT_)
        return 0;
    return dtypes[dtype].size;
}

CKPT_API const char *ckpt_dtype_name(ckpt_dtype dtype)
{
    if ((int)dtype <= 0 || dtype >= CKPT_DTYPE_COUNT_)
        return NULL;
    return dtypes[dtype].name;
}

CKPT_API ckpt_dtype ckpt_dtype_from_name(const char *name)
{
    if (!name)
        return CKPT_DTYPE_INVALID;
    for (int i = 1; i < CKPT_DTYPE_COUNT_; i++) /* a manifest asks once per tensor */
        if (dtypes[i].name[0] == name[0] && strcmp(dtypes[i].name, name) == 0)
            return (ckpt_dtype)i;
    return CKPT_DTYPE_INVALID;
}
