//! A decision's arguments, read from `lua/check.lua`'s layout — pure, no Redis: the fuzz
//! target `fuzz/fuzz_targets/module_args.rs` drives it with arbitrary bytes.
//!
//! `TURNSTILE.DECIDE numkeys key… time cost slot_id (name algorithm limit window burst
//! shadow)… [cost…]`: after the keys, exactly check.lua's ARGV. Every number is a decimal
//! integer without sign, at most 15 digits (the config loader keeps every value the
//! algorithms form below 2^52; Lua's doubles are exact there); anything else is an error reply,
//! never a guess.

/// Arguments per limit (check.lua's six).
pub const PER: usize = 6;
/// The most limits one decision may carry: a bound on what one call allocates.
pub const MAX_LIMITS: usize = 64;
const MAX_DIGITS: usize = 15;

/// When the decision happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Time {
    /// Redis's clock (`""`, production).
    Clock,
    /// Redis's clock plus milliseconds (`"+<ms>"`, tests).
    ClockPlus(i64),
    /// An explicit time in milliseconds (`"<ms>"`, tests).
    At(i64),
}

/// The algorithms the module decides natively (check.lua's codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    TokenBucket {
        burst: i64,
    },
    FixedWindow,
    /// A calendar window: the bounds "previous:start:end:next" the gateway computed.
    CalendarWindow {
        bounds: [i64; 4],
    },
    SlidingWindow,
    /// The leaky bucket that delays: `burst` and `delay` in requests.
    LeakyBucket {
        burst: i64,
        delay: i64,
    },
    SlidingLog,
    /// Requests in flight (`window`: how long a slot lives unreleased).
    Concurrency,
}

/// One limit of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit<'a> {
    pub name: &'a [u8],
    pub algorithm: Algorithm,
    pub limit: i64,
    /// Milliseconds (0 for a calendar window, whose bounds are in `algorithm`).
    pub window: i64,
    pub shadow: bool,
    pub cost: i64,
}

/// One request's decision: check.lua's arguments, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<'a> {
    pub time: Time,
    /// The request's slot id: names its concurrency slots ("" when it has none).
    pub slot_id: &'a [u8],
    pub limits: Vec<Limit<'a>>,
}

/// What a member of a batch is (`lua/batch.lua`'s kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request's decision (check.lua's; a member without a kind).
    Decide,
    /// A quota question (usage.lua's: `u`).
    Usage,
    /// A charge, refund or release (`c`, `r`, `l`): Lua's, not the module's.
    Other(u8),
}

/// One member of a batch: its kind, and where its keys and arguments are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub kind: Kind,
    pub keys: std::ops::Range<usize>,
    pub args: std::ops::Range<usize>,
}

/// The most members one batch may carry.
pub const MAX_MEMBERS: usize = 4096;

/// A batch's layout (`lua/batch.lua`'s ARGV, keys declared): `m`, then per member its kind
/// (none for a decision), its key count `n`, its argument count `a` and its arguments.
/// Every member must fit, and nothing may be left over, before any member runs.
pub fn batch(keys: usize, argv: &[&[u8]]) -> Result<Vec<Member>, String> {
    let m = match argv.first() {
        Some([b'a', ..]) => {
            return Err(
                "a batch with its keys after the arguments (a Cluster's) is batch.lua's".into(),
            )
        }
        Some(m) => number(m, "the member count")? as usize,
        None => return Err("no member count".into()),
    };
    if m > MAX_MEMBERS {
        return Err(format!("more than {MAX_MEMBERS} members"));
    }
    let (mut members, mut kb, mut p) = (Vec::with_capacity(m), 0, 1);
    for j in 1..=m {
        let past = || format!("member {j} runs past the keys or arguments");
        let first = argv.get(p).ok_or_else(past)?;
        let (kind, h) = match number(first, "") {
            Ok(_) => (Kind::Decide, p),
            Err(_) => match *first {
                b"u" => (Kind::Usage, p + 1),
                [k] => (Kind::Other(*k), p + 1),
                _ => return Err(format!("member {j}: unknown kind")),
            },
        };
        let n = number(argv.get(h).ok_or_else(past)?, "a key count")? as usize;
        let a = number(argv.get(h + 1).ok_or_else(past)?, "an argument count")? as usize;
        if kb + n > keys || h + 2 + a > argv.len() {
            return Err(past());
        }
        members.push(Member {
            kind,
            keys: kb..kb + n,
            args: h + 2..h + 2 + a,
        });
        (kb, p) = (kb + n, h + 2 + a);
    }
    if kb != keys || p != argv.len() {
        return Err(format!(
            "{} keys and {} arguments left over",
            keys - kb,
            argv.len() - p
        ));
    }
    Ok(members)
}

/// Reads one decision's arguments (`args`: check.lua's ARGV) for `keys` limits.
pub fn decision<'a>(keys: usize, args: &[&'a [u8]]) -> Result<Decision<'a>, String> {
    if keys == 0 || keys > MAX_LIMITS {
        return Err(format!("between 1 and {MAX_LIMITS} keys, got {keys}"));
    }
    let costs = args.len() == 3 + (PER + 1) * keys;
    if args.len() != 3 + PER * keys && !costs {
        return Err(format!(
            "expected 3 + 6 arguments per key (and a cost per key), got {} for {keys} keys",
            args.len()
        ));
    }
    let time = time(args[0])?;
    let cost = number(args[1], "cost")?;
    let mut limits = Vec::with_capacity(keys);
    for i in 0..keys {
        let a = &args[3 + PER * i..3 + PER * (i + 1)];
        let limit = number(a[2], "limit")?;
        if limit == 0 {
            return Err("a limit of 0".into());
        }
        let (algorithm, window) = match a[1] {
            b"tb" => {
                let burst = number(a[4], "burst")?;
                let window = positive(a[3], "window")?;
                if burst == 0 || burst.checked_mul(window).is_none_or(|c| c >= 1 << 52) {
                    return Err("a token bucket's burst × window must be in 1..2^52".into());
                }
                (Algorithm::TokenBucket { burst }, window)
            }
            b"fw" => (Algorithm::FixedWindow, positive(a[3], "window")?),
            b"sw" => {
                let window = positive(a[3], "window")?;
                if limit.checked_mul(window).is_none_or(|c| c >= 1 << 52) {
                    return Err("a sliding window's limit × window must be below 2^52".into());
                }
                (Algorithm::SlidingWindow, window)
            }
            b"cw" => (
                Algorithm::CalendarWindow {
                    bounds: bounds(a[3])?,
                },
                0,
            ),
            b"lb" => {
                let window = positive(a[3], "window")?;
                let (burst, delay) = shape(a[4])?;
                if (burst + 1).checked_mul(window).is_none_or(|c| c >= 1 << 52) {
                    return Err("a leaky bucket's burst × window must be below 2^52".into());
                }
                (Algorithm::LeakyBucket { burst, delay }, window)
            }
            b"sl" => (Algorithm::SlidingLog, positive(a[3], "window")?),
            b"cc" => (Algorithm::Concurrency, positive(a[3], "slot lifetime")?),
            other => {
                return Err(format!(
                    "unknown algorithm {}",
                    String::from_utf8_lossy(&other[..other.len().min(8)])
                ))
            }
        };
        let cost = if costs {
            number(args[3 + PER * keys + i], "cost")?
        } else {
            cost
        };
        limits.push(Limit {
            name: a[0],
            algorithm,
            limit,
            window,
            shadow: a[5] == b"1",
            cost,
        });
    }
    Ok(Decision {
        time,
        slot_id: args[2],
        limits,
    })
}

fn time(arg: &[u8]) -> Result<Time, String> {
    match arg {
        b"" => Ok(Time::Clock),
        [b'+', rest @ ..] => Ok(Time::ClockPlus(number(rest, "time offset")?)),
        _ => Ok(Time::At(number(arg, "time")?)),
    }
}

/// A decimal integer, 0 to 10^15 − 1.
pub fn number(arg: &[u8], what: &str) -> Result<i64, String> {
    if arg.is_empty() || arg.len() > MAX_DIGITS || !arg.iter().all(u8::is_ascii_digit) {
        return Err(format!(
            "{what} must be a decimal integer of at most {MAX_DIGITS} digits"
        ));
    }
    Ok(arg.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
}

fn positive(arg: &[u8], what: &str) -> Result<i64, String> {
    match number(arg, what)? {
        0 => Err(format!("a {what} of 0")),
        n => Ok(n),
    }
}

/// A leaky bucket's "burst:delay" (requests), the delay at most the burst.
fn shape(arg: &[u8]) -> Result<(i64, i64), String> {
    let (b, d) = match arg.iter().position(|&c| c == b':') {
        Some(at) => (&arg[..at], &arg[at + 1..]),
        None => return Err("a leaky bucket's shape must be burst:delay".into()),
    };
    let (burst, delay) = (number(b, "burst")?, number(d, "delay")?);
    if delay > burst {
        return Err("a leaky bucket's delay must not exceed its burst".into());
    }
    Ok((burst, delay))
}

/// A calendar window's "previous:start:end:next", in order.
fn bounds(arg: &[u8]) -> Result<[i64; 4], String> {
    let mut out = [0; 4];
    let mut parts = arg.split(|&b| b == b':');
    for slot in &mut out {
        *slot = number(parts.next().unwrap_or_default(), "calendar bound")?;
    }
    if parts.next().is_some() || !out.windows(2).all(|w| w[0] < w[1]) {
        return Err("calendar bounds must be previous:start:end:next, increasing".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<&[u8]> {
        s.split(',').map(str::as_bytes).collect()
    }

    #[test]
    fn reads_check_luas_layout() {
        let d = decision(2, &args("+5,2,,a,tb,10,1000,20,0,b,cw,3,1:2:3:4,3,1,4,5")).unwrap();
        assert_eq!(d.time, Time::ClockPlus(5));
        assert_eq!(d.limits[0].algorithm, Algorithm::TokenBucket { burst: 20 });
        assert_eq!((d.limits[0].cost, d.limits[1].cost), (4, 5));
        assert_eq!(
            d.limits[1].algorithm,
            Algorithm::CalendarWindow {
                bounds: [1, 2, 3, 4]
            }
        );
        assert!(d.limits[1].shadow && !d.limits[0].shadow);
    }

    #[test]
    fn reads_a_batchs_members_and_refuses_a_broken_layout() {
        let members = batch(3, &args("2,2,4,,1,,x,u,1,3,,0,")).unwrap();
        assert_eq!(members[0].kind, Kind::Decide);
        assert_eq!(
            (members[0].keys.clone(), members[0].args.clone()),
            (0..2, 3..7)
        );
        assert_eq!(members[1].kind, Kind::Usage);
        assert_eq!(
            (members[1].keys.clone(), members[1].args.clone()),
            (2..3, 10..13)
        );
        for bad in [
            "3,2,4,,1,,x,u,1,3,,0,",
            "1,2,4,,1,,x",
            "2,2,4,,1,,x,u,1,3,,0,,",
            "a2",
            "",
        ] {
            assert!(batch(3, &args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_what_is_not_strictly_a_decision() {
        for (keys, bad) in [
            (1, ",1,,a,tb,10,1000"),                  // too few
            (1, ",1,,a,tb,10,1000,20,0,1,1"),         // neither layout
            (1, ",-1,,a,tb,10,1000,20,0"),            // a sign
            (1, ",1.5,,a,tb,10,1000,20,0"),           // not an integer
            (1, ",1,,a,tb,0,1000,20,0"),              // a limit of 0
            (1, ",1,,a,tb,10,0,20,0"),                // a window of 0
            (1, ",1,,a,tb,10,1000000000000,99999,0"), // past 2^52
            (1, ",1,,a,xx,10,1000,20,0"),             // unknown algorithm
            (1, ",1,,a,cw,10,4:3:2:1,20,0"),          // bounds out of order
            (1, ",1,,a,cw,10,1:2:3,20,0"),            // too few bounds
            (1, ",1234567890123456,,a,fw,1,1,1,0"),   // 16 digits
            (0, ",1,"),
            (65, ",1,"),
        ] {
            assert!(decision(keys, &args(bad)).is_err(), "{bad}");
        }
    }
}
