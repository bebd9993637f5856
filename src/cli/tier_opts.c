/* The tiered KV store's flags (see tier_opts.h). */
#include "cli/tier_opts.h"

const char *const cli_tier_names[] = {"none", "ram", "disk", "redis", NULL};
const char *const cli_prefetch_names[] = {"default", "none", "dense", "layer", "token", NULL};
const char *const cli_disk_io_names[] = {"auto", "io_uring", "pread", NULL};

const char *cli_tier_flags_help =
    "  --kv-tier T          ram, disk or redis: keep the whole KV cache in a cold tier and\n"
    "                       only the blocks a step needs hot (default none: untiered);\n"
    "                       the logits equal the untiered ones; sliding-window layers\n"
    "                       (Gemma 2, 3) keep their rings in RAM, only global layers tier\n"
    "  --kv-dir DIR         disk tier: directory of its scratch files (default $TMPDIR,\n"
    "                       /tmp); they have no name and vanish with the process\n"
    "  --kv-url URL         redis tier: redis://HOST:PORT[,HOST:PORT...] (one server or the\n"
    "                       seed nodes of a cluster)[?OPTION=N&...], options timeout_ms,\n"
    "                       ttl_ms, failover_ms, pipeline, wait_replicas (docs/store.md)\n"
    "  --hot-budget N       hot-tier tokens per tiered layer (default: from the budget)\n"
    "  --prefetch M         dense, none, layer or token (default token)\n"
    "  --kv-syscall-submit  disk tier: submit reads by syscall, not through a kernel thread\n"
    "                       polling the io_uring ring\n"
    "  --kv-sq-cpu N        disk tier: run that polling thread on CPU N (for example with\n"
    "                       the decode thread kept elsewhere by taskset)\n"
    "  --kv-disk-io P       disk tier: auto, io_uring or pread (default auto: io_uring, pread\n"
    "                       threads where it is refused; KVP_DISK_IO sets auto's choice)\n";

int cli_tier_check(struct cli_tier_opts *o, bool has_policy)
{
    if (o->tier == KVP_TIER_NONE && (o->kv_dir || o->kv_url || o->hot_budget || o->prefetch ||
                                     o->syscall_submit || o->sq_cpu >= 0 || o->disk_io))
        return cli_fail("--kv-dir, --kv-url, --hot-budget, --prefetch, --kv-syscall-submit, "
                        "--kv-sq-cpu and --kv-disk-io need --kv-tier");
    if ((o->tier == KVP_TIER_REDIS) != (o->kv_url != NULL))
        return cli_fail("--kv-tier redis and --kv-url go together");
    if ((o->kv_dir || o->syscall_submit || o->disk_io) && o->tier != KVP_TIER_DISK)
        return cli_fail("--kv-dir, --kv-syscall-submit and --kv-disk-io need --kv-tier disk");
    if (o->sq_cpu >= 0 && (o->tier != KVP_TIER_DISK || o->syscall_submit))
        return cli_fail("--kv-sq-cpu needs --kv-tier disk without --kv-syscall-submit");
    if ((o->syscall_submit || o->sq_cpu >= 0) && o->disk_io == KVP_DISK_IO_PREAD)
        return cli_fail("--kv-syscall-submit and --kv-sq-cpu are io_uring's: not with "
                        "--kv-disk-io pread");
    if (o->tier != KVP_TIER_NONE && !has_policy && o->prefetch != KVP_PREFETCH_DENSE)
        cli_warn("without --policy every layer is dense and stays hot: nothing is tiered "
                 "unless --prefetch dense");
    o->ring = (struct kvp_disk_ring_params){.syscall_submit = o->syscall_submit,
                                            .sq_pin = o->sq_cpu >= 0,
                                            .sq_cpu = o->sq_cpu >= 0 ? (int)o->sq_cpu : 0};
    return 0;
}

void cli_tier_apply(const struct cli_tier_opts *o, struct kvp_ctx_params *cp)
{
    cp->kv_tier = o->tier;
    cp->kv_dir = o->kv_dir;
    cp->kv_url = o->kv_url;
    cp->hot_budget = (int)o->hot_budget;
    cp->prefetch = o->prefetch;
    cp->kv_ring = &o->ring;
    cp->kv_disk_io = o->disk_io;
}
