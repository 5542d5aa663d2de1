/* cli: what the `ckpt` subcommands share (options, output, progress). */
#ifndef CKPT_CLI_H
#define CKPT_CLI_H

#include <stdint.h>
#include <stdio.h>
#include <sys/statvfs.h>

#include <jansson.h>

#include "ckpt.h"

/* Exit codes, the same for every subcommand (docs/CLI.md). */
enum cli_exit {
    CLI_EXIT_OK = 0,      /* success                                      */
    CLI_EXIT_INVALID = 1, /* verification failed, or nothing valid        */
    CLI_EXIT_USAGE = 2,   /* bad command line                             */
    CLI_EXIT_ERROR = 3    /* I/O or any other error                       */
};

typedef struct cli_ctx {
    const char *cmd; /* subcommand name, for messages                     */
    int json;        /* --json: one JSON document on stdout, errors too   */
    int trust_group; /* --trust-group or CKPT_TRUST_GROUP=1: a group's root */
    int rewind;      /* import --rewind: CKPT_OPEN_REWIND                 */
} cli_ctx;

/* ------------------------------------------------------------ options */

typedef enum cli_opt_kind {
    CLI_OPT_END = 0,
    CLI_OPT_FLAG,   /* --name            value: int *, set to 1          */
    CLI_OPT_INT,    /* --name N          value: int64_t *, N >= min       */
    CLI_OPT_STRING, /* --name VALUE      value: const char **             */
    CLI_OPT_ARG     /* positional        value: const char **             */
} cli_opt_kind;

typedef struct cli_opt {
    cli_opt_kind kind;
    const char *name;    /* long name without "--", or the positional's name */
    const char *metavar; /* "N", "LEVEL" (options taking a value)            */
    const char *help;
    void *value;
    int required;        /* positional that must be given                   */
    int64_t min;         /* smallest value accepted by CLI_OPT_INT          */
    int *seen;           /* optional: set to 1 when the option was given    */
} cli_opt;

typedef struct cli_cmd {
    const char *name;
    const char *summary;     /* one line, for `ckpt --help`                   */
    const char *description; /* paragraphs for `ckpt CMD --help`, or NULL     */
    int json;                /* --json prints its result as JSON (else only
                                errors: metrics keeps the Prometheus format) */
    int (*run)(cli_ctx *ctx, int argc, char **argv);
} cli_cmd;

/*
 * Parse argv (argv[0] is the subcommand) against `opts`.  Returns 0 to go
 * on, CLI_EXIT_OK after printing --help (the caller returns it), or
 * CLI_EXIT_USAGE after reporting the problem.  --json and --help are
 * accepted for every command.
 */
int cli_parse(cli_ctx *ctx, const cli_cmd *cmd, const cli_opt *opts, int argc,
              char **argv, int *ret);
void cli_print_help(FILE *f, const cli_cmd *cmd, const cli_opt *opts);
void cli_print_exit_codes(FILE *f);

/* ------------------------------------------------------------- output */

/* Exit code for a libckpt status (docs/CLI.md, "Exit codes"). */
int cli_exit_for(int status);
/* "corrupt", "incomplete", "io", ... for a libckpt status ("ok" for 0). */
const char *cli_status_name(int status);

/*
 * Report an error and return `exit_code`: a JSON document {"error": ...}
 * on stdout with --json, else "ckpt CMD: message" on stderr.  `status` is
 * the libckpt status (0 when the CLI itself found the problem).
 */
int cli_fail(cli_ctx *ctx, int exit_code, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* cli_fail for a failed libckpt call: "what: <library message>". */
int cli_fail_lib(cli_ctx *ctx, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Usage error (exit 2), with a hint to run --help in text mode. */
int cli_usage(cli_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Print `doc` on stdout (indented, newline) and release it. */
int cli_json_print(json_t *doc);
/* Parse JSON text produced by libckpt; a JSON string holding the text when it
 * does not parse, JSON null for NULL. */
json_t *cli_json_from_text(const char *text);
/* `v` indented (any JSON value), each real in the fewest digits that read
 * back exactly (lib/jsontext.h); free() the result. */
char *cli_json_dumps(const json_t *v);
/* json_integer, or null for a negative value (meaning "unknown"). */
json_t *cli_json_int_or_null(int64_t v);

/* One ckpt_problem as a JSON object (docs/CLI.md, "problem"). */
json_t *cli_problem_json(const ckpt_problem *p);
/* Every problem of `report` (may be NULL) as a JSON array. */
json_t *cli_report_json(const ckpt_report *report);
/* "  step N: message [file F, tensor T, offset O]" lines on `f`. */
void cli_report_print(FILE *f, const ckpt_report *report);

/* "1.5 MiB" */
const char *cli_fmt_bytes(uint64_t bytes, char buf[32]);
/* "2024-05-01T12:00:00Z" (UTC) */
const char *cli_fmt_time(double unix_s, char buf[32]);
/* "1:02:03" or "4.2s" */
const char *cli_fmt_duration(double s, char buf[32]);
/* What the CLI prints names what other users wrote (tensor names, event
 * log entries, paths, messages quoting them), and a terminal acts on the
 * control characters in it (colours, titles, cursor moves).  Replaces
 * stderr, and stdout unless `json` (JSON escapes them itself), by streams
 * that show C0 controls but newline and tab, DEL and the C1 controls as
 * text: \xNN, \u00NN.  Once, in main, before anything is printed; the
 * progress bar writes its own escapes to the descriptor (progress.c). */
void cli_guard_terminal(int json);

/* Write `text` to `f` with each newline shown as `\n`: a tensor name or a
 * message holding one would otherwise print a line of its choosing (a
 * forged "resuming from step ..." in a job's log). */
void cli_put_oneline(FILE *f, const char *text);
/* One line on stderr, formatted as printf's `fmt` (no newline at its end)
 * and written with cli_put_oneline: for notes that quote paths, link
 * targets or names. */
void cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One line on stdout, formatted as printf's `fmt` (no newline at its end)
 * and written with cli_put_oneline: for lines that quote what others
 * named or wrote (temporary directories, event log entries, versions in a
 * manifest), which an admin's cleanup prints into its own log. */
void cli_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print `text` to stdout left-aligned in a column `width` characters wide
 * (cli_put_oneline), counted as the terminal shows them once filtered: a
 * newline takes 2 (`\n`), another control character 4 (`\x01`), a C1
 * control 6 (`\u0085`), any other UTF-8 character one.  printf's `%-40s`
 * counts bytes, so such names shifted the columns after them. */
void cli_print_column(const char *text, int width);
/* The columns cli_print_column counts for `text`. */
int cli_shown_width(const char *text);

/* ---------------------------------------------------------- progress */

/* A progress bar with throughput and ETA on stderr, drawn only when stderr
 * is a terminal (and CKPT_NO_PROGRESS is unset); silent otherwise. */
typedef struct cli_progress {
    int enabled;
    const char *label;
    uint64_t total;   /* bytes expected (0: unknown)  */
    uint64_t done;
    double start;
    double last_draw;
} cli_progress;

/* 1 when a bar would be drawn (so callers may skip computing its total). */
int cli_progress_wanted(void);
void cli_progress_start(cli_progress *p, const char *label, uint64_t total);
void cli_progress_add(cli_progress *p, uint64_t bytes);
void cli_progress_end(cli_progress *p);
/* Erase the bar before printing result lines (stdout may be the same
 * terminal). */
void cli_progress_hide(cli_progress *p);
double cli_now(void);

/* ------------------------------------------------------------ helpers */

/* Open `dir` read-only (no lock, no writes).  On failure reports the error
 * and returns its exit code; 0 on success. */
int cli_open_readonly(cli_ctx *ctx, const char *dir, ckpt_store **out);
/* For a directory with no checkpoints: name (on stderr, up to 3) the
 * directories right below it that are roots (hold step-* directories),
 * the likely meant ones.  Follows no link below `dir`; reads a bounded
 * number of entries. */
void cli_hint_roots_below(const char *dir);
/* Open `dir` as the writer, keeping every step (retention stays off). */
int cli_open_writer(cli_ctx *ctx, const char *dir, ckpt_store **out);

/* Verification outcome of one step, as the CLI names it. */
typedef enum cli_step_state {
    CLI_STEP_VALID = 0,
    CLI_STEP_INCOMPLETE,
    CLI_STEP_CORRUPT,
    CLI_STEP_ERROR, /* could not be checked (I/O error, permission, ...) */
    CLI_STEP_GONE   /* retired (by the writer's keep_last, or gc) while it was
                       checked: neither valid nor a failure; list, verify and
                       doctor leave it out */
} cli_step_state;

const char *cli_step_state_name(cli_step_state s);
/* Classify the result of ckpt_verify(): incomplete when any problem (or the
 * status) is CKPT_EINCOMPLETE, corrupt for CKPT_ECORRUPT, else error. */
cli_step_state cli_classify(int status, const ckpt_report *report);

/* One step checked at a verification level: what list, verify and doctor
 * show for it. */
typedef struct cli_step {
    int64_t step;
    int status;             /* ckpt_verify() result (or CKPT_OK)               */
    cli_step_state state;
    ckpt_report *report;    /* problems found (may be NULL)                    */
    ckpt_checkpoint *ckpt;  /* open when quick verification passed, else NULL */
    int have_stats;
    ckpt_save_stats stats;
    char message[512];      /* the library's message when it filed no problem */
} cli_step;

int cli_step_check(ckpt_store *store, int64_t step, ckpt_verify_level level,
                   cli_step *out);
/* A command checking the steps it listed, next to a writer that retires
 * old ones, lists again at most this many times when every step it meant
 * to check was retired meanwhile. */
#define CLI_RELISTS 20
void cli_step_clear(cli_step *s);
/* The "step" object of docs/CLI.md. */
json_t *cli_step_json(const cli_step *s);
/* Problems of `s` as text lines (cli_report_print, or its message). */
void cli_step_print_problems(FILE *f, const cli_step *s);

/* Whether the file system of `root` (statvfs'ed into `v`) refuses writes:
 * mounted read-only, or, where the caller may write `root`, refusing an
 * unnamed file with EROFS (ext4 after an error with errors=remount-ro,
 * which recent kernels no longer show in statvfs).  The unnamed file is
 * gone at close: nothing is left in the root. */
int cli_refuses_writes(const char *root, const struct statvfs *v);

/* Sum of the stored bytes of `steps` that pass quick verification. */
uint64_t cli_steps_stored_bytes(ckpt_store *store, const int64_t *steps, size_t count);

/* Size in bytes of the regular files directly inside `dir` (0 if none). */
uint64_t cli_dir_bytes(const char *dir);

/* The versions on this machine of the frameworks a checkpoint recorded
 * (its environment record's "frameworks": names of 1..64 bytes of
 * [A-Za-z0-9_.-]), asked of $CKPT_PYTHON (default python3) with a short
 * `-c` script that imports only the named modules ("python" imports none,
 * "torch.cuda" means torch.version.cuda; a name it does not know is looked
 * up in the installed distributions' metadata, never imported) and is
 * killed after CLI_FRAMEWORKS_TIMEOUT_S.  Returns a new object {name:
 * version or null} holding only the names installed here; NULL with the
 * reason in `why` when the interpreter could not be run or did not answer.
 * Names that are not valid are left out. */
#define CLI_FRAMEWORKS_TIMEOUT_S 10
json_t *cli_framework_versions(const json_t *recorded, char *why, size_t why_size);

/* Subcommands. */
int cmd_list(cli_ctx *ctx, int argc, char **argv);
int cmd_verify(cli_ctx *ctx, int argc, char **argv);
int cmd_latest(cli_ctx *ctx, int argc, char **argv);
int cmd_inspect(cli_ctx *ctx, int argc, char **argv);
int cmd_gc(cli_ctx *ctx, int argc, char **argv);
int cmd_doctor(cli_ctx *ctx, int argc, char **argv);
int cmd_export(cli_ctx *ctx, int argc, char **argv);
int cmd_import(cli_ctx *ctx, int argc, char **argv);
int cmd_log(cli_ctx *ctx, int argc, char **argv);
int cmd_metrics(cli_ctx *ctx, int argc, char **argv);
int cmd_health(cli_ctx *ctx, int argc, char **argv);

extern const cli_cmd cli_cmd_list, cli_cmd_verify, cli_cmd_latest, cli_cmd_inspect,
    cli_cmd_gc, cli_cmd_doctor, cli_cmd_export, cli_cmd_import, cli_cmd_log,
    cli_cmd_metrics, cli_cmd_health;

#endif
