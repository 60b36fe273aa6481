//! Verified tokens, remembered so that a client's next requests cost a hash and a lookup
//! instead of a signature check (an RSA verification costs tens of microseconds).
//!
//! Entries are keyed by the SHA-256 of the token (the token itself is not kept), hold only
//! what the routes use of it (the client, the claims key parts and forwarded headers read),
//! and are never used at or after the token's `exp`, nor once the issuer's keys have changed
//! (a key removed at the JWKS endpoint stops the tokens it signed at once). The table is
//! bounded: a full shard first drops its expired entries, and is emptied if that is not
//! enough — memory cannot grow with the number of tokens seen.

use crate::limit::sharded::Sharded;
use sha2::{Digest, Sha256};
use std::sync::Arc;

pub type TokenDigest = [u8; 32];

pub fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// What the cache keeps of a token: usable until it says otherwise.
pub trait Remembered {
    /// Before the token's `exp`, and its issuer's keys unchanged since it was verified.
    fn usable_at(&self, now: u64) -> bool;
}

pub struct TokenCache<V> {
    table: Sharded<TokenDigest, Arc<V>>,
    per_shard: usize,
    max: usize,
}

impl<V: Remembered> TokenCache<V> {
    /// A cache of at most about `max` tokens (0: nothing is remembered).
    pub fn new(max: usize) -> TokenCache<V> {
        let table = Sharded::new(Sharded::<TokenDigest, ()>::default_shards().min(max.max(1)));
        let per_shard = max.div_ceil(table.shard_count());
        TokenCache {
            table,
            per_shard,
            max,
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// The identity of a token verified earlier, if still usable at `now` (Unix seconds).
    pub fn get(&self, digest: &TokenDigest, now: u64) -> Option<Arc<V>> {
        if self.per_shard == 0 {
            return None;
        }
        let (_, shard) = self.table.lock_key(digest);
        shard
            .get(digest)
            .filter(|id| id.usable_at(now))
            .map(Arc::clone)
    }

    pub fn insert(&self, digest: TokenDigest, identity: Arc<V>, now: u64) {
        if self.per_shard == 0 {
            return;
        }
        let (_, mut shard) = self.table.lock_key(&digest);
        if shard.len() >= self.per_shard {
            shard.retain(|_, id| id.usable_at(now));
            if shard.len() >= self.per_shard {
                shard.retain(|_, _| false);
            }
        }
        shard.insert(digest, identity);
    }

    /// Drops entries no longer usable (the sweeper's call); how many.
    pub fn sweep(&self, now: u64) -> usize {
        self.table.retain(|_, id| id.usable_at(now))
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}
