//! The in-process limiting hot path, one piece at a time, with times passed in (no clock
//! reads inside the measured code except where stated):
//! - the per-IP table: one address, many addresses, and two threads hammering it;
//! - the pure algorithms;
//! - client-IP extraction from X-Forwarded-For and API-key lookup.
//!
//! Run with `cargo bench --bench limits`; results in BENCHMARKS.md.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use turnstile::chain::auth::{Client, KeyDigest, KeyRing, Plan};
use turnstile::chain::identity::{client_ip, group_key, Grouping, TrustedProxies};
use turnstile::limit::algorithm::State;
use turnstile::limit::ip::IpLimiter;
use turnstile::limit::{Algorithm, Policy};

const T0: u64 = 1 << 40;

fn ip_policy() -> Policy {
    // High enough that nothing is rejected: the admitted path is the common one.
    Policy::new(
        "ip",
        Algorithm::TokenBucket,
        1_000_000_000,
        1000,
        1_000_000_000,
    )
}

fn ip_table(c: &mut Criterion) {
    let limiter = IpLimiter::new(ip_policy(), 100_000);
    c.bench_function("ip_limiter/check one address", |b| {
        let mut now = T0;
        b.iter(|| {
            now += 1;
            limiter.check(black_box(42), now)
        })
    });
    let limiter = IpLimiter::new(ip_policy(), 100_000);
    let keys: Vec<u128> = (0..50_000u128)
        .map(|i| (0xffff_u128 << 32) | (0x0a00_0000 + i))
        .collect();
    c.bench_function("ip_limiter/check 50k addresses round robin", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % keys.len();
            limiter.check(black_box(keys[i]), T0 + i as u64)
        })
    });
    // Two threads, each doing `iters` checks on its own stream of addresses; reported time is
    // wall time per check per thread (contention shows up as a larger number).
    let limiter = Arc::new(IpLimiter::new(ip_policy(), 100_000));
    c.bench_function("ip_limiter/check 2 threads contended", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let handles: Vec<_> = (0..2u128)
                .map(|t| {
                    let limiter = Arc::clone(&limiter);
                    std::thread::spawn(move || {
                        for i in 0..iters {
                            limiter.check(black_box((t << 64) | u128::from(i % 1024)), T0 + i);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            start.elapsed()
        })
    });
}

fn algorithms(c: &mut Criterion) {
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        let p = Policy::new("p", alg, 1_000_000, 60_000, 1_000_000);
        let mut state = State::new(&p);
        c.bench_function(&format!("algorithm/{alg}"), |b| {
            let mut now = T0;
            b.iter(|| {
                now += 1;
                let (d, next) = state.decide(&p, black_box(now), 1);
                state = next;
                d
            })
        });
    }
}

fn identity(c: &mut Criterion) {
    let trusted = TrustedProxies::new(vec![
        "10.0.0.0/8".parse().unwrap(),
        "192.168.0.0/16".parse().unwrap(),
    ]);
    let peer: IpAddr = "10.0.0.1".parse().unwrap();
    let xff: &[u8] = b"198.51.100.7, 203.0.113.9, 10.1.2.3";
    c.bench_function("identity/client_ip trusted peer, 3 hops", |b| {
        b.iter(|| client_ip(black_box(peer), std::iter::once(black_box(xff)), &trusted))
    });
    let untrusted: IpAddr = "203.0.113.50".parse().unwrap();
    c.bench_function("identity/client_ip untrusted peer", |b| {
        b.iter(|| {
            client_ip(
                black_box(untrusted),
                std::iter::once(black_box(xff)),
                &trusted,
            )
        })
    });
    let v6: IpAddr = "2001:db8:1:2:3:4:5:6".parse().unwrap();
    c.bench_function("identity/group_key ipv6 /64", |b| {
        b.iter(|| group_key(black_box(v6), Grouping::default()))
    });

    let plan = Arc::new(Plan::new("p", vec![]));
    let ring = KeyRing::new((0..10_000).map(|i| {
        let key = format!("client-key-{i:012}");
        (
            KeyDigest::of(key.as_bytes()),
            Arc::new(Client {
                id: format!("c{i}").into(),
                plan: Arc::clone(&plan),
                groups: Vec::new(),
            }),
        )
    }));
    c.bench_function("auth/lookup among 10k keys", |b| {
        b.iter(|| ring.lookup(black_box(b"client-key-000000004242")))
    });
}

/// Not a timing: prints the memory the per-IP table takes per tracked address when full.
fn ip_table_memory(_: &mut Criterion) {
    for max in [10_000usize, 100_000, 1_000_000] {
        let limiter = IpLimiter::new(ip_policy(), max);
        for i in 0..(max as u128 * 2) {
            limiter.check(i, T0);
        }
        println!(
            "ip_limiter/memory: max_tracked_ips = {max}: {} tracked, {} bytes allocated, {:.1} bytes per address",
            limiter.tracked(),
            limiter.allocated_bytes(),
            limiter.allocated_bytes() as f64 / limiter.tracked() as f64
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3));
    targets = ip_table_memory, ip_table, algorithms, identity
}
criterion_main!(benches);
