//! Connections to the fleet's servers: the options every command shares (address, user and
//! password, TLS files) and one connection per node, with the replies turned into plain text,
//! numbers and maps. Every error names the node and says what failed, so that a command can
//! print it and exit non-zero; nothing here panics on what a server or a file sends.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, TlsCertificates, Value};

/// How long a connection attempt and a reply may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The options of every command: how to reach and authenticate to the fleet's servers. The
/// TLS files are PEM, as the module's own `shard.tls-*-file` settings take them.
#[derive(Args, Clone, Debug)]
pub struct ConnOpts {
    /// A node of the fleet, HOST:PORT (the others are found from its ring)
    #[arg(
        short = 'n',
        long = "node",
        global = true,
        default_value = "127.0.0.1:6379"
    )]
    pub node: String,
    /// The ACL user
    #[arg(long, global = true, env = "SHARDCLI_USER")]
    pub user: Option<String>,
    /// The password (or the REDISCLI_AUTH environment variable, as redis-cli takes it)
    #[arg(
        short = 'a',
        long,
        global = true,
        env = "REDISCLI_AUTH",
        hide_env_values = true
    )]
    pub password: Option<String>,
    /// Connect over TLS
    #[arg(long, global = true)]
    pub tls: bool,
    /// The CA certificate (PEM) that the servers' certificates chain to
    #[arg(long, global = true, value_name = "FILE")]
    pub cacert: Option<String>,
    /// The client certificate (PEM), for servers with tls-auth-clients
    #[arg(long, global = true, value_name = "FILE")]
    pub cert: Option<String>,
    /// The client certificate's key (unencrypted PEM)
    #[arg(long, global = true, value_name = "FILE")]
    pub key: Option<String>,
}

/// An open connection to one node, named for the messages.
pub struct Node {
    pub label: String,
    con: redis::Connection,
}

/// Splits `host:port` (or `[v6]:port`) into its parts.
pub fn split_addr(addr: &str) -> Result<(String, u16), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("address must be HOST:PORT, got '{addr}'"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("address must be HOST:PORT, got '{addr}': bad port '{port}'"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("address must be HOST:PORT, got '{addr}': no host"));
    }
    Ok((host.to_string(), port))
}

fn read_file(path: &str, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} '{path}': {e}"))
}

impl ConnOpts {
    /// Opens a connection to `addr`, labelled `label` in messages.
    pub fn connect(&self, label: &str, addr: &str) -> Result<Node, String> {
        let (host, port) = split_addr(addr)?;
        let fail = |e: redis::RedisError| format!("{label} ({addr}): {e}");
        let mut settings = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = &self.user {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password);
        }
        let client = if self.tls {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let root_cert = match &self.cacert {
                Some(p) => Some(read_file(p, "CA certificate")?),
                None => None,
            };
            let client_tls = match (&self.cert, &self.key) {
                (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                    client_cert: read_file(c, "client certificate")?,
                    client_key: read_file(k, "client key")?,
                }),
                (None, None) => None,
                _ => return Err("--cert and --key go together".to_string()),
            };
            let addr = ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            };
            let info = addr
                .into_connection_info()
                .map_err(fail)?
                .set_redis_settings(settings);
            let certs = TlsCertificates {
                client_tls,
                root_cert,
            };
            redis::Client::build_with_tls(info, certs).map_err(fail)?
        } else {
            let info = ConnectionAddr::Tcp(host, port)
                .into_connection_info()
                .map_err(fail)?
                .set_redis_settings(settings);
            redis::Client::open(info).map_err(fail)?
        };
        let con = client.get_connection_with_timeout(TIMEOUT).map_err(fail)?;
        con.set_read_timeout(Some(TIMEOUT)).map_err(fail)?;
        con.set_write_timeout(Some(TIMEOUT)).map_err(fail)?;
        Ok(Node {
            label: label.to_string(),
            con,
        })
    }
}

impl Node {
    /// Runs a command; an error reply or a network failure comes back as text naming the node
    /// and the command.
    pub fn call(&mut self, args: &[&str]) -> Result<Value, String> {
        let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.call_bytes(&argv)
    }

    /// `call` with arguments as bytes (key names need not be UTF-8).
    pub fn call_bytes(&mut self, args: &[&[u8]]) -> Result<Value, String> {
        let mut cmd = redis::Cmd::new();
        for a in args {
            cmd.arg(*a);
        }
        cmd.query::<Value>(&mut self.con).map_err(|e| {
            let what = args
                .iter()
                .take(2)
                .map(|a| String::from_utf8_lossy(a))
                .collect::<Vec<_>>()
                .join(" ");
            format!("{}: {what}: {e}", self.label)
        })
    }

    /// `INFO section ...` (sections separated by spaces) as a field -> value map.
    pub fn info(&mut self, section: &str) -> Result<BTreeMap<String, String>, String> {
        let mut args = vec!["INFO"];
        args.extend(section.split_whitespace());
        let text = text(&self.call(&args)?);
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect())
    }
}

/// A reply as text (numbers written out, nil as the empty string).
pub fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_string(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => d.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::VerbatimString { text, .. } => text.clone(),
        _ => String::new(),
    }
}

/// A reply's bytes, as sent (a key name need not be UTF-8); `text` for anything else.
pub fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        other => text(other).into_bytes(),
    }
}

/// A name as `redis-cli` shows one: in double quotes, `\`, `"` and control characters
/// escaped, and every byte outside printable ASCII as `\xHH` (`"caf\xc3\xa9"`).
pub fn repr(b: &[u8]) -> String {
    let mut out = String::from("\"");
    for &c in b {
        match c {
            b'\\' => out.push_str("\\\\"),
            b'"' => out.push_str("\\\""),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            0x20..=0x7e => out.push(c as char),
            _ => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    out.push('"');
    out
}

/// An argument as a POSIX shell reads it back: as is when it is plain, else in single quotes;
/// bytes outside printable ASCII in bash's `$'\xHH'` (a `redis-cli` argument is taken as is).
pub fn shell_word(b: &[u8]) -> String {
    let plain = |c: &u8| c.is_ascii_alphanumeric() || b"_-.:/@%+=,{}".contains(c);
    if !b.is_empty() && b.iter().all(plain) {
        return String::from_utf8_lossy(b).into_owned();
    }
    if b.iter().all(|c| (0x20..=0x7e).contains(c)) {
        return format!("'{}'", String::from_utf8_lossy(b).replace('\'', "'\\''"));
    }
    let mut out = String::from("$'");
    for &c in b {
        match c {
            b'\\' => out.push_str("\\\\"),
            b'\'' => out.push_str("\\'"),
            0x20..=0x7e => out.push(c as char),
            _ => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    out.push('\'');
    out
}

/// A reply as an integer (0 when it is not one).
pub fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => text(other).trim().parse().unwrap_or(0),
    }
}

/// A map reply (a RESP3 map, or RESP2's flat field/value list) as ordered pairs.
pub fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        Value::Array(items) => items
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (text(&c[0]), c[1].clone()))
            .collect(),
        _ => Vec::new(),
    }
}

/// The value of `field` in a map reply (nil when it is missing).
pub fn get(map: &[(String, Value)], field: &str) -> Value {
    map.iter()
        .find(|(k, _)| k == field)
        .map_or(Value::Nil, |(_, v)| v.clone())
}

/// An array reply's items (none for anything else).
pub fn items(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) | Value::Set(a) => a.clone(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_or_say_what_is_wrong() {
        assert_eq!(split_addr("10.0.0.1:6379"), Ok(("10.0.0.1".into(), 6379)));
        assert_eq!(split_addr("[::1]:7000"), Ok(("::1".into(), 7000)));
        assert!(split_addr("10.0.0.1").unwrap_err().contains("HOST:PORT"));
        assert!(split_addr("h:99999").unwrap_err().contains("bad port"));
        assert!(split_addr(":6379").unwrap_err().contains("no host"));
    }

    #[test]
    fn names_shown_as_redis_cli_and_a_shell_read_them() {
        assert_eq!(repr(b"key:1"), "\"key:1\"");
        assert_eq!(repr(b"a\"b\\\n\xff\x00"), "\"a\\\"b\\\\\\n\\xff\\x00\"");
        assert_eq!(shell_word(b"key:1"), "key:1");
        assert_eq!(shell_word(b"a b'c"), "'a b'\\''c'");
        assert_eq!(shell_word(b"st\xffray'"), "$'st\\xffray\\''");
        assert_eq!(shell_word(b""), "''");
    }

    #[test]
    fn map_replies_of_resp2_and_resp3_read_alike() {
        let flat = Value::Array(vec![
            Value::BulkString(b"phase".to_vec()),
            Value::BulkString(b"copy".to_vec()),
            Value::BulkString(b"term".to_vec()),
            Value::Int(3),
        ]);
        let m = pairs(&flat);
        assert_eq!(text(&get(&m, "phase")), "copy");
        assert_eq!(int(&get(&m, "term")), 3);
        assert_eq!(get(&m, "missing"), Value::Nil);
        let map = Value::Map(vec![(Value::SimpleString("term".into()), Value::Int(4))]);
        assert_eq!(int(&get(&pairs(&map), "term")), 4);
    }
}
