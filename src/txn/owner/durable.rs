//! The owner's durable records as bytes (its section of `txn::durable`, in the RDB aux
//! field): the prepared parts (txid, database, lock length, commands), the done list, and each
//! coordinator's mark of the txids dropped from it (a section after the done list, absent in
//! the bytes of a build before it: no marks), then the prepared parts' coordinators'
//! addresses (`PREPARE ... FROM`: a section after the marks, written only when some part has
//! one, so that an older build still reads the rest; absent: no addresses). A lock
//! loaded starts again from the load (`since_ms` is this process's clock). Decoding checks
//! every length and never panics.

use crate::persist::Reader;
use crate::txn::owner::table::Prepared;

/// The owner's records.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub prepared: Vec<(String, Prepared)>,
    pub done: Vec<String>,
    /// Each coordinator's mark: the highest number of its txids dropped from the done list.
    pub forgotten: Vec<(String, u64)>,
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

impl Records {
    pub fn is_empty(&self) -> bool {
        self.prepared.is_empty() && self.done.is_empty() && self.forgotten.is_empty()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.prepared.len() as u64).to_le_bytes());
        for (txid, p) in &self.prepared {
            put(&mut out, txid.as_bytes());
            out.extend_from_slice(&i64::from(p.db).to_le_bytes());
            out.extend_from_slice(&p.lock_ms.to_le_bytes());
            out.extend_from_slice(&(p.keys.len() as u64).to_le_bytes());
            p.keys.iter().for_each(|k| put(&mut out, k));
            out.extend_from_slice(&(p.cmds.len() as u64).to_le_bytes());
            for cmd in &p.cmds {
                out.extend_from_slice(&(cmd.len() as u64).to_le_bytes());
                cmd.iter().for_each(|a| put(&mut out, a));
            }
        }
        out.extend_from_slice(&(self.done.len() as u64).to_le_bytes());
        self.done.iter().for_each(|t| put(&mut out, t.as_bytes()));
        out.extend_from_slice(&(self.forgotten.len() as u64).to_le_bytes());
        for (coordinator, mark) in &self.forgotten {
            put(&mut out, coordinator.as_bytes());
            out.extend_from_slice(&mark.to_le_bytes());
        }
        let addresses: Vec<(usize, &str)> = (self.prepared.iter().enumerate())
            .filter_map(|(i, (_, p))| Some((i, p.coordinator_at.as_deref()?)))
            .collect();
        if !addresses.is_empty() {
            out.extend_from_slice(&(addresses.len() as u64).to_le_bytes());
            for (i, address) in addresses {
                out.extend_from_slice(&(i as u64).to_le_bytes());
                put(&mut out, address.as_bytes());
            }
        }
        out
    }

    /// Reads the records back; `now` is when the loaded locks start again.
    pub fn decode(bytes: &[u8], now: u64) -> Result<Records, String> {
        let mut r = Reader::new(bytes);
        let mut records = Records::default();
        let n = count(&mut r, "prepared parts")?;
        for _ in 0..n {
            let txid = r.string("prepared part's txid")?;
            let db = i32::try_from(r.i64("prepared part's database")?)
                .map_err(|_| "a prepared part's database is out of range".to_string())?;
            let lock_ms = r.u64("prepared part's lock length")?;
            let keys = list(&mut r, "prepared part's keys")?;
            let ncmds = count(&mut r, "prepared part's commands")?;
            let mut cmds = Vec::new();
            for _ in 0..ncmds {
                cmds.push(list(&mut r, "prepared command")?);
            }
            records.prepared.push((
                txid,
                Prepared {
                    db,
                    cmds,
                    keys,
                    lock_ms,
                    since_ms: now,
                    coordinator_at: None,
                },
            ));
        }
        let done = count(&mut r, "done list")?;
        for _ in 0..done {
            records.done.push(r.string("done txid")?);
        }
        if r.pos != bytes.len() {
            let marks = count(&mut r, "coordinators' marks")?;
            for _ in 0..marks {
                let coordinator = r.string("coordinator's name")?;
                records
                    .forgotten
                    .push((coordinator, r.u64("coordinator's mark")?));
            }
        }
        if r.pos != bytes.len() {
            let addresses = count(&mut r, "coordinators' addresses")?;
            for _ in 0..addresses {
                let i = r.u64("prepared part's index")?;
                let address = r.string("coordinator's address")?;
                let part = usize::try_from(i)
                    .ok()
                    .and_then(|i| records.prepared.get_mut(i))
                    .ok_or_else(|| {
                        format!("a coordinator's address for prepared part {i}, which is not there")
                    })?;
                part.1.coordinator_at = Some(address);
            }
        }
        if r.pos != bytes.len() {
            return Err(format!(
                "{} unexpected bytes after the transactions' records",
                bytes.len() - r.pos
            ));
        }
        Ok(records)
    }
}

/// A count that cannot be more than the bytes left (each item takes 8 bytes at least).
fn count(r: &mut Reader, what: &str) -> Result<usize, String> {
    let n = r.u64(what)?;
    let left = (r.bytes.len() - r.pos) as u64;
    if n > left {
        return Err(format!(
            "the count of {what} is {n}, more than the data holds"
        ));
    }
    Ok(n as usize)
}

fn list(r: &mut Reader, what: &str) -> Result<Vec<Vec<u8>>, String> {
    let n = count(r, what)?;
    (0..n).map(|_| r.sized(what).map(<[u8]>::to_vec)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_every_truncation_is_an_error() {
        let records = Records {
            prepared: vec![(
                "n0/1f".into(),
                Prepared {
                    db: 2,
                    cmds: vec![vec![b"SET".to_vec(), b"a".to_vec(), b"".to_vec()]],
                    keys: vec![b"a".to_vec()],
                    lock_ms: 5000,
                    since_ms: 7,
                    coordinator_at: None,
                },
            )],
            done: vec!["n1/2".into(), "n1/3".into()],
            forgotten: vec![("n1".into(), 1)],
        };
        let bytes = records.encode();
        assert_eq!(Records::decode(&bytes, 7).unwrap(), records);
        // The bytes of a build without marks: the same records, no marks.
        let without = bytes.len() - (8 + 8 + 2 + 8);
        let old = Records::decode(&bytes[..without], 7).unwrap();
        assert!(old.forgotten.is_empty() && old.done == records.done);
        for cut in (0..bytes.len()).filter(|c| *c != without) {
            assert!(Records::decode(&bytes[..cut], 7).is_err(), "{cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(Records::decode(&long, 7).is_err());
        assert!(Records::decode(&u64::MAX.to_le_bytes(), 0).is_err());
    }

    #[test]
    fn the_coordinators_addresses_follow_and_the_bytes_before_them_still_load() {
        let part = |at: Option<&str>| Prepared {
            db: 0,
            cmds: vec![vec![b"SET".to_vec(), b"a".to_vec(), b"1".to_vec()]],
            keys: vec![b"a".to_vec()],
            lock_ms: 5000,
            since_ms: 7,
            coordinator_at: at.map(str::to_string),
        };
        let mut records = Records {
            prepared: vec![("n0/1".into(), part(None)), ("n0/2".into(), part(None))],
            done: vec!["n1/2".into()],
            forgotten: vec![],
        };
        // No address: the bytes an older build writes and reads.
        let without = records.encode();
        records.prepared[1].1.coordinator_at = Some("127.0.0.1:7001".into());
        let bytes = records.encode();
        assert_eq!(&bytes[..without.len()], &without[..]);
        assert_eq!(Records::decode(&bytes, 7).unwrap(), records);
        let old = Records::decode(&without, 7).unwrap();
        assert!(old.prepared.iter().all(|(_, p)| p.coordinator_at.is_none()));
        let mut long = bytes.clone();
        long.push(0);
        assert!(Records::decode(&long, 7)
            .unwrap_err()
            .contains("unexpected"));
        for cut in without.len() + 1..bytes.len() {
            assert!(Records::decode(&bytes[..cut], 7).is_err(), "{cut}");
        }
        // An address for a part that is not there.
        let mut bad = without.clone();
        bad.extend_from_slice(&1u64.to_le_bytes());
        bad.extend_from_slice(&9u64.to_le_bytes());
        bad.extend_from_slice(&1u64.to_le_bytes());
        bad.push(b'x');
        assert!(Records::decode(&bad, 7).unwrap_err().contains("not there"));
    }
}
