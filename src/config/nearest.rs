//! The name nearest to a mistyped one: an unknown config key's likely meaning, and
//! the backend or service an operator meant (`compile2` for `compile2.lab.test-8140`).

/// Edits (Levenshtein) within which a key is a typo of another: `weigth`/`weight`.
pub(super) const TYPO_DISTANCE: usize = 2;

/// Levenshtein distance (names are short: the quadratic table is tiny).
pub(super) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The known name an operator most likely meant by `asked`: one that begins with it
/// (a backend named by its host's short name: `compile2` for
/// `compile2.lab.test-8140`), else one that contains it, else one within a typo's
/// distance (a third of its length, at least [`TYPO_DISTANCE`]); the shortest of
/// the best kind, then the first. `None` when nothing is near.
pub fn nearest<'a>(asked: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let asked_lower = asked.to_lowercase();
    let typo = TYPO_DISTANCE.max(asked.chars().count() / 3);
    known
        .into_iter()
        .filter(|k| *k != asked)
        .filter_map(|k| {
            let lower = k.to_lowercase();
            let rank = if lower.starts_with(&asked_lower) {
                0
            } else if !asked.is_empty() && lower.contains(&asked_lower) {
                1
            } else if distance(&asked_lower, &lower) <= typo {
                2
            } else {
                return None;
            };
            Some(((rank, k.len()), k))
        })
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_name_is_the_one_meant() {
        let backends = ["compile1.lab.test-8140", "compile2.lab.test-8140", "ca1"];
        assert_eq!(
            nearest("compile2", backends),
            Some("compile2.lab.test-8140")
        );
        assert_eq!(
            nearest("lab.test-8140", ["x", "compile2.lab.test-8140"]),
            Some("compile2.lab.test-8140")
        );
        assert_eq!(nearest("ca2", backends), Some("ca1"));
        assert_eq!(nearest("puppte", ["puppet", "puppetca"]), Some("puppet"));
        assert_eq!(nearest("zzz", backends), None);
        assert_eq!(
            nearest("ca1", backends),
            None,
            "the name itself is no suggestion"
        );
        assert_eq!(distance("weigth", "weight"), 2);
    }
}
