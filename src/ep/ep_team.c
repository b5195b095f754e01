/**
 * @file ep_team.c
 * @brief The team: one persistent thread per rank, and jobs that run on all of them at once.
 *
 * A rank's work between two exchanges is ordinary sequential code (gather rows, run the
 * experts, combine); the exchanges are collective, so every rank must run at the same time on
 * a thread of its own.  Starting N threads per MoE layer call would cost tens of microseconds
 * per call (and a decode step has one call per layer), so the team starts them once and hands
 * each job to all of them:
 *
 *     caller: job = (fn, ctx); generation++; broadcast; wait until done == N
 *     rank r: wait for a new generation; bind (GPU r); status[r] = fn(ctx, r); done++; signal
 *
 * Every job binds the thread to its rank first (mmoe_ep_group_bind_thread(): cudaSetDevice for
 * NCCL), so a rank's CUDA calls always go to its own GPU.  The caller's thread takes no rank:
 * it only waits, which keeps the caller's own state (its current GPU, its OpenBLAS threads)
 * untouched by the job.  The job's status is the lowest failed rank's, prefixed with its rank.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"

/** One rank's thread and its last status. */
typedef struct team_rank {
    mmoe_ep_team *team; /**< back pointer */
    int rank;           /**< which rank */
    pthread_t thread;   /**< its thread */
    mmoe_status status; /**< status of the last job */
    mmoe_error err;     /**< message of the last job */
} team_rank;

/** The team: its threads and the job being handed to them. */
struct mmoe_ep_team {
    mmoe_ep_group *group;       /**< the group (borrowed) */
    int size;                   /**< ranks = threads */
    pthread_mutex_t mu;         /**< guards everything below */
    pthread_cond_t start;       /**< signalled when a job (or the stop) is posted */
    pthread_cond_t finished;    /**< signalled when a rank completes a job */
    uint64_t generation;        /**< job counter: a rank runs each generation once */
    int stop;                   /**< 1: threads exit */
    int done;                   /**< ranks that finished the current job */
    mmoe_ep_job_fn fn;          /**< the current job */
    void *ctx;                  /**< its context */
    team_rank ranks[MMOE_EP_MAX_RANKS]; /**< [size] */
};

/** A rank's thread: run each new job once, until stopped. */
static void *rank_main(void *arg)
{
    team_rank *tr = arg;
    mmoe_ep_team *t = tr->team;
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->stop && t->generation == seen)
            pthread_cond_wait(&t->start, &t->mu);
        if (t->stop)
            break;
        seen = t->generation;
        mmoe_ep_job_fn fn = t->fn;
        void *ctx = t->ctx;
        pthread_mutex_unlock(&t->mu);
        mmoe_error_clear(&tr->err);
        mmoe_status st = mmoe_ep_group_bind_thread(t->group, tr->rank, &tr->err);
        if (st == MMOE_OK)
            st = fn(ctx, tr->rank, &tr->err);
        pthread_mutex_lock(&t->mu);
        tr->status = st;
        t->done++;
        pthread_cond_signal(&t->finished);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/** Stop and join the first @p n threads of @p t, then free it. */
static void team_stop(mmoe_ep_team *t, int n)
{
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->start);
    pthread_mutex_unlock(&t->mu);
    for (int r = 0; r < n; r++)
        pthread_join(t->ranks[r].thread, NULL);
    pthread_cond_destroy(&t->start);
    pthread_cond_destroy(&t->finished);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

mmoe_status mmoe_ep_team_create(mmoe_ep_group *group, mmoe_ep_team **out, mmoe_error *err)
{
    *out = NULL;
    mmoe_ep_team *t = calloc(1, sizeof *t);
    if (t == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory for a team");
    t->group = group;
    t->size = mmoe_ep_group_size(group);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->start, NULL);
    pthread_cond_init(&t->finished, NULL);
    for (int r = 0; r < t->size; r++) {
        t->ranks[r].team = t;
        t->ranks[r].rank = r;
        if (pthread_create(&t->ranks[r].thread, NULL, rank_main, &t->ranks[r]) != 0) {
            team_stop(t, r);
            return mmoe_error_set(err, MMOE_ENOMEM, "ep: cannot start the thread of rank %d", r);
        }
    }
    *out = t;
    return MMOE_OK;
}

void mmoe_ep_team_destroy(mmoe_ep_team *team)
{
    if (team != NULL)
        team_stop(team, team->size);
}

mmoe_ep_group *mmoe_ep_team_group(const mmoe_ep_team *team)
{
    return team->group;
}

mmoe_status mmoe_ep_team_run(mmoe_ep_team *t, mmoe_ep_job_fn fn, void *ctx, mmoe_error *err)
{
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->ctx = ctx;
    t->done = 0;
    t->generation++;
    pthread_cond_broadcast(&t->start);
    while (t->done < t->size)
        pthread_cond_wait(&t->finished, &t->mu);
    pthread_mutex_unlock(&t->mu);
    for (int r = 0; r < t->size; r++)
        if (t->ranks[r].status != MMOE_OK) {
            if (err != NULL) {
                *err = t->ranks[r].err;
                mmoe_error_prefix(err, "rank %d: ", r);
            }
            return t->ranks[r].status;
        }
    return MMOE_OK;
}
