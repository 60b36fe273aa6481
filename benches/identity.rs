//! What identifying a caller costs, one piece at a time (no network): an API key (digest and
//! lookup), a bearer token remembered from an earlier request (digest and cache hit), and a
//! token verified afresh per algorithm (RS256 with a 2048-bit key, ES256, EdDSA, HS256), all
//! through `chain::jwt::issuer::authenticate` as the request path calls it.
//! Run with `cargo bench --bench identity`; results in BENCHMARKS.md.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use prometheus::{IntCounter, IntGauge};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use turnstile::chain::auth::{Client, KeyDigest, KeyRing, Plan};
use turnstile::chain::jwt::cache::TokenCache;
use turnstile::chain::jwt::claims::ClaimPath;
use turnstile::chain::jwt::issuer::{authenticate, Issuer, TokenCheck};
use turnstile::chain::jwt::keys::KeySet;
use turnstile::chain::jwt::source::{KeySource, SourceMetrics};
use turnstile::chain::jwt::verify::IssuerRules;
use turnstile::chain::partition::KeyHasher;

fn openssl_key(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .arg("genpkey")
        .args(args)
        .output()
        .expect("openssl");
    assert!(out.status.success());
    out.stdout
}

fn public_pem(private: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(["pkey", "-pubout"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    child.stdin.take().unwrap().write_all(private).unwrap();
    child.wait_with_output().unwrap().stdout
}

fn metrics() -> SourceMetrics {
    SourceMetrics {
        fetched: IntCounter::new("f", "f").unwrap(),
        failed: IntCounter::new("e", "e").unwrap(),
        keys: IntGauge::new("k", "k").unwrap(),
        loaded_at: IntGauge::new("l", "l").unwrap(),
    }
}

fn issuer(alg: Algorithm, keys: KeySet) -> Arc<Issuer> {
    let plan = Arc::new(Plan::new("free", vec![]));
    Arc::new(Issuer {
        rules: IssuerRules {
            name: "idp".into(),
            issuer: "https://idp.bench/".into(),
            audiences: vec!["api".into()],
            algorithms: vec![alg],
            leeway: 30,
            required: vec![],
            client_id_claim: ClaimPath::parse("sub").unwrap(),
            plan_claim: None,
            plans: BTreeMap::new(),
            default_plan: plan,
            groups_claim: None,
        },
        source: Arc::new(KeySource::fixed(keys, metrics())),
    })
}

fn token(alg: Algorithm, key: &EncodingKey) -> String {
    let now = jsonwebtoken::get_current_timestamp();
    let claims = serde_json::json!({
        "iss": "https://idp.bench/", "aud": "api", "sub": "user-42",
        "exp": now + 3600, "iat": now, "scope": "orders:read orders:write",
    });
    jsonwebtoken::encode(&Header::new(alg), &claims, key).unwrap()
}

fn identity(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let hasher = KeyHasher::new(b"bench secret");
    let no_claims: Vec<ClaimPath> = Vec::new();

    let plan = Arc::new(Plan::new("free", vec![]));
    let ring = KeyRing::new([(
        KeyDigest::of(b"bench-api-key-0123456789"),
        Arc::new(Client {
            id: "bench".into(),
            plan,
            groups: Vec::new(),
        }),
    )]);
    c.bench_function("auth/api key: digest + lookup", |b| {
        b.iter(|| {
            ring.lookup(black_box(b"bench-api-key-0123456789"))
                .is_some()
        })
    });

    let rsa = openssl_key(&["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]);
    let ec = openssl_key(&["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]);
    let ed = openssl_key(&["-algorithm", "ed25519"]);
    let secret = b"bench-hmac-secret-of-thirty-two-bytes!!";
    let cases = [
        (
            "RS256 (2048)",
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(&rsa).unwrap(),
            KeySet::parse(&public_pem(&rsa)).unwrap(),
        ),
        (
            "ES256",
            Algorithm::ES256,
            EncodingKey::from_ec_pem(&ec).unwrap(),
            KeySet::parse(&public_pem(&ec)).unwrap(),
        ),
        (
            "EdDSA",
            Algorithm::EdDSA,
            EncodingKey::from_ed_pem(&ed).unwrap(),
            KeySet::parse(&public_pem(&ed)).unwrap(),
        ),
        (
            "HS256",
            Algorithm::HS256,
            EncodingKey::from_secret(secret).unwrap(),
            KeySet::secret(secret).unwrap(),
        ),
    ];
    c.bench_function("auth/block_on alone (subtract)", |b| {
        b.iter(|| rt.block_on(async { black_box(1) }))
    });
    for (name, alg, key, keys) in cases {
        let issuers = [issuer(alg, keys)];
        let token = token(alg, &key);
        let cache = TokenCache::new(1000);
        let cached = TokenCheck {
            issuers: &issuers,
            cache: &cache,
            hasher: &hasher,
            used_claims: &no_claims,
            may_verify: None,
        };
        let now = jsonwebtoken::get_current_timestamp();
        rt.block_on(authenticate(&cached, &token, now)).unwrap();
        c.bench_function(&format!("auth/jwt {name}, cached: digest + hit"), |b| {
            b.iter(|| {
                rt.block_on(authenticate(&cached, black_box(&token), now))
                    .unwrap()
            })
        });
        let none = TokenCache::new(0);
        let uncached = TokenCheck {
            cache: &none,
            ..cached
        };
        c.bench_function(&format!("auth/jwt {name}, verified"), |b| {
            b.iter(|| {
                rt.block_on(authenticate(&uncached, black_box(&token), now))
                    .unwrap()
            })
        });
    }
}

criterion_group!(benches, identity);
criterion_main!(benches);
