/* The ceiling of any forwarded call, for bench/fleet.py: a C module command that blocks its
 * client and unblocks it at once, doing nothing else; the reply is written by the reply
 * callback, as SHARD.CALL's forwarded replies are. Whatever a forwarded SHARD.CALL costs over
 * it is the network hop and the module's own work. */
#include "redismodule.h"

static int Reply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return RedisModule_ReplyWithStringBuffer(ctx, "xxxxxxxx", 8);
}

static int BlockNow(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    RedisModuleBlockedClient *bc = RedisModule_BlockClient(ctx, Reply, NULL, NULL, 0);
    RedisModule_UnblockClient(bc, NULL);
    return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "block", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return RedisModule_CreateCommand(ctx, "block.now", BlockNow, "readonly fast", 0, 0, 0);
}
