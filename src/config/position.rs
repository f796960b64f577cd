//! Where each YAML path (`services.puppet.backends[2].address`) sits in the file.
//!
//! serde_yaml forgets positions once a value is deserialised, so semantic errors
//! found later could only name a path. We therefore walk the same text a second
//! time with `yaml-rust2`'s event parser, which reports a line and column with
//! every event, and keep a path -> position index. Why this approach: serde_yaml
//! has no spanned values, `yaml-rust2` is pure Rust, maintained, small (no default
//! features) and its markers are exactly what we need; the two parsers agree on
//! the structure of any well-formed file (and serde_yaml has already rejected
//! anything malformed before the index is used). If `yaml-rust2` ever disagrees
//! and fails, the index is simply empty and messages still carry the path.
use std::collections::HashMap;

use yaml_rust2::parser::{MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;
use yaml_rust2::Event;

/// A 1-based (line, column).
pub(crate) type Pos = (usize, usize);

/// Where one node was written: its key (if it is a mapping value) and its value.
#[derive(Debug, Clone, Copy)]
struct Spot {
    key: Option<Pos>,
    value: Pos,
    /// The value is a mapping or a sequence.
    collection: bool,
}

impl Spot {
    /// The position a message should point at: the key of a keyed collection
    /// (`backends:` rather than its first item), otherwise the value itself.
    fn best(&self) -> Pos {
        match (self.collection, self.key) {
            (true, Some(key)) => key,
            _ => self.value,
        }
    }
}

/// Path -> positions of every node in a YAML document.
#[derive(Debug, Default)]
pub(crate) struct PositionIndex {
    spots: HashMap<String, Vec<Spot>>,
}

impl PositionIndex {
    /// Index `text`; an unparsable text gives an empty index.
    pub(crate) fn build(text: &str) -> PositionIndex {
        let mut builder = Builder::default();
        let mut parser = Parser::new_from_str(text);
        match parser.load(&mut builder, false) {
            Ok(()) => builder.index,
            Err(_) => PositionIndex::default(),
        }
    }

    /// Position of `path`, or of its nearest indexed ancestor (a key that was
    /// not written, or a node reached through an alias).
    pub(crate) fn at(&self, path: &str) -> Option<Pos> {
        self.nth(path, 0)
    }

    /// Position of the `n`th occurrence of `path` (a duplicated mapping key).
    pub(crate) fn nth(&self, path: &str, n: usize) -> Option<Pos> {
        let mut p = path;
        loop {
            if let Some(spots) = self.spots.get(p) {
                if let Some(spot) = spots.get(n).or(spots.first()) {
                    return Some(spot.best());
                }
            }
            p = parent(p)?;
        }
    }

    /// Keys written twice in one mapping: (path, first key, duplicate key), in
    /// file order; a duplicate inside a duplicated parent is not listed again.
    pub(crate) fn duplicates(&self) -> Vec<(String, Pos, Pos)> {
        let duplicated = |p: &str| self.spots.get(p).is_some_and(|s| s.len() > 1);
        let mut out: Vec<(String, Pos, Pos)> = self
            .spots
            .iter()
            .filter(|(path, spots)| {
                spots.len() > 1
                    && !std::iter::successors(parent(path), |p| parent(p)).any(duplicated)
            })
            .filter_map(|(path, spots)| {
                let first = spots[0].key?;
                Some((path.clone(), first, spots[1].key?))
            })
            .collect();
        out.sort_by_key(|(_, _, dup)| *dup);
        out
    }

    /// Position of the key itself (for "unknown" or "duplicate" keys).
    pub(crate) fn key_at(&self, path: &str, n: usize) -> Option<Pos> {
        let spots = self.spots.get(path)?;
        let spot = spots.get(n)?;
        spot.key.or(Some(spot.value))
    }
}

/// `a.b[2].c` -> `a.b[2]` -> `a.b` -> `a` -> None.
fn parent(path: &str) -> Option<&str> {
    let cut = path.rfind(['.', '['])?;
    Some(&path[..cut])
}

/// One open mapping or sequence while walking the events.
#[derive(Debug)]
enum Frame {
    Mapping {
        path: String,
        /// The key just read and where, while its value is pending.
        key: Option<(String, Pos)>,
    },
    Sequence {
        path: String,
        next: usize,
    },
}

#[derive(Debug, Default)]
struct Builder {
    index: PositionIndex,
    stack: Vec<Frame>,
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

impl Builder {
    /// A node starts at `pos`. Returns its path, or None when it is a mapping key.
    fn node(&mut self, pos: Pos, key_text: Option<&str>, collection: bool) -> Option<String> {
        let (path, key) = match self.stack.last_mut() {
            None => (String::new(), None),
            Some(Frame::Sequence { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                (p, None)
            }
            Some(Frame::Mapping { path, key }) => match key.take() {
                Some((k, kpos)) => (join(path, &k), Some(kpos)),
                None => {
                    // This node is a key. A collection as key is not something
                    // our schema has; index it under a placeholder.
                    *key = Some((key_text.unwrap_or("?").to_string(), pos));
                    return None;
                }
            },
        };
        let spot = Spot {
            key,
            value: pos,
            collection,
        };
        self.index.spots.entry(path.clone()).or_default().push(spot);
        Some(path)
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let pos = (mark.line(), mark.col() + 1);
        match ev {
            Event::Scalar(text, ..) => {
                self.node(pos, Some(&text), false);
            }
            Event::Alias(_) => {
                self.node(pos, Some("*"), false);
            }
            Event::MappingStart(..) => {
                let path = self.node(pos, None, true).unwrap_or_else(|| "?".into());
                self.stack.push(Frame::Mapping { path, key: None });
            }
            Event::SequenceStart(..) => {
                let path = self.node(pos, None, true).unwrap_or_else(|| "?".into());
                self.stack.push(Frame::Sequence { path, next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
services:
  puppet:
    listen: [\"10.0.0.1:8140\"]
    backends:
      - name: a
        address: x:1
      - { name: b, address: \"y:2\" }
";

    #[test]
    fn paths_point_at_values_and_keyed_collections_at_keys() {
        let idx = PositionIndex::build(TEXT);
        assert_eq!(idx.at("services.puppet"), Some((2, 3)));
        assert_eq!(idx.at("services.puppet.listen"), Some((3, 5)));
        assert_eq!(idx.at("services.puppet.listen[0]"), Some((3, 14)));
        assert_eq!(idx.at("services.puppet.backends"), Some((4, 5)));
        assert_eq!(idx.at("services.puppet.backends[0].address"), Some((6, 18)));
        assert_eq!(idx.at("services.puppet.backends[1].address"), Some((7, 29)));
        assert_eq!(
            idx.key_at("services.puppet.backends[1].address", 0),
            Some((7, 20))
        );
    }

    #[test]
    fn missing_paths_fall_back_to_their_parent() {
        let idx = PositionIndex::build(TEXT);
        assert_eq!(idx.at("services.puppet.stick.on"), Some((2, 3)));
        assert_eq!(idx.at("nowhere"), None);
    }

    #[test]
    fn duplicate_keys_keep_every_occurrence() {
        let idx = PositionIndex::build("a: 1\na: 2\n");
        assert_eq!(idx.nth("a", 1), Some((2, 4)));
    }
}
