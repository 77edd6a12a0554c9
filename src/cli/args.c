#include "cli/args.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

// An integer flag's value that did not read as a whole number: say what it is
// instead ("1e3" is a number, just not written as an integer).
static int bad_integer(const arg_spec *s, const char *v, double max, const char *max_text) {
    char *end;
    double d = strtod(v, &end);
    if (end != v && !*end && isfinite(d) && d == floor(d) && fabs(d) <= max)
        return dc_fail("--%s: '%s' is not written as an integer: write %.0f", s->name, v, d);
    if (end != v && !*end && isfinite(d) && d == floor(d))
        return dc_fail("--%s: %s is out of range (at most %s)", s->name, v, max_text);
    return dc_fail("--%s: '%s' is not an integer", s->name, v);
}

static int set_value(const arg_spec *s, const char *v) {
    char *end;
    errno = 0;
    switch (s->kind) {
    case ARG_INT: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end) return bad_integer(s, v, INT_MAX, "2147483647");
        if (errno == ERANGE || x < -INT_MAX || x > INT_MAX)
            return dc_fail("--%s: %s is out of range (integers from %d to %d)", s->name, v, -INT_MAX, INT_MAX);
        *(int *)s->dst = (int)x;
        return 0;
    }
    case ARG_U64: {
        while (*v == ' ') v++;
        if (*v == '-') return dc_fail("--%s: '%s' must be non-negative", s->name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end) return bad_integer(s, v, 18446744073709551615.0, "18446744073709551615");
        if (errno == ERANGE)
            return dc_fail("--%s: %s is out of range (at most %llu)", s->name, v, ULLONG_MAX);
        *(uint64_t *)s->dst = x;
        return 0;
    }
    case ARG_FLOAT: {
        float x = strtof(v, &end);
        if (end == v || *end) return dc_fail("--%s: '%s' is not a number", s->name, v);
        if (isnan(x) || (isinf(x) && errno != ERANGE))
            return dc_fail("--%s: '%s' is not a finite number", s->name, v);
        if (errno == ERANGE && fabsf(x) >= 1)
            return dc_fail("--%s: %s is out of range (32-bit floats reach about %.1e)", s->name, v, FLT_MAX);
        if (errno == ERANGE)
            return dc_fail("--%s: %s is too close to 0: it underflows in 32-bit floats (nonzero "
                           "values must be at least about %.1e in size)", s->name, v, FLT_MIN);
        *(float *)s->dst = x;
        return 0;
    }
    case ARG_STR:
        if (!*v) return dc_fail("--%s: empty value", s->name);
        *(const char **)s->dst = v;
        return 0;
    case ARG_LIST: {
        arg_list *l = s->dst;
        if (!*v) return dc_fail("--%s: empty value", s->name);
        if (l->n == ARGS_MAX_LIST) return dc_fail("--%s is given more than %d times", s->name, ARGS_MAX_LIST);
        l->v[l->n++] = v;
        return 0;
    }
    case ARG_FLAG: break;
    }
    return dc_fail("--%s takes no value", s->name);
}

int args_parse(arg_parser *p, int argc, char **argv) {
    if (p->nspecs > ARGS_MAX_SPECS)  // a programmer's error, caught before any flag is read
        return dc_fail("%s: %d flags, more than ARGS_MAX_SPECS (%d)", p->usage, p->nspecs, ARGS_MAX_SPECS);
    memset(p->given, 0, sizeof p->given);
    p->npositional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return args_help(p, stdout), 1;
        if (strncmp(a, "--", 2) != 0) {
            if (p->npositional >= p->max_positional)
                return dc_fail("unexpected argument '%s' (see --help)", a);
            p->positional[p->npositional++] = a;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int k = -1;
        for (int j = 0; j < p->nspecs; j++)
            if (strlen(p->specs[j].name) == len && strncmp(p->specs[j].name, name, len) == 0) k = j;
        if (k < 0) return dc_fail("unknown flag '%.*s' (see --help)", (int)(len + 2), a);
        const arg_spec *s = &p->specs[k];
        // The last of two values winning silently hides a typo in a long command line.
        if (p->given[k] && s->kind != ARG_LIST) return dc_fail("--%s is given twice", s->name);
        p->given[k] = true;
        if (s->kind == ARG_FLAG) {
            if (eq) return dc_fail("--%s takes no value", s->name);
            *(bool *)s->dst = true;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) return dc_fail("--%s needs a value (%s)", s->name, s->meta ? s->meta : "VALUE");
        DC_TRY(set_value(s, v));
    }
    return 0;
}

bool args_given(const arg_parser *p, const char *name) {
    for (int j = 0; j < p->nspecs && j < ARGS_MAX_SPECS; j++)
        if (strcmp(p->specs[j].name, name) == 0) return p->given[j];
    return false;
}

void args_help(const arg_parser *p, FILE *out) {
    fprintf(out, "usage: %s\n\n%s\n\nflags:\n", p->usage, p->summary);
    for (int j = 0; j < p->nspecs; j++) {
        const arg_spec *s = &p->specs[j];
        char left[64], def[64] = "";
        snprintf(left, sizeof left, "--%s%s%s", s->name, s->kind == ARG_FLAG ? "" : " ",
                 s->kind == ARG_FLAG ? "" : (s->meta ? s->meta : "VALUE"));
        if (!strstr(s->help, "default")) {
            switch (s->kind) {
            case ARG_INT: snprintf(def, sizeof def, " (default %d)", *(int *)s->dst); break;
            case ARG_U64: snprintf(def, sizeof def, " (default %llu)", (unsigned long long)*(uint64_t *)s->dst); break;
            case ARG_FLOAT: snprintf(def, sizeof def, " (default %g)", *(float *)s->dst); break;
            case ARG_STR:
                if (*(const char **)s->dst) snprintf(def, sizeof def, " (default %s)", *(const char **)s->dst);
                break;
            case ARG_FLAG: case ARG_LIST: break;
            }
        }
        fprintf(out, "  %-26s %s%s\n", left, s->help, def);
    }
    fprintf(out, "  %-26s %s\n", "--help", "show this help");
}
