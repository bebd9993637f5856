/* The transfer threads' queue (see xfer_queue.h). */
#include "store/xfer_queue.h"

#include <string.h>

#include "store/store_internal.h"

void kvp_xq_init(struct kvp_xfer_queue *q)
{
    memset(q, 0, sizeof(*q));
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv_work, NULL);
    pthread_cond_init(&q->cv_done, NULL);
}

void kvp_xq_destroy(struct kvp_xfer_queue *q)
{
    pthread_cond_destroy(&q->cv_work);
    pthread_cond_destroy(&q->cv_done);
    pthread_mutex_destroy(&q->mu);
}

void kvp_xq_push(struct kvp_xfer_queue *q, int id)
{
    pthread_mutex_lock(&q->mu);
    q->todo[(q->head + q->len) % KVP_STORE_MAX_XFER] = id;
    q->len++;
    pthread_cond_signal(&q->cv_work);
    pthread_mutex_unlock(&q->mu);
}

int kvp_xq_pop(struct kvp_xfer_queue *q)
{
    pthread_mutex_lock(&q->mu);
    while (q->len == 0 && !q->stop)
        pthread_cond_wait(&q->cv_work, &q->mu);
    int id = -1;
    if (q->len > 0) {
        id = q->todo[q->head];
        q->head = (q->head + 1) % KVP_STORE_MAX_XFER;
        q->len--;
    }
    pthread_mutex_unlock(&q->mu);
    return id;
}

void kvp_xq_finish(struct kvp_xfer_queue *q, struct kvp_store *s, int id, int res, double t_done)
{
    pthread_mutex_lock(&q->mu);
    s->xfer[id].res = res;
    s->xfer[id].t_done = t_done;
    q->done[q->n_done++] = id;
    pthread_cond_broadcast(&q->cv_done);
    pthread_mutex_unlock(&q->mu);
}

void kvp_xq_stop(struct kvp_xfer_queue *q)
{
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv_work);
    pthread_mutex_unlock(&q->mu);
}

int kvp_xq_collect(struct kvp_xfer_queue *q, struct kvp_store *s, bool wait)
{
    int ids[KVP_STORE_MAX_XFER], n;
    pthread_mutex_lock(&q->mu);
    while (wait && q->n_done == 0)
        pthread_cond_wait(&q->cv_done, &q->mu);
    n = q->n_done;
    memcpy(ids, q->done, (size_t)n * sizeof(int));
    q->n_done = 0;
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < n; i++)
        kvp_store_complete(s, ids[i], s->xfer[ids[i]].res, s->xfer[ids[i]].t_done);
    return n;
}
