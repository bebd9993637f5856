/* TEMPORARY: stand-in until the train-lm command lands. */
#include "cli/cli.h"
int cmd_train_lm(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail("train-lm is not built yet");
}
