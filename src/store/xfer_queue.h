/*
 * The queue between the store and a backend's transfer threads (cold_ram.c, cold_pread.c): the
 * store pushes record ids, threads pop them in order, do the transfer and hand them back; the
 * decode thread collects the finished ones into kvp_store_complete. One mutex, two condition
 * variables; capacities are the store's records in flight (KVP_STORE_MAX_XFER).
 */
#ifndef KVP_STORE_XFER_QUEUE_H
#define KVP_STORE_XFER_QUEUE_H

#include <pthread.h>
#include <stdbool.h>

#include "store/store.h"

struct kvp_xfer_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    int todo[KVP_STORE_MAX_XFER]; /* FIFO of record ids for the threads */
    int head, len;
    int done[KVP_STORE_MAX_XFER]; /* record ids the threads finished */
    int n_done;
    bool stop;
};

void kvp_xq_init(struct kvp_xfer_queue *q);
void kvp_xq_destroy(struct kvp_xfer_queue *q);
/* Store side: queue record id for the threads. */
void kvp_xq_push(struct kvp_xfer_queue *q, int id);
/* Thread side: the next record id, waiting for one; -1 once stopped and empty. */
int kvp_xq_pop(struct kvp_xfer_queue *q);
/* Thread side: record id finished with res bytes moved (or -errno) at time t_done. */
void kvp_xq_finish(struct kvp_xfer_queue *q, struct kvp_store *s, int id, int res, double t_done);
/* Wake every thread to end once the queue is empty. */
void kvp_xq_stop(struct kvp_xfer_queue *q);
/* Store side: complete the finished records (wait: block until at least one); how many. */
int kvp_xq_collect(struct kvp_xfer_queue *q, struct kvp_store *s, bool wait);

#endif
