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

/// A deterministic name: `prefix-suffix`, cut to fit 63 characters while
/// keeping the suffix, so that a name derived from a long parent stays a
/// valid DNS label.
pub fn child_name(prefix: &str, suffix: &str) -> String {
    let max_prefix = 63usize.saturating_sub(suffix.len() + 1);
    let mut p: String = prefix.chars().take(max_prefix).collect();
    while p.ends_with('-') {
        p.pop();
    }
    format!("{p}-{suffix}")
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
        let n = child_name(&"x".repeat(80), "eval-5f2c");
        assert!(is_dns_label(&n), "{n}");
        assert!(n.ends_with("-eval-5f2c"));
    }
}
