//! [4] Bearer tokens (JWT): the caller identified by a token an identity provider signed.
//!
//! ```text
//! token ─► cache.rs   known and still valid? (SHA-256 of the token → the identity)
//!       ─► issuer.rs  which issuer (the route's one, or by `iss`), its keys (source.rs:
//!                     fixed, or a JWKS URL refreshed in the background and on an unknown
//!                     `kid`), then verify.rs: alg allow-list, key by kid (keys.rs),
//!                     signature, exp / nbf / iat / iss / aud, required claims (claims.rs:
//!                     one reading of the payload), client id and plan from claims
//!       ─► TokenIdentity: client `jwt:<issuer>:<hash>` + plan, the claims routes use
//! ```
//!
//! Signatures are checked by the `jsonwebtoken` crate (its aws-lc-rs backend); nothing here signs
//! or verifies by hand.

pub mod cache;
pub mod claims;
pub mod issuer;
pub mod keys;
pub mod source;
pub mod verify;
