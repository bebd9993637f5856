/* `kvpred run`: generate text from a prompt, streaming tokens as they are sampled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/measure_opts.h"
#include "cli/prefill_opts.h"
#include "cli/tier_opts.h"
#include "core/platform.h"

static void help(void)
{
    printf("usage: kvpred run [-m MODEL] [-p TEXT | -f FILE] [-n N] [options]\n\n"
           "Generate text. Sampling is greedy unless --temp > 0. Timings go to stderr at the end;\n"
           "with --policy also the KV read per decode step (keys x (layer, KV head), bytes, the\n"
           "share read where the policy selects) and the time in the policy's hooks.\n\n%s"
           "  -p, --prompt TEXT    prompt text (default: empty, generation starts from BOS)\n"
           "  -f, --file PATH      read the prompt from a file\n"
           "  -n, --n-predict N    tokens to generate (default 128)\n"
           "  --temp T             temperature (default 0: greedy)\n"
           "  --top-k K            keep the K most likely tokens (default 40; 0 = off)\n"
           "  --top-p P            nucleus sampling threshold (default 0.95; 1 = off)\n"
           "  --repeat-penalty R   penalty for recent tokens (default 1.0 = off)\n"
           "  --repeat-last-n N    tokens the penalty looks back over (default 64)\n"
           "  --seed S             random seed (default 42)\n"
           "  --chat               wrap the prompt in the model's chat template (assistant turn)\n"
           "  --system TEXT        system message for --chat\n"
           "  --chat-format NAME   force a template: chatml, llama3, llama2, mistral, zephyr, phi3,\n"
           "                       gemma, plain (default: from tokenizer.chat_template)\n"
           "  --no-bos             do not prepend BOS\n"
           "  --ignore-eos         keep generating after an end-of-generation token\n"
           "  --policy P           KV selection policy (default full); known: %s\n"
           "  --budget B           tokens per layer and KV head, or a ratio such as 1/16\n"
           "                       (default: all); random policies use --seed\n%s%s%s",
           cli_model_flags_help, cli_policy_names(), cli_tier_flags_help, cli_prefill_flags_help,
           cli_policy_flags_help());
}

/* The command line. */
struct run_opts {
    struct cli_model_opts mo;
    const char *prompt, *prompt_file, *budget;
    long n_predict, top_k, repeat_last_n, seed;
    double temp, top_p, repeat_penalty;
    const char *system, *chat_format;
    bool no_bos, ignore_eos, chat;
    struct kvp_policy_params pp;
    struct cli_tier_opts to;
    struct cli_prefill_opts pf;
    char aux[4096]; /* the policy's file beside the model, when pp names it */
};

/* The prompt as generation starts from it: its text (echoed) and token ids. */
struct run_prompt {
    char *owned; /* the file's text or the chat template's, freed with the prompt */
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
};

/* What the generation measured, for the report on stderr. */
struct run_stats {
    double prefill_s, decode_s;
    long generated;
    long steps;         /* decode steps evaluated (the last sampled token is not) */
    double keys_summed; /* keys in the cache over the decode steps */
};

/* Parse argv into o. Returns 0, 1 after printing an error, or 2 after printing the help. */
static int parse_args(struct run_opts *o, int argc, char **argv)
{
    const struct cli_flag flags[] = {
        CLI_STR("-p|--prompt", &o->prompt),
        CLI_STR("-f|--file", &o->prompt_file),
        CLI_INT("-n|--n-predict", 0, 1 << 24, &o->n_predict, "a token count"),
        CLI_FLOAT("--temp", 0.0, 100.0, &o->temp, "a temperature in 0..100"),
        CLI_INT("--top-k", 0, 1 << 24, &o->top_k, "a count"),
        CLI_FLOAT("--top-p", 0.0, 1.0, &o->top_p, NULL),
        CLI_FLOAT("--repeat-penalty", 0.01, 100.0, &o->repeat_penalty, NULL),
        CLI_INT("--repeat-last-n", 0, 1 << 20, &o->repeat_last_n, "a count"),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &o->seed, "a non-negative integer"),
        CLI_BOOL("--chat", &o->chat),
        CLI_STR("--system", &o->system),
        CLI_STR("--chat-format", &o->chat_format),
        CLI_BOOL("--no-bos", &o->no_bos),
        CLI_BOOL("--ignore-eos", &o->ignore_eos),
        CLI_STR("--policy", &o->pp.name),
        CLI_STR("--budget", &o->budget),
        CLI_TIER_FLAGS(&o->to),
        CLI_PREFILL_FLAGS(&o->pf),
        {0},
    };
    int rc = cli_parse_policy_command("run", &o->mo, &o->pp, &o->budget, flags, help, argc, argv);
    if (rc)
        return rc;
    if (o->prompt && o->prompt_file)
        return cli_fail("run: give either -p or -f, not both");
    if (cli_tier_check(&o->to, o->pp.name != NULL) || cli_prefill_check(&o->pf))
        return 1;
    /* predictor, qpredictor and catekv without their file take the one beside the model */
    cli_policy_default_file(&o->mo, &o->pp, o->aux, sizeof(o->aux), "kvpred");
    return 0;
}

/* The chat template around the prompt text replaces it; its markers are tokenized as special
 * tokens. Returns 0, or 1 after printing the error. */
static int chat_prompt(const kvp_model *model, const struct run_opts *o, struct run_prompt *p)
{
    struct kvp_err err = {0};
    char *templ = NULL;
    size_t tlen = 0;
    char *user = strndup(p->text, p->len);
    int rc = user ? kvp_chat_prompt(model, o->chat_format, o->system, user, &templ, &tlen, &err)
                  : kvp_err_set(&err, KVP_ENOMEM, "out of memory");
    free(user);
    if (rc < 0)
        return cli_fail_err(&err);
    free(p->owned);
    p->owned = templ;
    p->text = templ;
    p->len = tlen;
    p->ids = malloc((p->len + 8) * sizeof(int32_t));
    if (!p->ids || kvp_tokenize_special(model, p->text, p->len, !o->no_bos, true, p->ids,
                                        p->len + 8, &p->n, &err) < 0)
        return cli_fail("%s", p->ids ? err.msg : "out of memory");
    return 0;
}

/* The prompt of -p or -f (in the chat template with --chat), tokenized. Returns 0, or 1 after
 * printing the error. */
static int read_prompt(const kvp_model *model, const struct run_opts *o, struct run_prompt *p)
{
    p->text = o->prompt ? o->prompt : "";
    if (o->prompt_file) {
        p->owned = cli_read_file(o->prompt_file, &p->len);
        if (!p->owned)
            return 1;
        p->text = p->owned;
    } else {
        p->len = strlen(p->text);
    }
    if (o->chat) {
        if (chat_prompt(model, o, p))
            return 1;
    } else {
        p->ids = cli_tokenize(model, p->text, p->len, !o->no_bos, &p->n);
    }
    if (!p->ids)
        return 1;
    if (p->n == 0)
        return cli_fail("run: the prompt is empty and --no-bos was given: nothing to start from");
    return 0;
}

/* The context a prompt of n_prompt tokens runs in (-c, else the model's training length); cuts
 * o->n_predict to what fits in it. Returns the length, or -1 after printing the error. */
static long context_length(struct run_opts *o, const struct kvp_model_info *info, size_t n_prompt)
{
    long n_ctx = o->mo.n_ctx > 0 ? o->mo.n_ctx : info->n_ctx_train;
    if ((long)n_prompt > n_ctx) {
        cli_fail("run: the prompt has %zu tokens, longer than the context (%ld); raise -c",
                 n_prompt, n_ctx);
        return -1;
    }
    if ((long)n_prompt + o->n_predict > n_ctx) {
        cli_warn("prompt (%zu) + %ld new tokens exceed the context (%ld): generation stops at "
                 "the context length",
                 n_prompt, o->n_predict, n_ctx);
        o->n_predict = n_ctx - (long)n_prompt;
    }
    return n_ctx;
}

/* The context with the tier, the selection policy and the prefill policy of o. NULL after
 * printing the error. */
static kvp_ctx *open_context(const kvp_model *model, struct run_opts *o, long n_ctx)
{
    struct kvp_ctx_params cp = cli_ctx_params(&o->mo, n_ctx);
    cli_tier_apply(&o->to, &cp);
    kvp_ctx *ctx = cli_open_ctx_params(model, &cp);
    if (!ctx)
        return NULL;
    struct kvp_err err = {0};
    o->pp.seed = (uint64_t)o->seed;
    if (o->pp.name && kvp_ctx_set_policy(ctx, &o->pp, &err) < 0) {
        cli_fail_err(&err);
        kvp_ctx_free(ctx);
        return NULL;
    }
    if (cli_prefill_apply(&o->pf, ctx)) {
        kvp_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

/* Echo the prompt, prefill it, then sample and print up to o->n_predict tokens, each decoded in
 * turn (the last one is printed, not evaluated). Returns 0, or 1 after printing the error. */
static int generate(const kvp_model *model, kvp_ctx *ctx, kvp_sampler *smp, float *logits,
                    const struct run_opts *o, const struct run_prompt *p, struct run_stats *st)
{
    struct kvp_err err = {0};
    fwrite(p->text, 1, p->len, stdout);
    fflush(stdout);
    double t0 = kvp_time_now();
    if (kvp_eval(ctx, p->ids, (int)p->n, logits, false, &err) < 0)
        return cli_fail_err(&err);
    for (size_t i = 0; i < p->n; i++)
        kvp_sampler_accept(smp, p->ids[i]);
    double t1 = kvp_time_now();
    kvp_ctx_policy_reset_seconds(ctx); /* the read counts reported are the decode steps' alone */
    int prev = p->ids[p->n - 1];
    char piece[256];
    while (st->generated < o->n_predict) {
        int tok = kvp_sampler_sample(smp, logits);
        st->generated++;
        if (!o->ignore_eos && kvp_token_is_eog(model, tok))
            break;
        size_t pn = kvp_token_to_piece(model, prev, tok, piece, sizeof(piece));
        fwrite(piece, 1, pn, stdout);
        fflush(stdout);
        kvp_sampler_accept(smp, tok);
        prev = tok;
        if (st->generated == o->n_predict)
            break;
        int32_t t = tok;
        st->keys_summed += kvp_ctx_n_tokens(ctx) + 1;
        st->steps++;
        if (kvp_eval(ctx, &t, 1, logits, false, &err) < 0)
            return cli_fail_err(&err);
    }
    st->prefill_s = t1 - t0;
    st->decode_s = kvp_time_now() - t1;
    return 0;
}

/* KV read per decode step: what the selections let attention read, plus every key of each
 * (layer, KV head) that made no selection (dense layers, or no policy at all). */
static void print_kv_reads(const kvp_model *model, kvp_ctx *ctx, const struct kvp_model_info *info,
                           const struct run_opts *o, const struct run_stats *st)
{
    double sel_tokens, selects;
    long steps = st->steps;
    kvp_ctx_policy_reads(ctx, &sel_tokens, &selects);
    double pairs = (double)info->n_layer * info->n_head_kv;
    double read = (sel_tokens + (pairs - selects / steps) * st->keys_summed) / steps;
    double all = pairs * st->keys_summed / steps;
    double per_pair_token =
        (double)kvp_kv_bytes_per_token(model, kvp_ctx_kv_type_k(ctx), kvp_ctx_kv_type_v(ctx),
                                       (int)o->mo.block_size) /
        pairs;
    double sel_all = selects * st->keys_summed / steps; /* keys of the selecting pairs */
    fprintf(stderr,
            "kvpred: KV read per decode step %.0f of %.0f keys x (layer, KV head) "
            "(%.1f%%, %.0f KiB; %.1f%% where the policy selects), policy hooks "
            "%.3f ms per step\n",
            read, all, all > 0 ? 100.0 * read / all : 0.0, read * per_pair_token / 1024.0,
            sel_all > 0 ? 100.0 * sel_tokens / sel_all : 100.0,
            1e3 * kvp_ctx_policy_seconds(ctx) / steps);
}

/* The timings and what the KV cache and the policies did, on stderr. */
static void print_report(const kvp_model *model, kvp_ctx *ctx, const struct kvp_model_info *info,
                         const struct run_opts *o, size_t n_prompt, const struct run_stats *st)
{
    size_t kv_resident = 0;
    kvp_ctx_kv_bytes(ctx, &kv_resident, NULL);
    fprintf(stderr,
            "\nkvpred: prompt %zu tokens in %.1f ms (%.0f tok/s), generated %ld tokens in "
            "%.1f ms (%.0f tok/s), KV resident %zu bytes (%s)\n",
            n_prompt, st->prefill_s * 1e3, n_prompt / st->prefill_s, st->generated,
            st->decode_s * 1e3, st->generated / (st->decode_s > 0 ? st->decode_s : 1e-9),
            kv_resident, o->pp.name ? o->pp.name : "full");
    if (o->pf.p.policy != KVP_PREFILL_DENSE) {
        struct kvp_prefill_stats ps;
        kvp_ctx_prefill_stats(ctx, &ps);
        fprintf(stderr,
                "kvpred: prefill %s, density %.3f, attention %.2f thread-s, estimate "
                "%.3f\n",
                kvp_prefill_policy_name(o->pf.p.policy),
                ps.keys_seen > 0 ? ps.keys_read / ps.keys_seen : 1.0, ps.attention_s,
                ps.estimate_s);
    }
    if (o->pp.name && st->steps > 0)
        print_kv_reads(model, ctx, info, o, st);
}

/* The sampler of o's sampling flags. NULL after printing the error. */
static kvp_sampler *open_sampler(const struct run_opts *o, int n_vocab)
{
    struct kvp_sampler_params sp = {.temperature = (float)o->temp,
                                    .top_k = (int)o->top_k,
                                    .top_p = (float)o->top_p,
                                    .repeat_penalty = (float)o->repeat_penalty,
                                    .repeat_last_n = (int)o->repeat_last_n,
                                    .seed = (uint64_t)o->seed};
    kvp_sampler *smp = NULL;
    struct kvp_err err = {0};
    if (kvp_sampler_init(&sp, n_vocab, &smp, &err) < 0) {
        cli_fail_err(&err);
        return NULL;
    }
    return smp;
}

/* Generate from the prompt of o with the model: prompt, context, sampler, the tokens, the
 * report. Returns the exit status. */
static int run_model(const kvp_model *model, struct run_opts *o)
{
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);
    int status = 1;
    struct run_prompt p = {0};
    struct run_stats st = {0};
    kvp_ctx *ctx = NULL;
    kvp_sampler *smp = NULL;
    float *logits = NULL;
    if (read_prompt(model, o, &p))
        goto out;
    long n_ctx = context_length(o, &info, p.n);
    if (n_ctx < 0 || !(ctx = open_context(model, o, n_ctx)) ||
        !(smp = open_sampler(o, info.n_vocab)))
        goto out;
    logits = malloc((size_t)info.n_vocab * sizeof(float));
    if (!logits) {
        cli_fail("out of memory");
        goto out;
    }
    if (generate(model, ctx, smp, logits, o, &p, &st))
        goto out;
    printf("\n");
    print_report(model, ctx, &info, o, p.n, &st);
    status = 0;
out:
    free(logits);
    kvp_sampler_free(smp);
    kvp_ctx_free(ctx);
    free(p.ids);
    free(p.owned);
    return status;
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o = {.n_predict = 128,
                         .top_k = 40,
                         .repeat_last_n = 64,
                         .seed = 42,
                         .top_p = 0.95,
                         .repeat_penalty = 1.0,
                         .pp = {.gqa_agg = KVP_AGG_MEAN},
                         .to = CLI_TIER_OPTS_INIT,
                         .pf = CLI_PREFILL_OPTS_INIT};
    int rc = parse_args(&o, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    kvp_model *model = cli_open_model(&o.mo);
    int status = model ? run_model(model, &o) : 1;
    kvp_model_close(model);
    return status;
}
