//! The `PYTORCH_CUDA_ALLOC_CONF` grammar: tokenizer and `key:value(,key:value)*` structure.
//!
//! The tokenizer is PyTorch's `ConfigTokenizer`: every `,` `:` `[` `]` is a token of its own,
//! every other run of characters is a token, and whitespace (C `isspace`) is dropped everywhere,
//! also inside a token (`max_split _size_mb` reads as `max_split_size_mb`).
//!
//! The structure is checked here, before any key is looked at, so that the meaning of a value
//! (in `values`) never has to deal with stray separators:
//! - `key:value` where `value` is one token, or a list `[a:b,c:d,...]` of token pairs;
//! - pairs are separated by `,`; a trailing `,` is accepted (PyTorch accepts it, both after a
//!   pair and inside a list); an empty list `[]` is a list with no entries.
//!
//! Note: since `,` `:` `[` `]` are separators and whitespace is dropped, a value (a path, for
//! example) can contain none of them.

use super::values::NOT_A_LIST;

/// One `key:value` pair as written.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub key: String,
    pub value: Value,
}

/// A value as written: one token, or a bracketed list of `a:b` pairs.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// One token as read (whitespace dropped); `written` is the token as written when
    /// whitespace between its characters was dropped (`my dir` reads as `mydir`), which
    /// matters for a path.
    Scalar {
        text: String,
        written: Option<String>,
    },
    List(Vec<(String, String)>),
}

impl Value {
    /// The value as the user wrote it (`20`, `my dir`, `[256:1,>:8]`), for messages.
    pub fn as_written(&self) -> String {
        match self {
            Value::Scalar { text, written } => written.clone().unwrap_or_else(|| text.clone()),
            Value::List(_) => self.as_read(),
        }
    }

    /// The value as PyTorch reads it: whitespace dropped.
    pub fn as_read(&self) -> String {
        match self {
            Value::Scalar { text, .. } => text.clone(),
            Value::List(items) => {
                let inner: Vec<String> = items.iter().map(|(a, b)| format!("{a}:{b}")).collect();
                format!("[{}]", inner.join(","))
            }
        }
    }
}

fn is_separator(token: &str) -> bool {
    matches!(token, "," | ":" | "[" | "]")
}

/// C `isspace` in the "C" locale: space, `\t`, `\n`, `\v`, `\f`, `\r`.
fn is_c_space(ch: char) -> bool {
    matches!(ch, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// Split `text` into tokens exactly as PyTorch's `ConfigTokenizer` does.
pub fn tokenize(text: &str) -> Vec<String> {
    tokenize_marked(text).into_iter().map(|(t, _)| t).collect()
}

/// The tokens of `text`, each with the token as written when whitespace between its
/// characters was dropped.
fn tokenize_marked(text: &str) -> Vec<(String, Option<String>)> {
    /// A token read so far: as read, as written, and whether whitespace was dropped inside.
    #[derive(Default)]
    struct Token {
        read: String,
        written: String,
        spaced: bool,
    }
    fn finish(tokens: &mut Vec<(String, Option<String>)>, token: Token) {
        if !token.read.is_empty() {
            tokens.push((token.read, token.spaced.then_some(token.written)));
        }
    }
    let mut tokens = Vec::new();
    let mut token = Token::default();
    // Whitespace after the token's last character so far.
    let mut pending = String::new();
    for ch in text.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            finish(&mut tokens, std::mem::take(&mut token));
            tokens.push((ch.to_string(), None));
            pending.clear();
        } else if is_c_space(ch) {
            if !token.read.is_empty() {
                pending.push(ch);
            }
        } else {
            if !pending.is_empty() {
                token.spaced = true;
                token.written.push_str(&std::mem::take(&mut pending));
            }
            token.read.push(ch);
            token.written.push(ch);
        }
    }
    finish(&mut tokens, token);
    tokens
}

/// A cursor over the tokens that names what it found in its messages.
struct Cursor {
    tokens: Vec<String>,
    /// Per token: the token as written, when whitespace between its characters was dropped.
    written: Vec<Option<String>>,
    at: usize,
}

impl Cursor {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn found(&self) -> String {
        match self.peek() {
            Some(t) => format!("'{t}'"),
            None => "the end of the text".to_string(),
        }
    }

    fn take(&mut self) -> Option<String> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    /// Consume `want` or fail with `expected '<want>' <context>, found ...`.
    fn expect(&mut self, want: &str, context: &str) -> Result<(), String> {
        if self.peek() == Some(want) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!(
                "expected '{want}' {context}, found {}",
                self.found()
            ))
        }
    }

    /// Consume a non-separator token or fail with `<what>, found ...`.
    fn word(&mut self, what: &str) -> Result<String, String> {
        match self.peek() {
            Some(t) if !is_separator(t) => Ok(self.take().unwrap_or_default()),
            _ => Err(format!("{what}, found {}", self.found())),
        }
    }
}

/// What the caller knows of a key's value, for the messages about a value that is missing or
/// whose list is malformed.
pub struct ValueForm {
    /// What the value may be ("integer >= 20 (MiB)").
    pub allowed: String,
    /// Whether the value may be a bracketed list.
    pub takes_list: bool,
}

/// Parse `text` into its `key:value` pairs, in order. The error is a message without the
/// variable name (the caller adds it); `form` says what a known key's value may be.
pub fn parse_entries(
    text: &str,
    form: &dyn Fn(&str) -> Option<ValueForm>,
) -> Result<Vec<Entry>, String> {
    let (tokens, written) = tokenize_marked(text).into_iter().unzip();
    let mut cur = Cursor {
        tokens,
        written,
        at: 0,
    };
    let mut entries = Vec::new();
    while cur.peek().is_some() {
        if cur.peek() == Some(",") {
            return Err("expected a key, found ',' (an empty entry: remove the extra ',')".into());
        }
        let key = cur.word("expected a key")?;
        if let Some((k, v)) = key.split_once('=')
            && cur.peek() != Some(":")
        {
            // `k=[...]`: the list is the next token, and the value is not in `key`.
            let fix = if v.is_empty() {
                format!("write {k}: before the value")
            } else {
                format!("write {k}:{v}")
            };
            return Err(format!(
                "'{key}': a key and its value are joined by ':', not '=' ({fix})"
            ));
        }
        cur.expect(":", &format!("after key '{key}'"))?;
        let value = if cur.peek() == Some("[") {
            let start = cur.at;
            cur.at += 1;
            let items = parse_list(&mut cur, &key).map_err(|e| match form(&key) {
                // A single-value key: the list is the mistake, not its punctuation.
                Some(f) if !f.takes_list => {
                    // The list as far as it was read, up to its first ',' (what follows may
                    // be the next entries, the list being unclosed).
                    let end = (cur.at + 1).min(cur.tokens.len());
                    let read = &cur.tokens[start..end];
                    let first_entry = read.iter().position(|t| t == ",").unwrap_or(read.len());
                    let shown = read[..first_entry].concat();
                    format!("{key}:{shown}: {NOT_A_LIST}; allowed: {}", f.allowed)
                }
                Some(f) => format!("{e}; allowed: {}", f.allowed),
                None => e,
            })?;
            Value::List(items)
        } else {
            let text =
                cur.word(&format!("missing value after '{key}:'"))
                    .map_err(|e| match form(&key) {
                        Some(f) => format!("{e}; allowed: {}", f.allowed),
                        None => e,
                    })?;
            Value::Scalar {
                text,
                written: cur.written[cur.at - 1].clone(),
            }
        };
        if cur.peek().is_some() {
            let context = format!(
                "after {key}:{} (a value cannot contain ',', ':', '[' or ']')",
                value.as_written()
            );
            cur.expect(",", &context)?;
        }
        entries.push(Entry { key, value });
    }
    Ok(entries)
}

/// The entries of a list after its `[`, up to and including the closing `]`.
fn parse_list(cur: &mut Cursor, key: &str) -> Result<Vec<(String, String)>, String> {
    let mut items = Vec::new();
    loop {
        match cur.peek() {
            None => {
                return Err(format!(
                    "the list value of '{key}' is missing its closing ']'"
                ));
            }
            Some("]") => {
                cur.at += 1;
                return Ok(items);
            }
            Some(_) => {}
        }
        let what = format!("expected an 'interval:value' entry in the list of '{key}'");
        let left = cur.word(&what)?;
        cur.expect(":", &format!("after '{left}' in the list of '{key}'"))?;
        let right = cur.word(&format!(
            "missing value after '{left}:' in the list of '{key}'"
        ))?;
        match cur.peek() {
            Some(",") => cur.at += 1,
            Some("]") => {}
            None => {
                return Err(format!(
                    "the list value of '{key}' is missing its closing ']'"
                ));
            }
            _ => {
                return Err(format!(
                    "expected ',' or ']' after '{left}:{right}' in the list of '{key}', found {}",
                    cur.found()
                ));
            }
        }
        items.push((left, right));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: Value::Scalar {
                text: value.into(),
                written: None,
            },
        }
    }

    #[test]
    fn tokenizer_splits_on_separators_and_drops_whitespace() {
        assert_eq!(
            tokenize(" a : b ,c:[1: 2,>:3]\t\n"),
            [
                "a", ":", "b", ",", "c", ":", "[", "1", ":", "2", ",", ">", ":", "3", "]"
            ]
        );
        assert_eq!(tokenize("max_split _size_mb"), ["max_split_size_mb"]);
        let marked = tokenize_marked(" a b :c ,d");
        let written: Vec<Option<&str>> = marked.iter().map(|(_, w)| w.as_deref()).collect();
        assert_eq!(written, [Some("a b"), None, None, None, None], "{marked:?}");
        assert!(tokenize(" \t\n").is_empty());
    }

    #[test]
    fn pairs_and_lists_parse_in_order() {
        let entries = parse_entries("a:1, b:[256:1,>:8],c:x", &|_| None).unwrap();
        assert_eq!(entries[0], scalar("a", "1"));
        assert_eq!(
            entries[1].value,
            Value::List(vec![("256".into(), "1".into()), (">".into(), "8".into())])
        );
        assert_eq!(entries[2], scalar("c", "x"));
    }

    #[test]
    fn trailing_commas_and_empty_lists_are_accepted_like_pytorch() {
        assert_eq!(
            parse_entries("a:1,", &|_| None).unwrap(),
            vec![scalar("a", "1")]
        );
        assert_eq!(
            parse_entries("a:[1:2,]", &|_| None).unwrap()[0].value,
            Value::List(vec![("1".into(), "2".into())])
        );
        assert_eq!(
            parse_entries("a:[]", &|_| None).unwrap()[0].value,
            Value::List(vec![])
        );
        assert!(parse_entries("", &|_| None).unwrap().is_empty());
    }

    #[test]
    fn structure_errors_name_what_was_expected_and_found() {
        let cases = [
            (
                ",a:1",
                "expected a key, found ',' (an empty entry: remove the extra ',')",
            ),
            (
                "a:1,,b:2",
                "expected a key, found ',' (an empty entry: remove the extra ',')",
            ),
            ("a", "expected ':' after key 'a', found the end of the text"),
            (
                "a=1,b:2",
                "'a=1': a key and its value are joined by ':', not '=' (write a:1)",
            ),
            (
                "a=[256:1,>:4]",
                "'a=': a key and its value are joined by ':', not '=' (write a: before the value)",
            ),
            ("a,b:1", "expected ':' after key 'a', found ','"),
            ("a:", "missing value after 'a:', found the end of the text"),
            ("a:,b:1", "missing value after 'a:', found ','"),
            (
                "trace:/tmp/a:b",
                "expected ',' after trace:/tmp/a (a value cannot contain ',', ':', '[' or ']'), \
                 found ':'",
            ),
            (
                "a:1]",
                "expected ',' after a:1 (a value cannot contain ',', ':', '[' or ']'), found ']'",
            ),
            ("a:[1:2", "the list value of 'a' is missing its closing ']'"),
            (
                "a:[1:2,",
                "the list value of 'a' is missing its closing ']'",
            ),
            (
                "a:[,1:2]",
                "expected an 'interval:value' entry in the list of 'a', found ','",
            ),
            (
                "a:[1]",
                "expected ':' after '1' in the list of 'a', found ']'",
            ),
            (
                "a:[1:]",
                "missing value after '1:' in the list of 'a', found ']'",
            ),
            (
                "a:[1:2:3]",
                "expected ',' or ']' after '1:2' in the list of 'a', found ':'",
            ),
            (
                "a:[1:[2]]",
                "missing value after '1:' in the list of 'a', found '['",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_entries(text, &|_| None).unwrap_err(),
                want,
                "input {text:?}"
            );
        }
    }
}
