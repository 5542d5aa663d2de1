/* pool_withdraw (lib/common/pool.h): the jobs of one group that no worker
 * has started are taken back and never run; others' jobs, and the queue's
 * order, stay as they were. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ckpt.h"
#include "pool.h"

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static int gate_open, gate_entered;

/* Holds the only worker until the test opens the gate. */
static int blocker(void *arg, int worker)
{
    (void)arg;
    (void)worker;
    pthread_mutex_lock(&gate_lock);
    gate_entered = 1;
    pthread_cond_broadcast(&gate_cond);
    while (!gate_open)
        pthread_cond_wait(&gate_cond, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
    return CKPT_OK;
}

static atomic_int order[16];
static atomic_int ran;

static int record(void *arg, int worker)
{
    (void)worker;
    order[atomic_fetch_add(&ran, 1)] = (int)(intptr_t)arg;
    return CKPT_OK;
}

Test(pool, withdraw_takes_back_only_the_unstarted_jobs_of_one_group)
{
    pool *p;
    cr_assert_eq(pool_create(&p, 1), CKPT_OK);
    pool_group hold, mine, other;
    pool_group_init(&hold);
    pool_group_init(&mine);
    pool_group_init(&other);
    cr_assert_eq(pool_submit(p, &hold, blocker, NULL), CKPT_OK);
    pthread_mutex_lock(&gate_lock);
    while (!gate_entered) /* the worker is busy: everything below queues */
        pthread_cond_wait(&gate_cond, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
    /* queue: other 1, mine 2, other 3, mine 4, mine 5 (the tail) */
    int groups[] = {0, 1, 0, 1, 1};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(pool_submit(p, groups[i] ? &mine : &other, record,
                                 (void *)(intptr_t)(i + 1)), CKPT_OK);
    cr_assert_eq(pool_withdraw(p, &mine), 3);
    cr_assert_eq(pool_group_wait(&mine), CKPT_OK, "nothing of it is left to wait for");
    cr_assert_eq(pool_withdraw(p, &mine), 0);
    cr_assert_eq(pool_submit(p, &mine, record, (void *)(intptr_t)6), CKPT_OK,
                 "the queue's tail is sound after taking it back");
    pthread_mutex_lock(&gate_lock);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
    cr_assert_eq(pool_group_wait(&other), CKPT_OK);
    cr_assert_eq(pool_group_wait(&mine), CKPT_OK);
    cr_assert_eq(pool_group_wait(&hold), CKPT_OK);
    cr_assert_eq(atomic_load(&ran), 3);
    cr_assert_eq(order[0], 1);
    cr_assert_eq(order[1], 3);
    cr_assert_eq(order[2], 6);
    pool_free(p);
    pool_group_destroy(&hold);
    pool_group_destroy(&mine);
    pool_group_destroy(&other);
}
