/* progress: a one-line bar with throughput and ETA, only on a terminal. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void draw(cli_progress *p, int final)
{
    double el = cli_now() - p->start;
    double rate = el > 0 ? (double)p->done / el : 0;
    char done[32], total[32], speed[32], eta[32];
    const int width = 24;
    char bar[32];

    int fill = p->total ? (int)((double)p->done / (double)p->total * width) : 0;
    if (fill > width)
        fill = width;
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    cli_fmt_bytes(p->done, done);
    cli_fmt_bytes(p->total, total);
    cli_fmt_bytes((uint64_t)rate, speed);
    if (final || !p->total)
        cli_fmt_duration(el, eta);
    else if (rate <= 0)
        snprintf(eta, sizeof eta, "--");
    else
        cli_fmt_duration((double)(p->total - (p->done < p->total ? p->done : p->total)) / rate,
                         eta);
    /* Straight to the descriptor: the bar's own escapes must reach the
     * terminal, past the filter on stderr (cli_guard_terminal); stderr is
     * unbuffered, so the order of lines is kept. */
    fflush(stderr);
    if (!p->total)
        dprintf(STDERR_FILENO, "\r\033[K%s %s %s/s %s %s", p->label, done, speed,
                final ? "in" : "elapsed", eta);
    else
        dprintf(STDERR_FILENO, "\r\033[K%s [%s] %3d%% %s/%s %s/s %s %s", p->label, bar,
                (int)(100.0 * (double)(p->done < p->total ? p->done : p->total) /
                      (double)p->total),
                done, total, speed, final ? "in" : "ETA", eta);
    p->last_draw = cli_now();
}

int cli_progress_wanted(void)
{
    const char *off = getenv("CKPT_NO_PROGRESS");
    return isatty(STDERR_FILENO) && !(off && *off);
}

void cli_progress_start(cli_progress *p, const char *label, uint64_t total)
{
    memset(p, 0, sizeof *p);
    p->enabled = cli_progress_wanted();
    p->label = label;
    p->total = total;
    p->start = cli_now();
    if (p->enabled)
        draw(p, 0);
}

void cli_progress_add(cli_progress *p, uint64_t bytes)
{
    p->done += bytes;
    if (p->enabled && cli_now() - p->last_draw >= 0.1)
        draw(p, 0);
}

void cli_progress_end(cli_progress *p)
{
    if (!p->enabled)
        return;
    draw(p, 1);
    fputc('\n', stderr);
    p->enabled = 0;
}

void cli_progress_hide(cli_progress *p)
{
    if (!p->enabled)
        return;
    /* Clear the bar so a line printed now starts at column 0; the next
     * update draws it again below. */
    fflush(stderr);
    dprintf(STDERR_FILENO, "\r\033[K");
    p->last_draw = 0;
}
