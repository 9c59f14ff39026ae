//! `SHARD.HOTKEYS [LOCAL] [COUNT n] [SAMPLES m]`: the busiest keys, by their LFU counters
//! (`OBJECT FREQ`). Without `LOCAL`, the fleet's: every node of the rings asked for its own
//! top, merged (`route::keyless_call::hot_keys`), `[[key, freq, node] ...]`; with `LOCAL`,
//! this node's (`route::hot_sample`), `[[key, freq] ...]`. `COUNT`: how many (10), `SAMPLES`:
//! how many keys each node reads at most (100000). Needs an LFU `maxmemory-policy`.

use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{int_in, is};
use crate::host::register::{flag, opt, Arg, CommandSpec, Kind};

/// The keys replied by default, and at most.
pub const DEFAULT_COUNT: usize = 10;
pub const MAX_COUNT: i64 = 1000;
/// The keys each node reads by default, and at most.
pub const DEFAULT_SAMPLES: u64 = 100_000;
pub const MAX_SAMPLES: i64 = 10_000_000;

/// What a call asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub local: bool,
    pub count: usize,
    pub samples: u64,
}

/// The arguments after the command's name.
pub fn parse(args: &[&[u8]]) -> Result<Request, CmdError> {
    let mut req = Request {
        local: false,
        count: DEFAULT_COUNT,
        samples: DEFAULT_SAMPLES,
    };
    let (mut count_given, mut samples_given) = (false, false);
    let mut rest = args.iter().copied();
    let mut first = true;
    while let Some(arg) = rest.next() {
        if first && is(arg, "local") {
            req.local = true;
        } else if is(arg, "count") || is(arg, "samples") {
            let counting = is(arg, "count");
            let given = if counting {
                &mut count_given
            } else {
                &mut samples_given
            };
            if std::mem::replace(given, true) {
                return Err(CmdError::given_twice(arg));
            }
            let value = rest
                .next()
                .ok_or_else(|| CmdError::err(format!("{} needs a value", upper(arg))))?;
            if counting {
                req.count =
                    usize::try_from(int_in(value, "COUNT", 1, MAX_COUNT)?).unwrap_or(DEFAULT_COUNT);
            } else {
                req.samples = u64::try_from(int_in(value, "SAMPLES", 1, MAX_SAMPLES)?)
                    .unwrap_or(DEFAULT_SAMPLES);
            }
        } else if is(arg, "local") {
            return Err(CmdError::err("LOCAL must come first"));
        } else {
            return Err(CmdError::unknown_option("shard.hotkeys", arg));
        }
        first = false;
    }
    Ok(req)
}

fn upper(arg: &[u8]) -> String {
    crate::host::args::printable(arg).to_ascii_uppercase()
}

pub fn hotkeys(call: &Call) -> CmdResult {
    let args: Vec<&[u8]> = (1..call.args.len()).map(|i| call.args.get(i)).collect();
    let req = parse(&args)?;
    if req.local {
        crate::route::hot_sample::local(call, req.count, req.samples)
    } else {
        crate::route::keyless_call::hot_keys(call, req.count, req.samples)
    }
}

static ARGS: &[Arg] = &[
    flag(c"local", c"LOCAL"),
    opt(c"count", c"COUNT", Kind::Int),
    opt(c"samples", c"SAMPLES", Kind::Int),
];

/// `SHARD.HOTKEYS`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.hotkeys",
    handler: hotkeys,
    flags: "readonly deny-script blocking",
    arity: -1,
    summary: "Lists the busiest keys of the fleet (or with LOCAL of this node) by their LFU counters, each with its frequency and node",
    complexity: "O(M) with M the keys sampled on each node (SAMPLES), in steps of at most 1 ms",
    args: ARGS,
    acl: "keyspace read slow",
};

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Request, String> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        parse(&args).map_err(|e| e.message().to_string())
    }

    #[test]
    fn defaults_and_options() {
        let default = Request {
            local: false,
            count: DEFAULT_COUNT,
            samples: DEFAULT_SAMPLES,
        };
        assert_eq!(p(&[]), Ok(default.clone()));
        assert_eq!(
            p(&["count", "3"]),
            Ok(Request {
                count: 3,
                ..default.clone()
            })
        );
        assert_eq!(
            p(&["LOCAL", "SAMPLES", "50", "COUNT", "1000"]),
            Ok(Request {
                local: true,
                count: 1000,
                samples: 50
            })
        );
    }

    #[test]
    fn bad_arguments_say_what_was_wrong() {
        let refused = |args: &[&str], says: &str| {
            let e = p(args).unwrap_err();
            assert!(e.starts_with("ERR ") && e.contains(says), "{args:?}: {e}");
        };
        refused(&["COUNT"], "COUNT needs a value");
        refused(&["COUNT", "0"], "COUNT must be an integer from 1 to 1000");
        refused(&["COUNT", "1001"], "from 1 to 1000");
        refused(&["COUNT", "ten"], "got 'ten'");
        refused(&["COUNT", "-1"], "COUNT must be");
        refused(
            &["SAMPLES", "0"],
            "SAMPLES must be an integer from 1 to 10000000",
        );
        refused(&["COUNT", "2", "count", "3"], "COUNT is given twice");
        refused(&["COUNT", "2", "LOCAL"], "LOCAL must come first");
        refused(&["FAST"], "unknown option 'FAST'");
    }
}
