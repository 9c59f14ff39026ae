/* The floor of any module command on this machine, for bench/run.py: a C module command that
 * does nothing but reply a 7-byte bulk string, as SHARD.WHEREIS replies a node name. What
 * SHARD.WHEREIS costs over it is the module's own work; what it costs over GET is Redis's
 * price for a module command (its context, with a monotonic clock read, in Redis 7.0). */
#include "redismodule.h"

static int FloorReply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return RedisModule_ReplyWithStringBuffer(ctx, "node123", 7);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "floor", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return RedisModule_CreateCommand(ctx, "floor.reply", FloorReply, "readonly fast", 0, 0, 0);
}
