/* jsonscan: what it is sure of, jansson (JSON_DECODE_ANY |
 * JSON_REJECT_DUPLICATES) accepts and reads as the same value, and its
 * compact form is the text without whitespace between tokens; what jansson
 * refuses, it is never sure of. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonscan.h"

#define DEPTH JSON_PARSER_MAX_DEPTH

/* The values (and, in *containers, the arrays and objects) of a tree. */
static size_t tree_count(const json_t *v, size_t *containers)
{
    size_t n = 1;
    if (json_is_array(v)) {
        ++*containers;
        for (size_t i = 0; i < json_array_size(v); i++)
            n += tree_count(json_array_get(v, i), containers);
    } else if (json_is_object(v)) {
        ++*containers;
        const char *k;
        json_t *m;
        json_object_foreach((json_t *)v, k, m)
            n += tree_count(m, containers);
    }
    return n;
}

/* jsonscan_tally on any text jansson accepts: the containers and the values
 * exactly (a reader's limit needs never fewer; a refusal's message names the
 * count). */
static void tally_bounds(const char *text, size_t len)
{
    json_t *a = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (!a)
        return;
    size_t want_c = 0, want_v = tree_count(a, &want_c), got_c;
    size_t got_v = jsonscan_tally(text, len, &got_c);
    cr_assert_eq(got_c, want_c, "%zu containers counted, %zu in %.*s", got_c, want_c,
                 (int)len, text);
    cr_assert_eq(got_v, want_v, "%zu values counted, %zu in %.*s", got_v, want_v, (int)len,
                 text);
    json_decref(a);
}

/* jsonscan_whole's verdict on `text`, with the oracle checked. */
static int verdict(const char *text, size_t len, size_t depth, char **out)
{
    tally_bounds(text, len);
    int rc = jsonscan_whole(text, len, depth, out);
    cr_assert(rc == 0 || rc == 1, "%d for %.*s", rc, (int)len, text);
    if (rc == 1) {
        json_error_t e;
        json_t *a = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
        cr_assert(a, "sure of text jansson refuses (%s): %.*s", e.text, (int)len, text);
        json_t *b = json_loads(*out, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
        cr_assert(b, "its compact form %s does not parse: %s", *out, e.text);
        cr_assert(json_equal(a, b), "%.*s became %s", (int)len, text, *out);
        json_decref(a);
        json_decref(b);
    } else {
        cr_assert_null(*out);
    }
    return rc;
}

static void sure(const char *text, const char *compact)
{
    char *out = NULL;
    cr_assert_eq(verdict(text, strlen(text), DEPTH, &out), 1, "unsure of %s", text);
    cr_assert_str_eq(out, compact);
    free(out);
}

static void unsure(const char *text)
{
    char *out = NULL;
    cr_assert_eq(verdict(text, strlen(text), DEPTH, &out), 0, "sure of %s", text);
}

Test(jsonscan, valid_text_compacts_to_itself_less_whitespace)
{
    sure("{\"a\": 1, \"b\": [true, false, null]}", "{\"a\":1,\"b\":[true,false,null]}");
    sure(" \t\r\n42\n", "42");
    sure("\"x y \\\" \\\\ \\/ \\b\\f\\n\\r\\t \\u00e9 \\uFFFF\"",
         "\"x y \\\" \\\\ \\/ \\b\\f\\n\\r\\t \\u00e9 \\uFFFF\"");
    sure("[ -0, 0.5, -1.25e-3, 1E+5, 123456789012345678, -123456789012345678 ]",
         "[-0,0.5,-1.25e-3,1E+5,123456789012345678,-123456789012345678]");
    sure("[1e-400, 9.99e300, 1234567.0e300]", "[1e-400,9.99e300,1234567.0e300]");
    sure("{\"\xc3\xa9t\xc3\xa9\": \"\xe2\x9c\x93 \xf0\x9f\x98\x80\"}",
         "{\"\xc3\xa9t\xc3\xa9\":\"\xe2\x9c\x93 \xf0\x9f\x98\x80\"}");
    sure("{}", "{}");
    sure("[ ]", "[]");
    sure("{ \"a\" : { } , \"b\" : [ [ ] ] }", "{\"a\":{},\"b\":[[]]}");
    /* the same key in two objects is fine */
    sure("[{\"k\": 1}, {\"k\": 2}]", "[{\"k\":1},{\"k\":2}]");
}

/* What jansson refuses, or reads in a way the scan does not follow. */
Test(jsonscan, unsure_of_anything_else)
{
    static const char *const texts[] = {
        "", "  ", "{", "}", "[1,]", "{\"a\":1,}", "[1 2]", "{\"a\" 1}", "{1: 2}",
        "{\"a\":1} x", "1 2", "01", "1.", ".5", "-", "+1", "1e", "1e+", "0x10",
        "tru", "nul", "truex", "nullnull", "NaN", "Infinity", "'a'",
        "\"unterminated", "\"bad \\x escape\"", "\"\\u12\"", "\"\\u00g0\"",
        "\"\\u0000\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud83d\\ude00\"",
        "\"raw\ttab\"", "\"raw\nline\"",
        "\"\xc0\xaf\"", "\"\xe0\x80\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
        "\"\xff\"", "\"\x80\"", "\"\xc3\"", "\"\xe2\x9c\"",
        "1234567890123456789", "-1234567890123456789", "1e400", "1e308", "-2e307",
        "12345678e300", "{\"a\":1,\"a\":2}", "{\"a\":1,\"b\":{},\"a\":3}",
        "{\"\\u0061\":1,\"a\":2}", "{\"\\n\":1}",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        unsure(texts[i]);
}

Test(jsonscan, repeated_key_among_many)
{
    char text[4096];
    int n = 0;
    n += snprintf(text + n, sizeof text - (size_t)n, "{");
    for (int i = 0; i < 100; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s\"k%d\":%d", i ? "," : "", i, i);
    n += snprintf(text + n, sizeof text - (size_t)n, "}");
    char *out = NULL;
    cr_assert_eq(verdict(text, (size_t)n, DEPTH, &out), 1);
    cr_assert_str_eq(out, text);
    free(out);
    /* the same key once more, in the middle */
    text[n - 1] = '\0';
    strcat(text, ",\"k57\":0}");
    unsure(text);
}

/* jansson counts each value's depth, a scalar included: [[1]] is 3. */
static char *nest(size_t arrays, const char *inner)
{
    size_t n = strlen(inner);
    char *t = malloc(2 * arrays + n + 1);
    memset(t, '[', arrays);
    memcpy(t + arrays, inner, n);
    memset(t + arrays + n, ']', arrays);
    t[2 * arrays + n] = '\0';
    return t;
}

Test(jsonscan, depth_is_counted_as_jansson_counts_it)
{
    char *out = NULL;
    for (size_t limit = 3; limit <= DEPTH; limit += DEPTH - 3) {
        char *ok = nest(limit - 1, "1"), *empty = nest(limit, ""), *deep = nest(limit, "1");
        cr_assert_eq(verdict(ok, strlen(ok), limit, &out), 1, "depth %zu", limit);
        free(out);
        cr_assert_eq(verdict(empty, strlen(empty), limit, &out), 1, "depth %zu", limit);
        free(out);
        cr_assert_eq(verdict(deep, strlen(deep), limit, &out), 0, "depth %zu", limit);
        /* jansson's own limit is the same count */
        if (limit == DEPTH) {
            json_t *v = json_loads(empty, JSON_DECODE_ANY, NULL);
            cr_assert(v != NULL);
            json_decref(v);
            cr_assert(json_loads(deep, JSON_DECODE_ANY, NULL) == NULL);
        }
        free(ok);
        free(empty);
        free(deep);
    }
}

/* jsonscan_value stops at the end of the value, and says where. */
Test(jsonscan, value_reports_its_end)
{
    const char *text = "  {\"a\": [1, 2]} ,\n  \"next\": 3";
    char out[64];
    size_t n = 0, end = 0;
    cr_assert_eq(jsonscan_value(text, strlen(text), DEPTH, out, &n, &end), 1);
    cr_assert_eq(end, strlen("  {\"a\": [1, 2]}"));
    cr_assert_eq(n, strlen("{\"a\":[1,2]}"));
    cr_assert(memcmp(out, "{\"a\":[1,2]}", n) == 0);
    cr_assert_eq(jsonscan_value("[1, 2", 5, DEPTH, NULL, NULL, &end), 0);
}

Test(jsonscan, depth_at)
{
    const char *t = "{\"a\": [\"]\", {\"b\\\"[\": 1";
    cr_assert_eq(jsonscan_depth_at(t, strlen(t)), 3);
    cr_assert_eq(jsonscan_depth_at(t, 9), -1); /* inside "]" */
    cr_assert_eq(jsonscan_depth_at(t, 1), 1);
}

/* Mutations of valid documents, checked against jansson: a byte changed,
 * removed or repeated.  Whatever the scan is sure of, jansson must take as
 * the same value (verdict asserts it). */
static uint64_t rng = 0x9E3779B97F4A7C15u;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

Test(jsonscan, tally_counts_through_strings_and_escapes)
{
    size_t c;
    cr_assert_eq(jsonscan_tally("[[],[],{}]", 10, &c), 4); /* 2 commas, 4 containers, 1, 3 empty */
    cr_assert_eq(c, 4);
    cr_assert_eq(jsonscan_tally(" [ ] ", 5, &c), 1, "an empty array is one value");
    cr_assert_eq(jsonscan_tally("[1,2,3]", 7, &c), 4);
    cr_assert_eq(c, 1);
    const char *t = "{\"a,[{\":\"x\\\\\",\"b\\\"[\":[1,2]}"; /* {"a,[{":"x\\","b\"[":[1,2]} */
    cr_assert_eq(jsonscan_tally(t, strlen(t), &c), 5, "%s", t);
    cr_assert_eq(c, 2);
    cr_assert_eq(jsonscan_tally("\"[,{", 4, &c), 1, "an unterminated string holds it all");
    cr_assert_eq(c, 0);
}

Test(jsonscan, mutations_agree_with_jansson)
{
    static const char *const seeds[] = {
        "{\"format\":\"libckpt-python-state\",\"version\":2,\"tree\":{\"dict\":[[\"w\","
        "{\"tensor\":\"w\",\"from\":\"pt\"}],[\"lr\",0.001],[\"ids\",[1,2,3]]]},"
        "\"metadata\":null}",
        "[ 1.5e-3 , -0 , \"\\u00e9\\n\" , {\"a\" : {\"b\" : [true, false, null]}} ]",
        "{\"\xc3\xa9\":\"\xe2\x9c\x93\",\"k\":123456789012345678,\"x\":9.99e300}",
    };
    const char alphabet[] = "{}[]\",:\\0123456789.eE+-tfnrulsaxu \n\t\x80\xc3\xe2\xed\xf4";
    size_t sure_count = 0, total = 0;
    for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
        size_t n = strlen(seeds[s]);
        char *buf = malloc(n + 8);
        for (int iter = 0; iter < 20000; iter++) {
            memcpy(buf, seeds[s], n);
            size_t len = n;
            int edits = 1 + (int)(next() % 3);
            for (int e = 0; e < edits && len > 1; e++) {
                size_t at = next() % len;
                switch (next() % 3) {
                case 0: buf[at] = alphabet[next() % (sizeof alphabet - 1)]; break;
                case 1: memmove(buf + at, buf + at + 1, len - at - 1); len--; break;
                default:
                    if (len < n + 7) {
                        memmove(buf + at + 1, buf + at, len - at);
                        len++;
                    }
                }
            }
            char *out = NULL;
            sure_count += (size_t)verdict(buf, len, DEPTH, &out);
            total++;
            free(out);
        }
        free(buf);
    }
    /* the test means something only if both verdicts occur often */
    cr_assert(sure_count > total / 20 && sure_count < total - total / 20,
              "sure of %zu of %zu mutations", sure_count, total);
}
