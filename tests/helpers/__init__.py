"""What the integration tests share, defined once (tests/conftest.py makes fixtures of it):

- `ports`: loopback ports of this test process's own block, safe with test files side by side;
- `server`: the server under test, `RedisServer`, INFO and map readers, waits on an event;
- `tls`: the certificates and a TLS server's client arguments;
- `resp`: `Raw`, replies as the exact bytes sent, and the comparison with a plain server's;
- `fleet`: named servers with the module (`Fleet`, `start_fleet`, `make_fleet`), ring
  arguments, owners, keys of every type and where they must be;
- `calls`: random commands over awkward keys, through a fleet and to a plain server;
- `reshard`: a node's COPY or CLEANUP job, the one-command fleet operation, one ring after;
- `writers`: clients writing through SHARD.CALL meanwhile, and what must survive;
- `cluster`: cluster clients on a `slots` ring and their loads through a grow and a shrink;
- `sentinel`: Redis Sentinels, a fleet of primaries and replicas, a failover under writes;
- `partition`: loopback addresses of this test process's own, and `nft` cuts between them;
- `listener`: a peer that accepts and never answers;
- `npm`: the Node.js packages some tests run, installed once per run;
- `ids`: the keys of the snowflake, tsid, uuidv7 and ulid layouts read as numbers, times, nodes.
"""
