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

/// `path` as one shell word: [`shell_word`] of its text, or, where it is not UTF-8 or holds a
/// control character, bash's `$'…'` quoting with each byte that is not printable ASCII written
/// as `\xNN`, so that the command names the very file (a lossy `\u{FFFD}` would name another)
/// and is printed on one line without a character a terminal acts on (a newline, a tab, an
/// escape sequence, which quotes would keep as they are).
pub fn shell_path(path: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    if let Some(text) = path.to_str().filter(|t| !t.chars().any(char::is_control)) {
        return shell_word(text);
    }
    let mut word = String::from("$'");
    for &byte in path.as_os_str().as_bytes() {
        match byte {
            b'\'' | b'\\' => {
                word.push('\\');
                word.push(char::from(byte));
            }
            b' '..=b'~' => word.push(char::from(byte)),
            _ => word.push_str(&format!("\\x{byte:02x}")),
        }
    }
    word.push('\'');
    word
}

#[cfg(test)]
mod tests {
    use super::{shell_path, shell_word};

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

    /// A path that is not UTF-8, pasted into bash, names the very bytes of the path; so does
    /// a UTF-8 one with control characters, written without them; any other UTF-8 one is
    /// quoted as any word.
    #[test]
    fn bash_reads_a_path_back_as_its_bytes() {
        use std::os::unix::ffi::OsStrExt;
        let paths: [&[u8]; 5] = [
            b"/tmp/caf\xe9 it's a \\ trace.pickle",
            b"\x01\xff\n$HOME`x`",
            b"/tmp/snap shot.pickle",
            b"/tmp/a\nb\tc\x1b[31m caf\xc3\xa9.pickle",
            b"/tmp/\xc2\x85next-line",
        ];
        for bytes in paths {
            let path = std::path::Path::new(std::ffi::OsStr::from_bytes(bytes));
            let word = shell_path(path);
            let out = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!("printf '%s' {word}"))
                .output()
                .unwrap();
            assert_eq!(out.stdout, bytes, "{word}");
            assert!(!word.chars().any(char::is_control), "{word:?}");
        }
        assert_eq!(
            shell_path(std::path::Path::new("/tmp/snap shot.pickle")),
            "'/tmp/snap shot.pickle'"
        );
    }
}
