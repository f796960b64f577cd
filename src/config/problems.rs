//! Every syntax, type and unknown-key problem of a file, in crossbar's own words.
//!
//! serde_yaml stops at the first problem and words it for Rust programmers
//! (`invalid type: string "x", expected u64`, `expected struct RawService`). Here:
//! tabs are found by a scan of the text (YAML indents with spaces only), duplicate
//! keys from the [`PositionIndex`] (at the duplicate, naming the first), and type and
//! unknown-key errors by deserialising again and again, each time with the node
//! that failed removed, so one run lists them all. Each message is then reworded.
use std::path::Path;

use serde_yaml::Value;

use super::nearest::{distance, TYPO_DISTANCE};
use super::position::{Pos, PositionIndex};
use super::raw::RawConfig;
use super::{ConfigError, Diagnostic};

/// Most problems reported from one file; past this the rest is noise.
const MAX_PROBLEMS: usize = 50;

/// Tabs used as whitespace, all of them: YAML forbids them in indentation and the
/// parser would report only the first, as "found character that cannot start any token".
pub(super) fn tabs_check(text: &str, file: &Path) -> Result<(), ConfigError> {
    let d: Vec<Diagnostic> = tabs(text)
        .into_iter()
        .map(|pos| diag(file, Some(pos), None, TAB_MESSAGE.to_string()))
        .collect();
    if d.is_empty() {
        Ok(())
    } else {
        Err(ConfigError { diagnostics: d })
    }
}

/// Keys written twice in one mapping, each reported at the duplicate.
pub(super) fn duplicates(file: &Path, index: &PositionIndex) -> Vec<Diagnostic> {
    let mut d = Vec::new();
    for (path, first, dup) in index.duplicates() {
        let key = path.rsplit('.').next().unwrap_or(&path).to_string();
        let msg = format!("`{key}` is written twice; the first is at line {}", first.0);
        d.push(diag(file, Some(dup), Some(path), msg));
    }
    d
}

/// A syntax error as the only diagnostic: the YAML parser cannot go on after one.
/// A key written twice is left to [`duplicates`], which names both places.
pub(super) fn syntax_check(text: &str, file: &Path) -> Result<(), ConfigError> {
    match serde_yaml::from_str::<Value>(text) {
        Err(e) if !e.to_string().contains("duplicate entry") => Err(ConfigError {
            diagnostics: vec![syntax(&e, file)],
        }),
        _ => Ok(()),
    }
}

const TAB_MESSAGE: &str =
    "a tab character: YAML indents with spaces only; replace the tab with spaces";

/// Positions of tabs used as whitespace (outside quotes and comments).
fn tabs(text: &str) -> Vec<Pos> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut quote: Option<char> = None;
        for (col, ch) in line.chars().enumerate() {
            match (quote, ch) {
                (None, '#') => break,
                (None, '"' | '\'') => quote = Some(ch),
                (Some(q), c) if c == q => quote = None,
                (None, '\t') => out.push((n + 1, col + 1)),
                _ => {}
            }
        }
    }
    out
}

/// What deserialising the document found: the raw model once every offending
/// node is removed (None when a problem could not be pinned on a node), the
/// problems, and the nodes removed (YAML path, the message about it).
pub(super) struct Deserialized {
    pub(super) raw: Option<RawConfig>,
    pub(super) diagnostics: Vec<Diagnostic>,
    pub(super) removed: Vec<(String, String)>,
}

/// All problems serde finds in `doc`, starting from its first error on the
/// original text (`first`, when there was one), each node that failed removed
/// before the next round; the raw model of what is left, for validation.
pub(super) fn deserialize(
    mut doc: Value,
    first: Option<String>,
    file: &Path,
    index: &PositionIndex,
) -> Deserialized {
    let mut out = Deserialized {
        raw: None,
        diagnostics: Vec::new(),
        removed: Vec::new(),
    };
    let mut pending = first;
    for _ in 0..MAX_PROBLEMS {
        let error = match pending.take() {
            Some(e) => e,
            None => {
                let Ok(again) = serde_yaml::to_string(&doc) else {
                    break;
                };
                match serde_yaml::from_str::<RawConfig>(&again) {
                    Ok(raw) => {
                        out.raw = Some(raw);
                        break;
                    }
                    Err(e) => e.to_string(),
                }
            }
        };
        let (path, message) = split_path(&error);
        let Some(problem) = Problem::read(path, message) else {
            break;
        };
        if !problem.node.contains(DUPLICATE_MARK) {
            out.diagnostics.push(problem.diagnostic(file, index));
        }
        if !remove(&mut doc, &problem.node) {
            break;
        }
        out.removed.push((problem.node, problem.message));
    }
    out.diagnostics
        .sort_by_key(|d| d.position.unwrap_or((usize::MAX, usize::MAX)));
    out.diagnostics.dedup();
    out
}

/// What a duplicate key is renamed to in the text before it is removed.
const DUPLICATE_MARK: &str = "__crossbar_duplicate_";

/// The document as a YAML value with every repeat of a key dropped (the first
/// stays), so one run reports the duplicates and every other problem too. The YAML
/// parser refuses a document with a duplicate key, so each repeat is renamed in the
/// text first, then removed from the value. None when the text does not parse.
pub(super) fn tolerant_value(text: &str, index: &PositionIndex) -> Option<Value> {
    let duplicates = index.duplicates();
    if duplicates.is_empty() {
        return serde_yaml::from_str(text).ok();
    }
    let mut lines: Vec<Vec<char>> = text.split('\n').map(|l| l.chars().collect()).collect();
    let mut renamed = Vec::new();
    for (i, (path, _, _)) in duplicates.iter().enumerate() {
        let cut = path.rfind(['.', ']']).map_or(0, |c| c + 1);
        let (parent, key) = (path[..cut].trim_end_matches('.'), &path[cut..]);
        for n in 1.. {
            let Some((line, col)) = index.key_at(path, n) else {
                break;
            };
            let new = format!("{DUPLICATE_MARK}{i}_{n}");
            let l = lines.get_mut(line.wrapping_sub(1))?;
            if !rename(l, col.wrapping_sub(1), key, &new) {
                return None;
            }
            renamed.push(if parent.is_empty() {
                new
            } else {
                format!("{parent}.{new}")
            });
        }
    }
    let text: Vec<String> = lines.into_iter().map(String::from_iter).collect();
    let mut doc = serde_yaml::from_str::<Value>(&text.join("\n")).ok()?;
    for p in &renamed {
        remove(&mut doc, p);
    }
    Some(doc)
}

/// Replace `key` written at `col` of `line` (plain or quoted) with `new`.
fn rename(line: &mut Vec<char>, col: usize, key: &str, new: &str) -> bool {
    let mut at = col;
    if matches!(line.get(at), Some('"' | '\'')) {
        at += 1;
    }
    let key: Vec<char> = key.chars().collect();
    if line.get(at..at + key.len()) != Some(&key[..]) {
        return false;
    }
    line.splice(at..at + key.len(), new.chars());
    true
}

/// serde_yaml's "PATH: message at line L column C" as (path, message).
fn split_path(error: &str) -> (Option<&str>, &str) {
    let msg = match error.rfind(" at line ") {
        Some(i) => &error[..i],
        None => error,
    };
    match msg.split_once(": ") {
        Some((p, rest)) if !p.is_empty() && !p.contains([' ', '`']) => (Some(p), rest),
        _ => (None, msg),
    }
}

/// A syntax error (the YAML parser cannot go on after one): where and why.
pub(super) fn syntax(e: &serde_yaml::Error, file: &Path) -> Diagnostic {
    let position = e.location().map(|l| (l.line(), l.column()));
    let mut message = e.to_string();
    if let Some((l, c)) = position {
        message = message.replacen(&format!(" at line {l} column {c}"), "", 1);
    }
    if message == "EOF while parsing a value" {
        message = "the file is empty: it needs at least `services:`".into();
    }
    diag(file, position, None, message)
}

pub(super) fn diag(
    file: &Path,
    position: Option<Pos>,
    path: Option<String>,
    message: String,
) -> Diagnostic {
    Diagnostic {
        file: file.to_path_buf(),
        position,
        path,
        message,
    }
}

/// One type or key problem: the node to blame (and drop before the next round).
#[derive(Debug)]
struct Problem {
    /// YAML path of the offending node.
    node: String,
    /// Point at the key (unknown keys) rather than the value.
    at_key: bool,
    message: String,
}

impl Problem {
    fn read(path: Option<&str>, message: &str) -> Option<Problem> {
        let parent = path.unwrap_or("");
        if let Some(rest) = message.strip_prefix("unknown field `") {
            let (key, tail) = rest.split_once('`')?;
            return Some(Problem {
                node: join(parent, key),
                at_key: true,
                message: unknown_key(key, tail),
            });
        }
        if let Some(rest) = message.strip_prefix("missing field `") {
            let (key, _) = rest.split_once('`')?;
            return Some(Problem {
                node: parent.to_string(),
                at_key: true,
                message: format!("`{key}` is missing"),
            });
        }
        path?; // anything else without a path is not one we can blame on a node
        Some(Problem {
            node: parent.to_string(),
            at_key: false,
            message: reword(message),
        })
    }

    fn diagnostic(&self, file: &Path, index: &PositionIndex) -> Diagnostic {
        let position = if self.at_key {
            index.key_at(&self.node, 0).or_else(|| index.at(&self.node))
        } else {
            index.at(&self.node)
        };
        let path = (!self.node.is_empty()).then(|| self.node.clone());
        diag(file, position, path, self.message.clone())
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// Longest unknown key quoted in full, and compared with the known ones.
const MAX_SHOWN_KEY: usize = 64;

/// "unknown key `x`", with the likely intended key or the keys allowed there.
fn unknown_key(key: &str, tail: &str) -> String {
    let known = backquoted(tail);
    if key.chars().count() > MAX_SHOWN_KEY {
        let head: String = key.chars().take(MAX_SHOWN_KEY).collect();
        return format!(
            "unknown key `{head}...` ({} characters)",
            key.chars().count()
        );
    }
    if known.is_empty() {
        return format!("unknown key `{key}`: nothing may be set here");
    }
    match known
        .iter()
        .map(|k| (distance(key, k), k))
        .filter(|(d, _)| *d <= TYPO_DISTANCE)
        .min()
    {
        Some((_, k)) => format!("unknown key `{key}`: did you mean `{k}`?"),
        None => format!("unknown key `{key}`; allowed here: {}", known.join(", ")),
    }
}

/// The `quoted` words of serde's "expected one of `a`, `b`".
fn backquoted(s: &str) -> Vec<String> {
    s.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// serde's type and value messages, in crossbar's words.
fn reword(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        if let Some((v, tail)) = rest.split_once('`') {
            let allowed = backquoted(tail);
            return format!("`{v}` is not one of: {}", allowed.join(", "));
        }
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            if let Some((found, expected)) = rest.split_once(", expected ") {
                return format!(
                    "must be {}, not {}",
                    expected_words(expected),
                    found_words(found)
                );
            }
        }
    }
    expected_words(message)
}

/// What serde expected (a Rust type or a visitor's text) as a reader says it.
fn expected_words(expected: &str) -> String {
    let e = expected.trim();
    match e {
        // Not "0 or more": the key's own range (`workers`: 1..=1024) is checked and
        // said once the value is a number.
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a string" | "a borrowed string" => "text".into(),
        "a sequence" => "a list ([a, b] or lines starting with `- `)".into(),
        "a map" => "a mapping (`key: value` lines)".into(),
        _ if e.starts_with("struct ") || e.starts_with("a map") => {
            "a mapping (`key: value` lines)".into()
        }
        _ if e.starts_with("one of ") || e.starts_with("enum ") => "one of the listed words".into(),
        _ => e.to_string(),
    }
}

/// What serde found, in plain words.
fn found_words(found: &str) -> String {
    let f = found.trim();
    if let Some(s) = f.strip_prefix("string ") {
        return format!("the text {s}");
    }
    for (serde, ours) in [
        ("integer ", "the number "),
        ("floating point ", "the number "),
        ("boolean ", ""),
    ] {
        if let Some(v) = f.strip_prefix(serde) {
            return format!("{ours}{}", v.trim_matches('`'));
        }
    }
    match f {
        "sequence" => "a list".into(),
        "map" => "a mapping".into(),
        "unit value" => "nothing (an empty value or null)".into(),
        other => other.to_string(),
    }
}

/// Drop the node at `path` from the document; false when there is none.
fn remove(doc: &mut Value, path: &str) -> bool {
    if path.is_empty() {
        return false;
    }
    let steps = steps(path);
    let Some((last, parents)) = steps.split_last() else {
        return false;
    };
    let mut node = doc;
    for step in parents {
        let next = match step {
            Step::Key(k) => node.get_mut(k.as_str()),
            Step::Index(i) => node.get_mut(*i),
        };
        match next {
            Some(n) => node = n,
            None => return false,
        }
    }
    match (last, node) {
        (Step::Key(k), Value::Mapping(m)) => m.remove(k.as_str()).is_some(),
        (Step::Index(i), Value::Sequence(s)) if *i < s.len() => {
            s.remove(*i);
            true
        }
        _ => false,
    }
}

#[derive(Debug, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// `a.b[2].c` -> Key(a), Key(b), Index(2), Key(c).
fn steps(path: &str) -> Vec<Step> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let mut rest = part;
        if let Some(i) = rest.find('[') {
            if i > 0 {
                out.push(Step::Key(rest[..i].to_string()));
            }
            rest = &rest[i..];
            while let Some(r) = rest.strip_prefix('[') {
                let Some((n, tail)) = r.split_once(']') else {
                    break;
                };
                if let Ok(n) = n.parse() {
                    out.push(Step::Index(n));
                }
                rest = tail;
            }
        } else {
            out.push(Step::Key(rest.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_steps() {
        assert_eq!(
            steps("services.p.backends[2].name"),
            vec![
                Step::Key("services".into()),
                Step::Key("p".into()),
                Step::Key("backends".into()),
                Step::Index(2),
                Step::Key("name".into())
            ]
        );
    }

    #[test]
    fn tabs_outside_quotes_and_comments() {
        assert_eq!(tabs("a:\n\tb: 1\nc: \"\t\" # \t\n"), vec![(2, 1)]);
    }

    #[test]
    fn serde_words_become_ours() {
        assert_eq!(
            reword("invalid type: string \"x\", expected u64"),
            "must be a whole number, not the text \"x\""
        );
        assert_eq!(
            reword("invalid type: string \"x\", expected struct RawService"),
            "must be a mapping (`key: value` lines), not the text \"x\""
        );
        assert_eq!(
            reword("unknown variant `random`, expected one of `roundrobin`, `first`"),
            "`random` is not one of: roundrobin, first"
        );
        assert_eq!(distance("weigth", "weight"), 2);
        assert_eq!(
            unknown_key("weigth", ", expected one of `name`, `weight`"),
            "unknown key `weigth`: did you mean `weight`?"
        );
    }
}
