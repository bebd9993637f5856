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
#include "server/server.h"

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

int cmd_run(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *prompt = NULL, *prompt_file = NULL, *budget = NULL;
    long n_predict = 128, top_k = 40, repeat_last_n = 64, seed = 42;
    double temp = 0.0, top_p = 0.95, repeat_penalty = 1.0;
    const char *system = NULL, *chat_format = NULL;
    bool no_bos = false, ignore_eos = false, chat = false;
    struct kvp_policy_params pp = {.gqa_agg = KVP_AGG_MEAN};
    struct cli_tier_opts to = CLI_TIER_OPTS_INIT;
    struct cli_prefill_opts pf = CLI_PREFILL_OPTS_INIT;
    const struct cli_flag flags[] = {
        CLI_STR("-p|--prompt", &prompt),
        CLI_STR("-f|--file", &prompt_file),
        CLI_INT("-n|--n-predict", 0, 1 << 24, &n_predict, "a token count"),
        CLI_FLOAT("--temp", 0.0, 100.0, &temp, "a temperature in 0..100"),
        CLI_INT("--top-k", 0, 1 << 24, &top_k, "a count"),
        CLI_FLOAT("--top-p", 0.0, 1.0, &top_p, NULL),
        CLI_FLOAT("--repeat-penalty", 0.01, 100.0, &repeat_penalty, NULL),
        CLI_INT("--repeat-last-n", 0, 1 << 20, &repeat_last_n, "a count"),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &seed, "a non-negative integer"),
        CLI_BOOL("--chat", &chat),
        CLI_STR("--system", &system),
        CLI_STR("--chat-format", &chat_format),
        CLI_BOOL("--no-bos", &no_bos),
        CLI_BOOL("--ignore-eos", &ignore_eos),
        CLI_STR("--policy", &pp.name),
        CLI_STR("--budget", &budget),
        CLI_TIER_FLAGS(&to),
        CLI_PREFILL_FLAGS(&pf),
        {0},
    };
    int rc = cli_parse_policy_command("run", &mo, &pp, &budget, flags, help, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (prompt && prompt_file)
        return cli_fail("run: give either -p or -f, not both");
    if (cli_tier_check(&to, pp.name != NULL) || cli_prefill_check(&pf))
        return 1;
    /* predictor, qpredictor and catekv without their file take the one beside the model */
    char aux[4096];
    if (srv_policy_default_file(mo.model_path ? mo.model_path : "models/kvpred-default.gguf", &pp,
                                aux, sizeof(aux)))
        fprintf(stderr, "kvpred: %s uses %s\n", pp.name,
                pp.aux_path == aux ? pp.aux_path : pp.head_profile);

    int status = 1;
    char *file_text = NULL;
    int32_t *ids = NULL;
    kvp_ctx *ctx = NULL;
    kvp_sampler *smp = NULL;
    float *logits = NULL;
    kvp_model *model = cli_open_model(&mo);
    if (!model)
        return 1;
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);

    size_t len = 0;
    const char *text = prompt ? prompt : "";
    if (prompt_file) {
        file_text = cli_read_file(prompt_file, &len);
        if (!file_text)
            goto out;
        text = file_text;
    } else {
        len = strlen(text);
    }
    size_t n_prompt = 0;
    if (chat) {
        /* the template text replaces the raw prompt; markers are tokenized as special tokens */
        struct kvp_err cerr = {0};
        char *templ = NULL;
        size_t tlen = 0;
        char *user = strndup(text, len);
        int crc = user ? kvp_chat_prompt(model, chat_format, system, user, &templ, &tlen, &cerr)
                       : kvp_err_set(&cerr, KVP_ENOMEM, "out of memory");
        free(user);
        if (crc < 0) {
            cli_fail_err(&cerr);
            goto out;
        }
        free(file_text);
        file_text = templ;
        text = templ;
        len = tlen;
        ids = malloc((len + 8) * sizeof(int32_t));
        if (!ids || kvp_tokenize_special(model, text, len, !no_bos, true, ids, len + 8, &n_prompt,
                                         &cerr) < 0) {
            cli_fail("%s", ids ? cerr.msg : "out of memory");
            goto out;
        }
    } else {
        ids = cli_tokenize(model, text, len, !no_bos, &n_prompt);
    }
    if (!ids)
        goto out;
    if (n_prompt == 0) {
        cli_fail("run: the prompt is empty and --no-bos was given: nothing to start from");
        goto out;
    }
    long n_ctx = mo.n_ctx > 0 ? mo.n_ctx : info.n_ctx_train;
    if ((long)n_prompt > n_ctx) {
        cli_fail("run: the prompt has %zu tokens, longer than the context (%ld); raise -c",
                 n_prompt, n_ctx);
        goto out;
    }
    if ((long)n_prompt + n_predict > n_ctx) {
        cli_warn("prompt (%zu) + %ld new tokens exceed the context (%ld): generation stops at "
                 "the context length", n_prompt, n_predict, n_ctx);
        n_predict = n_ctx - (long)n_prompt;
    }
    struct kvp_ctx_params cp = cli_ctx_params(&mo, n_ctx);
    cli_tier_apply(&to, &cp);
    ctx = cli_open_ctx_params(model, &cp);
    if (!ctx)
        goto out;
    struct kvp_err err = {0};
    pp.seed = (uint64_t)seed;
    if (pp.name && kvp_ctx_set_policy(ctx, &pp, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    if (cli_prefill_apply(&pf, ctx))
        goto out;
    struct kvp_sampler_params sp = {.temperature = (float)temp, .top_k = (int)top_k,
                                    .top_p = (float)top_p, .repeat_penalty = (float)repeat_penalty,
                                    .repeat_last_n = (int)repeat_last_n, .seed = (uint64_t)seed};
    if (kvp_sampler_init(&sp, info.n_vocab, &smp, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    logits = malloc((size_t)info.n_vocab * sizeof(float));
    if (!logits) {
        cli_fail("out of memory");
        goto out;
    }
    /* echo the prompt, then stream */
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    double t0 = kvp_time_now();
    if (kvp_eval(ctx, ids, (int)n_prompt, logits, false, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    for (size_t i = 0; i < n_prompt; i++)
        kvp_sampler_accept(smp, ids[i]);
    double t1 = kvp_time_now();
    kvp_ctx_policy_reset_seconds(ctx); /* the read counts below are the decode steps' alone */
    double keys_summed = 0;            /* keys in the cache over the decode steps */
    long steps = 0;
    int prev = ids[n_prompt - 1];
    long generated = 0;
    char piece[256];
    while (generated < n_predict) {
        int tok = kvp_sampler_sample(smp, logits);
        generated++;
        if (!ignore_eos && kvp_token_is_eog(model, tok))
            break;
        size_t pn = kvp_token_to_piece(model, prev, tok, piece, sizeof(piece));
        fwrite(piece, 1, pn, stdout);
        fflush(stdout);
        kvp_sampler_accept(smp, tok);
        prev = tok;
        if (generated == n_predict)
            break;
        int32_t t = tok;
        keys_summed += kvp_ctx_n_tokens(ctx) + 1;
        steps++;
        if (kvp_eval(ctx, &t, 1, logits, false, &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
    }
    double t2 = kvp_time_now();
    size_t kv_resident = 0;
    kvp_ctx_kv_bytes(ctx, &kv_resident, NULL);
    printf("\n");
    fprintf(stderr, "\nkvpred: prompt %zu tokens in %.1f ms (%.0f tok/s), generated %ld tokens in "
                    "%.1f ms (%.0f tok/s), KV resident %zu bytes (%s)\n",
            n_prompt, (t1 - t0) * 1e3, n_prompt / (t1 - t0), generated, (t2 - t1) * 1e3,
            generated / (t2 - t1 > 0 ? t2 - t1 : 1e-9), kv_resident, pp.name ? pp.name : "full");
    if (pf.p.policy != KVP_PREFILL_DENSE) {
        struct kvp_prefill_stats ps;
        kvp_ctx_prefill_stats(ctx, &ps);
        fprintf(stderr, "kvpred: prefill %s, density %.3f, attention %.2f thread-s, estimate "
                        "%.3f\n",
                kvp_prefill_policy_name(pf.p.policy),
                ps.keys_seen > 0 ? ps.keys_read / ps.keys_seen : 1.0, ps.attention_s,
                ps.estimate_s);
    }
    if (pp.name && steps > 0) {
        /* KV read per decode step: what the selections let attention read, plus every key of
         * each (layer, KV head) that made no selection (dense layers, or no policy at all) */
        double sel_tokens, selects;
        kvp_ctx_policy_reads(ctx, &sel_tokens, &selects);
        double pairs = (double)info.n_layer * info.n_head_kv;
        double read = (sel_tokens + (pairs - selects / steps) * keys_summed) / steps;
        double all = pairs * keys_summed / steps;
        double per_pair_token = (double)kvp_kv_bytes_per_token(
            model, kvp_ctx_kv_type_k(ctx), kvp_ctx_kv_type_v(ctx), (int)mo.block_size) / pairs;
        double sel_all = selects * keys_summed / steps; /* keys of the selecting pairs */
        fprintf(stderr, "kvpred: KV read per decode step %.0f of %.0f keys x (layer, KV head) "
                        "(%.1f%%, %.0f KiB; %.1f%% where the policy selects), policy hooks "
                        "%.3f ms per step\n",
                read, all, all > 0 ? 100.0 * read / all : 0.0, read * per_pair_token / 1024.0,
                sel_all > 0 ? 100.0 * sel_tokens / sel_all : 100.0,
                1e3 * kvp_ctx_policy_seconds(ctx) / steps);
    }
    status = 0;
out:
    free(logits);
    kvp_sampler_free(smp);
    kvp_ctx_free(ctx);
    free(ids);
    free(file_text);
    kvp_model_close(model);
    return status;
}
