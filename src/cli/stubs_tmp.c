/* TEMPORARY: stand-ins until the convert/tokenize/train-lm commands land. */
#include "cli/cli.h"
int cmd_convert(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("not yet"); }
int cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("not yet"); }
int cmd_train_lm(int argc, char **argv) { (void)argc; (void)argv; return cli_fail("not yet"); }
