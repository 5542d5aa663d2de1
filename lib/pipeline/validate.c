/* validate: the caller's tensor descriptors, checked before any is used. */
#include "validate.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "nameset.h"
#include "util.h"

int validate_tensors(const ckpt_tensor *t, size_t count, int for_restore)
{
    if (count > 0 && !t)
        return ckpt_seterr(CKPT_EINVAL, "tensors is NULL but count is %zu", count);
    if (count > UINT32_MAX)
        return ckpt_seterr(CKPT_EINVAL, "too many tensors (%zu)", count);
    for (size_t i = 0; i < count; i++) {
        const ckpt_tensor *x = &t[i];
        if (!x->name)
            return ckpt_seterr(CKPT_EINVAL, "tensor %zu has no name", i);
        size_t len = 0;
        int ascii = 1; /* ASCII is UTF-8: jansson is asked only about the rest */
        for (const unsigned char *c = (const unsigned char *)x->name; *c; c++, len++)
            ascii &= *c < 0x80;
        json_t *probe = ascii ? NULL : json_string(x->name); /* NULL unless valid UTF-8 */
        json_decref(probe);
        if (len == 0 || len > CKPT_NAME_MAX || (!ascii && !probe))
            return ckpt_seterr(CKPT_EINVAL, "tensor %zu: name must be 1..%d bytes of "
                               "UTF-8", i, CKPT_NAME_MAX);
        size_t es = ckpt_dtype_size(x->dtype);
        if (es == 0)
            return ckpt_seterr(CKPT_EINVAL, "tensor '%s': invalid dtype %d", x->name,
                               (int)x->dtype);
        if (x->ndim < 0 || x->ndim > CKPT_MAX_DIMS || (x->ndim > 0 && !x->shape))
            return ckpt_seterr(CKPT_EINVAL, "tensor '%s': ndim %d invalid or shape is NULL",
                               x->name, x->ndim);
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] < 0)
                return ckpt_seterr(CKPT_EINVAL, "tensor '%s': invalid dimension %d (%lld)",
                                   x->name, d, (long long)x->shape[d]);
        uint64_t bytes;
        if (!util_shape_bytes(x->shape, x->ndim, es, &bytes))
            return ckpt_seterr(CKPT_EINVAL, "tensor '%s': invalid shape: its nonzero "
                               "dimensions times the %s element size exceed 2^63-1 bytes",
                               x->name, ckpt_dtype_name(x->dtype));
        if (bytes != x->bytes)
            return ckpt_seterr(CKPT_EINVAL, "tensor '%s': %llu bytes given, shape and %s "
                               "make %llu", x->name, (unsigned long long)x->bytes,
                               ckpt_dtype_name(x->dtype), (unsigned long long)bytes);
        if (x->bytes > 0 && !x->data)
            return ckpt_seterr(CKPT_EINVAL, "tensor '%s': data is NULL", x->name);
        if (x->memory != CKPT_MEM_HOST && x->memory != CKPT_MEM_DEVICE &&
            x->memory != CKPT_MEM_AUTO)
            return ckpt_seterr(CKPT_EINVAL, "tensor '%s': invalid memory kind %d",
                               x->name, (int)x->memory);
    }
    const char **names = malloc((count ? count : 1) * sizeof *names);
    if (!names)
        return ckpt_seterr(CKPT_ENOMEM, "out of memory");
    for (size_t i = 0; i < count; i++)
        names[i] = t[i].name;
    size_t at;
    int rc = CKPT_OK;
    switch (nameset_find_repeat(names, count, &at)) {
    case 1:
        rc = ckpt_seterr(CKPT_EINVAL, "tensor name '%s' is given twice%s", names[at],
                         for_restore ? " to restore" : "");
        break;
    case -1:
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
        break;
    }
    free(names);
    return rc;
}
