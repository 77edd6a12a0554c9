// A scratch folder for a test program: tmpdir_make("name") creates
// /tmp/dc_test_name_XXXXXX, tmp_path("f") names a file in it (the last four
// results stay valid), tmpdir_remove() deletes it with everything inside.
#pragma once
#include <stdio.h>
#include <stdlib.h>

static char g_dir[64];

static int tmpdir_make(const char *name) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dc_test_%s_XXXXXX", name);
    if (!mkdtemp(g_dir)) return perror("mkdtemp"), -1;
    return 0;
}

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

static void tmpdir_remove(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", g_dir);
}
