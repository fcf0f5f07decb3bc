/* test_cli_util.c — the zeropp command's shared helpers (tools/cli_util.c):
 * the one count parser every subcommand uses. */
#include <stdint.h>
#include <string.h>

#include "../tools/cli.h"
#include "testlib.h"

static void expect_count(const char *s, size_t want) {
    size_t got = 12345;
    EXPECT(zpp_cli_parse_count(s, &got) == 0, "'%s' refused", s);
    EXPECT(got == want, "'%s' -> %zu, expected %zu", s, got, want);
}

static void expect_bad(const char *s) {
    size_t got = 12345;
    EXPECT(zpp_cli_parse_count(s, &got) == -1, "'%s' accepted as %zu", s, got);
    EXPECT(got == 12345, "'%s' wrote %zu on failure", s, got);
}

static void test_count_suffixes(void) {
    expect_count("0", 0);
    expect_count("7", 7);
    expect_count("10000000", 10000000);
    /* Decimal suffixes: model sizes as the docs quote them. */
    expect_count("1k", 1000);
    expect_count("1K", 1000);
    expect_count("1M", 1000000);
    expect_count("1m", 1000000);
    expect_count("125M", 125000000);
    expect_count("1.5B", 1500000000);
    expect_count("1.5G", 1500000000);
    expect_count("2b", 2000000000);
    expect_count("1.50k", 1500);
    expect_count("0.001M", 1000);
    /* Binary suffixes: exact powers of two. */
    expect_count("1Ki", 1024);
    expect_count("1Mi", 1048576);
    expect_count("16Mi", 16777216);
    expect_count("64mi", 67108864);
    expect_count("1Gi", 1073741824);
    expect_count("0.5Ki", 512);
    expect_count("1.5Gi", 1610612736);
    /* Exponents. */
    expect_count("1e9", 1000000000);
    expect_count("2.5E3", 2500);
    expect_count("125e-1k", 12500);
    expect_count("1e+3", 1000);
    /* The limit, 2^53, and no further. */
    expect_count("9007199254740992", (size_t)1 << 53);
    expect_count("8Mi", (size_t)1 << 23);
}

static void test_count_refuses_garbage(void) {
    const char *bad[] = {"", " ", "abc", "M", "k1", "-1", "-0", "+5", " 5", "5 ", "12 M",
                         "1.5", "0.1", "1.0001k", "1e-1", "0x10", "inf", "nan", "1e", "1e+",
                         "1.2.3", "5Bi", "5i", "5Kx", "5MB", "5T", "1..0", ".", "e3",
                         "9007199254740993", "18446744073709551616", "99999999999999999999999",
                         "1e300", "9.1e15", "8388609Gi", "10000000000B", NULL};
    for (int i = 0; bad[i]; i++) expect_bad(bad[i]);
    EXPECT(zpp_cli_parse_count(NULL, &(size_t){0}) == -1);
}

static void test_int_in_range(void) {
    int v = 0;
    EXPECT(zpp_cli_parse_int("8", 1, &v) == 0 && v == 8);
    EXPECT(zpp_cli_parse_int("4k", 1, &v) == 0 && v == 4000);
    EXPECT(zpp_cli_parse_int("16Mi", 1, &v) == 0 && v == 1 << 24);
    EXPECT(zpp_cli_parse_int("0", 0, &v) == 0 && v == 0);
    v = 5;
    EXPECT(zpp_cli_parse_int("0", 1, &v) == -1 && v == 5, "below lo");
    EXPECT(zpp_cli_parse_int("16777217", 1, &v) == -1 && v == 5, "above 2^24");
    EXPECT(zpp_cli_parse_int("-2", -5, &v) == -1 && v == 5, "negative");
    EXPECT(zpp_cli_parse_int("x", 0, &v) == -1 && v == 5);
}

/* The option table: --name value and --name=value, ranges per field type,
 * unknown options named wherever they are. */
static int parse(int argc, const char **argv, int *steps, long *seed, size_t *n, int *quiet,
                 const char **path) {
    const zpp_cli_opt opts[] = {
        {"--steps", ZPP_CLI_INT, steps, 1, 1ll << 40}, /* clamped to INT_MAX */
        {"--seed", ZPP_CLI_LONG, seed, 0, 1ll << 53},
        {"--n", ZPP_CLI_SIZE, n, 1, 1000},
        {"--quiet", ZPP_CLI_FLAG, quiet, 0, 0},
        {"--data", ZPP_CLI_STR, path, 0, 0},
    };
    return zpp_cli_parse_opts("test", argc, (char **)argv, opts, 5, 0);
}

static void test_option_table(void) {
    int steps = 0, quiet = 0;
    long seed = 0;
    size_t n = 0;
    const char *path = NULL;
    const char *ok[] = {"x", "--steps=2147483647", "--seed", "9007199254740992", "--n=1k",
                        "--quiet", "--data=a=b"};
    EXPECT(parse(7, ok, &steps, &seed, &n, &quiet, &path) == 0 && steps == 2147483647 &&
           seed == 9007199254740992L && n == 1000 && quiet == 1 && !strcmp(path, "a=b"));
    const char *bad[][3] = {
        {"x", "--steps", "2147483648"}, {"x", "--steps=4294967298", ""},
        {"x", "--n", "1001"},           {"x", "--seed", "9007199254740993"},
        {"x", "--bogus", ""},           {"x", "--quiet=1", ""},
        {"x", "--steps", ""},           {"x", "--data", "--quiet"},
        {"x", "stray", ""},             {"x", "--steps", "-1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int argc = bad[i][2][0] ? 3 : 2; /* "": the line ends there */
        EXPECT(parse(argc, bad[i], &steps, &seed, &n, &quiet, &path) == -1,
               "'%s %s' accepted", bad[i][1], bad[i][2]);
    }
    const char *help[] = {"x", "--bogus=1", "--help"}; /* the first error wins */
    EXPECT(parse(3, help, &steps, &seed, &n, &quiet, &path) == -1);
    const char *help2[] = {"x", "--steps=3", "-h"};
    EXPECT(parse(3, help2, &steps, &seed, &n, &quiet, &path) == 1);
}

ZPP_TESTS(ZPP_TEST(test_count_suffixes), ZPP_TEST(test_count_refuses_garbage),
          ZPP_TEST(test_int_in_range), ZPP_TEST(test_option_table))
