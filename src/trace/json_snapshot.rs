//! Memory snapshots written as JSON (`json.dump(torch.cuda.memory._snapshot(), f)`), decoded
//! into the values the pickle decoder gives, so that `snapshot` reads them with every check it
//! makes of a pickle.
//!
//! JSON holds what the pickle holds, less some of Python's types: a tuple is written as a list
//! (the snapshot reader takes either), `None` as `null`, and dict keys as strings.
//!
//! The text is read by `serde_json`'s streaming deserializer from a buffered reader (a JSON
//! snapshot can be hundreds of MB: it repeats the stack frames a pickle shares), and a
//! [`Visitor`] builds the pickle decoder's arena of values as the deserializer meets them:
//! there is no `serde_json::Value` tree beside the values kept, so memory stays proportional
//! to what is built. Equal strings share one object, as Python's pickler shares them: a JSON
//! snapshot repeats the same keys, file names and frame names in every entry. Broken text is
//! refused with `serde_json`'s message, which names the line and column.
//!
//! Where this differs from Python's `json.load`, none of which a memory snapshot written by
//! `json.dump` holds:
//! - an integer beyond 64 bits reaches the visitor as a float (`serde_json` reads it so
//!   without its crate-wide `arbitrary_precision` feature); every field that needs an integer
//!   refuses a float, and `snapshot` names such a number as too large for 64 bits;
//! - `NaN`, `Infinity` and `-Infinity`, which `json.dump` writes for such floats, are refused
//!   as not JSON, as is a string holding a lone UTF-16 surrogate escape;
//! - nesting is limited to `serde_json`'s 128 levels (a snapshot nests a few), which also
//!   keeps the visitor's recursion shallow.
//!
//! Which files are JSON snapshots is told by their first bytes ([`json_start`]): JSON whose
//! first key is one of a snapshot's, or a list whose first item is a segment dict
//! (`torch.cuda.memory_snapshot()`). Other JSON (a profiler trace, say) is left to the caller
//! to refuse without reading the rest.

use std::fmt;
use std::io::BufRead;

use rustc_hash::FxHashMap;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::error::Category;

use super::pickle::{Pickle, PyObj, PyValue};

/// The keys of `torch.cuda.memory._snapshot()`'s dict: `json.dump` writes one of them first
/// (`segments` in the dict's order, `allocator_settings` or `device_traces` with
/// `sort_keys=True`).
const SNAPSHOT_KEYS: [&[u8]; 6] = [
    b"\"segments\"",
    b"\"device_traces\"",
    b"\"allocator_settings\"",
    b"\"external_annotations\"",
    b"\"host_segments\"",
    b"\"host_traces\"",
];

/// What JSON text a file's first bytes begin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum JsonStart {
    /// A memory snapshot: a dict whose first key is one of a snapshot's, or a list whose first
    /// item is a segment dict (`device` first, `total_size` among its keys; or, its keys
    /// sorted, `active_size` first, `address` among them).
    Snapshot,
    /// Other JSON: an object or a list that does not begin as a snapshot does.
    Other,
}

/// What JSON `head`, the first bytes of a file, begins; `None` when it does not begin with an
/// object or a list.
pub(super) fn json_start(head: &[u8]) -> Option<JsonStart> {
    fn after(text: &[u8], open: u8) -> Option<&[u8]> {
        text.strip_prefix(&[open]).map(<[u8]>::trim_ascii_start)
    }
    let text = head.trim_ascii_start();
    let snapshot = if let Some(first_key) = after(text, b'{') {
        SNAPSHOT_KEYS.iter().any(|key| first_key.starts_with(key))
    } else {
        let list = after(text, b'[')?;
        let holds = |text: &[u8], key: &[u8]| text.windows(key.len()).any(|w| w == key);
        after(list, b'{').is_some_and(|segment| {
            // PyTorch's own order puts `device` first; `sort_keys`, `active_size` then `address`.
            segment.starts_with(b"\"device\"") && holds(segment, b"\"total_size\"")
                || segment.starts_with(b"\"active_size\"") && holds(segment, b"\"address\"")
        })
    };
    Some(if snapshot {
        JsonStart::Snapshot
    } else {
        JsonStart::Other
    })
}

/// Why JSON text could not be decoded.
#[derive(Debug)]
pub(super) enum JsonError {
    /// Reading the text failed.
    Io(std::io::Error),
    /// The text is not JSON: what was wrong, and at which line and column.
    Syntax(String),
}

/// Decode one JSON value, the whole of `text`, into the pickle decoder's values.
pub(super) fn decode(text: impl BufRead) -> Result<Pickle, JsonError> {
    let mut json = serde_json::Deserializer::from_reader(text);
    let mut arena = Arena::default();
    let root = Value(&mut arena)
        .deserialize(&mut json)
        .and_then(|root| json.end().map(|()| root))
        .map_err(json_error)?;
    Ok(Pickle::from_parts(arena.objs, root))
}

/// `serde_json`'s error as ours: a failure to read stays an I/O error; a message about the
/// text names the line and column.
fn json_error(e: serde_json::Error) -> JsonError {
    match e.classify() {
        Category::Io => JsonError::Io(e.into()),
        Category::Eof => JsonError::Syntax(format!("truncated: {e}")),
        Category::Syntax | Category::Data => JsonError::Syntax(e.to_string()),
    }
}

/// The values built so far, and each string's object (by its text), to share equal ones.
#[derive(Default)]
struct Arena {
    objs: Vec<PyObj>,
    strings: FxHashMap<String, usize>,
}

impl Arena {
    fn push(&mut self, obj: PyObj) -> PyValue {
        self.objs.push(obj);
        PyValue::Obj(self.objs.len() - 1)
    }

    fn string(&mut self, text: &str) -> PyValue {
        if let Some(&index) = self.strings.get(text) {
            return PyValue::Obj(index);
        }
        let value = self.push(PyObj::Str(text.to_owned()));
        if let PyValue::Obj(index) = value {
            self.strings.insert(text.to_owned(), index);
        }
        value
    }
}

/// One JSON value, built into the arena as it is read: the seed `serde_json` deserializes and
/// the visitor it calls.
struct Value<'a>(&'a mut Arena);

impl<'de> DeserializeSeed<'de> for Value<'_> {
    type Value = PyValue;

    fn deserialize<D: Deserializer<'de>>(self, json: D) -> Result<PyValue, D::Error> {
        json.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Value<'_> {
    type Value = PyValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<PyValue, E> {
        Ok(PyValue::Bool(b))
    }

    fn visit_i64<E>(self, v: i64) -> Result<PyValue, E> {
        Ok(PyValue::Int(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<PyValue, E> {
        Ok(PyValue::Int(v.into()))
    }

    /// A number with a fraction or an exponent, or an integer beyond 64 bits.
    fn visit_f64<E>(self, v: f64) -> Result<PyValue, E> {
        Ok(PyValue::Float(v))
    }

    fn visit_str<E>(self, text: &str) -> Result<PyValue, E> {
        Ok(self.0.string(text))
    }

    /// `null`.
    fn visit_unit<E>(self) -> Result<PyValue, E> {
        Ok(PyValue::None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<PyValue, A::Error> {
        let arena = self.0;
        let mut list = Vec::new();
        while let Some(item) = items.next_element_seed(Value(&mut *arena))? {
            list.push(item);
        }
        Ok(arena.push(PyObj::List(list)))
    }

    /// An object: its items in order, a repeated key kept twice (the dict's reader takes the
    /// last, as Python's dict keeps it).
    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<PyValue, A::Error> {
        let arena = self.0;
        let mut dict = Vec::new();
        while let Some(key) = entries.next_key_seed(Value(&mut *arena))? {
            let value = entries.next_value_seed(Value(&mut *arena))?;
            dict.push((key, value));
        }
        Ok(arena.push(PyObj::Dict(dict)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    fn decoded(text: &str) -> Pickle {
        decode(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e:?}"))
    }

    fn error(text: &[u8]) -> String {
        match decode(text) {
            Err(JsonError::Syntax(detail)) => detail,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(text)),
        }
    }

    /// The items of the top-level list of `text`.
    fn items(text: &str) -> (Pickle, Vec<PyValue>) {
        let p = decoded(text);
        let items = p.as_list(p.root()).unwrap().to_vec();
        (p, items)
    }

    /// Integers of 64 bits are exact; a fraction or an exponent makes a float, and so does an
    /// integer beyond 64 bits (which no field accepts).
    #[test]
    fn numbers_are_integers_to_64_bits_and_floats_beyond() {
        let (_, values) = items(
            "[0, 7, -5, 18446744073709551615, -9223372036854775808, 18446744073709551616, \
             -9223372036854775809, 0.5, 1e3, -2.5E-1, 1.0, true, false, null]",
        );
        assert_eq!(
            values,
            [
                PyValue::Int(0),
                PyValue::Int(7),
                PyValue::Int(-5),
                PyValue::Int(u64::MAX.into()),
                PyValue::Int(i64::MIN.into()),
                PyValue::Float(2f64.powi(64)),
                PyValue::Float(-(2f64.powi(63))),
                PyValue::Float(0.5),
                PyValue::Float(1000.0),
                PyValue::Float(-0.25),
                PyValue::Float(1.0),
                PyValue::Bool(true),
                PyValue::Bool(false),
                PyValue::None,
            ]
        );
    }

    /// Escapes as `json.dump` writes them (`ensure_ascii`: every non-ASCII character as
    /// `\uXXXX`, astral ones as surrogate pairs) and raw UTF-8 both read.
    #[test]
    fn strings_are_unescaped() {
        let (p, values) =
            items(r#"["a\"b\\c\/d\b\f\n\r\t", "\u00e9t\u00E9", "été", "\ud83d\ude00", ""]"#);
        let strings: Vec<_> = values.iter().map(|&v| p.as_str(v).unwrap()).collect();
        assert_eq!(
            strings,
            ["a\"b\\c/d\u{8}\u{c}\n\r\t", "été", "été", "😀", ""]
        );
    }

    /// Lists and objects nest; an object keeps its items in order, a repeated key's last
    /// value is the one read (as Python's dict keeps it); equal strings share one object.
    #[test]
    fn containers_nest_and_equal_strings_are_shared() {
        let p = decoded(
            r#" { "segments" : [ [], {}, [1, [2, {"k": [3]}]] ], "name": "x", "name": "y",
                 "other": "segments" } "#,
        );
        let top = p.as_dict(p.root()).unwrap();
        let keys: Vec<_> = top.iter().map(|&(k, _)| p.as_str(k).unwrap()).collect();
        assert_eq!(keys, ["segments", "name", "name", "other"]);
        assert_eq!(p.get(top, "name").and_then(|v| p.as_str(v)), Some("y"));
        assert_eq!(
            top[0].0, top[3].1,
            "the key and the equal value are one object"
        );
        let lists = p.as_list(p.get(top, "segments").unwrap()).unwrap();
        assert_eq!(p.type_name(lists[0]), "list");
        assert_eq!(p.as_dict(lists[1]), Some(&[][..]));
        let inner = p.as_list(p.as_list(lists[2]).unwrap()[1]).unwrap();
        let k = p.as_dict(inner[1]).unwrap();
        assert_eq!(
            p.as_list(p.get(k, "k").unwrap()).unwrap(),
            [PyValue::Int(3)]
        );
    }

    /// Nesting deeper than `serde_json`'s limit is an error, not a stack overflow; a
    /// snapshot's few levels are far below it.
    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let nested = |depth| "[".repeat(depth) + &"]".repeat(depth);
        let p = decoded(&nested(100));
        assert_eq!(p.type_name(p.root()), "list");
        let err = error(nested(1_000_000).as_bytes());
        assert!(err.contains("recursion limit exceeded"), "{err}");
    }

    /// However the reader cuts the text into buffers (a byte at a time here), the values are
    /// the same.
    #[test]
    fn values_do_not_depend_on_how_the_text_is_buffered() {
        let text = r#"{"segments": [{"name": "\u00e9t\u00e9 ab\ud83d\ude00", "n": -1234567890123456789}], "f": 1.5e-3}"#;
        let whole = decoded(text);
        let bytewise = decode(BufReader::with_capacity(1, text.as_bytes())).unwrap();
        assert_eq!(format!("{whole:?}"), format!("{bytewise:?}"));
    }

    /// Text that is not JSON is refused, saying what was wrong and at which line and column;
    /// text that ends early says it is truncated. `NaN` and `Infinity` (which a memory
    /// snapshot does not hold) and a lone surrogate escape are refused too.
    #[test]
    fn malformed_text_names_what_and_where() {
        let cases: [(&[u8], &str); 10] = [
            (
                b"",
                "truncated: EOF while parsing a value at line 1 column 0",
            ),
            (
                b"[1,\n 2",
                "truncated: EOF while parsing a list at line 2 column 2",
            ),
            (b"{\"a\" 1}", "expected `:` at line 1 column 6"),
            (b"{1: 2}", "key must be a string at line 1 column 2"),
            (b"[1,]", "trailing comma at line 1 column 4"),
            (b"[] []", "trailing characters at line 1 column 4"),
            (b"[01]", "at line 1 column 3"),
            (b"[NaN]", "expected value at line 1 column 2"),
            (
                b"[\"\\ud800\"]",
                "unexpected end of hex escape at line 1 column 9",
            ),
            (
                b"[\"a\xff\"]",
                "invalid unicode code point at line 1 column 4",
            ),
        ];
        let wrong: Vec<String> = cases
            .iter()
            .map(|&(text, says)| (String::from_utf8_lossy(text), error(text), says))
            .filter(|(_, err, says)| !err.ends_with(says))
            .map(|(text, err, says)| format!("{text:?}: {err:?} should end {says:?}"))
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// Every prefix of a document and a stream of pseudo-random bytes end in an error or a
    /// value, never a panic.
    #[test]
    fn cut_and_random_text_is_an_error_not_a_panic() {
        let text =
            br#"{"segments": [{"a": [1, -2.5e3, "x\u00e9\ud83d\ude00", null, true]}], "b": 1}"#;
        assert!(decode(&text[..]).is_ok());
        for n in 0..text.len() {
            assert!(decode(&text[..n]).is_err(), "{n} bytes");
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let alphabet = b"[]{}\",:\\u0123456789.eE+-tfnNIa \n";
        for _ in 0..5000 {
            let len = (x % 48) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    alphabet[(x % alphabet.len() as u64) as usize]
                })
                .collect();
            let _ = decode(&bytes[..]);
        }
    }

    /// A failure to read is an I/O error, not a syntax error.
    #[test]
    fn read_errors_are_io_errors() {
        struct Failing;
        impl std::io::Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("disk on fire"))
            }
        }
        let text = std::io::Read::chain(&b"{\"segments\": ["[..], Failing);
        match decode(BufReader::new(text)) {
            Err(JsonError::Io(e)) => assert_eq!(e.to_string(), "disk on fire"),
            other => panic!("{other:?}"),
        }
    }

    /// A snapshot is told by its first key (any of a snapshot's, as `sort_keys` may put
    /// another first) or by a list of segment dicts; other JSON is other; anything else is not
    /// JSON.
    #[test]
    fn snapshots_are_told_by_their_first_bytes() {
        let cases: [(&[u8], Option<JsonStart>); 13] = [
            (
                b"{\"segments\": [], \"device_traces\": []}",
                Some(JsonStart::Snapshot),
            ),
            // A snapshot of host memory alone, its keys sorted (refused later as such).
            (b"{\"host_segments\": [],", Some(JsonStart::Snapshot)),
            (b" \n{\n  \"device_traces\": [", Some(JsonStart::Snapshot)),
            (b"{\"allocator_settings\": {", Some(JsonStart::Snapshot)),
            (
                b"[{\"device\": 0, \"address\": 1, \"total_size\": 2097152",
                Some(JsonStart::Snapshot),
            ),
            // The same, its keys sorted (`json.dump(…, sort_keys=True, indent=1)`).
            (
                b"[\n {\n  \"active_size\": 0,\n  \"address\": 1,",
                Some(JsonStart::Snapshot),
            ),
            (b"[{\"active_size\": 0}]", Some(JsonStart::Other)),
            (b"{\"traceEvents\": []}", Some(JsonStart::Other)),
            (b"[{\"device\": 0}]", Some(JsonStart::Other)),
            (b"[]", Some(JsonStart::Other)),
            (b"{", Some(JsonStart::Other)),
            (b"\x80\x04\x95", None),
            (b"", None),
        ];
        for (head, start) in cases {
            assert_eq!(
                json_start(head),
                start,
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }
}
