#include "train/optimizer.h"

#include <stdlib.h>

void dc_optimizer_install(dc_optimizer *o) {
    o->hooks.win_lo = o->hooks.win_hi = 0;
    o->ps->hooks = &o->hooks;
}

void dc_optimizer_uninstall(dc_optimizer *o) {
    if (o->ps && o->ps->hooks == &o->hooks) o->ps->hooks = NULL;
}

void dc_optimizer_free(dc_optimizer *o) {
    if (!o) return;
    dc_optimizer_uninstall(o);
    o->ops->free(o);
    free(o);
}
