/* Framework versions on this machine, for `ckpt doctor`: asked of a Python
 * interpreter in a child process, because the frameworks are Python
 * packages and only their interpreter knows which ones it would import. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Prints {name: version} for the installed names of argv.  The script dir
 * ('' for -c: the working directory) leaves sys.path before anything else
 * is imported (sys is built in, so it cannot be shadowed): a json.py or
 * platform.py that another user left where doctor runs would otherwise run
 * as whoever runs doctor, root included, and a directory named like a
 * framework would be mistaken for it. */
static const char script[] =
    "import sys\n"
    "if sys.path and sys.path[0] == '': del sys.path[0]\n"
    "import json, platform\n"
    "out = {}\n"
    "for n in sys.argv[1:]:\n"
    "    try:\n"
    "        if n == 'python': out[n] = platform.python_version()\n"
    "        elif n == 'torch.cuda':\n"
    "            import torch; c = torch.version.cuda\n"
    "            out[n] = None if c is None else str(c)\n"
    "        elif n in ('numpy', 'torch'):\n"
    "            out[n] = str(__import__(n).__version__)\n"
    "        else:\n"
    "            import importlib.metadata; out[n] = importlib.metadata.version(n)\n"
    "    except Exception: pass\n"
    "print(json.dumps(out))\n";

static int valid_name(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > 64 || n[0] == '-')
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!(n[i] == '_' || n[i] == '.' || n[i] == '-' || (n[i] >= '0' && n[i] <= '9') ||
              (n[i] >= 'a' && n[i] <= 'z') || (n[i] >= 'A' && n[i] <= 'Z')))
            return 0;
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Run argv with stdout into `out` (at most `cap` - 1 bytes, NUL-ended);
 * 0 when it exited 0 within the timeout. */
static int run_capture(char *const argv[], char *out, size_t cap, char *why, size_t why_size)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(why, why_size, "pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, why_size, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 2);
        }
        dup2(fds[1], 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t used = 0;
    double deadline = now_s() + CLI_FRAMEWORKS_TIMEOUT_S;
    int timed_out = 0;
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {fds[0], POLLIN, 0};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue; /* the deadline check above ends it */
        char tmp[4096];
        ssize_t n = read(fds[0], tmp, sizeof tmp);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        size_t take = (size_t)n < cap - 1 - used ? (size_t)n : cap - 1 - used;
        memcpy(out + used, tmp, take);
        used += take;
    }
    out[used] = '\0';
    close(fds[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (timed_out) {
        snprintf(why, why_size, "%s did not answer within %d s", argv[0],
                 CLI_FRAMEWORKS_TIMEOUT_S);
        return -1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
            snprintf(why, why_size, "%s cannot be run", argv[0]);
        else
            snprintf(why, why_size, "%s failed", argv[0]);
        return -1;
    }
    return 0;
}

json_t *cli_framework_versions(const json_t *recorded, char *why, size_t why_size)
{
    const char *python = getenv("CKPT_PYTHON");
    if (!python || !*python)
        python = "python3";
    size_t n = json_object_size(recorded);
    char **argv = calloc(n + 4, sizeof *argv);
    if (!argv) {
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    size_t argc = 0;
    argv[argc++] = (char *)python;
    argv[argc++] = (char *)"-c";
    argv[argc++] = (char *)script;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)recorded, k, v)
        if (valid_name(k))
            argv[argc++] = (char *)k;
    argv[argc] = NULL;
    size_t cap = 65536;
    char *out = malloc(cap);
    json_t *found = NULL;
    if (!out)
        snprintf(why, why_size, "out of memory");
    else if (run_capture(argv, out, cap, why, why_size) == 0) {
        json_error_t err;
        found = json_loads(out, 0, &err);
        if (!json_is_object(found)) {
            json_decref(found);
            found = NULL;
            snprintf(why, why_size, "%s printed no JSON object", python);
        }
    }
    free(out);
    free(argv);
    return found;
}
