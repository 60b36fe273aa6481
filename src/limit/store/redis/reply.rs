//! The typed reading of the scripts' replies: check.lua's one-line verdict and lease.lua's
//! grant. A reply that does not have the expected shape is a protocol error, never a guess.

use crate::limit::store::error::StoreError;
use crate::limit::store::lease::{Grant, GrantWindow};
use crate::limit::{Decision, Policy, Verdict};
use redis::Value;

/// check.lua's reply, `"<admitted> <now_ms> <4 integers per limit> <rejected name>"`, → a
/// verdict decided at `now_ms`.
pub fn parse_reply(reply: &[u8], policies: &[Policy]) -> Result<Verdict, StoreError> {
    let integers = 2 + 4 * policies.len();
    // The name (possibly empty) is whatever follows the last integer.
    let mut fields = reply.splitn(integers + 1, |&b| b == b' ');
    let malformed = || {
        StoreError::Protocol(format!(
            "expected {integers} integers and a name for {} limits, got {:?}",
            policies.len(),
            String::from_utf8_lossy(reply)
        ))
    };
    let mut next = || -> Result<u64, StoreError> {
        let field = fields.next().unwrap_or_default();
        std::str::from_utf8(field)
            .ok()
            .and_then(|f| f.parse().ok())
            .ok_or_else(malformed)
    };
    let admitted = next()?;
    let at_ms = next()?;
    let mut decisions = Vec::with_capacity(policies.len());
    for policy in policies {
        decisions.push(Decision {
            allowed: next()? == 1,
            limit: policy.capacity(),
            remaining: next()?,
            reset_ms: next()?,
            retry_after_ms: next()?,
        });
    }
    let admitted = match admitted {
        0 => false,
        1 => true,
        other => {
            return Err(StoreError::Protocol(format!(
                "expected 0 or 1, got {other}"
            )))
        }
    };
    if fields.next().is_none() {
        return Err(malformed());
    }
    Ok(Verdict {
        admitted,
        decisions,
        at_ms,
        from_lease: false,
    })
}

/// `{granted, now, rejected name, then 4 integers per limit}` → a grant.
pub fn parse_grant(reply: &[Value], policies: &[Policy]) -> Result<Grant, StoreError> {
    if reply.len() != 3 + 4 * policies.len() {
        return Err(StoreError::Protocol(format!(
            "expected {} values for a lease of {} limits, got {}",
            3 + 4 * policies.len(),
            policies.len(),
            reply.len()
        )));
    }
    let windows = reply[3..]
        .chunks(4)
        .map(|w| {
            Ok(GrantWindow {
                remaining: int(&w[0])?,
                reset_ms: int(&w[1])?,
                retry_after_ms: int(&w[2])?,
                start: int(&w[3])?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let rejected = match &reply[2] {
        Value::BulkString(name) if !name.is_empty() => policies
            .iter()
            .position(|p| p.name.as_bytes() == name.as_slice()),
        _ => None,
    };
    Ok(Grant {
        granted: int(&reply[0])?,
        rejected,
        windows,
    })
}

pub fn int(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        other => Err(StoreError::Protocol(format!(
            "expected a non-negative integer, got {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    #[test]
    fn replies_are_checked() {
        let ok = b"1 5 1 9 10 0 ";
        let p = Policy::new("p", Algorithm::FixedWindow, 10, 1000, 10);
        let v = parse_reply(ok, std::slice::from_ref(&p)).unwrap();
        assert!(v.admitted);
        assert_eq!(v.at_ms, 5);
        assert_eq!((v.decisions[0].remaining, v.decisions[0].limit), (9, 10));
        assert_eq!(v.decisions[0].reset_ms, 10);
        let protocol = |reply: &[u8], policies: &[Policy]| {
            matches!(parse_reply(reply, policies), Err(StoreError::Protocol(_)))
        };
        assert!(protocol(ok, &[p.clone(), p.clone()]), "too few integers");
        assert!(
            protocol(b"1 5 1 9 10 0", std::slice::from_ref(&p)),
            "no name field"
        );
        assert!(
            protocol(b"7 5 1 9 10 0 ", std::slice::from_ref(&p)),
            "not 0 or 1"
        );
        assert!(
            protocol(b"1 5 1 -9 10 0 ", std::slice::from_ref(&p)),
            "negative"
        );
        assert!(protocol(b"", std::slice::from_ref(&p)), "empty");
        let rejected = parse_reply(b"0 5 0 0 10 10 p", std::slice::from_ref(&p)).unwrap();
        assert!(!rejected.admitted && !rejected.decisions[0].allowed);
        assert_eq!(rejected.decisions[0].retry_after_ms, 10);
    }
}
