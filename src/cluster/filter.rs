//! The cluster protocol's part of the module's command filter: `CLUSTER ...` and the
//! connection commands become `SHARD.CLUSTER ...`, keyed commands for another node's slots
//! `SHARD.REDIRECT ...` (or, inside `MULTI`, an unknown command named after the redirect, so
//! that `EXEC` aborts). The decision is `protocol::decide`; this file applies it.

use crate::cluster::protocol::{decide, FilterEnv, Rewrite};
use crate::host::filter::FilterArgs;

impl<'a> FilterEnv<'a> for FilterArgs {
    fn arg(&self, i: usize) -> Option<&'a [u8]> {
        FilterArgs::arg(self, i)
    }

    fn movable_keys(&self) -> Option<Vec<usize>> {
        self.command_keys()
    }

    fn exists(&self, pos: usize) -> bool {
        self.key_exists(pos)
    }

    fn is_replica(&self) -> bool {
        crate::host::context::server_is_replica()
    }

    fn in_transaction(&self) -> bool {
        self.client_in_multi()
    }
}

/// Applies the cluster protocol's rewrite to the filtered command.
pub fn rewrite(args: &mut FilterArgs) {
    let insert: &[u8] = match decide(args.len(), args) {
        Rewrite::None => return,
        Rewrite::Redirect(leave) if args.client_in_multi() => {
            refuse(args, &leave.refusal());
            return;
        }
        Rewrite::Cluster => {
            args.replace(0, b"shard.cluster");
            return;
        }
        Rewrite::Connection => b"shard.cluster",
        Rewrite::Redirect(_) => b"shard.redirect",
    };
    args.insert(0, insert);
}

/// Makes the filtered command an unknown command named `text`, with no argument: the server
/// refuses it (`ERR unknown command 'text'`) and, inside `MULTI`, flags the transaction so that
/// `EXEC` aborts.
fn refuse(args: &mut FilterArgs, text: &str) {
    for pos in (1..args.len()).rev() {
        args.delete(pos);
    }
    args.replace(0, text.as_bytes());
}
