//! A batch's one call (`lua/batch.lua`) made from its members' own script calls, and each
//! member's reply read from the batch's array (`batch.rs` sends it).

use crate::limit::store::error::StoreError;
use redis::{Cmd, Value};

/// One member of a batch: its own script call, how many keys it names, and its kind's code
/// (`None`: a decision).
#[derive(Clone, Copy)]
pub struct Part<'a> {
    pub cmd: &'a Cmd,
    pub keys: usize,
    pub kind: Option<&'static str>,
}

/// What a member's reply in the batch's array says.
pub enum Reply {
    /// Run: check.lua's string (a decision), a count as a string (a charge, a refund).
    Ran(Value),
    /// "E <message>", or not a string.
    Failed(StoreError),
    /// "M <message>": a Cluster node that does not serve the member's slot (now) did not
    /// run it.
    Elsewhere,
}

pub fn member_reply(value: Value) -> Reply {
    match value {
        Value::BulkString(bytes) if bytes.starts_with(b"M ") => Reply::Elsewhere,
        Value::BulkString(bytes) if bytes.starts_with(b"E ") => Reply::Failed(StoreError::Refused(
            String::from_utf8_lossy(&bytes[2..]).into_owned(),
        )),
        value @ Value::BulkString(_) => Reply::Ran(value),
        other => Reply::Failed(StoreError::Protocol(format!(
            "expected a string per member from batch.lua, got {other:?}"
        ))),
    }
}

/// `EVALSHA <batch> <all keys> <keys…> <m> ([<kind>] <n> <a> <args…>)…` from the members' own
/// `EVALSHA <script> <n> <keys…> <args…>` commands (a decision names no kind). With
/// `keys_in_args` (a Cluster): `EVALSHA <batch> 0 a<m> ([<kind>] <n> <a> <args…>)… <keys…>
/// <all keys>`.
pub fn batch_cmd<'a, M>(sha: &str, members: M, keys_in_args: bool) -> Cmd
where
    M: Iterator<Item = Part<'a>> + Clone,
{
    let count = members.clone().count();
    let keys: usize = members.clone().map(|m| m.keys).sum();
    let args: usize = members.clone().map(|m| m.cmd.args_iter().count()).sum();
    let bytes: usize = members
        .clone()
        .flat_map(|m| parts(m.cmd))
        .map(|p| p.len() + 4)
        .sum();
    let mut cmd = Cmd::with_capacity(args + count * 3 + 4, bytes + 64);
    let each_key = |cmd: &mut Cmd| {
        for m in members.clone() {
            for arg in parts(m.cmd).skip(3).take(m.keys) {
                cmd.arg(arg);
            }
        }
    };
    cmd.arg("EVALSHA").arg(sha);
    if keys_in_args {
        cmd.arg(0).arg(format!("a{count}"));
    } else {
        cmd.arg(keys);
        each_key(&mut cmd);
        cmd.arg(count);
    }
    for m in members.clone() {
        let args = parts(m.cmd).count().saturating_sub(3 + m.keys);
        if let Some(kind) = m.kind {
            cmd.arg(kind);
        }
        cmd.arg(m.keys).arg(args);
        for arg in parts(m.cmd).skip(3 + m.keys) {
            cmd.arg(arg);
        }
    }
    if keys_in_args {
        each_key(&mut cmd);
        cmd.arg(keys);
    }
    cmd
}

fn parts(cmd: &Cmd) -> impl Iterator<Item = &[u8]> {
    cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => bytes,
        _ => &[][..],
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `EVALSHA sha <n> <keys…> <args…>`: a member's own call.
    pub fn check(keys: &[&str], args: &[&str]) -> Cmd {
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA").arg("sha").arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        for a in args {
            cmd.arg(*a);
        }
        cmd
    }

    #[test]
    fn a_batch_lists_every_members_keys_then_each_members_kind_counts_and_arguments() {
        let (a, b) = (
            check(&["a1", "a2"], &["", "1", "s"]),
            check(&["b1"], &["", "2", ""]),
        );
        let members = [
            Part {
                cmd: &a,
                keys: 2,
                kind: None,
            },
            Part {
                cmd: &b,
                keys: 1,
                kind: Some("c"),
            },
        ];
        let text = |cmd: &Cmd| -> Vec<String> {
            parts(cmd)
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect()
        };
        let want = [
            "EVALSHA", "bsha", "3", "a1", "a2", "b1", "2", "2", "3", "", "1", "s", "c", "1", "3",
            "", "2", "",
        ];
        assert_eq!(
            text(&batch_cmd("bsha", members.iter().copied(), false)),
            want
        );
        // On a Cluster: no key declared, the member count marked, the keys after the
        // arguments, then their number.
        let want = [
            "EVALSHA", "bsha", "0", "a2", "2", "3", "", "1", "s", "c", "1", "3", "", "2", "", "a1",
            "a2", "b1", "3",
        ];
        assert_eq!(
            text(&batch_cmd("bsha", members.iter().copied(), true)),
            want
        );
    }

    #[test]
    fn a_member_error_is_its_own_and_other_replies_pass_through() {
        let bad = member_reply(Value::BulkString(b"E unknown algorithm zz".to_vec()));
        assert!(
            matches!(bad, Reply::Failed(StoreError::Refused(m)) if m == "unknown algorithm zz")
        );
        let good = member_reply(Value::BulkString(b"1 5 1 9 100 0 ".to_vec()));
        assert!(matches!(good, Reply::Ran(Value::BulkString(_))));
        assert!(matches!(
            member_reply(Value::Int(1)),
            Reply::Failed(StoreError::Protocol(_))
        ));
        let elsewhere = b"M ERR Script attempted to access a non local key in a cluster node";
        assert!(matches!(
            member_reply(Value::BulkString(elsewhere.to_vec())),
            Reply::Elsewhere
        ));
    }
}
