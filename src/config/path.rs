//! Output paths with a `%p` placeholder, so each process of a multi-process job (one per GPU,
//! `torchrun`, MPI ranks) writes its own file.

/// Replace every `%p` in `template` with `pid`; `%%` stands for a literal `%`. Any other `%`
/// is kept as written.
pub fn expand_pid(template: &str, pid: u32) -> String {
    let mut out = String::with_capacity(template.len() + 8);
    let mut chars = template.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        match chars.peek() {
            Some('p') => {
                chars.next();
                out.push_str(&pid.to_string());
            }
            Some('%') => {
                chars.next();
                out.push('%');
            }
            _ => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::expand_pid;

    #[test]
    fn percent_p_becomes_the_pid() {
        let cases = [
            ("/tmp/stats-%p.json", 4242, "/tmp/stats-4242.json"),
            ("%p/%p", 7, "7/7"),
            ("no-placeholder", 7, "no-placeholder"),
            ("100%%-%p", 9, "100%-9"),
            ("%%p", 9, "%p"),
            ("trailing%", 9, "trailing%"),
            ("%d-%p", 1, "%d-1"),
            ("", 1, ""),
        ];
        for (template, pid, want) in cases {
            assert_eq!(expand_pid(template, pid), want, "{template:?}");
        }
    }
}
