#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define MAX_SPECS 64
static bool g_given[MAX_SPECS];

static int set_value(const arg_spec *s, const char *v) {
    char *end;
    errno = 0;
    switch (s->kind) {
    case ARG_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < -2147483647L || x > 2147483647L)
            return dc_fail("--%s: '%s' is not an integer", s->name, v);
        *(int *)s->dst = (int)x;
        return 0;
    }
    case ARG_U64: {
        if (*v == '-') return dc_fail("--%s: '%s' must be non-negative", s->name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end || errno) return dc_fail("--%s: '%s' is not an integer", s->name, v);
        *(uint64_t *)s->dst = x;
        return 0;
    }
    case ARG_FLOAT: {
        float x = strtof(v, &end);
        if (end == v || *end || errno || !isfinite(x))
            return dc_fail("--%s: '%s' is not a number", s->name, v);
        *(float *)s->dst = x;
        return 0;
    }
    case ARG_STR:
        if (!*v) return dc_fail("--%s: empty value", s->name);
        *(const char **)s->dst = v;
        return 0;
    case ARG_FLAG: break;
    }
    return dc_fail("--%s takes no value", s->name);
}

int args_parse(arg_parser *p, int argc, char **argv) {
    memset(g_given, 0, sizeof g_given);
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
        g_given[k] = true;
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
    for (int j = 0; j < p->nspecs && j < MAX_SPECS; j++)
        if (strcmp(p->specs[j].name, name) == 0) return g_given[j];
    return false;
}

void args_help(const arg_parser *p, FILE *out) {
    fprintf(out, "usage: %s\n\n%s\n\nflags:\n", p->usage, p->summary);
    for (int j = 0; j < p->nspecs; j++) {
        const arg_spec *s = &p->specs[j];
        char left[64], def[64] = "";
        snprintf(left, sizeof left, "--%s%s%s", s->name, s->kind == ARG_FLAG ? "" : " ",
                 s->kind == ARG_FLAG ? "" : (s->meta ? s->meta : "VALUE"));
        switch (s->kind) {
        case ARG_INT: snprintf(def, sizeof def, " (default %d)", *(int *)s->dst); break;
        case ARG_U64: snprintf(def, sizeof def, " (default %llu)", (unsigned long long)*(uint64_t *)s->dst); break;
        case ARG_FLOAT: snprintf(def, sizeof def, " (default %g)", *(float *)s->dst); break;
        case ARG_STR:
            if (*(const char **)s->dst) snprintf(def, sizeof def, " (default %s)", *(const char **)s->dst);
            break;
        case ARG_FLAG: break;
        }
        fprintf(out, "  %-26s %s%s\n", left, s->help, def);
    }
    fprintf(out, "  %-26s %s\n", "--help", "show this help");
}
