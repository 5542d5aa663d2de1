/* jsonscan: a quick check of JSON text that builds no tree.
 *
 * The caller's metadata is stored in the manifest as JSON text.  A state
 * saved from Python describes its whole structure there: for a 12,000-tensor
 * model and Adam state that is 290 KB and some 50,000 values, which jansson
 * takes 8-10 ms to parse (a value allocated each) and as long again to
 * print.  A save parsed it once at begin, where the caller waits, printed it
 * into the manifest, and parsed it again reading the manifest back.  This
 * scan checks the same text in well under a millisecond and gives its
 * compact form, so the text is kept as text.
 *
 * It accepts a strict subset of what jansson accepts (JSON_DECODE_ANY |
 * JSON_REJECT_DUPLICATES), and what it accepts jansson reads as the same
 * value: ASCII or valid UTF-8 strings, escapes other than \u0000 and
 * surrogates, keys without escapes and never twice in one object, integers
 * of at most 18 digits, reals that cannot overflow.  For anything else it
 * says "unsure", and the caller asks jansson, which gives the verdict and
 * the message.  tests/fuzz/fuzz_jsonscan.c holds it to that.
 *
 * A leaf helper (libc only). */
#ifndef CKPT_JSONSCAN_H
#define CKPT_JSONSCAN_H

#include <stddef.h>

/* Scan the one JSON value that starts `text` (after any whitespace) and
 * ends within its `len` bytes, nesting at most `max_depth` values deep (a
 * scalar is depth 1, [] is 1, [1] is 2: jansson's count).  Returns 1 when
 * it is sure the value is valid (see above), with *end the offset just past
 * it and, when `out` is not NULL, its compact form (no whitespace outside
 * strings) in `out` (room for `len` bytes; not terminated) and its length
 * in *out_len; 0 when unsure; -1 when out of memory. */
int jsonscan_value(const char *text, size_t len, size_t max_depth, char *out,
                   size_t *out_len, size_t *end);

/* Whether `text` (len bytes) is one JSON value, possibly surrounded by
 * whitespace, that jsonscan_value is sure of.  Returns 1 with *out a
 * malloc'd, NUL-terminated compact form; 0 when unsure; -1 when out of
 * memory. */
int jsonscan_whole(const char *text, size_t len, size_t max_depth, char **out);

/* The nesting depth of containers at the end of `text` (len bytes), or -1
 * when that is inside a string.  Exact for a prefix of text that jansson
 * accepts (the callers make sure of the rest). */
long jsonscan_depth_at(const char *text, size_t len);

/* Count what a parser would build from `text` (len bytes, any JSON or a
 * piece of one between values): *containers the arrays and objects, and
 * the return value the values (every ',' outside strings, plus every
 * container, plus one, less one for each empty container): exact for one
 * JSON value, an upper bound for a piece.  What a tree costs grows with these, not
 * with the bytes: jansson spends about 280 bytes on each empty array of
 * "[[],[],...]", 90 times the text.  A linear scan, no allocation. */
size_t jsonscan_tally(const char *text, size_t len, size_t *containers);

#endif
