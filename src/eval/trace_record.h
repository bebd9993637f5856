/* Recording AttentionPredictor traces from a running context (see trace_record.c). */
#ifndef KVP_EVAL_TRACE_RECORD_H
#define KVP_EVAL_TRACE_RECORD_H

#include "kvpred.h"
#include "predictor/trace.h"

/* Decode tokens[0..n) densely from an empty cache (ctx is reset; its policy is replaced by a
 * measuring `full` policy with first_layer dense layers) and append the sequence to w. */
int kvp_trace_record(struct kvp_trace_writer *w, kvp_ctx *ctx, const int32_t *tokens, int n,
                     struct kvp_err *err);

#endif
