/*
 * `kvpred tokenize`: print the token ids of a text, space-separated on one line, using the
 * model's own vocabulary (GGUF metadata, or a llama2.c checkpoint plus --tokenizer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"

static void help(void)
{
    printf("usage: kvpred tokenize [-m MODEL] (-p TEXT | -f FILE) [--no-bos]\n\n"
           "Print the token ids of a text, BOS first unless --no-bos.\n\n"
           "  -p, --prompt TEXT       text to tokenize\n"
           "  -f, --file FILE         read the text from FILE (bytes as they are)\n"
           "  --no-bos                do not prepend the BOS token\n"
           "%s",
           cli_model_flags_help);
}

int cmd_tokenize(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *prompt = NULL, *file = NULL;
    bool no_bos = false;
    const struct cli_flag flags[] = {
        CLI_STR("-p|--prompt", &prompt),
        CLI_STR("-f|--file", &file),
        CLI_BOOL("--no-bos", &no_bos),
        {0},
    };
    const struct cli_command cmd = {.name = "tokenize", .mo = &mo, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (!prompt == !file)
        return cli_fail("tokenize: give exactly one of -p TEXT and -f FILE");
    size_t len = prompt ? strlen(prompt) : 0, n = 0;
    char *owned = file ? cli_read_file(file, &len) : NULL;
    if (file && !owned)
        return 1;
    kvp_model *model = cli_open_model(&mo);
    int32_t *ids = model ? cli_tokenize(model, owned ? owned : prompt, len, !no_bos, &n) : NULL;
    for (size_t i = 0; ids && i < n; i++)
        printf(i ? " %d" : "%d", (int)ids[i]);
    if (ids)
        printf("\n");
    free(ids);
    kvp_model_close(model);
    free(owned);
    return ids ? 0 : 1;
}
