/* output: errors, JSON documents and human-readable formatting. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "jsontext.h" /* lib/common, linked in (tools/meson.build) */

int cli_exit_for(int status)
{
    switch (status) {
    case CKPT_OK:
        return CLI_EXIT_OK;
    case CKPT_ECORRUPT:
    case CKPT_EINCOMPLETE:
    case CKPT_ENOCKPT:
    case CKPT_ENOTFOUND:
        return CLI_EXIT_INVALID;
    default:
        return CLI_EXIT_ERROR;
    }
}

const char *cli_status_name(int status)
{
    const char *name = ckpt_status_name(status);
    return name ? name : "unknown";
}

/* "ckpt list: msg", or "ckpt: msg" for what main() itself reports (its
 * ctx->cmd is "ckpt"). */
static void print_error(const cli_ctx *ctx, const char *msg)
{
    if (strcmp(ctx->cmd, "ckpt") == 0)
        fputs("ckpt: ", stderr);
    else
        fprintf(stderr, "ckpt %s: ", ctx->cmd);
    cli_put_oneline(stderr, msg); /* a message is one line, whatever it quotes */
    fputc('\n', stderr);
}

/* The library's advice names its C flags; a shell user has commands and
 * options instead.  Rewrites `msg` (a buffer of `size` bytes) in place,
 * leaving a phrase as it is where the result would not fit. */
static const char *const CLI_WORDS[][2] = {
    {"open it with CKPT_OPEN_READONLY to read", "reading commands and gc --dry-run need no lock"},
    {"open this one with CKPT_OPEN_READONLY to read", "use a reading command"},
    {"(CKPT_OPEN_TRUST_GROUP)", "(--trust-group)"},
};

static void in_cli_words(char *msg, size_t size)
{
    for (size_t i = 0; i < sizeof CLI_WORDS / sizeof CLI_WORDS[0]; i++) {
        char *at = strstr(msg, CLI_WORDS[i][0]);
        size_t from = strlen(CLI_WORDS[i][0]), to = strlen(CLI_WORDS[i][1]);
        if (!at || strlen(msg) - from + to >= size)
            continue;
        memmove(at + to, at + from, strlen(at + from) + 1);
        memcpy(at, CLI_WORDS[i][1], to);
    }
}

static int vfail(cli_ctx *ctx, int exit_code, int status, const char *text)
{
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", text);
    in_cli_words(msg, sizeof msg);
    if (ctx->json) {
        json_t *err = json_pack("{s:s, s:s?, s:i}", "message", msg, "status",
                                status ? cli_status_name(status) : NULL, "exit_code",
                                exit_code);
        if (status)
            json_object_set_new(err, "code", json_integer(status));
        cli_json_print(json_pack("{s:o}", "error", err));
    } else {
        print_error(ctx, msg);
    }
    return exit_code;
}

int cli_fail(cli_ctx *ctx, int exit_code, int status, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return vfail(ctx, exit_code, status, msg);
}

int cli_fail_lib(cli_ctx *ctx, int status, const char *fmt, ...)
{
    char what[1024], msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *detail = ckpt_error_last();
    if (!detail || !*detail)
        detail = ckpt_strerror(status);
    snprintf(msg, sizeof msg, "%s: %s", what, detail);
    return vfail(ctx, cli_exit_for(status), status, msg);
}

int cli_usage(cli_ctx *ctx, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ctx->json)
        return vfail(ctx, CLI_EXIT_USAGE, 0, msg);
    print_error(ctx, msg);
    if (strcmp(ctx->cmd, "ckpt") == 0)
        fprintf(stderr, "Try 'ckpt --help'.\n");
    else
        fprintf(stderr, "Try 'ckpt %s --help'.\n", ctx->cmd);
    return CLI_EXIT_USAGE;
}

char *cli_json_dumps(const json_t *v)
{
    return jsontext_dumps(v, JSON_INDENT(2) | JSON_ENCODE_ANY);
}

int cli_json_print(json_t *doc)
{
    if (!doc) {
        fprintf(stderr, "ckpt: out of memory building JSON output\n");
        return -1;
    }
    char *text = jsontext_dumps(doc, JSON_INDENT(2));
    int r = text && fputs(text, stdout) >= 0 ? 0 : -1;
    free(text);
    fputc('\n', stdout);
    fflush(stdout);
    json_decref(doc);
    return r;
}

json_t *cli_json_from_text(const char *text)
{
    if (!text)
        return json_null();
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    return v ? v : json_string(text);
}

json_t *cli_json_int_or_null(int64_t v)
{
    return v < 0 ? json_null() : json_integer(v);
}

json_t *cli_problem_json(const ckpt_problem *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "step", cli_json_int_or_null(p->step));
    json_object_set_new(o, "status", json_string(cli_status_name(p->status)));
    json_object_set_new(o, "code", json_integer(p->status));
    json_object_set_new(o, "message", json_string(p->message ? p->message : ""));
    json_object_set_new(o, "file",
                        p->file && *p->file ? json_string(p->file) : json_null());
    json_object_set_new(o, "tensor",
                        p->tensor && *p->tensor ? json_string(p->tensor) : json_null());
    json_object_set_new(o, "offset", cli_json_int_or_null(p->offset));
    return o;
}

json_t *cli_report_json(const ckpt_report *report)
{
    json_t *a = json_array();
    size_t n = report ? ckpt_report_count(report) : 0;
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, cli_problem_json(ckpt_report_get(report, i)));
    return a;
}

void cli_report_print(FILE *f, const ckpt_report *report)
{
    size_t n = report ? ckpt_report_count(report) : 0;
    for (size_t i = 0; i < n; i++) {
        const ckpt_problem *p = ckpt_report_get(report, i);
        fprintf(f, "  step %" PRId64 ": ", p->step);
        cli_put_oneline(f, p->message ? p->message : "");
        /* The library's messages usually name the file already. */
        if (p->file && *p->file && p->message && strstr(p->message, p->file)) {
            fputc('\n', f);
            continue;
        }
        int any = 0;
        if (p->file && *p->file) {
            fprintf(f, " [file %s", p->file);
            any = 1;
        }
        if (p->tensor && *p->tensor) {
            fprintf(f, "%stensor ", any ? ", " : " [");
            cli_put_oneline(f, p->tensor);
            any = 1;
        }
        if (p->offset >= 0) {
            fprintf(f, "%soffset %" PRId64, any ? ", " : " [", p->offset);
            any = 1;
        }
        fprintf(f, "%s\n", any ? "]" : "");
    }
}

const char *cli_fmt_bytes(uint64_t bytes, char buf[32])
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, 32, "%.1f %s", v, units[u]);
    return buf;
}

const char *cli_fmt_time(double unix_s, char buf[32])
{
    /* A manifest's time is any number a file says: beyond year 9999 it
     * would not convert (undefined beyond time_t) or fit the format. */
    struct tm tm;
    time_t t;
    if (!(unix_s > 0) || !(unix_s < 253402300800.0) || !(t = (time_t)unix_s, gmtime_r(&t, &tm)) ||
        strftime(buf, 32, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, 32, "-");
    return buf;
}

const char *cli_fmt_duration(double s, char buf[32])
{
    if (!(s >= 0) || !isfinite(s)) {
        snprintf(buf, 32, "-");
    } else if (s < 1) { /* small saves take milliseconds: "0.00s" says nothing */
        snprintf(buf, 32, "%.0fms", s * 1e3);
    } else if (s < 60) {
        snprintf(buf, 32, "%.2fs", s);
    } else {
        long t = (long)(s + 0.5);
        snprintf(buf, 32, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    }
    return buf;
}

/* ------------------------------------------------- control characters */

/* A stream's filter: its descriptor, and a 0xC2 byte held back until the
 * next one says whether the pair is a C1 control (U+0080..U+009F). */
typedef struct guard {
    int fd;
    int held;
} guard;

static int write_all(int fd, const char *b, size_t n)
{
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static ssize_t guard_write(void *cookie, const char *buf, size_t size)
{
    guard *g = cookie;
    char out[4096 + 16];
    size_t k = 0;
    for (size_t i = 0; i < size; i++) {
        unsigned char c = (unsigned char)buf[i];
        int c1 = g->held && c >= 0x80 && c <= 0x9f;
        if (g->held && !c1)
            out[k++] = (char)0xc2;
        g->held = 0;
        if (c1)
            k += (size_t)snprintf(out + k, 16, "\\u%04x", c);
        else if (c == 0xc2)
            g->held = 1;
        else if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
            k += (size_t)snprintf(out + k, 16, "\\x%02x", c);
        else
            out[k++] = (char)c;
        if (k >= 4096) {
            if (write_all(g->fd, out, k))
                return -1;
            k = 0;
        }
    }
    return k && write_all(g->fd, out, k) ? -1 : (ssize_t)size;
}

static int guard_close(void *cookie)
{
    guard *g = cookie;
    int rc = g->held ? write_all(g->fd, "\xc2", 1) : 0;
    g->held = 0;
    return rc;
}

/* `*stream`, writing to `fd`, replaced by a filtered one (unbuffered for
 * stderr, line-buffered on a terminal, else fully: as stdio would).  `g`
 * lives as long as the process: stdio flushes the stream at exit, after
 * main has returned, and never closes it. */
static void guard_stream(FILE **stream, int fd, guard *g)
{
    *g = (guard){fd, 0};
    cookie_io_functions_t io = {NULL, guard_write, NULL, guard_close};
    FILE *f = fopencookie(g, "w", io);
    if (!f)
        return; /* unfiltered rather than no output */
    if (fd == STDERR_FILENO)
        setvbuf(f, NULL, _IONBF, 0);
    else if (isatty(fd))
        setvbuf(f, NULL, _IOLBF, 0);
    fflush(*stream);
    *stream = f;
}

void cli_note(const char *fmt, ...)
{
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cli_put_oneline(stderr, line);
    fputc('\n', stderr);
}

void cli_line(const char *fmt, ...)
{
    char *line = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&line, fmt, ap);
    va_end(ap);
    if (n >= 0) {
        cli_put_oneline(stdout, line);
        free(line);
    }
    fputc('\n', stdout);
}

void cli_put_oneline(FILE *f, const char *text)
{
    for (const char *nl; (nl = strchr(text, '\n')); text = nl + 1) {
        fwrite(text, 1, (size_t)(nl - text), f);
        fputs("\\n", f);
    }
    fputs(text, f);
}

int cli_shown_width(const char *text)
{
    int shown = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f)
            shown += 6, c++;
        else if ((*c < 0x20 && *c != '\t') || *c == 0x7f)
            shown += *c == '\n' ? 2 : 4; /* \n (cli_put_oneline), \xNN (the filter) */
        else if ((*c & 0xc0) != 0x80) /* not a continuation byte */
            shown++;
    }
    return shown;
}

void cli_print_column(const char *text, int width)
{
    int shown = cli_shown_width(text);
    cli_put_oneline(stdout, text);
    printf("%*s", shown < width ? width - shown : 0, "");
}

void cli_guard_terminal(int json)
{
    /* The process's standard streams are the process's: so are their
     * filters (static, not allocated: nothing to free at exit). */
    static guard err, out;
    guard_stream(&stderr, STDERR_FILENO, &err);
    if (!json)
        guard_stream(&stdout, STDOUT_FILENO, &out);
}
