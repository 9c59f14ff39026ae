//! What the emulated commands need besides the map (`replies`): which `INFO` calls show the
//! cluster section and that section as a cluster node writes it (`cluster_enabled:1`, the
//! rest of `INFO` as the server wrote it), `CLUSTER HELP`'s text, and the refusal of each
//! `CLUSTER` subcommand that changes a real cluster's slots, nodes or epochs by hand: on a
//! fleet those are the ring's, changed with the module's own commands, which the refusal
//! names. Pure.

/// Whether `INFO` with these arguments shows the cluster section: with none (the default
/// sections), or with `cluster`, `default`, `all` or `everything` among them.
pub fn shows_cluster<'a>(mut sections: impl Iterator<Item = &'a [u8]>) -> bool {
    let mut none = true;
    let shows = sections.any(|s| {
        none = false;
        [&b"cluster"[..], b"default", b"all", b"everything"]
            .iter()
            .any(|name| s.eq_ignore_ascii_case(name))
    });
    shows || none
}

/// The server's `INFO` text as a cluster node shows it: `cluster_enabled:1`, every other
/// byte as it was.
pub fn as_cluster_node(info: &[u8]) -> Vec<u8> {
    const PLAIN: &[u8] = b"cluster_enabled:0";
    let mut out = info.to_vec();
    let mut at = 0;
    while let Some(found) = memchr::memmem::find(&out[at..], PLAIN) {
        let start = at + found;
        let end = start + PLAIN.len();
        let line_start = start == 0 || out[start - 1] == b'\n';
        let line_end = matches!(out.get(end), None | Some(b'\r' | b'\n'));
        if line_start && line_end {
            out[end - 1] = b'1';
        }
        at = end;
    }
    out
}

/// The refusal of a `CLUSTER` subcommand that assigns slots, nodes or epochs by hand (`sub`,
/// lower case), naming what does it on a fleet; `None` for the others.
pub fn by_hand(sub: &str) -> Option<String> {
    let why = match sub {
        "addslots" | "addslotsrange" | "delslots" | "delslotsrange" | "flushslots" => {
            "a fleet's slots are its slots ring's: give them with SHARD.RING SET slots name host:port weight [SLOTS ranges] ... and SHARD.RING PUSH, or move them while the fleet serves with SHARD.RESHARD START slots name host:port weight [SLOTS ranges] ..."
        }
        "setslot" => {
            "a slot moves with its keys in a resharding: SHARD.RESHARD START slots name host:port weight [SLOTS ranges] ... moves slots while the fleet serves"
        }
        "meet" | "forget" => {
            "a fleet's nodes are its ring's: SHARD.RESHARD START slots name host:port weight ... with the new ring's nodes adds or removes a node while the fleet serves"
        }
        "replicate" => {
            "a node's replicas are plain replicas: REPLICAOF host port on the replica (or Sentinel, with sentinel ring nodes)"
        }
        "failover" => {
            "failover is Sentinel's: SENTINEL FAILOVER master-name on a sentinel, for a ring node of the sentinel kind"
        }
        "reset" => {
            "this node's place in the fleet is its ring's: SHARD.RING SET or SHARD.RESHARD START changes it, CONFIG SET shard.cluster-protocol no ends the protocol"
        }
        "set-config-epoch" | "bumpepoch" => {
            "a node's config epoch is its place in the ring: SHARD.RING SET or SHARD.RESHARD START changes the ring"
        }
        _ => return None,
    };
    Some(format!(
        "CLUSTER {} is not run on a fleet under shard.cluster-protocol: {why}",
        sub.to_ascii_uppercase()
    ))
}

/// `CLUSTER HELP`: the subcommands answered here, as cluster mode lists them.
pub const HELP: &[&str] = &[
    "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "COUNT-FAILURE-REPORTS <node-id>",
    "    Return number of failure reports for <node-id> (always 0: no node fails here).",
    "COUNTKEYSINSLOT <slot>",
    "    Return the number of keys in <slot>.",
    "GETKEYSINSLOT <slot> <count>",
    "    Return key names stored by current node in a slot.",
    "INFO",
    "    Return information about the cluster.",
    "KEYSLOT <key>",
    "    Return the hash slot for <key>.",
    "LINKS",
    "    Return information about all network links between this node and its peers.",
    "MYID",
    "    Return the node id.",
    "MYSHARDID",
    "    Return the node's shard id.",
    "NODES",
    "    Return cluster configuration seen by node. Output format:",
    "    <id> <ip:port@cport> <flags> <master> <pings> <pongs> <epoch> <link> <slot> ...",
    "REPLICAS <node-id>",
    "    Return <node-id> replicas.",
    "SAVECONFIG",
    "    Does nothing: the fleet's configuration is its ring, saved with the data.",
    "SHARDS",
    "    Return information about slot range mappings and the nodes associated with them.",
    "SLOTS",
    "    Return information about slots range mappings. Each range is made of:",
    "    start, end, master and replicas IP addresses, ports and ids",
    "ADDSLOTS, ADDSLOTSRANGE, DELSLOTS, DELSLOTSRANGE, FLUSHSLOTS, SETSLOT, MEET, FORGET,",
    "REPLICATE, FAILOVER, RESET, SET-CONFIG-EPOCH, BUMPEPOCH",
    "    Refused: the fleet's slots and nodes are its ring's (SHARD.RING, SHARD.RESHARD START).",
    "HELP",
    "    Print this help.",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_shows_the_cluster_section_by_default_and_when_named() {
        let shows = |args: &[&[u8]]| shows_cluster(args.iter().copied());
        assert!(shows(&[]));
        assert!(shows(&[b"CLUSTER"]));
        assert!(shows(&[b"server", b"everything"]));
        assert!(shows(&[b"all"]));
        assert!(shows(&[b"Default"]));
        assert!(!shows(&[b"server"]));
        assert!(!shows(&[b"shard", b"memory"]));
    }

    #[test]
    fn only_the_cluster_enabled_line_changes() {
        let info = b"# Server\r\nx:cluster_enabled:0\r\n\r\n# Cluster\r\ncluster_enabled:0\r\n\r\n# Keyspace\r\n";
        let out = as_cluster_node(info);
        assert_eq!(
            out,
            b"# Server\r\nx:cluster_enabled:0\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n\r\n# Keyspace\r\n"
        );
        assert_eq!(as_cluster_node(b"cluster_enabled:0"), b"cluster_enabled:1");
        assert_eq!(
            as_cluster_node(b"cluster_enabled:00\r\n"),
            b"cluster_enabled:00\r\n"
        );
    }

    #[test]
    fn by_hand_refusals_name_the_command_to_use() {
        for sub in [
            "addslots",
            "addslotsrange",
            "delslots",
            "delslotsrange",
            "flushslots",
        ] {
            let text = by_hand(sub).unwrap_or_default();
            assert!(text.contains("SHARD.RING SET") && text.contains("SHARD.RESHARD START"));
        }
        assert!(by_hand("setslot").is_some_and(|t| t.starts_with("CLUSTER SETSLOT ")));
        assert!(by_hand("meet").is_some_and(|t| t.contains("SHARD.RESHARD START")));
        assert!(by_hand("failover").is_some_and(|t| t.contains("SENTINEL FAILOVER")));
        assert!(by_hand("replicate").is_some_and(|t| t.contains("REPLICAOF")));
        assert!(by_hand("bumpepoch").is_some_and(|t| t.contains("SHARD.RING SET")));
        assert!(by_hand("slots").is_none());
    }
}
