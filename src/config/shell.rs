//! Settings written into a command line that the user may paste into a shell.

/// `text` as one shell word: as it is when every character is safe in a shell word, else in
/// single quotes, so that a list value's `[`, `]` and `>` are neither a glob nor a
/// redirection (`roundup_power2_divisions:[256:1,>:4]`).
pub fn shell_word(text: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-.,:/%+=@".contains(c);
    if !text.is_empty() && text.chars().all(safe) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_word;

    /// Each word, pasted into `sh`, reads back as one word holding the text it was made from
    /// (an empty text too: an empty value must not vanish from a command line).
    #[test]
    fn a_shell_reads_each_word_back_as_its_text() {
        let texts = [
            "max_split_size_mb:128,trace:/tmp/cachealloc-%p.jsonl",
            "roundup_power2_divisions:[256:1,>:4]",
            "stats_file:/tmp/it's here",
            "expandable_segments:True,garbage_collection_threshold:0.6",
            "",
            "a*b?c$HOME`x`;y|z&",
        ];
        for text in texts {
            let word = shell_word(text);
            let dir = tempfile::tempdir().unwrap();
            let out = std::process::Command::new("sh")
                .current_dir(dir.path())
                .arg("-c")
                .arg(format!("set -- {word}; printf '%s|%s' \"$#\" \"$1\""))
                .output()
                .unwrap();
            let read = String::from_utf8_lossy(&out.stdout);
            assert_eq!(read, format!("1|{text}"), "{word}");
            assert!(
                std::fs::read_dir(dir.path()).unwrap().next().is_none(),
                "{word}"
            );
        }
        assert_eq!(shell_word("max_split_size_mb:128"), "max_split_size_mb:128");
        assert_eq!(
            shell_word("roundup_power2_divisions:[256:1,>:4]"),
            "'roundup_power2_divisions:[256:1,>:4]'"
        );
    }
}
