/*
 * `kvpred train-predictor`: train the AttentionPredictor CNN on a trace from `kvpred trace` and
 * write the predictor file the `predictor` policy loads (formats in src/predictor/cnn.h and
 * src/predictor/train.h). With --validate the file is not trained but evaluated.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "core/platform.h"
#include "predictor/train.h"

static void help(void)
{
    printf(
        "usage: kvpred train-predictor DATASET -o PREDICTOR [options]\n"
        "       kvpred train-predictor DATASET --validate PREDICTOR [options]\n\n"
        "Train the predictor CNN by backprop with Adam on a trace (kvpred trace); the last\n"
        "sequences are held out for validation, which reports the attention recovery of the\n"
        "predicted blocks relative to the block oracle at several budgets.\n\n"
        "  -o, --output PATH    predictor file to write\n"
        "  --validate PATH      evaluate an existing predictor file instead of training\n"
        "  --loss mse|ce        MSE on the next block-max row (the paper; default: it recovered\n"
        "                       more attention on stories260K), or softmax cross-entropy on\n"
        "                       the next block-attention distribution (ranking-aware)\n"
        "  --epochs N           (default 4)\n"
        "  --samples N          training samples per epoch (default 20000)\n"
        "  --batch N            samples per Adam step (default 32)\n"
        "  --lr X               Adam learning rate, decayed linearly to X/10 (default 1e-3)\n"
        "  --seed S             initialisation and sampling seed (default 1)\n"
        "  --val-frac F         fraction of sequences held out (default 0.1)\n"
        "  --val-samples N      validation samples (default 4000)\n"
        "  --sink N, --local N  the slice the policy gives the CNN (default 16, 16)\n"
        "  --history H          history rows (default 64)\n"
        "  --channels C1,C2     conv1 and conv2 channels (default 16,32)\n"
        "  --kernel K           odd kernel size (default 3)\n"
        "  --budgets B1,B2,...  validation token budgets (default 32,64,128)\n"
        "  --query              a second input channel: the query's per-block bound (Quest's\n"
        "                       min/max key metadata) in the newest row, for --policy qpredictor\n"
        "                       (needs a trace recorded by this build: version 2)\n"
        "  --group              one sample per (layer, KV head), the group's rows pooled as\n"
        "                       qpredictor pools them\n"
        "  --sparse-history     history rows as a policy without calibration reads them: each\n"
        "                       keeps its best 1/20 to 1/5 of the blocks, renormalised\n"
        "  --tail N             samples from each sequence's last N positions (the\n"
        "                       answers of a --tasks trace), their histories dense;\n"
        "                       validation reports those steps apart too\n"
        "  --tail-frac F        the fraction of samples --tail draws (default 0.5)\n"
        "  --extra N            validation with --query: the policy's candidates, the N\n"
        "                       best blocks by the bound beyond k (default 16, as\n"
        "                       qpredictor's option extra)\n");
}

static void progress(void *user, int epoch, long step, long steps, double loss)
{
    double *t0 = user;
    if (step != steps && step % 20)
        return;
    int width = 30, fill = (int)((double)width * step / steps);
    double el = kvp_time_now() - *t0;
    fprintf(stderr, "\r[%.*s%*s] %3d%% epoch %d loss %.5f  %.0fs elapsed, %.0fs left ", fill,
            "##############################", width - fill, "", (int)(100.0 * step / steps),
            epoch + 1, loss, el, step ? el * (steps - step) / step : 0.0);
    if (step == steps)
        fputc('\n', stderr);
}

/* One recovery table: a row per budget; with the query channel also the policy's pruned
 * selection (the predicted best among the k + extra best by the bound). */
static void print_recovery(const struct kvp_predtrain_report *rep, const double *pred,
                           const double *oracle, const double *last, const double *recent,
                           const double *query, const double *pruned, const double *rel,
                           bool has_query, int extra)
{
    printf("  budget  predicted  oracle  newest-row  recency  quest-bound  predicted/oracle");
    if (has_query)
        printf("  pruned(k+%d)", extra);
    printf("\n");
    for (int b = 0; b < rep->n_budgets; b++) {
        printf("  %6d  %9.4f  %6.4f  %10.4f  %7.4f  %11.4f  %16.4f", rep->budgets[b], pred[b],
               oracle[b], last[b], recent[b], query[b], rel[b]);
        if (has_query)
            printf("  %11.4f", pruned[b]);
        printf("\n");
    }
}

int cmd_train_predictor(int argc, char **argv)
{
    struct kvp_predtrain_opts o = {.loss = KVP_LOSS_MSE};
    const char *data = NULL, *out_path = NULL, *val_path = NULL, *channels = NULL, *budgets = NULL;
    int query = 0;
    static const char *const losses[] = {"mse", "ce", NULL}; /* enum kvp_cnn_loss */
    const struct cli_flag flags[] = {
        CLI_STR("-o|--output", &out_path),
        CLI_STR("--validate", &val_path),
        CLI_CHOICE("--loss", losses, 0, &o.loss, "mse or ce"),
        CLI_INT("--epochs", 1, 1 << 24, &o.epochs, NULL),
        CLI_INT("--samples", 1, 1 << 24, &o.samples, NULL),
        CLI_INT("--batch", 1, 1 << 24, &o.batch, NULL),
        CLI_FLOAT("--lr", 1e-7, 1.0, &o.lr, NULL),
        CLI_INT("--seed", 1, 0x7fffffffffffffffL, &o.seed, "a positive integer"),
        CLI_FLOAT("--val-frac", 0.01, 0.9, &o.val_frac, NULL),
        CLI_INT("--val-samples", 1, 1 << 24, &o.val_samples, NULL),
        CLI_INT0("--sink", 0, 1 << 24, &o.sink, NULL),
        CLI_INT("--local", 1, 1 << 24, &o.local, NULL),
        CLI_INT("--history", 1, KVP_CNN_MAX_H, &o.H, NULL),
        CLI_STR("--channels", &channels),
        CLI_INT("--kernel", 1, KVP_CNN_MAX_K, &o.k, NULL),
        CLI_STR("--budgets", &budgets),
        CLI_BOOL("--query", &query),
        CLI_BOOL("--group", &o.group),
        CLI_BOOL("--sparse-history", &o.sparse),
        CLI_INT("--tail", 1, 1 << 20, &o.tail, NULL),
        CLI_INT("--extra", 1, 1 << 20, &o.extra, NULL),
        CLI_FLOAT("--tail-frac", 0.01, 1, &o.tail_frac, NULL),
        {0},
    };
    const struct cli_command cmd = {
        .name = "train-predictor",
        .flags = flags,
        .help = help,
        .positional = &data,
    };
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    long v[KVP_CNN_MAX_REC > 2 ? KVP_CNN_MAX_REC : 2];
    if (channels) {
        if (cli_parse_int_list(channels, 1, KVP_CNN_MAX_CH, v, 2) != 2)
            return cli_fail("--channels: '%s' is not C1,C2 in 1..%d", channels, KVP_CNN_MAX_CH);
        o.c1 = (int)v[0];
        o.c2 = (int)v[1];
    }
    if (budgets) {
        if ((o.n_budgets = cli_parse_int_list(budgets, 1, 1 << 24, v, KVP_CNN_MAX_REC)) < 1)
            return cli_fail("--budgets: '%s' is not a list of up to %d token counts", budgets,
                            KVP_CNN_MAX_REC);
        for (int b = 0; b < o.n_budgets; b++)
            o.budgets[b] = (int)v[b];
    }
    if (o.k % 2 == 0 && o.k != 0)
        return cli_fail("--kernel: %d is even; the padding needs an odd kernel", o.k);
    if (!data || (!out_path && !val_path))
        return cli_fail("train-predictor: give the dataset and -o PREDICTOR (or --validate)");
    o.cin = query ? 2 : 1;
    kvp_predtrain_opts_default(&o);
    if (o.sink < 0)
        o.sink = 0;

    struct kvp_err err = {0};
    struct kvp_trace tr;
    struct kvp_cnn net = {0};
    struct kvp_predtrain_report rep = {0};
    if (kvp_trace_load(data, &tr, &err) < 0)
        return cli_fail_err(&err);
    int status = 1;
    double t0 = kvp_time_now();
    if (val_path) {
        if (kvp_cnn_load(val_path, &net, &err) < 0 ||
            kvp_predictor_validate(&tr, &net, &o, &rep, &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
    } else {
        if (isatty(2)) {
            o.progress = progress;
            o.user = &t0;
        }
        fprintf(stderr,
                "train-predictor: %s (%s), %d sequences; loss %s, %d epochs × %d "
                "samples, batch %d, lr %g, seed %llu\n",
                data, tr.model, tr.n_seq, o.loss == KVP_LOSS_CE ? "ce" : "mse", o.epochs, o.samples,
                o.batch, (double)o.lr, (unsigned long long)o.seed);
        if (kvp_predictor_train(&tr, &o, &net, &rep, &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
        if (kvp_cnn_save(&net, out_path, &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
    }
    printf("%s: %s, %zu parameters, H %d, loss %s; %ld train / %ld validation samples "
           "available; train loss %.5f, validation loss %.5f (%.0f s)\n",
           val_path ? val_path : out_path, net.meta.model, kvp_cnn_n_params(&net), net.H,
           net.meta.loss == KVP_LOSS_CE ? "ce" : "mse", rep.n_train_samples, rep.n_val_samples,
           rep.train_loss, rep.val_loss, kvp_time_now() - t0);
    printf("validation recovery (%s histories%s; sink %d, local %d):\n",
           o.sparse ? "sparse" : "dense", net.cin > 1 ? ", query channel" : "", o.sink, o.local);
    print_recovery(&rep, rep.rec_pred, rep.rec_oracle, rep.rec_last, rep.rec_recent,
                   rep.rec_query, rep.rec_pruned, rep.rel, net.cin > 1, o.extra);
    if (o.tail > 0) {
        printf("at answer steps (the last %d positions of a sequence, dense histories; %ld "
               "samples):\n",
               o.tail, rep.tail.n);
        print_recovery(&rep, rep.tail.rec_pred, rep.tail.rec_oracle, rep.tail.rec_last,
                       rep.tail.rec_recent, rep.tail.rec_query, rep.tail.rec_pruned, rep.tail.rel,
                       net.cin > 1, o.extra);
    }
    status = 0;
out:
    kvp_cnn_free(&net);
    kvp_trace_free(&tr);
    return status;
}
