/* The floor of a forwarding design with an I/O thread (bench/findings.md, issue 19): the client
 * is blocked on the main thread, handed to another thread, and unblocked from there, with no
 * network at all. Compare BLK.THREAD with block.c's BLOCK.NOW on one server:
 *   gcc -O2 -fPIC -shared -I<redismodule.h dir> -o /tmp/t.so bench/floor/unblock_from_thread.c
 *   redis-server --loadmodule /tmp/t.so ... ; redis-benchmark -c 50 -P 16 BLK.THREAD */
#include "redismodule.h"
#include <pthread.h>
#define QN 65536
static RedisModuleBlockedClient *q[QN]; static unsigned head, tail;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int reply_cb(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) { return RedisModule_ReplyWithSimpleString(ctx, "OK"); }
static void *worker(void *arg) {
  for (;;) { pthread_mutex_lock(&mu); while (head == tail) pthread_cond_wait(&cv, &mu);
    RedisModuleBlockedClient *bc = q[tail++ % QN]; pthread_mutex_unlock(&mu); RedisModule_UnblockClient(bc, NULL); }
  return NULL; }
static int cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
  RedisModuleBlockedClient *bc = RedisModule_BlockClient(ctx, reply_cb, NULL, NULL, 0);
  pthread_mutex_lock(&mu); q[head++ % QN] = bc; pthread_cond_signal(&cv); pthread_mutex_unlock(&mu); return REDISMODULE_OK; }
int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
  if (RedisModule_Init(ctx, "blkthr", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
  pthread_t t; pthread_create(&t, NULL, worker, NULL);
  return RedisModule_CreateCommand(ctx, "blk.thread", cmd, "fast", 0, 0, 0); }
