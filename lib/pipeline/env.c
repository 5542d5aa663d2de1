#include "env.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>
#include <xxhash.h>

#include "ckpt.h"
#include "error.h"

/* /proc/self/cmdline, arguments joined by spaces (bounded). */
static json_t *command_line(void)
{
    char buf[4096];
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return json_string("");
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return json_string("");
    for (ssize_t i = 0; i < n; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
    while (n > 0 && buf[n - 1] == ' ')
        n--;
    buf[n] = '\0';
    json_t *s = json_string(buf);
    return s ? s : json_string("(not UTF-8)");
}

json_t *env_record(device *dev, int with_command_line)
{
    char host[256] = "", when[64] = "";
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    unsigned xv = XXH_versionNumber();
    char xxh[32];
    snprintf(xxh, sizeof xxh, "%u.%u.%u", xv / 10000, (xv / 100) % 100, xv % 100);
    struct utsname u;
    char os[3 * 65 + 3] = "";
    if (uname(&u) == 0)
        snprintf(os, sizeof os, "%s %s %s", u.sysname, u.release, u.machine);
    json_t *env = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:o, s:s}",
        "libckpt", CKPT_VERSION_STRING, "zstd", ZSTD_versionString(),
        "xxhash", xxh, "jansson", JANSSON_VERSION, "host", host, "os", os,
        "pid", (json_int_t)getpid(), "command_line",
        with_command_line ? command_line() : json_string("(not recorded)"), "time", when);
    if (env && dev)
        device_describe(dev, env);
    return env;
}

int env_add_frameworks(json_t *env, const char *json)
{
    json_error_t err;
    json_t *fw = json_loads(json, 0, &err);
    if (!fw)
        return ckpt_seterr(CKPT_EINVAL, "frameworks_json is not a JSON object (line %d, "
                           "column %d: %s)", err.line, err.column, err.text);
    if (!json_is_object(fw)) {
        json_decref(fw);
        return ckpt_seterr(CKPT_EINVAL, "frameworks_json is not a JSON object");
    }
    const char *k;
    json_t *v;
    json_object_foreach(fw, k, v) {
        size_t n = strlen(k);
        if (n == 0 || n > 64 || !(json_is_string(v) || json_is_null(v))) {
            /* the message first: `k` belongs to `fw` */
            int rc = ckpt_seterr(CKPT_EINVAL, "frameworks_json: entry \"%.64s%s\" must "
                                 "have a name of 1..64 bytes and a string or null version",
                                 k, n > 64 ? "..." : "");
            json_decref(fw);
            return rc;
        }
    }
    if (json_object_set_new(env, "frameworks", fw))
        return ckpt_seterr(CKPT_ENOMEM, "out of memory recording the frameworks");
    return CKPT_OK;
}
