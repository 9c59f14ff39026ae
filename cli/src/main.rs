//! `shard-cli`: a fleet of servers running the `shard` module at a glance, and its operations
//! with progress, as `redis-cli --cluster` serves a Redis Cluster (issue 45). One module per
//! job: `conn` (connections, options, replies), `fleet` (the ring a node replies), `info`,
//! `top` (info refreshed in place), `check` (and its parts: `strays`, the keys away from their
//! owner, `cluster`, the cluster protocol, `replicas`, Sentinel's too), `fix`
//! (check's mends applied), `create` (and `sentinel`, Sentinel as create meets it), `ops`
//! (add-node, del-node, status), `rebalance`, `follow` (the progress of an operation) and `jobs`
//! (a copy or cleanup run by hand). Errors print what was wrong and exit 1; `check` exits 1 on
//! any problem.
//!
//! The module's crate is not linked in: it is built with the server's allocator as its global
//! allocator (only its `system-alloc` feature turns that off, and a feature asked for by this
//! crate would reach the module's own build whenever both are built by one cargo invocation),
//! and it needs `redis-module`. The tool needs none of its code anyway: the nodes reply the
//! digests, shares and slot maps, and `SHARD.RESHARD START` computes the new ring itself.

mod check;
mod cluster;
mod conn;
mod create;
mod fix;
mod fleet;
mod follow;
mod info;
mod jobs;
mod ops;
mod rebalance;
mod replicas;
mod sentinel;
mod strays;
mod top;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "shard-cli",
    version,
    about = "A shard fleet at a glance, and its grows and shrinks with progress"
)]
struct Cli {
    #[command(flatten)]
    conn: conn::ConnOpts,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Per node: keys, memory, ops/s, share of the ring, role and replicas, key index, transactions in doubt
    Info {
        /// JSON for scripts
        #[arg(long)]
        json: bool,
    },
    /// The fleet's figures refreshed in place, as redis-cli --stat (a line a refresh when not a terminal)
    Top {
        /// Seconds between refreshes
        #[arg(long, short = 'i', default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many refreshes
        #[arg(long)]
        count: Option<u64>,
        /// One refresh, then exit
        #[arg(long)]
        once: bool,
        /// One JSON object a line per refresh
        #[arg(long)]
        json: bool,
    },
    /// Whether the fleet is well: same rings and term, keys at their owner, replicas in sync, no operation stuck
    Check {
        #[arg(long)]
        json: bool,
        /// Keys sampled per node
        #[arg(long, default_value_t = 20)]
        sample: usize,
    },
    /// Runs the mends `check` prints, each one shown as it is applied (nothing while an operation runs)
    Fix {
        /// Keys sampled per node
        #[arg(long, default_value_t = 20)]
        sample: usize,
    },
    /// A ring over the servers given (NAME=HOST:PORT, or HOST:PORT named n0, n1, ...), set on every one
    Create {
        /// The ring's algorithm: ketama, slots, jedis, jedis-murmur, redis-shard
        #[arg(long, default_value = "ketama")]
        algo: String,
        /// Take servers that hold keys or a ring
        #[arg(long)]
        force: bool,
        /// A replica of a node, NAME=HOST:PORT (repeatable): shard.self NAME, REPLICAOF its primary
        #[arg(long = "replica", value_name = "NAME=HOST:PORT")]
        replicas: Vec<String>,
        /// A sentinel, HOST:PORT (repeatable): the ring's nodes written `sentinel`, named as Sentinel's masters
        #[arg(long = "sentinel", value_name = "HOST:PORT")]
        sentinels: Vec<String>,
        /// The sentinels' ACL user (shard.sentinel-user)
        #[arg(long)]
        sentinel_user: Option<String>,
        /// The sentinels' password (shard.sentinel-password)
        #[arg(long)]
        sentinel_password: Option<String>,
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
    },
    /// Grows the fleet by a node (SHARD.RESHARD START), with progress
    AddNode {
        #[arg(value_name = "NAME=HOST:PORT")]
        spec: String,
        #[arg(long, default_value_t = 1)]
        weight: i64,
        /// Keys per second each source sends at most
        #[arg(long)]
        maxrate: Option<u64>,
    },
    /// Shrinks the fleet by a node (SHARD.RESHARD START), with progress
    DelNode {
        name: String,
        #[arg(long)]
        maxrate: Option<u64>,
    },
    /// The same nodes at new weights (all 1 unless --weight): an even split, the fewest keys moving
    Rebalance {
        /// A node's weight, NAME=W (repeatable; the nodes not named get 1)
        #[arg(long = "weight", value_name = "NAME=W")]
        weights: Vec<String>,
        /// Print the plan (each node's share now and after, the keys it gains or loses) only
        #[arg(long)]
        dry_run: bool,
        /// The plan as JSON (with --dry-run)
        #[arg(long)]
        json: bool,
        #[arg(long)]
        maxrate: Option<u64>,
    },
    /// The fleet's operation: reattaches to it and follows it to its end
    Status {
        /// Resume an operation whose coordinator stopped driving it (SHARD.RESHARD RESUME)
        #[arg(long)]
        resume: bool,
        /// The operation as JSON, once, without following it
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    // Rust ignores SIGPIPE, so printing into a closed pipe (`shard-cli info | head`) would
    // panic; the default action ends the process quietly, as other command-line tools do.
    // SAFETY: called first, before any thread starts; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let o = &cli.conn;
    let result = match &cli.command {
        Command::Info { json } => info::run(o, *json),
        Command::Top {
            interval,
            count,
            once,
            json,
        } => top::run(o, *interval, *count, *once, *json),
        Command::Check { json, sample } => check::run(o, *json, *sample),
        Command::Fix { sample } => fix::run(o, *sample),
        Command::Create {
            algo,
            force,
            nodes,
            replicas,
            sentinels,
            sentinel_user,
            sentinel_password,
        } => {
            let extra = create::Extra {
                replicas,
                sentinels,
                sentinel_user: sentinel_user.as_deref(),
                sentinel_password: sentinel_password.as_deref(),
            };
            create::run(o, algo, *force, nodes, &extra)
        }
        Command::AddNode {
            spec,
            weight,
            maxrate,
        } => ops::add(o, spec, *weight, *maxrate),
        Command::DelNode { name, maxrate } => ops::del(o, name, *maxrate),
        Command::Rebalance {
            weights,
            dry_run,
            json,
            maxrate,
        } => rebalance::run(o, weights, *dry_run, *json, *maxrate),
        Command::Status { resume, json } => ops::status(o, *resume, *json),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("shard-cli: {e}");
            std::process::exit(1);
        }
    }
}
