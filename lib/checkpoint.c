/* checkpoint: the public face of ckpt_checkpoint (one committed step
 * opened for reading) and ckpt_load; the work is pipeline/reader.c. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "manifest.h"
#include "reader.h"
#include "restore.h"
#include "save.h"
#include "validate.h"


CKPT_API int ckpt_checkpoint_open(ckpt_checkpoint **out, ckpt_store *s, int64_t step,
                                  ckpt_verify_level level)
{
    if (out)
        *out = NULL;
    if (!out || !s)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_open: NULL argument");
    if (level != CKPT_VERIFY_QUICK && level != CKPT_VERIFY_FULL)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_open: level must be "
                           "CKPT_VERIFY_QUICK or CKPT_VERIFY_FULL");
    if (context_usable(s, "ckpt_checkpoint_open"))
        return CKPT_EINVAL;
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    int rc = reader_open_select(s, step, level, out);
    pthread_mutex_unlock(&s->api_lock);
    return rc;
}

CKPT_API void ckpt_checkpoint_free(ckpt_checkpoint *ck)
{
    if (ck && context_forked(ck->store)) /* a child's copy: let go of nothing */
        return;
    reader_close(ck);
}

CKPT_API int64_t ckpt_checkpoint_step(const ckpt_checkpoint *ck)
{
    return ck ? ck->m.step : -1;
}

CKPT_API const char *ckpt_checkpoint_path(const ckpt_checkpoint *ck)
{
    return ck ? ck->shown : NULL;
}

CKPT_API size_t ckpt_checkpoint_tensor_count(const ckpt_checkpoint *ck)
{
    return ck ? ck->m.ntensors : 0;
}

CKPT_API int ckpt_checkpoint_world_size(const ckpt_checkpoint *ck)
{
    return ck && ck->m.world_size > 1 ? (int)ck->m.world_size : 1;
}

CKPT_API int ckpt_checkpoint_tensor_rank(const ckpt_checkpoint *ck, size_t i, int *rank)
{
    if (!ck || !rank)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_tensor_rank: NULL argument");
    if (context_usable(ck->store, "ckpt_checkpoint_tensor_rank"))
        return CKPT_EINVAL;
    if (i >= ck->m.ntensors)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_tensor_rank: index %zu out of range "
                           "(%zu tensors)", i, (size_t)ck->m.ntensors);
    /* Shard r is rank r's on a step of several ranks (FORMAT.md). */
    *rank = ck->m.world_size > 1 ? (int)ck->m.tensors[i].shard : 0;
    return CKPT_OK;
}

CKPT_API int ckpt_checkpoint_tensor(const ckpt_checkpoint *ck, size_t i, ckpt_tensor_info *info)
{
    if (!ck || !info)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_tensor: NULL argument");
    if (context_usable(ck->store, "ckpt_checkpoint_tensor"))
        return CKPT_EINVAL;
    if (i >= ck->m.ntensors)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_tensor: index %zu out of range "
                           "(%zu tensors)", i, (size_t)ck->m.ntensors);
    const manifest_tensor *t = &ck->m.tensors[i];
    memset(info, 0, sizeof *info);
    info->name = t->name;
    info->dtype = t->dtype;
    info->ndim = t->ndim;
    memcpy(info->shape, t->shape, sizeof t->shape);
    info->bytes = t->bytes;
    info->stored_bytes = t->stored_bytes;
    info->chunks = t->chunks;
    return CKPT_OK;
}

CKPT_API int ckpt_checkpoint_tensors(const ckpt_checkpoint *ck, size_t first, size_t count,
                                     ckpt_tensor_info *infos)
{
    if (!ck || (!infos && count))
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_tensors: NULL argument");
    if (context_usable(ck->store, "ckpt_checkpoint_tensors"))
        return CKPT_EINVAL;
    if (first > ck->m.ntensors || count > ck->m.ntensors - first)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_tensors: tensors %zu..+%zu are out "
                           "of range (%zu tensors)", first, count, (size_t)ck->m.ntensors);
    for (size_t i = 0; i < count; i++)
        ckpt_checkpoint_tensor(ck, first + i, &infos[i]); /* checked above: cannot fail */
    return CKPT_OK;
}

CKPT_API int ckpt_checkpoint_find(const ckpt_checkpoint *ck, const char *name, size_t *index)
{
    if (!ck || !name || !index)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_find: NULL argument");
    if (context_usable(ck->store, "ckpt_checkpoint_find"))
        return CKPT_EINVAL;
    /* const to the caller: the only change is the name index made on the
     * first search, under its lock */
    long i = reader_find((ckpt_checkpoint *)ck, name);
    if (i < 0)
        return ckpt_seterr(CKPT_ENOTFOUND, "tensor '%s' is not in %s", name, ck->label);
    *index = (size_t)i;
    return CKPT_OK;
}

CKPT_API const char *ckpt_checkpoint_metadata(const ckpt_checkpoint *ck)
{
    return ck ? ck->meta_text : NULL;
}

CKPT_API int ckpt_checkpoint_rank_metadata(const ckpt_checkpoint *cck, int rank,
                                           const char **json)
{
    if (json)
        *json = NULL;
    if (!cck || !json)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_rank_metadata: NULL argument");
    if (context_usable(cck->store, "ckpt_checkpoint_rank_metadata"))
        return CKPT_EINVAL;
    uint32_t world = cck->m.world_size > 1 ? cck->m.world_size : 1;
    if (rank < 0 || (uint32_t)rank >= world)
        return ckpt_seterr(CKPT_ENOTFOUND, "%s was saved by %u rank%s: it has no rank %d",
                           cck->label, world, world > 1 ? "s" : "", rank);
    if (rank == 0) { /* the global manifest carries rank 0's */
        *json = cck->meta_text;
        return CKPT_OK;
    }
    if (context_usable(cck->store, "ckpt_checkpoint_rank_metadata"))
        return CKPT_EINVAL;
    /* const to the caller: the only change is the metadata kept once read,
     * under the store's lock (as the part is opened through the store) */
    ckpt_checkpoint *ck = (ckpt_checkpoint *)cck;
    ckpt_store *s = ck->store;
    int rc = CKPT_OK;
    pthread_mutex_lock(&s->api_lock);
    if (!ck->rank_meta && !(ck->rank_meta = calloc(world, sizeof *ck->rank_meta)))
        rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
    if (!rc && !ck->rank_meta[rank]) {
        char part[MANIFEST_PART_NAME_SIZE];
        manifest_part_name((uint32_t)rank, part);
        ckpt_checkpoint *pk = NULL;
        rc = reader_open_manifest(s, ck->dir, part, ck->m.step, &pk);
        if (rc)
            ckpt_seterr(rc, "rank %d's metadata is kept in its part manifest %s/%s, which "
                        "cannot be read: %s", rank, ck->label, part, ckpt_error_last());
        else if (!reader_part_agrees(&ck->m, &pk->m, (uint32_t)rank))
            rc = ckpt_seterr(CKPT_ECORRUPT, "rank %d's metadata is kept in its part manifest "
                             "%s/%s, which does not list what %s gives rank %d", rank,
                             ck->label, part, MANIFEST_NAME, rank);
        else if (!(ck->rank_meta[rank] = strdup(pk->meta_text)))
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory");
        reader_close(pk);
    }
    if (!rc)
        *json = ck->rank_meta[rank];
    pthread_mutex_unlock(&s->api_lock);
    return rc;
}

CKPT_API const char *ckpt_checkpoint_env(const ckpt_checkpoint *ck)
{
    return ck ? ck->env_text : NULL;
}

CKPT_API const char *ckpt_checkpoint_manifest(const ckpt_checkpoint *ck)
{
    return ck ? ck->text : NULL;
}

CKPT_API double ckpt_checkpoint_time(const ckpt_checkpoint *ck)
{
    return ck ? ck->m.time : 0.0;
}

CKPT_API int ckpt_checkpoint_stats(const ckpt_checkpoint *ck, ckpt_save_stats *stats)
{
    if (!ck || !stats)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_stats: NULL argument");
    if (context_usable(ck->store, "ckpt_checkpoint_stats"))
        return CKPT_EINVAL;
    *stats = ck->m.stats;
    return CKPT_OK;
}

CKPT_API int ckpt_checkpoint_read(ckpt_checkpoint *ck, const char *name, void *dst,
                                  uint64_t bytes)
{
    if (!ck || !name || (!dst && bytes))
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_read: NULL argument");
    if (context_usable(ck->store, "ckpt_checkpoint_read"))
        return CKPT_EINVAL;
    long i = reader_find(ck, name);
    if (i < 0)
        return ckpt_seterr(CKPT_ENOTFOUND, "tensor '%s' is not in %s", name, ck->label);
    if (ck->m.tensors[i].bytes != bytes)
        return ckpt_seterr(CKPT_EMISMATCH, "tensor '%s' has %llu bytes, buffer %llu", name,
                           (unsigned long long)ck->m.tensors[i].bytes,
                           (unsigned long long)bytes);
    reader_target t = {(uint32_t)i, dst, CKPT_MEM_HOST, NULL, -1};
    pthread_mutex_lock(&ck->store->api_lock);
    int rc = reader_read(ck, &t, 1);
    pthread_mutex_unlock(&ck->store->api_lock);
    return rc;
}

CKPT_API int ckpt_checkpoint_read_range(ckpt_checkpoint *ck, const char *name, uint64_t offset,
                                        void *dst, uint64_t bytes)
{
    if (!ck || !name || (!dst && bytes))
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_read_range: NULL argument");
    if (context_usable(ck->store, "ckpt_checkpoint_read_range"))
        return CKPT_EINVAL;
    long i = reader_find(ck, name);
    if (i < 0)
        return ckpt_seterr(CKPT_ENOTFOUND, "tensor '%s' is not in %s", name, ck->label);
    uint64_t size = ck->m.tensors[i].bytes;
    if (offset > size || bytes > size - offset)
        return ckpt_seterr(CKPT_EINVAL,
                           "bytes %llu to %llu are outside tensor '%s' of %llu bytes in %s",
                           (unsigned long long)offset, (unsigned long long)offset + bytes, name,
                           (unsigned long long)size, ck->label);
    if (!bytes)
        return CKPT_OK;
    pthread_mutex_lock(&ck->store->api_lock);
    int rc = reader_read_range(ck, (uint32_t)i, offset, dst, bytes);
    pthread_mutex_unlock(&ck->store->api_lock);
    return rc;
}

CKPT_API int ckpt_checkpoint_restore(ckpt_checkpoint *ck, const ckpt_tensor *t, size_t count,
                                     const ckpt_restore_options *opts)
{
    if (!ck)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_checkpoint_restore: checkpoint is NULL");
    if (context_usable(ck->store, "ckpt_checkpoint_restore"))
        return CKPT_EINVAL;
    ckpt_restore_options o;
    int rc = restore_options_read(opts, &o, "ckpt_checkpoint_restore");
    if (rc)
        return rc;
    rc = validate_tensors(t, count, 1);
    if (rc)
        return rc;
    int caller_error;
    pthread_mutex_lock(&ck->store->api_lock);
    rc = restore_from(ck, t, count, &o, &caller_error, NULL);
    pthread_mutex_unlock(&ck->store->api_lock);
    return rc;
}

CKPT_API int ckpt_load(ckpt_store *s, int64_t step, const char *name, void **data,
                       uint64_t *bytes, ckpt_tensor_info *info)
{
    if (data)
        *data = NULL;
    if (!s || !name || !data)
        return ckpt_seterr(CKPT_EINVAL, "ckpt_load: NULL argument");
    if (context_usable(s, "ckpt_load"))
        return CKPT_EINVAL;
    ckpt_checkpoint *ck;
    pthread_mutex_lock(&s->api_lock);
    save_drain(s);
    /* CKPT_LATEST: the newest step whose every chunk verifies, so that
     * tensors loaded one by one all come from the same valid step. */
    int rc = step == CKPT_LATEST ? reader_open_newest(s, CKPT_VERIFY_FULL, &ck)
                                 : reader_open_select(s, step, CKPT_VERIFY_QUICK, &ck);
    pthread_mutex_unlock(&s->api_lock);
    if (rc)
        return rc;
    size_t i;
    void *buf = NULL;
    if (!(rc = ckpt_checkpoint_find(ck, name, &i))) {
        uint64_t n = ck->m.tensors[i].bytes;
        if (!(buf = malloc(n ? (size_t)n : 1)))
            rc = ckpt_seterr(CKPT_ENOMEM, "out of memory for %llu bytes of '%s'",
                             (unsigned long long)n, name);
        else if (!(rc = ckpt_checkpoint_read(ck, name, buf, n))) {
            if (bytes)
                *bytes = n;
            if (info) {
                ckpt_checkpoint_tensor(ck, i, info);
                info->name = NULL; /* owned by the checkpoint, which goes now */
            }
        }
    }
    ckpt_checkpoint_free(ck);
    if (rc) {
        free(buf);
        return rc;
    }
    *data = buf;
    return CKPT_OK;
}
