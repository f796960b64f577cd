//! Indentation mistakes, said as such: a key moved left or right of the block it
//! belongs to makes the YAML parser report something unrelated (`did not find
//! expected key`, `mapping values are not allowed in this context`, often on the
//! next line), or makes it a key of the wrong block (`unknown key `server_name`:
//! did you mean `server_names`?`).
//!
//! A scan of the lines keeps the open blocks' indentations. A key line indented to
//! no open block, or deeper than a key that already has its value, is suspect; so
//! is a key the schema does not know where it sits. Each suspect is moved (with the
//! lines under it) to the neighbouring blocks' indentations in turn, and the file
//! analysed again: the first place where the file parses and the key is known is
//! the one the message names, with its column. After a syntax error is explained
//! this way, the analysis goes on with the corrected text, so the rest of the file
//! is checked in the same run.
use std::path::Path;

use super::problems::diag;
use super::validate::{analyse_syntax_ok, Analysis};
use super::Diagnostic;

/// Indentation mistakes explained in one run; more are left for the next one.
const MAX_FIXES: usize = 10;
/// Unknown keys tried for an indentation mistake (each try re-analyses the file).
const MAX_KEY_TRIES: usize = 10;
/// Columns tried per suspect line: the nearest blocks; a key is rarely off by more.
const MAX_CANDIDATES: usize = 6;
/// Files larger than this get no indentation diagnosis (each try re-parses the
/// file); a crossbar config is a few KiB.
const MAX_DIAGNOSED_BYTES: usize = 256 * 1024;

/// Analyse `text`; with `diagnose`, explain syntax errors and unknown keys that
/// are indentation mistakes.
pub(super) fn analyse(text: &str, file: &Path, diagnose: bool) -> Analysis {
    let first = analyse_syntax_ok(text, file);
    if !diagnose || first.diagnostics.is_empty() || text.len() > MAX_DIAGNOSED_BYTES {
        return first;
    }
    let mut text = text.to_string();
    let mut fixes = Vec::new();
    let mut current = first;
    while current.syntax_error && fixes.len() < MAX_FIXES {
        let Some((fix, fixed, next)) = fix_syntax(&text, file, &current) else {
            break;
        };
        fixes.push(fix);
        text = fixed;
        current = next;
    }
    if !current.syntax_error {
        explain_unknown_keys(&text, file, &mut current.diagnostics);
    }
    if fixes.is_empty() {
        return current;
    }
    fixes.extend(current.diagnostics);
    fixes.sort_by_key(|d| d.position.unwrap_or((usize::MAX, usize::MAX)));
    Analysis {
        config: None,
        diagnostics: fixes,
        syntax_error: current.syntax_error,
    }
}

/// The first suspect line at or before the syntax error, moved where the file
/// parses (best: and its key is known there); the message and the corrected text.
/// A line deeper than the key above it may as well mean that key is the one out
/// of place (dedented out of its block): that key is tried too.
fn fix_syntax(text: &str, file: &Path, a: &Analysis) -> Option<(Diagnostic, String, Analysis)> {
    let err_line = a.diagnostics.first()?.position?.0;
    let places = scan(text);
    let at = places
        .iter()
        .position(|p| p.suspect.is_some() && p.line <= err_line)?;
    let mut tries = vec![&places[at]];
    if places[at].suspect == Some(Suspect::UnderValue) && at > 0 {
        tries.push(&places[at - 1]);
    }
    let mut fallback = None;
    for place in tries {
        for cand in place.candidates.iter().take(MAX_CANDIDATES) {
            let fixed = reindent(text, place, cand.indent);
            let b = analyse_syntax_ok(&fixed, file);
            if b.syntax_error {
                continue;
            }
            let d = diag(file, Some(place.pos()), None, message(place, cand));
            if !any_at(&b.diagnostics, place.line) {
                return Some((d, fixed, b));
            }
            fallback.get_or_insert((d, fixed, b));
        }
    }
    fallback
}

/// Replace each "unknown key" that is known one block deeper or shallower with
/// an indentation message. The move must leave every other problem reported as
/// it is: one whose fix only turns another problem into a different (or raw
/// parser) error is no fix.
fn explain_unknown_keys(text: &str, file: &Path, diagnostics: &mut [Diagnostic]) {
    let places = scan(text);
    let before = diagnostics.len();
    let reported: Vec<(Option<(usize, usize)>, String)> = diagnostics
        .iter()
        .map(|d| (d.position, d.message.clone()))
        .collect();
    let mut tries = 0;
    for d in diagnostics.iter_mut() {
        let Some((line, _)) = d.position else {
            continue;
        };
        if !d.message.starts_with("unknown key `") || tries >= MAX_KEY_TRIES {
            continue;
        }
        let Some(place) = places.iter().find(|p| p.line == line) else {
            continue;
        };
        tries += 1;
        for cand in place.candidates.iter().take(MAX_CANDIDATES) {
            let b = analyse_syntax_ok(&reindent(text, place, cand.indent), file);
            let fewer = b.diagnostics.len() < before;
            let others_as_they_were = b.diagnostics.iter().all(|x| {
                reported
                    .iter()
                    .any(|(p, m)| *p == x.position && *m == x.message)
            });
            if !b.syntax_error && fewer && others_as_they_were && !any_at(&b.diagnostics, line) {
                d.message = message(place, cand);
                break;
            }
        }
    }
}

/// A problem reported on `line`.
fn any_at(diagnostics: &[Diagnostic], line: usize) -> bool {
    diagnostics
        .iter()
        .any(|d| d.position.is_some_and(|p| p.0 == line))
}

fn message(place: &Place, cand: &Level) -> String {
    let (at, to) = (place.indent + 1, cand.indent + 1);
    let key = &place.key;
    let whose = match &cand.opener {
        Some((line, k)) => format!("`{k}:` (line {line}), whose keys are at column {to}"),
        None => format!("the top level (column {to})"),
    };
    let here = match place.suspect {
        Some(Suspect::NoBlock) => format!("column {at} lines up with no block here"),
        Some(Suspect::UnderValue) => {
            format!("at column {at} it is deeper than the key above it, which has its value")
        }
        None => match &place.parent {
            Some((_, k)) => format!("it is not a key of `{k}:`, where column {at} puts it"),
            None => format!("it is not a top-level key, where column {at} puts it"),
        },
    };
    format!("indentation: `{key}`: {here}; it belongs to {whose}: indent it to column {to}")
}

/// Why a line's indentation is suspect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suspect {
    /// Between the indentations of two open blocks.
    NoBlock,
    /// Deeper than the key above it, which has a value on its own line.
    UnderValue,
}

/// An open block: its keys' indentation and the key that opened it.
#[derive(Debug, Clone)]
struct Level {
    indent: usize,
    /// The key whose value this block is (line, key); None at the top level.
    opener: Option<(usize, String)>,
}

/// A key line, with where else it could belong.
#[derive(Debug, Clone)]
struct Place {
    line: usize,
    indent: usize,
    key: String,
    /// The key of the block it sits in.
    parent: Option<(usize, String)>,
    /// Its value is on its line: the lines under it are not its block.
    has_value: bool,
    suspect: Option<Suspect>,
    /// The blocks it could belong to instead, nearest first.
    candidates: Vec<Level>,
}

impl Place {
    fn pos(&self) -> (usize, usize) {
        (self.line, self.indent + 1)
    }
}

/// One open block while scanning.
#[derive(Debug, Clone)]
struct Open {
    level: Level,
    /// The last key written at this level: (line, key, has a value on its line).
    last: Option<(usize, String, bool)>,
    /// A list's level: its entries start with `- `.
    list: bool,
}

/// The key lines of `text` (not list items), each with its candidates.
fn scan(text: &str) -> Vec<Place> {
    let mut out = Vec::new();
    let mut stack: Vec<Open> = Vec::new();
    let mut skip_deeper_than: Option<usize> = None;
    let mut flow_depth: i32 = 0;
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let indent = raw.len() - raw.trim_start_matches(' ').len();
        let body = raw[indent..].trim_end();
        if flow_depth > 0 {
            flow_depth += flow_balance(body);
            continue;
        }
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if let Some(d) = skip_deeper_than {
            if indent > d {
                continue;
            }
            skip_deeper_than = None;
        }
        if body.starts_with("---") || body.starts_with("...") || body.starts_with('%') {
            stack.clear();
            continue;
        }
        let (key_indent, content, item) = match body.strip_prefix('-') {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => {
                let spaces = rest.len() - rest.trim_start().len();
                (indent + 1 + spaces, rest.trim_start(), true)
            }
            _ => (indent, body, false),
        };
        let key = split_key(content);
        flow_depth = flow_balance(content).max(0);
        if let Some((_, value)) = &key {
            if is_block_scalar(value) {
                skip_deeper_than = Some(key_indent.saturating_sub(usize::from(item)));
            }
        }
        let place = step(&mut stack, line, indent, item, key_indent, key);
        out.extend(place);
    }
    out
}

/// Place one line on the stack of open blocks; a key line (not a list item)
/// comes back as a [`Place`].
fn step(
    stack: &mut Vec<Open>,
    line: usize,
    indent: usize,
    item: bool,
    key_indent: usize,
    key: Option<(String, String)>,
) -> Option<Place> {
    // Blocks this line closes, the nearest (shallowest) first.
    let mut closed: Vec<Open> = Vec::new();
    while stack.last().is_some_and(|t| t.level.indent > indent) {
        if let Some(o) = stack.pop() {
            closed.insert(0, o);
        }
    }
    let has_value = key.as_ref().is_some_and(|(_, v)| has_value(v));
    let (deeper, suspect) = deeper_levels(stack, &closed, indent, item);
    let parent_level = parent_level(stack, indent);
    // Shallower candidates: this block's own level (when the line is deeper than
    // it) and every enclosing one, nearest first.
    let shallower: Vec<Level> = stack
        .iter()
        .rev()
        .filter(|o| o.level.indent != indent)
        .map(|o| o.level.clone())
        .collect();
    // The stack after this line.
    if stack.last().is_some_and(|t| t.level.indent == indent) {
        if let Some(top) = stack.last_mut() {
            top.last = key.as_ref().map(|(k, _)| (line, k.clone(), has_value));
        }
    } else {
        stack.push(Open {
            level: parent_level.clone(),
            last: key.as_ref().map(|(k, _)| (line, k.clone(), has_value)),
            list: false,
        });
    }
    if item {
        if let Some(top) = stack.last_mut() {
            top.last = None; // an item has no key at the dash's level
            top.list = true;
        }
        let opener = parent_level.opener.clone();
        stack.push(Open {
            level: Level {
                indent: key_indent,
                opener,
            },
            last: key.map(|(k, _)| (line, k, has_value)),
            list: false,
        });
        return None;
    }
    let (key, _) = key?;
    let mut candidates = deeper;
    candidates.extend(shallower);
    Some(Place {
        line,
        indent,
        key,
        parent: parent_level.opener,
        has_value,
        suspect,
        candidates,
    })
}

/// The levels deeper than this line that it may have meant (the blocks it closes,
/// and the block a key without a value just opened), and what looks wrong with
/// its place.
fn deeper_levels(
    stack: &[Open],
    closed: &[Open],
    indent: usize,
    item: bool,
) -> (Vec<Level>, Option<Suspect>) {
    let mut suspect = None;
    // A key never belongs at a list's dashes.
    let mut deeper: Vec<Level> = closed
        .iter()
        .filter(|o| !o.list)
        .map(|o| o.level.clone())
        .collect();
    match stack.last() {
        Some(top) if top.level.indent == indent => {
            if top.list && !item {
                suspect = Some(Suspect::NoBlock);
            }
            if let (true, Some((l, k, false))) = (closed.is_empty(), &top.last) {
                deeper.push(Level {
                    indent: indent + 2,
                    opener: Some((*l, k.clone())),
                });
            }
        }
        Some(top) => {
            if !closed.is_empty() {
                suspect = Some(Suspect::NoBlock);
            } else if matches!(top.last, Some((_, _, true))) && !item {
                suspect = Some(Suspect::UnderValue);
            }
        }
        None => {}
    }
    (deeper, suspect)
}

/// The level a line at `indent` stands at: the open block there, else a new block
/// under the last key.
fn parent_level(stack: &[Open], indent: usize) -> Level {
    match stack.last() {
        Some(top) if top.level.indent == indent => top.level.clone(),
        Some(top) => Level {
            indent,
            opener: top.last.as_ref().map(|(l, k, _)| (*l, k.clone())),
        },
        None => Level {
            indent,
            opener: None,
        },
    }
}

/// `key: value` as (key, value); quoted keys unquoted. None when the text is not
/// a mapping entry.
fn split_key(content: &str) -> Option<(String, String)> {
    let (key, rest) = match content.chars().next()? {
        q @ ('"' | '\'') => {
            let end = content[1..].find(q)? + 1;
            (content[1..end].to_string(), &content[end + 1..])
        }
        '{' | '[' | '#' | '&' | '*' | '!' | '|' | '>' => return None,
        _ => {
            let at = content
                .find(": ")
                .or_else(|| content.ends_with(':').then(|| content.len() - 1))?;
            (content[..at].trim_end().to_string(), &content[at..])
        }
    };
    let value = rest.strip_prefix(':')?;
    if !(value.is_empty() || value.starts_with(' ')) {
        return None;
    }
    Some((key, value.trim().to_string()))
}

/// A value written on the key's line (not a comment, an anchor alone or a block
/// scalar indicator).
fn has_value(v: &str) -> bool {
    let v = v.trim();
    !(v.is_empty()
        || v.starts_with('#')
        || is_block_scalar(v)
        || (v.starts_with('&') && !v.contains(' ')))
}

fn is_block_scalar(v: &str) -> bool {
    let v = v.split(" #").next().unwrap_or(v).trim();
    v.starts_with('|') || v.starts_with('>')
}

/// Open minus closed flow brackets on a line, outside quotes and comments.
fn flow_balance(s: &str) -> i32 {
    let mut depth = 0;
    let mut quote = None;
    for c in s.chars() {
        match (quote, c) {
            (None, '#') => break,
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            _ => {}
        }
    }
    depth
}

/// `text` with `place`'s line and the lines under it moved to `to`.
fn reindent(text: &str, place: &Place, to: usize) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_block = false;
    for (n, raw) in text.split('\n').enumerate() {
        let indent = raw.len() - raw.trim_start_matches(' ').len();
        let blank = raw.trim().is_empty();
        if n + 1 == place.line {
            in_block = true;
        } else if in_block && (place.has_value || (!blank && indent <= place.indent)) {
            in_block = false;
        }
        if n > 0 {
            out.push('\n');
        }
        if in_block && !blank {
            let kept = (indent + to).saturating_sub(place.indent);
            out.push_str(&" ".repeat(kept));
            out.push_str(&raw[indent..]);
        } else {
            out.push_str(raw);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEDENTED_PATH: &str = "\
services:
  p:
    listen: [\"10.0.0.1:8140\"]
    health:
      check: https
     path: /status/v1/simple
    backends:
      - { name: a, address: \"10.0.1.1:8140\" }
";

    #[test]
    fn a_line_between_two_blocks_is_suspect_with_both_as_candidates() {
        let places = scan(DEDENTED_PATH);
        let path = places.iter().find(|p| p.key == "path").unwrap();
        assert_eq!(path.suspect, Some(Suspect::NoBlock));
        let cols: Vec<usize> = path.candidates.iter().map(|c| c.indent).collect();
        assert_eq!(cols, [6, 4, 2, 0]);
        assert_eq!(path.candidates[0].opener, Some((4, "health".into())));
        assert!(places
            .iter()
            .filter(|p| p.key != "path")
            .all(|p| p.suspect.is_none()));
    }

    #[test]
    fn keys_split_and_list_items_open_a_block() {
        assert_eq!(split_key("a: 1"), Some(("a".into(), "1".into())));
        assert_eq!(split_key("a:"), Some(("a".into(), String::new())));
        assert_eq!(split_key("\"a b\": x"), Some(("a b".into(), "x".into())));
        assert_eq!(split_key("http://x"), None);
        assert_eq!(split_key("{ a: 1 }"), None);
        let places = scan("a:\n  - name: x\n    address: y\n  - name: z\nb: 1\n");
        let keys: Vec<(&str, Option<Suspect>)> =
            places.iter().map(|p| (p.key.as_str(), p.suspect)).collect();
        assert_eq!(keys, [("a", None), ("address", None), ("b", None)]);
    }

    #[test]
    fn block_scalars_and_flow_lines_are_skipped() {
        let places = scan("a: |\n  text: here\n   more\nb: [1,\n  2]\nc: 3\n");
        let keys: Vec<&str> = places.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert!(places.iter().all(|p| p.suspect.is_none()));
    }

    /// The shipped config with random lines re-indented, cut or joined: never a
    /// panic, and every file that fails says why.
    #[test]
    fn mangled_configs_never_panic() {
        let base: Vec<&str> = include_str!("../../conf/crossbar.yaml").lines().collect();
        let mut rng = fastrand::Rng::with_seed(27);
        for _ in 0..200 {
            let mut lines: Vec<String> = base.iter().map(|l| l.to_string()).collect();
            for _ in 0..rng.usize(1..4) {
                let i = rng.usize(..lines.len());
                let l = lines[i].trim_start().to_string();
                match rng.u8(..3) {
                    0 => lines[i] = format!("{}{l}", " ".repeat(rng.usize(..12))),
                    1 => {
                        let cut = rng.usize(..=lines[i].len());
                        if lines[i].is_char_boundary(cut) {
                            lines[i].truncate(cut);
                        }
                    }
                    _ => lines[i] = format!("{}: {l}", lines[i]),
                }
            }
            let text = lines.join("\n");
            if let Err(e) = crate::config::Config::from_str_at(&text, Path::new("m.yaml")) {
                assert!(!e.diagnostics.is_empty());
            }
        }
    }

    #[test]
    fn reindent_moves_the_line_and_its_block() {
        let text = "a:\n  b: 1\nc:\n  d: 2\ne: 3\n";
        let place = scan(text).into_iter().find(|p| p.key == "c").unwrap();
        assert_eq!(
            reindent(text, &place, 2),
            "a:\n  b: 1\n  c:\n    d: 2\ne: 3\n"
        );
    }
}
