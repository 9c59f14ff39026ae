//! Transactions across nodes (`docs/transactions.md`): the coordinator (`coord`), the client's
//! side of `SHARD.WATCH`/`SHARD.MULTI`/`SHARD.EXEC`.

pub mod coord;
