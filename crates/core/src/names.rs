//! Kubernetes name rules.

/// RFC 1123 DNS label: at most 63 lowercase alphanumerics or '-', starting
/// and ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 DNS subdomain: at most 253 characters, dot-separated DNS labels.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A deterministic name `prefix-suffix` that is a valid DNS label (63
/// characters at most), whatever the length of `prefix`: a prefix too
/// long is cut, and a hash of the whole of it goes in before the suffix,
/// so two long parents that share their first characters still get two
/// names, and the same parent always gets the same one.
pub fn child_name(prefix: &str, suffix: &str) -> String {
    let whole = format!("{prefix}-{suffix}");
    if whole.len() <= 63 {
        return whole;
    }
    let hash = crate::util::hash::short_hex(prefix.as_bytes(), 8);
    let max_prefix = 63usize.saturating_sub(suffix.len() + hash.len() + 2);
    let mut p: String = prefix.chars().take(max_prefix).collect();
    while p.ends_with('-') || p.ends_with('.') {
        p.pop();
    }
    let name = match p.is_empty() {
        true => format!("{hash}-{suffix}"),
        false => format!("{p}-{hash}-{suffix}"),
    };
    // A suffix too long for any prefix: the hash of it all.
    if name.len() > 63 {
        return crate::util::hash::short_hex(whole.as_bytes(), 16);
    }
    name
}

/// `text` as it is when it fits a DNS label's 63 characters (a label
/// value, a Service's name); otherwise its first characters and a hash
/// of the whole, deterministically.
pub fn short_name(text: &str) -> String {
    if text.len() <= 63 {
        return text.to_string();
    }
    let hash = crate::util::hash::short_hex(text.as_bytes(), 8);
    let mut p: String = text.chars().take(54).collect();
    while p.ends_with('-') || p.ends_with('.') || p.ends_with('_') {
        p.pop();
    }
    format!("{p}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_rules() {
        assert!(is_dns_label("chatbot-eval-1"));
        assert!(!is_dns_label("Chatbot"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("runbook.dev"));
        assert!(!is_dns_subdomain("runbook..dev"));
    }

    #[test]
    fn child_names_stay_valid_labels() {
        assert_eq!(child_name("chatbot", "eval-5f2c"), "chatbot-eval-5f2c");
        let n = child_name(&"x".repeat(80), "eval-5f2c");
        assert!(is_dns_label(&n), "{n}");
        assert!(n.ends_with("-eval-5f2c"));
        // Two long parents alike in their first 50 characters differ.
        let a = child_name(&format!("{}-a", "m".repeat(58)), "eval-5f2c");
        let b = child_name(&format!("{}-b", "m".repeat(58)), "eval-5f2c");
        assert_ne!(a, b);
        assert!(is_dns_label(&a) && is_dns_label(&b), "{a} {b}");
        // The same parent, the same name.
        assert_eq!(a, child_name(&format!("{}-a", "m".repeat(58)), "eval-5f2c"));
        let n = child_name("db", &"s".repeat(70));
        assert!(is_dns_label(&n), "{n}");
    }

    #[test]
    fn short_names_fit_a_label_and_stay_distinct() {
        assert_eq!(short_name("llama"), "llama");
        let a = short_name(&format!("{}-a", "m".repeat(70)));
        let b = short_name(&format!("{}-b", "m".repeat(70)));
        assert!(is_dns_label(&a) && is_dns_label(&b), "{a} {b}");
        assert_ne!(a, b);
    }
}
