//! Micro-benchmarks of the pure core (no Redis): base62, each layout's text and bits, the
//! generator's reserve, the ID layouts' (tsid, uuidv7, ulid) issue and parse, and each ring's
//! lookup and bucket. Run with
//! `cargo bench --features system-alloc` (or `cargo bench --features system-alloc -- ring` for
//! some).
//!
//! The crate is built with its `system-alloc` feature here (see `required-features` in
//! Cargo.toml): outside Redis, Redis's allocator is not available.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shard::keys::{
    base62, codec, Encoding, Entropy, Format, Generator, KeyFields, KeyFormatter, Layout, Request,
    Shape,
};
use shard::ring::{Ring, RingSpec};

/// A time in 2024, in unix ms.
const NOW_MS: i64 = 1_717_000_000_000;

fn layouts() -> Vec<(&'static str, Layout)> {
    vec![
        ("snowflake", Layout::snowflake()),
        ("instagram", Layout::instagram()),
        ("sonyflake", Layout::sonyflake()),
        ("shardjs", Layout::shardjs(1)),
    ]
}

/// A typical key of `layout`: now, node 1 (0 for shardjs), seq 5, the default type.
fn sample_fields(layout: &Layout) -> KeyFields {
    let tick = layout
        .tick_of(NOW_MS)
        .expect("now is after every default epoch");
    let mut f = KeyFields {
        tick,
        node: 1,
        key_type: layout.default_type(),
        seq: 5,
    };
    f.node = if layout.is_text() {
        layout.node_of(&f)
    } else {
        1
    };
    f
}

fn bench_base62(c: &mut Criterion) {
    let mut g = c.benchmark_group("base62");
    let n: u64 = 1_795_305_412_170 << 22;
    g.bench_function("encode_fixed_11", |b| {
        let mut out = [0u8; base62::KEY_WIDTH];
        b.iter(|| base62::encode_fixed(black_box(n), &mut out))
    });
    g.bench_function("encode_unpadded", |b| {
        let mut out = [0u8; base62::MAX_WIDTH];
        b.iter(|| base62::encode_unpadded(black_box(n), &mut out))
    });
    let mut text = [0u8; base62::KEY_WIDTH];
    base62::encode_fixed(n, &mut text);
    g.bench_function("decode_11", |b| b.iter(|| base62::decode(black_box(&text))));
    g.finish();
}

fn bench_layouts(c: &mut Criterion) {
    let mut g = c.benchmark_group("layout");
    for (name, layout) in layouts() {
        let fields = sample_fields(&layout);
        let encodings: &[Encoding] = if layout.is_text() {
            &[Encoding::Decimal]
        } else {
            &[Encoding::Decimal, Encoding::Base62]
        };
        for &enc in encodings {
            let label = if layout.is_text() {
                name.to_string()
            } else {
                format!("{name}/{}", enc.name())
            };
            let text = codec::format(&layout, enc, &fields);
            g.bench_function(format!("format/{label}"), |b| {
                b.iter(|| codec::format(black_box(&layout), enc, black_box(&fields)))
            });
            // What GENKEY does: the text lent from a reused formatter, no copy.
            let mut formatter = KeyFormatter::new();
            g.bench_function(format!("formatter/{label}"), |b| {
                b.iter(|| {
                    black_box(
                        formatter
                            .format(black_box(&layout), enc, black_box(&fields))
                            .len(),
                    )
                })
            });
            g.bench_function(format!("parse/{label}"), |b| {
                b.iter(|| codec::parse(black_box(&layout), enc, black_box(text.as_bytes())))
            });
        }
        if !layout.is_text() {
            let number = layout.pack(&fields);
            g.bench_function(format!("pack/{name}"), |b| {
                b.iter(|| black_box(&layout).pack(black_box(&fields)))
            });
            g.bench_function(format!("unpack/{name}"), |b| {
                b.iter(|| black_box(&layout).unpack(black_box(number)))
            });
        }
    }
    g.finish();
}

fn bench_generator(c: &mut Criterion) {
    let layout = Layout::snowflake();
    let shape = Shape::of(&layout, 1);
    // The wall clock moves 1 ms per 1000 keys (a quarter of the layout's ceiling), so most
    // single-key calls continue a tick and the generator never refuses.
    let requests = |count: u64| {
        let mut k: i64 = 0;
        move || {
            k += 1;
            Request {
                now_ms: NOW_MS + k * count as i64 / 1000,
                count,
                node: 1,
                key_type: 0,
                max_drift_ms: 5000,
            }
        }
    };
    let mut g = c.benchmark_group("generator");
    for count in [1u64, 1000] {
        let mut gen = Generator::new();
        let mut next = requests(count);
        g.bench_function(format!("reserve/snowflake/count={count}"), |b| {
            b.iter(|| {
                let req = next();
                gen.reserve(&layout, &shape, black_box(&req))
                    .map(|batch| batch.len())
            })
        });
    }
    g.finish();

    // Reserve and format every key, as SHARD.GENKEY does before replying.
    let mut g = c.benchmark_group("generator_keys");
    for count in [1u64, 1000] {
        g.throughput(Throughput::Elements(count));
        let mut gen = Generator::new();
        let mut next = requests(count);
        g.bench_function(format!("reserve+format/snowflake/count={count}"), |b| {
            b.iter(|| {
                let req = next();
                let batch = gen
                    .reserve(&layout, &shape, black_box(&req))
                    .expect("never refused");
                batch
                    .map(|f| {
                        codec::format(&layout, Encoding::Decimal, &f)
                            .as_bytes()
                            .len()
                    })
                    .sum::<usize>()
            })
        });
    }
    g.finish();
}

/// The ID layouts of issue 34: what GENKEY COUNT 1000 does per key (reserve, then the text
/// with its counter and random bits), and DECODE's parse of each form.
fn bench_ids(c: &mut Criterion) {
    let mut g = c.benchmark_group("ids");
    for layout in [Layout::tsid(10), Layout::uuidv7(10), Layout::ulid(10)] {
        let name = layout.name();
        let shape = Shape::of(&layout, 1);
        let mut gen = Generator::new();
        let mut entropy = Entropy::from_seed([7; 32]);
        let mut formatter = KeyFormatter::new();
        let mut k: i64 = 0;
        g.throughput(Throughput::Elements(1000));
        g.bench_function(format!("reserve+issue/{name}/count=1000"), |b| {
            b.iter(|| {
                k += 1;
                let req = Request {
                    now_ms: NOW_MS + k,
                    count: 1000,
                    node: 1,
                    key_type: 0,
                    max_drift_ms: 5000,
                };
                let mut draw = entropy.ready().expect("seeded");
                let batch = gen.reserve(&layout, &shape, &req).expect("never refused");
                batch
                    .map(|f| formatter.issue(&layout, Format::Text, &f, &mut draw).len())
                    .sum::<usize>()
            })
        });
        g.throughput(Throughput::Elements(1));
        let fields = sample_fields(&layout);
        let mut draw_entropy = Entropy::from_seed([8; 32]);
        for format in Format::choices(&layout) {
            let mut draw = draw_entropy.ready().expect("seeded");
            let text = formatter
                .issue(&layout, *format, &fields, &mut draw)
                .to_vec();
            g.bench_function(format!("parse/{name}/{}", format.name()), |b| {
                b.iter(|| {
                    codec::parse_as(
                        black_box(&layout),
                        Encoding::Decimal,
                        Some(*format),
                        black_box(&text),
                    )
                })
            });
        }
    }
    g.finish();
}

/// The spec of a ring of `n` nodes of weight 1, as `SHARD.RING SET` parses it.
fn spec(algo: &str, n: usize) -> RingSpec {
    let fields: Vec<Vec<u8>> = (0..n)
        .flat_map(|i| {
            [
                format!("node{i}").into_bytes(),
                format!("10.0.{}.{}:6379", i / 250, i % 250 + 1).into_bytes(),
                b"1".to_vec(),
            ]
        })
        .collect();
    let refs: Vec<&[u8]> = fields.iter().map(Vec::as_slice).collect();
    RingSpec::from_args(algo.as_bytes(), None, &refs).expect("a valid ring")
}

fn bench_rings(c: &mut Criterion) {
    let keys: Vec<Vec<u8>> = (0..1024)
        .map(|i| format!("user:{i}").into_bytes())
        .collect();
    let mut g = c.benchmark_group("ring");
    for algo in ["ketama", "jedis", "jedis-murmur", "redis-shard", "slots"] {
        for n in [10, 1000] {
            let r = Ring::build(&spec(algo, n)).expect("the ring builds");
            let mut i = 0usize;
            g.bench_function(format!("locate/{algo}/{n}"), |b| {
                b.iter(|| {
                    i = (i + 1) & 1023;
                    r.locate(black_box(&keys[i])).node
                })
            });
            g.bench_function(format!("bucket/{algo}/{n}"), |b| {
                b.iter(|| {
                    i = (i + 1) & 1023;
                    r.bucket(black_box(&keys[i]))
                })
            });
        }
    }
    g.finish();

    let mut g = c.benchmark_group("ring_build");
    g.sample_size(10);
    for n in [100, 1000, 3844] {
        let s = spec("ketama", n);
        g.bench_function(format!("ketama/{n}"), |b| {
            b.iter(|| Ring::build(black_box(&s)).map(|r| r.point_count()))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_base62,
    bench_layouts,
    bench_generator,
    bench_ids,
    bench_rings
);
criterion_main!(benches);
