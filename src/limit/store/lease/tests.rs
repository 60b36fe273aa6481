//! The lease table, decided by hand: grants, spending, windows, refusals, renewals.
use super::*;
use crate::limit::Algorithm;
use std::future::Future;

fn key() -> LeaseKey {
    LeaseKey {
        client: "c".into(),
        route: "r".into(),
    }
}

fn policies() -> Vec<Policy> {
    vec![Policy::new("m", Algorithm::FixedWindow, 100, 60_000, 100)]
}

fn grant(granted: u64, remaining: u64, reset_ms: u64, start: u64) -> Grant {
    Grant {
        granted,
        rejected: (granted == 0).then_some(0),
        windows: vec![GrantWindow {
            remaining,
            reset_ms,
            retry_after_ms: if granted == 0 { reset_ms } else { 0 },
            start,
        }],
    }
}

fn ask(t: &LeaseTable, now: u64) -> Ask {
    match t.take(&key(), &policies(), 1, 10, now, 50) {
        FromLease::Ask(a) => a,
        _ => panic!("expected an ask"),
    }
}

#[test]
fn a_cold_key_asks_for_its_request_only_and_a_hot_one_for_the_cap() {
    let t = LeaseTable::new(100);
    let a = ask(&t, 1_000);
    assert_eq!((a.need, a.want, a.held), (1, 1, 0));
    assert!(
        t.settle(&key(), &policies(), a, &grant(1, 99, 30_000, 0), 1_001)
            .admitted
    );
    // 1 unit per ms observed since the last ask: 200 ms of it is capped at 10.
    let a = ask(&t, 1_001);
    assert_eq!(a.want, 10);
    let v = t.settle(&key(), &policies(), a, &grant(10, 89, 29_999, 0), 1_002);
    assert!(v.admitted);
    assert_eq!(v.decisions[0].remaining, 89 + 9);
    for _ in 0..9 {
        assert!(matches!(
            t.take(&key(), &policies(), 1, 10, 1_003, 50),
            FromLease::Local(v) if v.admitted
        ));
    }
    assert!(matches!(
        t.take(&key(), &policies(), 1, 10, 1_003, 50),
        FromLease::Ask(_)
    ));
}

#[test]
fn a_refund_goes_back_to_the_lease_of_its_window_only() {
    let t = LeaseTable::new(100);
    let a = ask(&t, 1_000);
    let v = t.settle(&key(), &policies(), a, &grant(5, 95, 30_000, 0), 1_001);
    t.refund(&key(), &policies(), 1, v.at_ms, 1_002);
    for _ in 0..5 {
        let taken = t.take(&key(), &policies(), 1, 10, 1_003, 50);
        assert!(matches!(taken, FromLease::Local(v) if v.admitted));
    }
    let taken = t.take(&key(), &policies(), 1, 10, 1_003, 50);
    assert!(matches!(taken, FromLease::Ask(_)));
    // After the lease's window: nothing to give back to.
    let t = LeaseTable::new(100);
    let a = ask(&t, 1_000);
    let v = t.settle(&key(), &policies(), a, &grant(5, 95, 30_000, 0), 1_001);
    t.refund(&key(), &policies(), 1, v.at_ms, 40_000);
    let taken = t.take(&key(), &policies(), 1, 10, 40_001, 50);
    assert!(matches!(taken, FromLease::Ask(a) if a.held == 0));
}

#[test]
fn a_renewal_in_flight_makes_others_wait_and_settling_wakes_them() {
    let t = LeaseTable::new(100);
    let a = ask(&t, 1_000);
    let FromLease::Wait(mut wait) = t.take(&key(), &policies(), 1, 10, 1_000, 50) else {
        panic!("expected a wait")
    };
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(wait.as_mut().poll(&mut cx).is_pending());
    t.settle(&key(), &policies(), a, &grant(1, 99, 30_000, 0), 1_001);
    assert!(wait.as_mut().poll(&mut cx).is_ready());
}

#[test]
fn a_refusal_is_remembered_until_the_retry_time() {
    let t = LeaseTable::new(100);
    let a = ask(&t, 1_000);
    let v = t.settle(&key(), &policies(), a, &grant(0, 0, 5_000, 0), 1_010);
    assert!(!v.admitted);
    assert_eq!(v.decisions[0].retry_after_ms, 5_000 - 10);
    assert!(matches!(
        t.take(&key(), &policies(), 1, 10, 5_999, 50),
        FromLease::Local(v) if !v.admitted
    ));
    assert!(matches!(
        t.take(&key(), &policies(), 1, 10, 6_000, 50),
        FromLease::Ask(_)
    ));
}

#[test]
fn a_lease_is_never_spent_after_its_window_and_lapsed_units_are_given_back() {
    let t = LeaseTable::new(100);
    let a = ask(&t, 1_000);
    t.settle(&key(), &policies(), a, &grant(1, 99, 100, 60_000), 1_000);
    let a = ask(&t, 1_001);
    t.settle(&key(), &policies(), a, &grant(10, 80, 99, 60_000), 1_001);
    // 9 units left, expiring at 1_001 + 99 = 1_100.
    assert!(
        matches!(t.take(&key(), &policies(), 1, 10, 1_099, 50), FromLease::Local(v) if v.admitted)
    );
    // Expired: the 8 left lapse and ride along with the renewal, to be given back.
    let a = ask(&t, 1_100);
    assert_eq!((a.held, a.need, a.give_back), (0, 1, 8));
    assert_eq!(a.give_back_starts, vec![60_000]);
    t.settle(
        &key(),
        &policies(),
        a,
        &grant(5, 70, 59_000, 120_000),
        1_110,
    );
    assert_eq!(
        t.drain(1_120),
        vec![Unspent {
            key: key(),
            policies: policies(),
            starts: vec![120_000],
            units: 4,
        }]
    );
    // Drained: nothing left to spend.
    assert!(matches!(
        t.take(&key(), &policies(), 1, 10, 1_121, 50),
        FromLease::Ask(_)
    ));
}

#[test]
fn held_units_join_a_renewal_in_their_window_and_are_void_in_another() {
    let t = LeaseTable::new(100);
    let take = |now| t.take(&key(), &policies(), 3, 10, now, 50);
    let FromLease::Ask(a) = take(1_000) else {
        panic!()
    };
    t.settle(&key(), &policies(), a, &grant(4, 96, 30_000, 0), 1_000);
    // 1 left; the next request holds it and needs 2 more (and gets 3: 1 left again).
    let FromLease::Ask(a) = take(1_001) else {
        panic!()
    };
    assert_eq!((a.held, a.need), (1, 2));
    assert!(
        t.settle(&key(), &policies(), a, &grant(3, 93, 29_999, 0), 1_002)
            .admitted
    );
    // If a grant lands in a later window (a store clock jump), the held unit is void and
    // the request is refused rather than overspend.
    let FromLease::Ask(a) = take(1_003) else {
        panic!()
    };
    assert_eq!(a.held, 1);
    let v = t.settle(&key(), &policies(), a, &grant(2, 98, 60_000, 60_000), 1_004);
    assert!(!v.admitted);
    // 2 left, expiring at 1_003 + 60_000. Near that end they cannot join a renewal: they
    // lapse and are given back with it.
    let FromLease::Ask(a) = take(60_960) else {
        panic!()
    };
    assert_eq!((a.held, a.need, a.give_back), (0, 3, 2));
}

#[test]
fn a_failed_renewal_returns_the_held_units_and_a_changed_plan_starts_afresh() {
    let t = LeaseTable::new(100);
    let FromLease::Ask(a) = t.take(&key(), &policies(), 2, 10, 1_000, 50) else {
        panic!()
    };
    t.settle(&key(), &policies(), a, &grant(3, 97, 30_000, 0), 1_000);
    let FromLease::Ask(a) = t.take(&key(), &policies(), 2, 10, 1_001, 50) else {
        panic!()
    };
    assert_eq!(a.held, 1);
    t.renewal_failed(&key(), &a, 1_002);
    let FromLease::Ask(a) = t.take(&key(), &policies(), 2, 10, 1_003, 50) else {
        panic!()
    };
    assert_eq!(a.held, 1);
    t.renewal_failed(&key(), &a, 1_004);
    let other = vec![Policy::new("m", Algorithm::FixedWindow, 50, 60_000, 50)];
    let FromLease::Ask(a) = t.take(&key(), &other, 2, 10, 1_005, 50) else {
        panic!()
    };
    assert_eq!((a.held, a.need), (0, 2));
}

#[test]
fn the_table_is_bounded_and_idle_entries_are_swept() {
    let t = LeaseTable::new(1);
    let shards = Sharded::<LeaseKey, Held>::default_shards().next_power_of_two();
    let mut untracked = 0;
    for i in 0..shards * 4 {
        let k = LeaseKey {
            client: format!("c{i}").into(),
            route: "r".into(),
        };
        match t.take(&k, &policies(), 1, 10, 1_000, 50) {
            FromLease::Untracked => untracked += 1,
            FromLease::Ask(a) => t.renewal_failed(&k, &a, 1_000),
            _ => panic!(),
        }
    }
    assert!(t.len() <= shards && untracked > 0);
    assert_eq!(t.sweep(1_000 + IDLE_MS - 1), 0);
    let n = t.len();
    assert_eq!(t.sweep(1_000 + IDLE_MS), n);
    assert!(t.is_empty());
}
