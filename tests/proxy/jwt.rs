//! Bearer tokens (JWT) through the real gateway, against a real JWKS endpoint served by the
//! harness (HTTP, and HTTPS with a test CA), with tokens signed by real RSA, EC, Ed25519 keys
//! and HMAC secrets: who the caller is, plans from claims, keyed limits on claims, exact
//! counts per subject across two gateways on one Redis; every way a token can be bad → 401
//! and no limiter state; key rotation, an endpoint that fails, a flood of unknown key ids;
//! what the upstream receives.

use crate::common;

use common::jwks::{now, JwksServer, Signer};
use common::redis::RedisServer;
use common::tls::Ca;
use common::{http, wait_until, Gateway, Upstream};
use jsonwebtoken::{Algorithm, Header};
use serde_json::{json, Value};

const ISS: &str = "https://idp.test/";
const AUD: &str = "orders-api";

fn claims(sub: &str) -> Value {
    json!({"iss": ISS, "aud": AUD, "sub": sub, "exp": now() + 600, "iat": now()})
}

fn with(mut c: Value, field: &str, value: Value) -> Value {
    c[field] = value;
    c
}

/// A gateway config: one issuer (`keys_line` says where its keys are), plans, and an
/// `/echo` route with `auth` and `route_extra`.
fn config(up: &Upstream, keys_line: &str, issuer_extra: &str, route_extra: &str) -> String {
    format!(
        r#"
[upstreams.api]
servers = ["{addr}"]

[plans.free]
limits = [{{ name = "per-hour", algorithm = "sliding_log", limit = 5, window = "1h" }}]

[plans.pro]
limits = [{{ name = "per-hour", algorithm = "sliding_log", limit = 8, window = "1h" }}]

[issuers.idp]
issuer = "{ISS}"
audiences = ["{AUD}", "other-api"]
{keys_line}
plan = "free"
{issuer_extra}

[[routes]]
name = "api"
path_prefix = "/echo"
upstream = "api"
auth = "jwt"
{route_extra}
"#,
        addr = up.addr()
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn call(gw: &Gateway, token: &str) -> http::Response {
    gw.get_with("/echo/x", &[("Authorization", &bearer(token))])
}

fn header_of(resp: &http::Response, name: &str) -> Option<String> {
    resp.json()["headers"].as_array().and_then(|hs| {
        hs.iter()
            .find(|h| h[0].as_str() == Some(name))
            .map(|h| h[1].as_str().unwrap().to_owned())
    })
}

#[test]
fn tokens_from_a_jwks_endpoint_are_counted_per_subject_exactly_across_two_gateways() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let key = Signer::rsa("rsa-1");
    let idp = JwksServer::start(&[&key]);
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\n",
        redis.url()
    );
    let text = format!(
        "{}{store}",
        config(&up, &format!("jwks_url = \"{}\"", idp.url()), "", "")
    );
    let secret = "key_hash_secret = \"same-secret-on-every-instance\"";
    let a = Gateway::start_with(secret, &text);
    let b = Gateway::start_with(secret, &text);
    wait_until("both gateways ready (keys fetched)", || {
        a.admin("/readyz").status == 200 && b.admin("/readyz").status == 200
    });

    // The plan allows 5 per hour and subject: 12 calls alternating between the gateways,
    // each with a freshly signed token of the same subject, admit exactly 5.
    let statuses: Vec<u16> = (0..12)
        .map(|i| {
            let token = key.sign(&with(claims("alice"), "jti", json!(i)));
            call(if i % 2 == 0 { &a } else { &b }, &token).status
        })
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        7,
        "{statuses:?}"
    );
    // Another subject has its own count.
    assert_eq!(call(&b, &key.sign(&claims("bob"))).status, 200);

    // What the upstream got: the subject as X-Client-Id, the token itself (forward_token
    // defaults to true).
    let token = key.sign(&claims("carol"));
    let resp = call(&a, &token);
    assert_eq!(header_of(&resp, "x-client-id").as_deref(), Some("carol"));
    assert_eq!(header_of(&resp, "authorization"), Some(bearer(&token)));
    // Store keys name a namespaced, hashed client: no subject in Redis.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(keys.iter().any(|k| k.contains("{jwt:idp:")), "{keys:?}");
    assert!(!keys.iter().any(|k| k.contains("alice")), "{keys:?}");
    // The second call of a token is remembered, not verified again.
    call(&a, &token);
    assert!(a.metric("turnstile_token_checks_total", &[("result", "cached")]) >= 1.0);
    assert!(a.metric("turnstile_jwks_keys", &[("issuer", "idp")]) == 1.0);
}

#[test]
fn the_plan_comes_from_a_claim_and_a_keyed_limit_counts_per_tenant_claim() {
    let up = Upstream::start("api");
    let key = Signer::ec("ec-1");
    let idp = JwksServer::start(&[&key]);
    let route = r#"
forward_claims = { "X-Tenant-Id" = "org.id", "X-Tier" = "tier" }
limits = [{ name = "per-tenant", algorithm = "sliding_log", limit = 6, window = "1h", key = ["jwt:org.id"] }]
"#;
    let gw = Gateway::start(&config(
        &up,
        &format!("jwks_url = \"{}\"\nalgorithms = [\"ES256\"]", idp.url()),
        "plan_claim = \"tier\"\nplans = { gold = \"pro\" }",
        route,
    ));
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let token = |sub: &str, org: &str, tier: &str| {
        let c = with(claims(sub), "org", json!({"id": org}));
        key.sign(&with(c, "tier", json!(tier)))
    };
    // A gold user gets the pro plan's 8; a free user the free plan's 5 (the tenant limit of
    // 6 is per organisation, and each user here is alone in theirs).
    let count = |sub: &str, org: &str, tier: &str, n: usize| {
        (0..n)
            .filter(|_| call(&gw, &token(sub, org, tier)).status == 200)
            .count()
    };
    assert_eq!(
        count("gold-user", "solo-a", "gold", 10),
        6,
        "tenant limit first"
    );
    assert_eq!(count("free-user", "solo-b", "basic", 10), 5, "free plan");
    // Three users of one tenant share its 6 ("ACME" and " acme" fold to one tenant).
    let shared = ["u1", "u2", "u3"]
        .iter()
        .zip(["acme", "ACME", " acme"])
        .map(|(u, org)| count(u, org, "gold", 3))
        .sum::<usize>();
    assert_eq!(shared, 6);
    // A token without the claim: the limit's missing part → 400 (reject by default).
    let resp = call(&gw, &key.sign(&claims("no-org")));
    assert_eq!(resp.status, 400, "{}", resp.text());
    // Claims as headers; a header the client sent under that name never passes.
    let resp = gw.get_with(
        "/echo/x",
        &[
            ("Authorization", &bearer(&token("h", "tenant-h", "gold"))),
            ("X-Tenant-Id", "spoofed"),
        ],
    );
    assert_eq!(resp.status, 200);
    assert_eq!(header_of(&resp, "x-tenant-id").as_deref(), Some("tenant-h"));
    assert_eq!(header_of(&resp, "x-tier").as_deref(), Some("gold"));
}

#[test]
fn bad_tokens_get_401_without_echo_and_write_nothing_to_the_store() {
    let up = Upstream::start("api");
    let redis = RedisServer::start();
    let rsa = Signer::rsa("rsa-1");
    let stranger = Signer::rsa("rsa-1");
    let idp = JwksServer::start(&[&rsa]);
    let text = format!(
        "{}[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\n",
        config(
            &up,
            &format!("jwks_url = \"{}\"\njwks_min_refresh = \"1h\"", idp.url()),
            "",
            ""
        ),
        redis.url()
    );
    let gw = Gateway::start_with(
        "key_hash_secret = \"same-secret-on-every-instance\"\nmax_header_bytes = 262144",
        &text,
    );
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let n = now();
    let good = rsa.sign(&claims("mallory"));
    let (head, rest) = good.split_once('.').unwrap();
    let payload = rest.split('.').next().unwrap();
    // HS256 "signed" with the RSA public key as the secret: algorithm confusion.
    let public = rsa.public_pem();
    let confused =
        Signer::hmac(&public).sign_with(Header::new(Algorithm::HS256), &claims("mallory"));
    let mut unknown_kid = Header::new(Algorithm::RS256);
    unknown_kid.kid = Some("nobody-knows".into());
    let cases: Vec<(&str, String)> = vec![
        (
            "expired",
            rsa.sign(&with(claims("mallory"), "exp", json!(n - 3600))),
        ),
        (
            "not yet valid",
            rsa.sign(&with(claims("mallory"), "nbf", json!(n + 3600))),
        ),
        (
            "issued in the future",
            rsa.sign(&with(claims("mallory"), "iat", json!(n + 3600))),
        ),
        (
            "wrong audience",
            rsa.sign(&with(claims("mallory"), "aud", json!("billing"))),
        ),
        (
            "wrong issuer",
            rsa.sign(&with(claims("mallory"), "iss", json!("https://evil.test/"))),
        ),
        ("no exp", {
            let mut c = claims("mallory");
            c.as_object_mut().unwrap().remove("exp");
            rsa.sign(&c)
        }),
        // {"alg":"none","typ":"JWT"} and no signature.
        (
            "alg none",
            format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}."),
        ),
        ("algorithm confusion", confused),
        (
            "unknown kid",
            rsa.sign_with(unknown_kid, &claims("mallory")),
        ),
        ("another key, same kid", stranger.sign(&claims("mallory"))),
        ("truncated", good[..good.len() - 10].to_owned()),
        ("header only", format!("{head}.")),
        (
            "100 KB",
            format!("{head}.{}.{}", "A".repeat(100 * 1024), "B".repeat(64)),
        ),
        ("not a token", "not-a-token".into()),
    ];
    for (what, token) in &cases {
        let resp = call(&gw, token);
        assert_eq!(resp.status, 401, "{what}: {}", resp.text());
        let challenge = resp
            .header("www-authenticate")
            .unwrap_or_default()
            .to_owned();
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
        let body = resp.text();
        assert!(body.contains("unauthorized"), "{what}: {body}");
        if token.len() > 40 {
            assert!(!body.contains(&token[10..40]), "{what} echoed: {body}");
            assert!(
                !challenge.contains(&token[10..40]),
                "{what} echoed: {challenge}"
            );
        }
    }
    // No token at all: 401 with a plain challenge.
    let resp = gw.get("/echo/x");
    assert_eq!(resp.status, 401);
    // Nothing of the limiter was touched: no key in Redis but the instances' heartbeat (the
    // set, and what each says of itself).
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    let heartbeat = ["turnstile:instances", "{turnstile:instances}:info"];
    assert!(
        keys.iter().all(|k| heartbeat.contains(&k.as_str())),
        "{keys:?}"
    );
    // And no token reached the log.
    let log = gw.proc.log_text();
    for (what, token) in &cases {
        if token.len() > 30 {
            assert!(!log.contains(&token[..30]), "{what} in the log");
        }
    }
    // The one good token still works.
    assert_eq!(call(&gw, &good).status, 200);
}

#[test]
fn keys_rotate_at_the_endpoint_without_a_restart_and_outlive_an_endpoint_that_fails() {
    let up = Upstream::start("api");
    let old = Signer::rsa("2026-old");
    let new = Signer::ed("2026-new");
    let idp = JwksServer::start(&[&old]);
    let gw = Gateway::start(&config(
        &up,
        &format!(
            "jwks_url = \"{}\"\njwks_min_refresh = \"1s\"\njwks_refresh = \"1h\"\nalgorithms = [\"RS256\", \"EdDSA\"]",
            idp.url()
        ),
        "",
        "",
    ));
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let old_token = old.sign(&claims("u"));
    assert_eq!(call(&gw, &old_token).status, 200);

    // The provider rotates: the new key only. A token with the new kid makes the gateway
    // fetch again (once min_refresh has passed since the last fetch).
    idp.set_keys(&[&new]);
    wait_until("the new key", || {
        call(&gw, &new.sign(&claims("u"))).status == 200
    });
    // The old key is gone: its token stops working, also the one remembered from before.
    assert_eq!(call(&gw, &old_token).status, 401);

    // The endpoint fails, then answers garbage: the keys in use stay, new tokens of the new
    // key keep working, and /readyz says what happened.
    idp.fail();
    let fetches = idp.fetches();
    wait_until("a failed fetch", || {
        call(
            &gw,
            &new.sign_with(
                {
                    let mut h = Header::new(Algorithm::EdDSA);
                    h.kid = Some("unknown-now".into());
                    h
                },
                &claims("u"),
            ),
        );
        idp.fetches() > fetches
    });
    for i in 0..3 {
        let token = new.sign(&with(claims("v"), "jti", json!(i)));
        assert_eq!(call(&gw, &token).status, 200);
    }
    let ready = gw.admin("/readyz");
    assert_eq!(ready.status, 200, "keys were had: still ready");
    let issuer = &ready.json()["issuers"]["idp"];
    assert_eq!(issuer["keys"], 1);
    assert!(
        issuer["last_fetch_error"]
            .as_str()
            .is_some_and(|e| e.contains("503")),
        "{issuer}"
    );
    assert!(
        gw.metric(
            "turnstile_jwks_fetches_total",
            &[("issuer", "idp"), ("result", "error")]
        ) >= 1.0
    );
    idp.garbage();
    let fetches = idp.fetches();
    wait_until("a fetch of garbage", || {
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some("unknown-again".into());
        call(&gw, &new.sign_with(h, &claims("u")));
        idp.fetches() > fetches
    });
    assert_eq!(call(&gw, &new.sign(&claims("w"))).status, 200);
}

#[test]
fn a_flood_of_unknown_key_ids_costs_at_most_one_fetch_per_min_refresh() {
    let up = Upstream::start("api");
    let key = Signer::rsa("k1");
    let idp = JwksServer::start(&[&key]);
    let gw = Gateway::start(&config(
        &up,
        &format!(
            "jwks_url = \"{}\"\njwks_min_refresh = \"1h\"\njwks_refresh = \"1h\"",
            idp.url()
        ),
        "",
        "",
    ));
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let before = idp.fetches();
    assert_eq!(before, 1, "the fetch at start");
    for i in 0..200 {
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some(format!("random-{i}"));
        assert_eq!(call(&gw, &key.sign_with(h, &claims("x"))).status, 401);
    }
    // The last fetch was the one at start, less than min_refresh (1h) ago: none at all.
    assert_eq!(idp.fetches(), before, "unknown kids made the gateway fetch");
    assert_eq!(call(&gw, &key.sign(&claims("x"))).status, 200);
}

#[test]
fn keys_over_https_fixed_keys_and_hmac_secrets_verify_their_own_algorithms() {
    let up = Upstream::start("api");
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let cert = ca.issue(dir.path(), "idp", "idp", &["127.0.0.1"]);
    let ed = Signer::ed("ed-1");
    let ec = Signer::ec("ec-1");
    let idp = JwksServer::start_tls(&[&ed, &ec], &cert.cert, &cert.key);
    let rsa = Signer::rsa("fixed");
    let pem_file = dir.path().join("rsa.pub.pem");
    std::fs::write(&pem_file, rsa.public_pem()).unwrap();
    let secret = "an-internal-hmac-secret-of-32-bytes!!";
    let text = format!(
        r#"
[upstreams.api]
servers = ["{addr}"]

[plans.free]
limits = [{{ name = "per-hour", algorithm = "sliding_log", limit = 100, window = "1h" }}]

[issuers.https]
issuer = "https://https.test/"
audiences = ["{AUD}"]
jwks_url = "{url}"
jwks_ca_file = "{ca}"
algorithms = ["EdDSA", "ES256"]
plan = "free"

[issuers.fixed]
issuer = "https://fixed.test/"
audiences = ["{AUD}"]
keys = {{ file = "{pem}" }}
algorithms = ["RS256", "PS256"]
plan = "free"

[issuers.internal]
issuer = "https://internal.test/"
audiences = ["{AUD}"]
secret = "{secret}"
plan = "free"

[[routes]]
name = "api"
path_prefix = "/echo"
upstream = "api"
auth = "jwt"
"#,
        addr = up.addr(),
        url = idp.url(),
        ca = ca_file.display(),
        pem = pem_file.display(),
    );
    let gw = Gateway::start(&text);
    wait_until("keys fetched over https", || {
        gw.admin("/readyz").status == 200
    });
    let of = |iss: &str, sub: &str| {
        let c = claims(sub);
        with(c, "iss", json!(iss))
    };
    // Three issuers on one route: the token's iss chooses whose keys check it.
    assert_eq!(
        call(&gw, &ed.sign(&of("https://https.test/", "a"))).status,
        200
    );
    assert_eq!(
        call(&gw, &ec.sign(&of("https://https.test/", "b"))).status,
        200
    );
    assert_eq!(
        call(&gw, &rsa.sign(&of("https://fixed.test/", "c"))).status,
        200
    );
    let mut ps = Header::new(Algorithm::PS256);
    ps.kid = None;
    assert_eq!(
        call(&gw, &rsa.sign_with(ps, &of("https://fixed.test/", "d"))).status,
        200
    );
    let hs = Signer::hmac(secret.as_bytes());
    assert_eq!(
        call(&gw, &hs.sign(&of("https://internal.test/", "e"))).status,
        200
    );
    // Each key verifies its own issuer's tokens only, and its own algorithms only.
    assert_eq!(
        call(&gw, &ed.sign(&of("https://fixed.test/", "f"))).status,
        401
    );
    let wrong = Signer::hmac(b"another-secret-that-is-also-32-bytes");
    assert_eq!(
        call(&gw, &wrong.sign(&of("https://internal.test/", "g"))).status,
        401
    );
    assert_eq!(
        call(&gw, &hs.sign(&of("https://unknown.test/", "h"))).status,
        401
    );
    // An HMAC token claiming the RSA issuer, signed with its public key: refused.
    let confused = Signer::hmac(&rsa.public_pem());
    assert_eq!(
        call(&gw, &confused.sign(&of("https://fixed.test/", "i"))).status,
        401
    );
}

#[test]
fn an_issuer_whose_keys_never_arrived_answers_503_and_the_gateway_is_not_ready() {
    let up = Upstream::start("api");
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let cert = ca.issue(dir.path(), "idp", "idp", &["127.0.0.1"]);
    let key = Signer::rsa("k");
    // Served over TLS with a certificate the gateway does not trust (no jwks_ca_file).
    let idp = JwksServer::start_tls(&[&key], &cert.cert, &cert.key);
    let gw = Gateway::start(&config(
        &up,
        &format!("jwks_url = \"{}\"\njwks_min_refresh = \"1s\"", idp.url()),
        "",
        "",
    ));
    wait_until("a failed fetch", || {
        gw.admin("/readyz").json()["issuers"]["idp"]["last_fetch_error"].is_string()
    });
    let ready = gw.admin("/readyz");
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["routes_without_issuer_keys"], json!(["api"]));
    let resp = call(&gw, &key.sign(&claims("u")));
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert!(resp.text().contains("identity-provider-unavailable"));
    assert_eq!(resp.header("retry-after"), Some("5"));
}

#[test]
fn an_api_key_or_a_token_on_one_route_but_never_both() {
    let up = Upstream::start("api");
    let key = Signer::rsa("k");
    let idp = JwksServer::start(&[&key]);
    let text = format!(
        "{}\n[[clients]]\nid = \"partner\"\nplan = \"pro\"\napi_keys = [\"partner-key-0123456789\"]\n",
        config(&up, &format!("jwks_url = \"{}\"", idp.url()), "", "")
    )
    .replace("auth = \"jwt\"", "auth = [\"api_key\", \"jwt\"]");
    let gw = Gateway::start(&text);
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let token = key.sign(&claims("user-1"));
    let by_key = gw.get_with("/echo/x", &[("X-Api-Key", "partner-key-0123456789")]);
    assert_eq!(by_key.status, 200);
    assert_eq!(
        header_of(&by_key, "x-client-id").as_deref(),
        Some("partner")
    );
    let by_bearer_key = gw.get_with(
        "/echo/x",
        &[("Authorization", "Bearer partner-key-0123456789")],
    );
    assert_eq!(by_bearer_key.status, 200);
    assert_eq!(
        header_of(&by_bearer_key, "authorization"),
        None,
        "an API key is not forwarded"
    );
    let by_token = call(&gw, &token);
    assert_eq!(by_token.status, 200);
    assert_eq!(
        header_of(&by_token, "x-client-id").as_deref(),
        Some("user-1")
    );
    let both = gw.get_with(
        "/echo/x",
        &[
            ("X-Api-Key", "partner-key-0123456789"),
            ("Authorization", &bearer(&token)),
        ],
    );
    assert_eq!(both.status, 400, "{}", both.text());
    // A client whose id looks like a token's client cannot share its count: API-key client
    // ids are names without ':' (config check), token clients are `jwt:<issuer>:<hash>`.
    assert_eq!(gw.get("/echo/x").status, 401);
}

#[test]
fn a_token_from_a_cookie_can_be_kept_from_the_upstream() {
    let up = Upstream::start("api");
    let key = Signer::rsa("k");
    let idp = JwksServer::start(&[&key]);
    let gw = Gateway::start(&config(
        &up,
        &format!("jwks_url = \"{}\"", idp.url()),
        "",
        "token_from = \"cookie:session\"\nforward_token = false",
    ));
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let token = key.sign(&claims("cookie-user"));
    let resp = gw.get_with(
        "/echo/x",
        &[("Cookie", &format!("theme=dark; session={token}"))],
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(header_of(&resp, "cookie").as_deref(), Some("theme=dark"));
    assert_eq!(
        header_of(&resp, "x-client-id").as_deref(),
        Some("cookie-user")
    );
    // Twice, or also in Authorization: two readings, refused.
    let twice = gw.get_with(
        "/echo/x",
        &[("Cookie", &format!("session={token}; session=x"))],
    );
    assert_eq!(twice.status, 400);
    let also = gw.get_with(
        "/echo/x",
        &[
            ("Cookie", &format!("session={token}")),
            ("Authorization", &bearer(&token)),
        ],
    );
    assert_eq!(also.status, 400);
}

/// An endpoint that accepts connections and never answers: a request needing keys joins
/// the fetch under way and gives up with it — it never waits for a second fetch queued behind
/// the first (before, with `jwks_min_refresh` under `jwks_timeout`, every request waited out
/// the fetch in flight and then started and waited out another: twice the bound). Failures
/// are logged once per interval, naming the issuer; when keys come, requests are served.
#[test]
fn a_request_joins_the_key_fetch_under_way_and_never_waits_for_the_next() {
    let up = Upstream::start("api");
    let key = Signer::rsa("k");
    let idp = JwksServer::start(&[&key]);
    idp.hang();
    let gw = Gateway::start(&config(
        &up,
        &format!(
            "jwks_url = \"{}\"\njwks_timeout = \"2s\"\njwks_min_refresh = \"1s\"",
            idp.url()
        ),
        "",
        "",
    ));
    let token = key.sign(&claims("u"));
    for round in 1..=3u64 {
        // A fetch is under way (the background's); a request arrives and joins it.
        wait_until("a fetch under way", || idp.fetches() == round);
        let resp = call(&gw, &token);
        assert_eq!(resp.status, 503, "{}", resp.text());
        // Answered when that fetch gave up, not after one more: no second fetch was started
        // for it (the next, the background's retry, comes a second after the failure).
        assert_eq!(
            idp.fetches(),
            round,
            "round {round}: the request fetched again"
        );
    }
    let failures = |gw: &Gateway| {
        gw.proc
            .log_text()
            .matches("issuer idp: fetching its keys from")
            .count()
    };
    assert_eq!(
        failures(&gw),
        1,
        "logged once per interval, naming the issuer"
    );
    idp.set_keys(&[&key]);
    wait_until("keys fetched", || call(&gw, &token).status == 200);
    assert!(gw.proc.log_text().contains("issuer idp: keys fetched from"));
}

/// CGI/WSGI upstreams read `_` as `-`: an `X_Tenant_Id` would stand in for the tenant
/// header the gateway derives from a claim, an `X_Token` for the token header it reads (and,
/// with `forward_token = false`, strips). Neither reaches the upstream, whatever the case.
#[test]
fn underscore_spellings_of_a_routes_claim_and_token_headers_never_reach_the_upstream() {
    let up = Upstream::start("api");
    let key = Signer::rsa("k");
    let idp = JwksServer::start(&[&key]);
    let gw = Gateway::start(&config(
        &up,
        &format!("jwks_url = \"{}\"", idp.url()),
        "",
        "token_from = \"header:X-Token\"\nforward_token = false\nforward_claims = { \"X-Tenant-Id\" = \"org\" }",
    ));
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let forged = Signer::rsa("k").sign(&claims("admin"));
    for org in [Some("acme"), None] {
        let c = match org {
            Some(org) => with(claims("u"), "org", json!(org)),
            None => claims("u"),
        };
        let resp = gw.get_with(
            "/echo/x",
            &[
                ("X-Token", &key.sign(&c)),
                ("X_Tenant_Id", "victim-org"),
                ("x_TENANT_id", "victim-org"),
                ("X_Token", &forged),
            ],
        );
        assert_eq!(resp.status, 200, "{}", resp.text());
        let names: Vec<String> = resp.json()["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                h[0].as_str()
                    .unwrap()
                    .to_ascii_lowercase()
                    .replace('_', "-")
            })
            .collect();
        let count = |n: &str| names.iter().filter(|h| *h == n).count();
        assert_eq!(count("x-token"), 0, "{names:?}");
        assert_eq!(
            count("x-tenant-id"),
            usize::from(org.is_some()),
            "{names:?}"
        );
        assert_eq!(header_of(&resp, "x-tenant-id").as_deref(), org);
    }
}

/// A second token cookie must not reach the upstream in a form the gateway did not read: in a
/// `Cookie` line that is not text (it was skipped, so a Node upstream taking the first
/// `session` cookie acted as the other token's subject), or under a spelling of the name that
/// ASP.NET Core (any case) or PHP (percent-decoded) reads as the same cookie.
#[test]
fn a_second_token_cookie_in_any_spelling_or_an_unreadable_cookie_line_is_refused() {
    let up = Upstream::start("api");
    let key = Signer::rsa("k");
    let idp = JwksServer::start(&[&key]);
    let gw = Gateway::start(&config(
        &up,
        &format!("jwks_url = \"{}\"", idp.url()),
        "",
        "token_from = \"cookie:session\"",
    ));
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let token = key.sign(&claims("cookie-user"));
    let forged = Signer::rsa("k").sign(&claims("admin"));
    let send = |lines: &[&[u8]]| {
        let mut req = b"GET /echo/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".to_vec();
        for line in lines {
            req.extend_from_slice(line);
            req.extend_from_slice(b"\r\n");
        }
        req.extend_from_slice(b"\r\n");
        http::raw(gw.port, &req).unwrap()
    };
    let good = format!("Cookie: session={token}");
    let mut undecodable = b"Cookie: y=\xff; session=".to_vec();
    undecodable.extend_from_slice(forged.as_bytes());
    assert_eq!(send(&[good.as_bytes()]).status, 200);
    for lines in [
        [good.as_bytes(), &undecodable[..]],
        [&undecodable[..], good.as_bytes()],
    ] {
        let resp = send(&lines);
        assert_eq!(resp.status, 400, "{}", resp.text());
    }
    for other in ["Session", "SESSION", "sess%69on", "%73ession"] {
        let resp = send(&[format!("Cookie: session={token}; {other}={forged}").as_bytes()]);
        assert_eq!(resp.status, 400, "{other}: {}", resp.text());
        let resp = send(&[
            good.as_bytes(),
            format!("Cookie: {other}={forged}").as_bytes(),
        ]);
        assert_eq!(resp.status, 400, "{other} on its own line: {}", resp.text());
    }
    assert_eq!(
        up.served(),
        1,
        "only the one clean request reached the upstream"
    );
}

/// The README's tour mints a token with openssl for the demo's issuer: that block, run by
/// bash, makes a token the demo configuration accepts (and maps to the partner plan).
#[test]
fn the_readmes_demo_token_is_accepted_by_the_demo_configuration() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("TOKEN="))
        .expect("the README mints a token");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("set -e\n{block}\nprintf %s \"$TOKEN\""))
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap();
    let up = Upstream::start("orders");
    let demo = std::fs::read_to_string(root.join("conf/demo.toml")).unwrap();
    let tables = &demo[demo.find("[upstreams.orders]").unwrap()..];
    let tables = tables.replace(
        "\"127.0.0.1:9001\", \"127.0.0.1:9002\"",
        &format!("\"{}\"", up.addr()),
    );
    let gw = Gateway::start(&tables);
    let resp = gw.get_with("/orders", &[("Authorization", &bearer(&token))]);
    assert_eq!(resp.status, 200, "{}", resp.text());
    let policy = resp
        .header("ratelimit-policy")
        .unwrap_or_default()
        .to_owned();
    assert!(
        policy.contains("\"per-minute\";q=600"),
        "the partner plan: {policy}"
    );
    // As the README forges one: the signature's last five characters replaced (the very last
    // alone may only carry padding bits).
    let forged = format!("{}AAAAA", &token[..token.len() - 5]);
    let resp = gw.get_with("/orders", &[("Authorization", &bearer(&forged))]);
    assert_eq!(resp.status, 401);
}

#[test]
fn an_address_whose_tokens_keep_failing_gets_no_more_verified_for_a_while() {
    // No per-IP limit on the route: the failure bucket alone bounds the signatures one
    // address makes the gateway check.
    let up = Upstream::start("api");
    let key = Signer::rsa("k1");
    let forger = Signer::rsa("k1"); // the issuer's kid, another key
    let idp = JwksServer::start(&[&key]);
    let gw = Gateway::start_with(
        "token_failure_limit = { rate = \"1/h\", burst = 5 }",
        &config(&up, &format!("jwks_url = \"{}\"", idp.url()), "", ""),
    );
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    // A token verified before the address's failures stays usable (remembered, no check).
    let known = key.sign(&claims("alice"));
    assert_eq!(call(&gw, &known).status, 200);
    let checked = |result: &str| gw.metric("turnstile_token_checks_total", &[("result", result)]);
    for i in 0..5 {
        let forged = forger.sign(&claims(&format!("admin-{i}")));
        assert_eq!(call(&gw, &forged).status, 401, "forged token {i}");
    }
    assert_eq!(checked("signature"), 5.0);
    // The sixth forged token, and a valid token never seen, are refused unverified.
    for token in [forger.sign(&claims("admin-6")), key.sign(&claims("bob"))] {
        let resp = call(&gw, &token);
        assert_eq!(resp.status, 429, "{}", resp.text());
        assert_eq!(resp.header("retry-after"), Some("1"));
        assert!(
            resp.text().contains("failed their checks"),
            "{}",
            resp.text()
        );
    }
    assert_eq!(
        checked("signature"),
        5.0,
        "no signature checked once refused"
    );
    assert_eq!(checked("too_many_failures"), 2.0);
    assert_eq!(
        call(&gw, &known).status,
        200,
        "a remembered token still passes"
    );

    // The same flood where the limit is off: every token is verified.
    let open = Gateway::start_with(
        "token_failure_limit = \"off\"",
        &config(&up, &format!("jwks_url = \"{}\"", idp.url()), "", ""),
    );
    wait_until("keys fetched", || open.admin("/readyz").status == 200);
    for i in 0..8 {
        assert_eq!(
            call(&open, &forger.sign(&claims(&format!("m-{i}")))).status,
            401
        );
    }
    let signature = open.metric("turnstile_token_checks_total", &[("result", "signature")]);
    assert_eq!(signature, 8.0);
}

/// `allow_clients` names a token's subject (what the upstream gets as `X-Client-Id`) and
/// `deny_plans` the plan its claim chose: refused with 403 after the token is verified.
#[test]
fn who_may_call_a_route_reads_the_tokens_subject_and_plan() {
    let up = Upstream::start("api");
    let key = Signer::ec("ec-1");
    let idp = JwksServer::start(&[&key]);
    let gw = Gateway::start(&config(
        &up,
        &format!("jwks_url = \"{}\"\nalgorithms = [\"ES256\"]", idp.url()),
        "plan_claim = \"tier\"\nplans = { gold = \"pro\" }",
        "allow_clients = [\"alice\", \"carol\"]\ndeny_plans = [\"pro\"]",
    ));
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let token = |sub: &str, tier: &str| key.sign(&with(claims(sub), "tier", json!(tier)));
    let resp = call(&gw, &token("alice", "basic"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(header_of(&resp, "x-client-id").as_deref(), Some("alice"));
    let resp = call(&gw, &token("bob", "basic"));
    assert_eq!(resp.status, 403, "{}", resp.text());
    assert_eq!(
        resp.json()["type"],
        "https://turnstile.dev/problems/forbidden"
    );
    assert_eq!(
        call(&gw, &token("carol", "gold")).status,
        403,
        "pro is denied"
    );
}

/// `groups_claim`: the token's groups (a list, or a space-separated string) are what
/// `allow_groups` / `deny_groups` name.
#[test]
fn a_tokens_groups_claim_names_its_groups() {
    let up = Upstream::start("api");
    let key = Signer::ec("ec-1");
    let idp = JwksServer::start(&[&key]);
    let gw = Gateway::start(&config(
        &up,
        &format!("jwks_url = \"{}\"\nalgorithms = [\"ES256\"]", idp.url()),
        "groups_claim = \"realm.groups\"",
        "allow_groups = [\"admins\", \"ops\"]\ndeny_groups = [\"banned\"]",
    ));
    wait_until("keys fetched", || gw.admin("/readyz").status == 200);
    let token = |groups: serde_json::Value| {
        key.sign(&with(claims("alice"), "realm", json!({ "groups": groups })))
    };
    assert_eq!(call(&gw, &token(json!(["staff", "admins"]))).status, 200);
    assert_eq!(call(&gw, &token(json!("staff ops"))).status, 200);
    assert_eq!(call(&gw, &token(json!(["staff"]))).status, 403);
    assert_eq!(call(&gw, &token(json!(["admins", "banned"]))).status, 403);
    assert_eq!(
        call(&gw, &key.sign(&claims("alice"))).status,
        403,
        "no claim: no group"
    );
}
