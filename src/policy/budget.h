/* The one grammar of a policy budget as text, shared by the command line (--budget) and the
 * server's "kvpred": {"budget": ...} field. */
#ifndef KVP_POLICY_BUDGET_H
#define KVP_POLICY_BUDGET_H

#include <stdbool.h>

/* A token count ("256"), a ratio of the context in (0, 1] ("0.0625") or a fraction a/b with
 * a <= b ("1/16"): true with *budget or *ratio set (the other 0); false for anything else
 * (signs, spaces, trailing text, zero). */
bool kvp_budget_parse(const char *s, int *budget, float *ratio);

/* Whether r is a ratio the grammar accepts: finite, in (0, 1], and not 0 once stored as a float
 * (1e-68 is). For budgets that arrive as numbers rather than text (the server's JSON). */
bool kvp_budget_ratio_ok(double r);

#endif
