//! The RDB aux format (`Persisted::decode`), the ring canonical text (`parse_canonical`) and the
//! fleet coordinator's plan (`FleetPlan::decode`) on arbitrary bytes. Checks: no panic; whatever decodes encodes to bytes that decode to the
//! same value, and the encoding of a decoded value is stable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shard::persist::{parse_canonical, Persisted};
use shard::reshard::fleet::plan::FleetPlan;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Persisted::decode(data) {
        let bytes = p.encode();
        let again = Persisted::decode(&bytes).expect("re-encoded data must decode");
        assert_eq!(again, p);
        assert_eq!(again.encode(), bytes);
    }
    if let Ok(plan) = FleetPlan::decode(data) {
        let bytes = plan.encode();
        assert_eq!(FleetPlan::decode(&bytes).as_ref(), Ok(&plan));
    }
    if let Ok(spec) = parse_canonical(data) {
        let text = spec.canonical();
        assert_eq!(parse_canonical(text.as_bytes()).as_ref(), Ok(&spec));
    }
    // The same bytes behind a valid header, so the ring parts get reached.
    let mut framed = Vec::with_capacity(data.len() + 40);
    framed.extend_from_slice(b"SHRD\x01");
    framed.extend_from_slice(&7i64.to_le_bytes());
    framed.extend_from_slice(&3u64.to_le_bytes());
    let split = data.iter().position(|&b| b == 0xff).unwrap_or(data.len());
    let (a, b) = (&data[..split], data.get(split + 1..).unwrap_or(&[]));
    for part in [a, b] {
        framed.extend_from_slice(&(part.len() as u64).to_le_bytes());
        framed.extend_from_slice(part);
    }
    if let Ok(p) = Persisted::decode(&framed) {
        assert_eq!(Persisted::decode(&p.encode()).as_ref(), Ok(&p));
    }
});
