//! "Did you mean": the nearest of some known names to a misspelt one.

/// Edit distance (insertions, deletions, substitutions, and swaps of two
/// neighbours, which is how most typos happen).
pub fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    rows[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

/// The known name nearest to `wanted`, if one is near enough to be the
/// name meant: the same but for case, or within a third of its length.
pub fn closest<'a>(wanted: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (wanted.chars().count() / 3).max(1);
    known
        .into_iter()
        .filter(|k| *k != wanted)
        .map(|k| {
            let d = if k.eq_ignore_ascii_case(wanted) {
                0
            } else {
                distance(&k.to_ascii_lowercase(), &wanted.to_ascii_lowercase())
            };
            (d, k)
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, k)| (*d, *k))
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_the_name_meant_and_strangers_find_nothing() {
        let known = ["version", "image", "replicas", "StatefulSet"];
        assert_eq!(closest("verison", known), Some("version"));
        assert_eq!(closest("imgae", known), Some("image"));
        assert_eq!(closest("Statefulset", known), Some("StatefulSet"));
        assert_eq!(closest("replica", known), Some("replicas"));
        assert_eq!(closest("owner", known), None);
        assert_eq!(closest("x", known), None);
    }
}
