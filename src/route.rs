//! Routing: which service a connection on a listen address belongs to.
//!
//! A listen address used by one service sends everything there. On an address
//! shared by several services, the ClientHello's SNI picks one: exact names first,
//! then the longest matching `*.suffix` wildcard, then the `default: true` service;
//! otherwise the connection is refused.
use std::collections::HashMap;
use std::sync::Arc;

/// The routing table of one listen address.
#[derive(Debug)]
pub struct Routes<T> {
    single: Option<Arc<T>>,
    exact: HashMap<String, Arc<T>>,
    /// (suffix including the leading dot, target), longest suffix first.
    wildcards: Vec<(String, Arc<T>)>,
    default: Option<Arc<T>>,
}

impl<T> Routes<T> {
    /// A listen address served by one service.
    pub fn single(target: Arc<T>) -> Routes<T> {
        Routes {
            single: Some(target),
            exact: HashMap::new(),
            wildcards: Vec::new(),
            default: None,
        }
    }

    /// A shared listen address: `(server_names, is_default, target)` per service.
    /// Names must already be lower case without a trailing dot (config does that).
    pub fn shared(services: Vec<(Vec<String>, bool, Arc<T>)>) -> Routes<T> {
        let mut r = Routes {
            single: None,
            exact: HashMap::new(),
            wildcards: Vec::new(),
            default: None,
        };
        for (names, is_default, target) in services {
            for n in names {
                match n.strip_prefix('*') {
                    Some(suffix) => r.wildcards.push((suffix.to_string(), target.clone())),
                    None => {
                        r.exact.insert(n, target.clone());
                    }
                }
            }
            if is_default {
                r.default = Some(target);
            }
        }
        r.wildcards.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        r
    }

    /// True if the address is served by a single service (no SNI needed).
    pub fn is_single(&self) -> bool {
        self.single.is_some()
    }

    /// The service for a connection with this SNI (already lower case, no trailing dot).
    pub fn route(&self, sni: Option<&str>) -> Option<&Arc<T>> {
        if let Some(t) = &self.single {
            return Some(t);
        }
        if let Some(name) = sni {
            if let Some(t) = self.exact.get(name) {
                return Some(t);
            }
            for (suffix, t) in &self.wildcards {
                if name.len() > suffix.len() && name.ends_with(suffix.as_str()) {
                    return Some(t);
                }
            }
        }
        self.default.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(default: bool) -> Routes<&'static str> {
        Routes::shared(vec![
            (vec!["puppet.example.com".into()], false, Arc::new("puppet")),
            (vec!["*.example.com".into()], false, Arc::new("wild")),
            (
                vec!["*.ca.example.com".into(), "puppetca.example.com".into()],
                default,
                Arc::new("ca"),
            ),
        ])
    }

    #[test]
    fn exact_beats_wildcard_and_longest_wildcard_wins() {
        let r = table(false);
        assert_eq!(**r.route(Some("puppet.example.com")).unwrap(), "puppet");
        assert_eq!(**r.route(Some("puppetca.example.com")).unwrap(), "ca");
        assert_eq!(**r.route(Some("x.ca.example.com")).unwrap(), "ca");
        assert_eq!(**r.route(Some("files.example.com")).unwrap(), "wild");
        assert_eq!(**r.route(Some("a.b.example.com")).unwrap(), "wild");
    }

    #[test]
    fn bare_suffix_is_not_a_wildcard_match() {
        let r = table(false);
        assert!(r.route(Some("example.com")).is_none());
        assert!(r.route(Some("xexample.com")).is_none());
    }

    #[test]
    fn default_catches_unknown_and_missing_sni() {
        let r = table(true);
        assert_eq!(**r.route(Some("other.org")).unwrap(), "ca");
        assert_eq!(**r.route(None).unwrap(), "ca");
        let r = table(false);
        assert!(r.route(None).is_none());
    }

    #[test]
    fn single_takes_everything() {
        let r = Routes::single(Arc::new("only"));
        assert_eq!(**r.route(None).unwrap(), "only");
        assert_eq!(**r.route(Some("anything")).unwrap(), "only");
        assert!(r.is_single());
    }
}
