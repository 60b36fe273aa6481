//! Which files of `lua/` make each script Redis runs: one list per script, concatenated at
//! compile time (helpers before their users, the entry point last).

/// Defines a script: `$files`, the Lua files it is made of (in order: helpers before their
/// users, the entry point last), and `$source`, their concatenation.
macro_rules! script {
    ($(#[$doc:meta])* $source:ident, $files:ident = [$($file:literal),+ $(,)?]) => {
        script!($(#[$doc])* $source, "", $files = [$($file),+]);
    };
    ($(#[$doc:meta])* $source:ident, $header:literal, $files:ident = [$($file:literal),+ $(,)?]) => {
        $(#[$doc])*
        pub const $files: &[&str] = &[$($file),+];
        $(#[$doc])*
        pub const $source: &str =
            concat!($header, $(include_str!(concat!("../../../../lua/", $file)), "\n"),+);
    };
}

/// The first line of `batch.lua`'s script: its keys span many Cluster slots (of one node).
pub const BATCH_HEADER: &str = "#!lua flags=allow-cross-slot-keys\n";

script!(
    /// Decides a request against every limit of its plan (`lua/check.lua`).
    CHECK_SOURCE,
    CHECK_FILES = [
        "lib.lua",
        "token_bucket.lua",
        "leaky_bucket.lua",
        "fixed_window.lua",
        "sliding_window.lua",
        "sliding_log.lua",
        "concurrency.lua",
        "limits.lua",
        "decide.lua",
        "check.lua",
    ]
);
script!(
    /// Decides many requests in one call, each as `check.lua` would, with the charges,
    /// refunds, releases and quota questions that arrived with them (`lua/batch.lua`).
    BATCH_SOURCE,
    "#!lua flags=allow-cross-slot-keys\n",
    BATCH_FILES = [
        "batch_keys.lua",
        "lib.lua",
        "token_bucket.lua",
        "leaky_bucket.lua",
        "fixed_window.lua",
        "sliding_window.lua",
        "sliding_log.lua",
        "concurrency.lua",
        "limits.lua",
        "decide.lua",
        "return_units.lua",
        "charging.lua",
        "refunding.lua",
        "releasing.lua",
        "reporting.lua",
        "batch.lua",
    ]
);
script!(
    /// What a client has left of its limits, read without writing (`lua/usage.lua`).
    USAGE_SOURCE,
    USAGE_FILES = [
        "lib.lua",
        "token_bucket.lua",
        "leaky_bucket.lua",
        "fixed_window.lua",
        "sliding_window.lua",
        "sliding_log.lua",
        "concurrency.lua",
        "limits.lua",
        "reporting.lua",
        "usage.lua",
    ]
);
script!(
    /// Quota leasing: reserves a slice of every limit of a plan at once (`lua/lease.lua`).
    LEASE_SOURCE,
    LEASE_FILES = [
        "lib.lua",
        "fixed_window.lua",
        "sliding_window.lua",
        "return_units.lua",
        "lease.lua",
    ]
);
script!(
    /// Gives the unspent units of leases back (`lua/give_back.lua`).
    GIVE_BACK_SOURCE,
    GIVE_BACK_FILES = ["return_units.lua", "give_back.lua"]
);
script!(
    /// Gives back what check.lua committed in one slot when another slot rejected the request
    /// (Redis Cluster; `lua/refund.lua`).
    REFUND_SOURCE,
    REFUND_FILES = [
        "lib.lua",
        "leaky_bucket.lua",
        "return_units.lua",
        "refunding.lua",
        "refund.lua",
    ]
);
script!(
    /// Frees a finished request's concurrency slots (`lua/release.lua`).
    RELEASE_SOURCE,
    RELEASE_FILES = ["releasing.lua", "release.lua"]
);
script!(
    /// Gateway instances announce themselves (`lua/heartbeat.lua`).
    HEARTBEAT_SOURCE,
    HEARTBEAT_FILES = ["heartbeat.lua"]
);

script!(
    /// Counts what requests turned out to cost, once their responses told (`lua/charge.lua`).
    CHARGE_SOURCE,
    CHARGE_FILES = [
        "lib.lua",
        "return_units.lua",
        "charging.lua",
        "charge.lua",
    ]
);
script!(
    /// The client registry: read, compare-and-set one client, restore (`lua/registry.lua`).
    REGISTRY_SOURCE,
    REGISTRY_FILES = ["registry.lua"]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_script_is_its_listed_files_concatenated() {
        let lua = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        for (source, files) in [
            (CHECK_SOURCE, CHECK_FILES),
            (
                BATCH_SOURCE.strip_prefix(BATCH_HEADER).unwrap(),
                BATCH_FILES,
            ),
            (LEASE_SOURCE, LEASE_FILES),
            (GIVE_BACK_SOURCE, GIVE_BACK_FILES),
            (REFUND_SOURCE, REFUND_FILES),
            (RELEASE_SOURCE, RELEASE_FILES),
            (HEARTBEAT_SOURCE, HEARTBEAT_FILES),
            (REGISTRY_SOURCE, REGISTRY_FILES),
            (CHARGE_SOURCE, CHARGE_FILES),
            (USAGE_SOURCE, USAGE_FILES),
        ] {
            let expected: String = files
                .iter()
                .map(|f| std::fs::read_to_string(lua.join(f)).unwrap() + "\n")
                .collect();
            assert_eq!(source, expected, "{files:?}");
        }
        // Every Lua file is part of some script.
        for entry in std::fs::read_dir(&lua).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".lua") {
                let listed = [
                    CHECK_FILES,
                    BATCH_FILES,
                    LEASE_FILES,
                    GIVE_BACK_FILES,
                    REFUND_FILES,
                    RELEASE_FILES,
                    HEARTBEAT_FILES,
                    REGISTRY_FILES,
                    CHARGE_FILES,
                    USAGE_FILES,
                ]
                .iter()
                .any(|files| files.contains(&name.as_str()));
                assert!(listed, "{name} is in no script");
            }
        }
    }

    #[test]
    fn helpers_come_before_their_users() {
        for part in [
            "local function floor_div",
            "local function token_bucket",
            "local function fixed_window",
            "local function sliding_window",
            "local function sliding_log",
            "local algorithms =",
        ] {
            assert!(CHECK_SOURCE.contains(part), "{part}");
        }
        // Helpers come before their users, the entry point last.
        assert!(
            CHECK_SOURCE.find("local function ceil_div").unwrap()
                < CHECK_SOURCE.find("local function token_bucket").unwrap()
        );
        assert!(
            CHECK_SOURCE.find("local algorithms =").unwrap()
                > CHECK_SOURCE.find("local function sliding_log").unwrap()
        );
    }
}
