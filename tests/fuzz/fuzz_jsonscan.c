/* libFuzzer harness: jsonscan (lib/common/jsonscan.c) on any bytes.
 *
 * Oracle: whatever jsonscan_whole is sure of, jansson (JSON_DECODE_ANY |
 * JSON_REJECT_DUPLICATES) must accept, its compact form must parse to the
 * same value, hold no whitespace outside strings (its length is the
 * input's less that whitespace, so never more), and nest no deeper than
 * the limit given (jansson's count); jsonscan_value must agree on where
 * the value ends.  The first byte picks the depth limit (1 to 64, or
 * jansson's own), so the limit is exercised near its edge too. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonscan.h"

static void die(const char *what, const uint8_t *data, size_t size)
{
    fprintf(stderr, "fuzz_jsonscan: %s: %.*s\n", what, (int)size, (const char *)data);
    abort();
}

/* jansson's count: every value is one level, inside its containers. */
static size_t value_depth(json_t *v)
{
    size_t most = 0, d;
    const char *k;
    json_t *x;
    if (json_is_array(v)) {
        json_array_foreach(v, d, x) {
            size_t c = value_depth(x);
            most = c > most ? c : most;
        }
    } else if (json_is_object(v)) {
        json_object_foreach(v, k, x) {
            size_t c = value_depth(x);
            most = c > most ? c : most;
        }
    }
    return most + 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1u << 16))
        return 0;
    size_t depth = data[0] < 0x80 ? (size_t)(data[0] % 64) + 1 : JSON_PARSER_MAX_DEPTH;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    char *out = NULL;
    int rc = jsonscan_whole(text, len, depth, &out);
    if (rc != 1) {
        if (out)
            die("unsure, yet a compact form", data + 1, len);
        return 0;
    }
    json_error_t e;
    json_t *a = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
    if (!a)
        die("sure of a text jansson refuses", data + 1, len);
    json_t *b = json_loads(out, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
    if (!b || !json_equal(a, b))
        die("the compact form reads differently", data + 1, len);
    size_t n = strlen(out);
    if (n > len || jsonscan_depth_at(out, n) != 0)
        die("the compact form is longer or unbalanced", data + 1, len);
    for (size_t i = 0, in_string = 0; i < n; i++) { /* no whitespace between tokens */
        if (in_string && out[i] == '\\')
            i++;
        else if (out[i] == '"')
            in_string = !in_string;
        else if (!in_string && strchr(" \t\r\n", out[i]))
            die("whitespace left in the compact form", data + 1, len);
    }
    if (value_depth(a) > depth)
        die("sure of a value nested deeper than the limit", data + 1, len);
    size_t end = 0;
    if (jsonscan_value(text, len, depth, NULL, NULL, &end) != 1 || end > len)
        die("jsonscan_value disagrees", data + 1, len);
    for (size_t i = end; i < len; i++)
        if (!strchr(" \t\r\n", text[i]))
            die("something after the value's end", data + 1, len);
    json_decref(a);
    json_decref(b);
    free(out);
    return 0;
}
