//! The fuzz target's body (`fuzz/fuzz_targets/module_args.rs`), also run by the unit tests
//! over a fixed set of generated inputs: whatever bytes a client sends as a command's
//! arguments, parsing answers an error or a layout within bounds, and a parsed decision is
//! decided without a panic or an overflow (the algorithms' arithmetic checked here in debug
//! builds).

use crate::algorithm::{decide, State};
use crate::args::{batch, decision, Time};

/// `data`: the first byte a key count, the rest arguments separated by 0 bytes.
pub fn module_args(data: &[u8]) {
    let Some((&keys, rest)) = data.split_first() else {
        return;
    };
    let args: Vec<&[u8]> = rest.split(|&b| b == 0).collect();
    let keys = usize::from(keys % 8);
    if let Ok(d) = decision(keys, &args) {
        assert!(d.limits.len() == keys && keys >= 1);
        let now = match d.time {
            Time::At(ms) | Time::ClockPlus(ms) => ms,
            Time::Clock => 1_800_000_000_000,
        };
        for limit in &d.limits {
            for state in [
                State::Missing,
                State::Bucket {
                    level: now,
                    updated: now / 2,
                    turns: vec![now, 1],
                },
                State::Window {
                    start: now - now % 1000,
                    count: limit.limit,
                    previous: limit.limit,
                },
                State::Live(vec![now / 2, now]),
            ] {
                let (report, _) = decide(limit, &state, now, limit.cost);
                assert!(report[0] == 0 || report[0] == 1);
            }
        }
    }
    if let Ok(members) = batch(keys, &args) {
        for m in members {
            assert!(m.keys.end <= keys && m.args.end <= args.len());
        }
    }
}

#[cfg(test)]
mod tests {
    /// Inputs built from the shapes a decision has, mutated: a quick stand-in for the fuzzer
    /// on every `cargo test`.
    #[test]
    fn arbitrary_arguments_never_panic() {
        let seeds: [&[u8]; 4] = [
            b"\x01\x00\x001\x00\x00a\x00tb\x002\x001000\x003\x000",
            b"\x02+5\x002\x00s\x00a\x00lb\x001\x001000\x002:1\x000\x00b\x00cw\x003\x001:2:3:4\x000\x001",
            b"\x01999999999999999\x00999999999999999\x00\x00a\x00sw\x00999999999999999\x00999999999999999\x000\x000",
            b"\x032\x002\x004\x00\x001\x00\x00x\x00u\x001\x003\x00\x000\x00",
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for seed in seeds {
            super::module_args(seed);
            for _ in 0..20_000 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let mut input = seed.to_vec();
                let at = (state as usize) % input.len();
                match state >> 60 {
                    0..=5 => input[at] = (state >> 8) as u8,
                    6..=9 => input.insert(at, b"0123456789:+ \x00"[(state >> 20) as usize % 14]),
                    _ => drop(input.remove(at)),
                }
                super::module_args(&input);
            }
        }
    }
}

#[cfg(test)]
mod seeds {
    #[test]
    fn the_seeds_are_decisions_and_batches() {
        let args = |s: &'static [u8]| -> Vec<&'static [u8]> { s.split(|&b| b == 0).collect() };
        assert!(
            crate::args::decision(1, &args(b"\x001\x00\x00a\x00tb\x002\x001000\x003\x000")).is_ok()
        );
        assert!(crate::args::decision(2, &args(b"+5\x002\x00s\x00a\x00lb\x001\x001000\x002:1\x000\x00b\x00cw\x003\x001:2:3:4\x000\x001")).is_ok());
        assert!(crate::args::batch(
            3,
            &args(b"2\x002\x004\x00\x001\x00\x00x\x00u\x001\x003\x00\x000\x00")
        )
        .is_ok());
    }
}
