//! The owner protocol's argument forms, pure: `nwatched key ...` and `ncmds (argc arg ...)
//! ...` (docs/transactions.md), read from a list of arguments with every count checked against
//! what is left, so that bad input is an error that says what was wrong, never a panic.

/// A command: its name, then its arguments.
pub type Command = Vec<Vec<u8>>;

/// Reads a count at `at` (`what` names it in the error), at most `left` after it.
fn count(args: &[&[u8]], at: usize, what: &str) -> Result<usize, String> {
    let text = args.get(at).ok_or_else(|| format!("{what} is missing"))?;
    let n = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<usize>().ok())
        .ok_or_else(|| format!("{what} is not a count"))?;
    if n > args.len().saturating_sub(at + 1) {
        return Err(format!(
            "{what} is {n}, more than the arguments that follow"
        ));
    }
    Ok(n)
}

/// `nwatched key ...` at `at`: the keys, and where the next argument is.
pub fn watched(args: &[&[u8]], at: usize) -> Result<(Vec<Vec<u8>>, usize), String> {
    let n = count(args, at, "nwatched")?;
    let keys = args[at + 1..at + 1 + n]
        .iter()
        .map(|k| k.to_vec())
        .collect();
    Ok((keys, at + 1 + n))
}

/// `ncmds (argc arg ...) ...` at `at`, up to the end of the arguments exactly.
pub fn commands(args: &[&[u8]], at: usize) -> Result<Vec<Command>, String> {
    let (cmds, pos) = commands_then(args, at)?;
    if pos != args.len() {
        return Err(format!(
            "{} arguments after the last command",
            args.len() - pos
        ));
    }
    Ok(cmds)
}

/// `ncmds (argc arg ...) ...` at `at`, then `[FROM host:port]` to the end of the arguments
/// exactly (`PREPARE`'s: the coordinator's address as it gives it).
pub fn commands_from(args: &[&[u8]], at: usize) -> Result<(Vec<Command>, Option<String>), String> {
    let (cmds, pos) = commands_then(args, at)?;
    match &args[pos..] {
        [] => Ok((cmds, None)),
        [from, address] if from.eq_ignore_ascii_case(b"FROM") => {
            let address = std::str::from_utf8(address)
                .ok()
                .filter(|a| {
                    crate::net::endpoint::split_address(a).is_some_and(|(h, _)| !h.is_empty())
                })
                .ok_or("FROM takes the coordinator's address as host:port")?;
            Ok((cmds, Some(address.to_string())))
        }
        rest => Err(format!(
            "{} arguments after the last command (only FROM host:port may follow)",
            rest.len()
        )),
    }
}

/// `ncmds (argc arg ...) ...` at `at`: the commands, and where the next argument is.
fn commands_then(args: &[&[u8]], at: usize) -> Result<(Vec<Command>, usize), String> {
    let n = count(args, at, "ncmds")?;
    let mut pos = at + 1;
    let mut cmds = Vec::with_capacity(n);
    for i in 0..n {
        let argc = count(args, pos, &format!("the argc of command {}", i + 1))?;
        if argc == 0 {
            return Err(format!("command {} has no name (argc 0)", i + 1));
        }
        cmds.push(
            args[pos + 1..pos + 1 + argc]
                .iter()
                .map(|a| a.to_vec())
                .collect(),
        );
        pos += 1 + argc;
    }
    Ok((cmds, pos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn reads_watched_keys_then_commands() {
        let args = v("APPLY t 2 a b 2 3 SET a 1 2 GET b");
        let (keys, next) = watched(&args, 2).unwrap();
        assert_eq!(keys, vec![b"a".to_vec(), b"b".to_vec()]);
        let cmds = commands(&args, next).unwrap();
        assert_eq!(cmds.len(), 2);
        assert_eq!(cmds[1], vec![b"GET".to_vec(), b"b".to_vec()]);
        assert_eq!(commands(&v("0"), 0).unwrap().len(), 0);
    }

    #[test]
    fn every_bad_count_is_an_error() {
        for (text, at, error) in [
            ("3 a b", 0, "more than the arguments"),
            ("x", 0, "not a count"),
            ("-1 a", 0, "not a count"),
        ] {
            assert!(watched(&v(text), at).unwrap_err().contains(error), "{text}");
        }
        for (text, error) in [
            ("1 3 SET a", "more than the arguments"),
            ("1 0", "no name"),
            ("1 2 GET a extra", "1 arguments after"),
            ("2 2 GET a", "argc of command 2 is missing"),
        ] {
            assert!(commands(&v(text), 0).unwrap_err().contains(error), "{text}");
        }
        assert!(watched(&[], 0).unwrap_err().contains("missing"));
    }

    #[test]
    fn prepare_may_end_with_the_coordinator_s_address() {
        let (cmds, from) = commands_from(&v("1 2 GET a"), 0).unwrap();
        assert_eq!((cmds.len(), from), (1, None));
        let (_, from) = commands_from(&v("1 2 GET a from 127.0.0.1:7001"), 0).unwrap();
        assert_eq!(from.as_deref(), Some("127.0.0.1:7001"));
        for text in [
            "1 2 GET a FROM",
            "1 2 GET a FROM nope",
            "1 2 GET a FROM :1",
            "1 2 GET a FROM h:1 x",
            "1 2 GET a TO h:1",
        ] {
            assert!(commands_from(&v(text), 0).is_err(), "{text}");
        }
    }
}
