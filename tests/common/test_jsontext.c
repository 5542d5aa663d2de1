/* jsontext: every real prints in its shortest exact form; nothing else in
 * the text changes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "jsontext.h"

static char *dump(json_t *v, size_t flags)
{
    char *s = jsontext_dumps(v, flags);
    cr_assert(s, "jsontext_dumps returned NULL");
    json_decref(v);
    return s;
}

static void expect_real(double x, const char *want)
{
    char *s = dump(json_real(x), JSON_ENCODE_ANY);
    cr_expect_str_eq(s, want, "%.17g printed as %s, want %s", x, s, want);
    free(s);
}

Test(jsontext, short_forms)
{
    expect_real(0.1, "0.1");
    expect_real(0.001, "0.001");
    expect_real(1.0 / 3.0, "0.3333333333333333");
    expect_real(2.5, "2.5");
    expect_real(1.0, "1.0");
    expect_real(-0.0, "-0.0");
    expect_real(1e16, "1e16");
    expect_real(1e-7, "1e-7");
    expect_real(5e-324, "5e-324");
    expect_real(1.7976931348623157e308, "1.7976931348623157e308");
    expect_real((double)0.1f, "0.10000000149011612");
}

/* Bit-exact round trips of many doubles of every magnitude. */
Test(jsontext, random_reals_read_back_exactly)
{
    uint64_t r = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < 200000; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        double x;
        memcpy(&x, &r, sizeof x);
        if (!isfinite(x))
            continue;
        json_t *a = json_array();
        json_array_append_new(a, json_real(x));
        char *s = dump(a, JSON_COMPACT);
        json_t *back = json_loads(s, 0, NULL);
        cr_assert(back, "%s does not parse", s);
        double y = json_real_value(json_array_get(back, 0));
        cr_assert(memcmp(&x, &y, sizeof x) == 0, "%.17g came back as %.17g via %s", x, y, s);
        json_decref(back);
        free(s);
    }
}

Test(jsontext, strings_integers_and_layout_untouched)
{
    json_t *v = json_pack("{s:s, s:I, s:I, s:[f, s, i], s:s}", "a", "0.10000000000000001 \"x\\\" 1e+05",
                          "big", (json_int_t)9007199254740993LL, "neg", (json_int_t)-12,
                          "list", 0.5, "-3.25e+10", 7, "k\"1.50\"", "2.0");
    char *plain = json_dumps(v, JSON_INDENT(2) | JSON_SORT_KEYS);
    char *s = dump(v, JSON_INDENT(2) | JSON_SORT_KEYS);
    cr_expect_str_eq(s, plain, "%s\n---\n%s", s, plain);
    free(plain);
    free(s);
}
