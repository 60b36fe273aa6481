//! Who may call a route, by identity (`allow_clients` / `deny_clients`, `allow_plans` /
//! `deny_plans`, `allow_groups` / `deny_groups`): checked after identity and before any limit, so a refused client spends
//! nothing and writes nothing to the store. Pure: names in, a yes or no out.

/// A route's rules on its identified callers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallerRules {
    pub allow_clients: Names,
    pub deny_clients: Names,
    pub allow_plans: Names,
    pub deny_plans: Names,
    pub allow_groups: Names,
    pub deny_groups: Names,
}

impl CallerRules {
    /// Whether the client `id` on `plan`, in `groups`, may call. A denied client, plan or
    /// group is refused; where an allow list exists (of clients, plans or groups), the client
    /// must be named in one of them (its id, its plan or one of its groups).
    pub fn admits(&self, id: &str, plan: &str, groups: &[std::sync::Arc<str>]) -> bool {
        let in_group = |names: &Names| groups.iter().any(|g| names.contains(g));
        if self.deny_clients.contains(id)
            || self.deny_plans.contains(plan)
            || in_group(&self.deny_groups)
        {
            return false;
        }
        let allows = !self.allow_clients.is_empty()
            || !self.allow_plans.is_empty()
            || !self.allow_groups.is_empty();
        !allows
            || self.allow_clients.contains(id)
            || self.allow_plans.contains(plan)
            || in_group(&self.allow_groups)
    }

    pub fn is_empty(&self) -> bool {
        self.allow_clients.is_empty()
            && self.deny_clients.is_empty()
            && self.allow_plans.is_empty()
            && self.deny_plans.is_empty()
            && self.allow_groups.is_empty()
            && self.deny_groups.is_empty()
    }
}

/// A sorted list of names, looked up by binary search.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Names(Box<[Box<str>]>);

impl Names {
    pub fn new(names: Vec<String>) -> Names {
        let mut names: Vec<Box<str>> = names.into_iter().map(String::into_boxed_str).collect();
        names.sort_unstable();
        names.dedup();
        Names(names.into_boxed_slice())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.binary_search_by(|n| (**n).cmp(name)).is_ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|n| &**n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn groups_allow_and_deny_like_plans() {
        let rules = CallerRules {
            allow_groups: names(&["partners"]),
            deny_groups: names(&["suspended"]),
            ..CallerRules::default()
        };
        let groups =
            |list: &[&str]| -> Vec<Arc<str>> { list.iter().map(|g| Arc::from(*g)).collect() };
        assert!(rules.admits("ada", "free", &groups(&["staff", "partners"])));
        assert!(!rules.admits("ada", "free", &groups(&["staff"])));
        assert!(!rules.admits("ada", "free", &[]));
        assert!(!rules.admits("ada", "free", &groups(&["partners", "suspended"])));
    }

    fn names(list: &[&str]) -> Names {
        Names::new(list.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn deny_wins_and_an_allow_list_of_either_kind_admits() {
        let rules = CallerRules {
            allow_clients: names(&["ada"]),
            allow_plans: names(&["gold"]),
            deny_clients: names(&["mallory"]),
            deny_plans: names(&[]),
            ..CallerRules::default()
        };
        assert!(rules.admits("ada", "free", &[]), "named client");
        assert!(rules.admits("bob", "gold", &[]), "named plan");
        assert!(!rules.admits("bob", "free", &[]), "neither");
        assert!(
            !rules.admits("mallory", "gold", &[]),
            "denied although on an allowed plan"
        );
    }

    #[test]
    fn deny_lists_alone_admit_everyone_else() {
        let rules = CallerRules {
            deny_plans: names(&["trial"]),
            ..CallerRules::default()
        };
        assert!(rules.admits("ada", "free", &[]));
        assert!(!rules.admits("ada", "trial", &[]));
        assert!(CallerRules::default().is_empty());
    }

    #[test]
    fn names_compare_exactly() {
        let list = names(&["b", "a", "a", "c"]);
        assert_eq!(list.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(list.contains("a") && !list.contains("A") && !list.contains("a "));
    }
}
