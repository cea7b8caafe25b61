//! A small pickle decoder for plain data (dicts, lists, tuples, sets, strings, bytes, numbers,
//! booleans, None), protocols 0–5.
//!
//! Why not `serde-pickle`: its `Value` decoder counts memo references as they appear in the
//! byte stream and drops a memoised value after its last counted use. Python's pickler shares
//! objects freely (PyTorch snapshots share stack-frame dicts between entries), and a shared
//! container that holds further memo references expands those inner references more often than
//! they appear in the stream: decoding fails with "recursive structure found", or, with
//! `replace_recursive_structures`, silently turns the second and later copies into `None` (the
//! frame names that tell `empty_cache()` from `malloc` vanish). Its typed decoder additionally
//! fails on any integer ≥ 2^63. Here every container lives once in an arena and values refer to
//! it by index, exactly as Python shares it, so nothing is copied or lost.
//!
//! Class instances (`GLOBAL`, `REDUCE`, `BUILD`, …) are refused with a clear message: memory
//! snapshots contain only plain data. Every length is checked against the bytes that remain, so
//! hostile input ends in an error, not a panic or a huge allocation.

use rustc_hash::FxHashMap;

/// A decoded value. Containers and strings live in the [`Pickle`] arena.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    /// Any integer that fits in 128 bits.
    Int(i128),
    /// An integer wider than 128 bits (kept only as "too large").
    HugeInt,
    Float(f64),
    /// Index of a container, string or bytes object in the arena.
    Obj(usize),
}

/// A container or string in the arena.
#[derive(Clone, Debug, PartialEq)]
pub enum PyObj {
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    Set(Vec<PyValue>),
    Dict(Vec<(PyValue, PyValue)>),
}

/// A decoded pickle: the arena of objects and the top-level value.
#[derive(Clone, Debug, Default)]
pub struct Pickle {
    objs: Vec<PyObj>,
    root: Option<PyValue>,
}

impl Pickle {
    /// Values another decoder built (`json_snapshot`): `root` and the values inside `objs`
    /// refer to `objs` by index, as the pickle decoder's do.
    pub(super) fn from_parts(objs: Vec<PyObj>, root: PyValue) -> Self {
        Self {
            objs,
            root: Some(root),
        }
    }

    pub fn root(&self) -> PyValue {
        self.root.unwrap_or(PyValue::None)
    }

    pub fn obj(&self, value: PyValue) -> Option<&PyObj> {
        match value {
            PyValue::Obj(i) => self.objs.get(i),
            _ => None,
        }
    }

    /// Items of a dict, in insertion order.
    pub fn as_dict(&self, value: PyValue) -> Option<&[(PyValue, PyValue)]> {
        match self.obj(value)? {
            PyObj::Dict(items) => Some(items),
            _ => None,
        }
    }

    /// Items of a list or tuple.
    pub fn as_list(&self, value: PyValue) -> Option<&[PyValue]> {
        match self.obj(value)? {
            PyObj::List(items) | PyObj::Tuple(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_str(&self, value: PyValue) -> Option<&str> {
        match self.obj(value)? {
            PyObj::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value under string key `key` of a dict's items (the last one if repeated).
    pub fn get(&self, items: &[(PyValue, PyValue)], key: &str) -> Option<PyValue> {
        items
            .iter()
            .rev()
            .find(|(k, _)| self.as_str(*k) == Some(key))
            .map(|(_, v)| *v)
    }

    /// The value as an error message shows it: its type, and for a number or a short string
    /// the value itself (`int -5`, `float 1.0`, `str "abc"`, `list`).
    pub fn describe(&self, value: PyValue) -> String {
        let ty = self.type_name(value);
        match value {
            PyValue::None => ty.to_string(),
            PyValue::Bool(b) => format!("{ty} {}", if b { "True" } else { "False" }),
            PyValue::Int(v) => format!("{ty} {v}"),
            PyValue::HugeInt => format!("{ty} wider than 128 bits"),
            // Written as Python writes it: 1.0, not 1.
            PyValue::Float(v) if v.is_finite() && v.fract() == 0.0 => format!("{ty} {v:.1}"),
            PyValue::Float(v) => format!("{ty} {v}"),
            PyValue::Obj(_) => match self.as_str(value) {
                Some(text) if text.chars().count() <= 40 => format!("{ty} {text:?}"),
                _ => ty.to_string(),
            },
        }
    }

    /// Python's name for the value's type (for error messages).
    pub fn type_name(&self, value: PyValue) -> &'static str {
        match value {
            PyValue::None => "None",
            PyValue::Bool(_) => "bool",
            PyValue::Int(_) | PyValue::HugeInt => "int",
            PyValue::Float(_) => "float",
            PyValue::Obj(_) => match self.obj(value) {
                Some(PyObj::Str(_)) => "str",
                Some(PyObj::Bytes(_)) => "bytes",
                Some(PyObj::List(_)) => "list",
                Some(PyObj::Tuple(_)) => "tuple",
                Some(PyObj::Set(_)) => "set",
                Some(PyObj::Dict(_)) => "dict",
                None => "?",
            },
        }
    }
}

#[derive(Clone, Copy)]
enum Slot {
    Value(PyValue),
    Mark,
}

struct Machine<'a> {
    bytes: &'a [u8],
    pos: usize,
    stack: Vec<Slot>,
    memo: FxHashMap<u64, PyValue>,
    out: Pickle,
    /// The bytes ended before the pickle did (set by the failing read).
    ran_out: bool,
}

/// Decode a pickle of plain data. The error says what was wrong and at which byte offset.
pub fn decode(bytes: &[u8]) -> Result<Pickle, String> {
    let mut m = Machine::new(bytes);
    m.run()?;
    Ok(m.out)
}

/// Whether `bytes` can be the start of a pickle: `Err` with the decoder's account when a byte
/// before their end rules it out; `Ok` when they decode, or decode until they run out. (A
/// stream is judged by its first bytes before the rest is read: `/dev/zero` is not a pickle.)
pub fn check_start(bytes: &[u8]) -> Result<(), String> {
    let mut m = Machine::new(bytes);
    match m.run() {
        Err(detail) if !m.ran_out => Err(detail),
        _ => Ok(()),
    }
}

impl<'a> Machine<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Machine {
            bytes,
            pos: 0,
            stack: Vec::new(),
            memo: FxHashMap::default(),
            out: Pickle::default(),
            ran_out: false,
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let Some(end) = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
        else {
            self.ran_out = true;
            return Err(format!(
                "truncated: the file ends at byte {}, inside the {n}-byte argument at byte {}",
                self.bytes.len(),
                self.pos
            ));
        };
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len_u32(&mut self) -> Result<usize, String> {
        Ok(u32::from_le_bytes(self.take_array()?) as usize)
    }

    fn len_u64(&mut self) -> Result<usize, String> {
        usize::try_from(u64::from_le_bytes(self.take_array()?))
            .map_err(|_| format!("length too large at byte {}", self.pos))
    }

    fn line(&mut self) -> Result<&str, String> {
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        let Some(n) = rest.iter().position(|&b| b == b'\n') else {
            self.ran_out = true;
            return Err(format!(
                "truncated: the file ends at byte {}, inside the text argument at byte {}",
                self.bytes.len(),
                self.pos
            ));
        };
        let text = std::str::from_utf8(&rest[..n])
            .map_err(|_| format!("text argument is not UTF-8 at byte {}", self.pos))?;
        self.pos += n + 1;
        Ok(text)
    }

    fn push(&mut self, v: PyValue) {
        self.stack.push(Slot::Value(v));
    }

    fn new_obj(&mut self, obj: PyObj) -> PyValue {
        self.out.objs.push(obj);
        PyValue::Obj(self.out.objs.len() - 1)
    }

    fn pop(&mut self) -> Result<PyValue, String> {
        match self.stack.pop() {
            Some(Slot::Value(v)) => Ok(v),
            Some(Slot::Mark) => Err(format!("unexpected mark at byte {}", self.pos)),
            None => Err(format!("stack underflow at byte {}", self.pos)),
        }
    }

    fn top(&self) -> Result<PyValue, String> {
        match self.stack.last() {
            Some(Slot::Value(v)) => Ok(*v),
            _ => Err(format!("no value on the stack at byte {}", self.pos)),
        }
    }

    /// Pop everything down to the topmost mark (the mark too).
    fn pop_mark(&mut self) -> Result<Vec<PyValue>, String> {
        let at = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| format!("no mark on the stack at byte {}", self.pos))?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        Ok(items
            .into_iter()
            .filter_map(|s| match s {
                Slot::Value(v) => Some(v),
                Slot::Mark => None,
            })
            .collect())
    }

    fn obj_mut(&mut self, v: PyValue) -> Option<&mut PyObj> {
        match v {
            PyValue::Obj(i) => self.out.objs.get_mut(i),
            _ => None,
        }
    }

    fn extend_list(&mut self, items: Vec<PyValue>) -> Result<(), String> {
        let pos = self.pos;
        let target = self.top()?;
        match self.obj_mut(target) {
            Some(PyObj::List(list)) => {
                list.extend(items);
                Ok(())
            }
            _ => Err(format!("append to a non-list at byte {pos}")),
        }
    }

    fn extend_dict(&mut self, items: Vec<PyValue>) -> Result<(), String> {
        let pos = self.pos;
        if !items.len().is_multiple_of(2) {
            return Err(format!("odd number of dict items at byte {pos}"));
        }
        let target = self.top()?;
        match self.obj_mut(target) {
            Some(PyObj::Dict(dict)) => {
                dict.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            _ => Err(format!("setitem on a non-dict at byte {pos}")),
        }
    }

    fn extend_set(&mut self, items: Vec<PyValue>) -> Result<(), String> {
        let pos = self.pos;
        let target = self.top()?;
        match self.obj_mut(target) {
            Some(PyObj::Set(set)) => {
                set.extend(items);
                Ok(())
            }
            _ => Err(format!("additems on a non-set at byte {pos}")),
        }
    }

    fn memo_put(&mut self, id: u64) -> Result<(), String> {
        let v = self.top()?;
        self.memo.insert(id, v);
        Ok(())
    }

    fn memo_get(&mut self, id: u64) -> Result<(), String> {
        let v = *self
            .memo
            .get(&id)
            .ok_or_else(|| format!("memo entry {id} missing at byte {}", self.pos))?;
        self.push(v);
        Ok(())
    }

    fn long(&mut self, n: usize) -> Result<PyValue, String> {
        let le = self.take(n)?;
        if n == 0 {
            return Ok(PyValue::Int(0));
        }
        if n > 16 {
            return Ok(PyValue::HugeInt);
        }
        let negative = le[n - 1] & 0x80 != 0;
        let mut buf = if negative { [0xff; 16] } else { [0; 16] };
        buf[..n].copy_from_slice(le);
        Ok(PyValue::Int(i128::from_le_bytes(buf)))
    }

    fn string(&mut self, n: usize) -> Result<PyValue, String> {
        let pos = self.pos;
        let raw = self.take(n)?;
        let text = std::str::from_utf8(raw)
            .map_err(|_| format!("string is not UTF-8 at byte {pos}"))?
            .to_owned();
        Ok(self.new_obj(PyObj::Str(text)))
    }

    fn bytes_obj(&mut self, n: usize) -> Result<PyValue, String> {
        let raw = self.take(n)?.to_vec();
        Ok(self.new_obj(PyObj::Bytes(raw)))
    }

    fn run(&mut self) -> Result<(), String> {
        loop {
            let at = self.pos;
            let [op] = self.take_array::<1>().map_err(|_| {
                format!("truncated: the pickle ends at byte {at} without a STOP opcode")
            })?;
            match op {
                0x80 => {
                    let [proto] = self.take_array()?;
                    if proto > 5 {
                        return Err(format!("unsupported pickle protocol {proto}"));
                    }
                }
                0x95 => {
                    self.take(8)?;
                }
                b'.' => {
                    let root = self.pop()?;
                    self.out.root = Some(root);
                    return Ok(());
                }
                b'(' => self.stack.push(Slot::Mark),
                b'0' => {
                    self.stack
                        .pop()
                        .ok_or_else(|| format!("stack underflow at byte {at}"))?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?;
                    self.push(v);
                }
                b'N' => self.push(PyValue::None),
                0x88 => self.push(PyValue::Bool(true)),
                0x89 => self.push(PyValue::Bool(false)),
                b'I' => {
                    let v = match self.line()? {
                        "00" => PyValue::Bool(false),
                        "01" => PyValue::Bool(true),
                        text => PyValue::Int(
                            text.trim()
                                .parse()
                                .map_err(|_| format!("bad INT argument at byte {at}"))?,
                        ),
                    };
                    self.push(v);
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.take_array()?);
                    self.push(PyValue::Int(v.into()));
                }
                b'K' => {
                    let [v] = self.take_array()?;
                    self.push(PyValue::Int(v.into()));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.take_array()?);
                    self.push(PyValue::Int(v.into()));
                }
                b'L' => {
                    let text = self.line()?.trim_end_matches('L');
                    let v = text
                        .parse::<i128>()
                        .map(PyValue::Int)
                        .unwrap_or(PyValue::HugeInt);
                    self.push(v);
                }
                0x8a => {
                    let [n] = self.take_array()?;
                    let v = self.long(n.into())?;
                    self.push(v);
                }
                0x8b => {
                    let n = self.len_u32()?;
                    let v = self.long(n)?;
                    self.push(v);
                }
                b'F' => {
                    let v = self
                        .line()?
                        .trim()
                        .parse()
                        .map_err(|_| format!("bad FLOAT argument at byte {at}"))?;
                    self.push(PyValue::Float(v));
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.take_array()?);
                    self.push(PyValue::Float(v));
                }
                b'X' => {
                    let n = self.len_u32()?;
                    let v = self.string(n)?;
                    self.push(v);
                }
                0x8c => {
                    let [n] = self.take_array()?;
                    let v = self.string(n.into())?;
                    self.push(v);
                }
                0x8d => {
                    let n = self.len_u64()?;
                    let v = self.string(n)?;
                    self.push(v);
                }
                b'V' => {
                    let text = self.line()?.to_owned();
                    let v = self.new_obj(PyObj::Str(text));
                    self.push(v);
                }
                b'S' => {
                    let text = self.line()?;
                    let unquoted = text
                        .strip_prefix('\'')
                        .and_then(|t| t.strip_suffix('\''))
                        .or_else(|| text.strip_prefix('"').and_then(|t| t.strip_suffix('"')))
                        .ok_or_else(|| format!("bad STRING argument at byte {at}"))?
                        .to_owned();
                    let v = self.new_obj(PyObj::Str(unquoted));
                    self.push(v);
                }
                b'T' => {
                    let n = self.len_u32()?;
                    let v = self.bytes_obj(n)?;
                    self.push(v);
                }
                b'U' | b'C' => {
                    let [n] = self.take_array()?;
                    let v = self.bytes_obj(n.into())?;
                    self.push(v);
                }
                b'B' => {
                    let n = self.len_u32()?;
                    let v = self.bytes_obj(n)?;
                    self.push(v);
                }
                0x8e | 0x96 => {
                    let n = self.len_u64()?;
                    let v = self.bytes_obj(n)?;
                    self.push(v);
                }
                b']' => {
                    let v = self.new_obj(PyObj::List(Vec::new()));
                    self.push(v);
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    let v = self.new_obj(PyObj::List(items));
                    self.push(v);
                }
                b'a' => {
                    let item = self.pop()?;
                    self.extend_list(vec![item])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.extend_list(items)?;
                }
                b')' => {
                    let v = self.new_obj(PyObj::Tuple(Vec::new()));
                    self.push(v);
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let v = self.new_obj(PyObj::Tuple(items));
                    self.push(v);
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = vec![PyValue::None; n];
                    for slot in items.iter_mut().rev() {
                        *slot = self.pop()?;
                    }
                    let v = self.new_obj(PyObj::Tuple(items));
                    self.push(v);
                }
                b'}' => {
                    let v = self.new_obj(PyObj::Dict(Vec::new()));
                    self.push(v);
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let v = self.new_obj(PyObj::Dict(Vec::new()));
                    self.push(v);
                    self.extend_dict(items)?;
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    self.extend_dict(vec![key, value])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.extend_dict(items)?;
                }
                0x8f => {
                    let v = self.new_obj(PyObj::Set(Vec::new()));
                    self.push(v);
                }
                0x90 => {
                    let items = self.pop_mark()?;
                    self.extend_set(items)?;
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    let v = self.new_obj(PyObj::Set(items));
                    self.push(v);
                }
                b'p' => {
                    let id = self
                        .line()?
                        .trim()
                        .parse()
                        .map_err(|_| format!("bad PUT argument at byte {at}"))?;
                    self.memo_put(id)?;
                }
                b'q' => {
                    let [id] = self.take_array()?;
                    self.memo_put(id.into())?;
                }
                b'r' => {
                    let id = u32::from_le_bytes(self.take_array()?);
                    self.memo_put(id.into())?;
                }
                0x94 => {
                    let id = self.memo.len() as u64;
                    self.memo_put(id)?;
                }
                b'g' => {
                    let id = self
                        .line()?
                        .trim()
                        .parse()
                        .map_err(|_| format!("bad GET argument at byte {at}"))?;
                    self.memo_get(id)?;
                }
                b'h' => {
                    let [id] = self.take_array()?;
                    self.memo_get(id.into())?;
                }
                b'j' => {
                    let id = u32::from_le_bytes(self.take_array()?);
                    self.memo_get(id.into())?;
                }
                b'c' | 0x93 | b'R' | b'b' | 0x81 | 0x92 | b'i' | b'o' | b'P' | b'Q' | 0x82
                | 0x83 | 0x84 | 0x97 | 0x98 => {
                    return Err(format!(
                        "byte {at}: opcode {op:#04x} builds a Python object (class instance or \
                         external reference); only plain data is supported"
                    ));
                }
                other => return Err(format!("unknown opcode {other:#04x} at byte {at}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dict_keys(p: &Pickle, v: PyValue) -> Vec<String> {
        p.as_dict(v)
            .unwrap()
            .iter()
            .map(|(k, _)| p.as_str(*k).unwrap().to_owned())
            .collect()
    }

    #[test]
    fn decodes_what_serde_pickle_writes_at_every_protocol() {
        use serde_pickle::{HashableValue as H, SerOptions, Value as V};
        let mut inner = std::collections::BTreeMap::new();
        inner.insert(H::String("addr".into()), V::I64(139_872_103_890_944));
        inner.insert(H::String("neg".into()), V::I64(-5));
        inner.insert(H::String("f".into()), V::F64(0.5));
        inner.insert(H::String("t".into()), V::Bool(true));
        inner.insert(H::String("n".into()), V::None);
        inner.insert(
            H::String("tup".into()),
            V::Tuple(vec![V::I64(0), V::I64(1)]),
        );
        let top = V::List(vec![V::Dict(inner), V::String("é".into())]);
        for proto3 in [false, true] {
            let opts = if proto3 {
                SerOptions::new().proto_v2()
            } else {
                SerOptions::new()
            };
            let bytes = serde_pickle::value_to_vec(&top, opts).unwrap();
            let p = decode(&bytes).unwrap();
            let items = p.as_list(p.root()).unwrap();
            assert_eq!(items.len(), 2);
            assert_eq!(p.as_str(items[1]), Some("é"));
            let d = p.as_dict(items[0]).unwrap();
            assert_eq!(p.get(d, "addr"), Some(PyValue::Int(139_872_103_890_944)));
            assert_eq!(p.get(d, "neg"), Some(PyValue::Int(-5)));
            assert_eq!(p.get(d, "f"), Some(PyValue::Float(0.5)));
            assert_eq!(p.get(d, "t"), Some(PyValue::Bool(true)));
            assert_eq!(p.get(d, "n"), Some(PyValue::None));
            assert_eq!(p.as_list(p.get(d, "tup").unwrap()).unwrap().len(), 2);
            assert_eq!(dict_keys(&p, items[0]).len(), 6);
        }
    }

    /// `[d, d]` where `d = {"name": "emptyCache"}` shared, as Python's pickler writes it
    /// (protocol 4): the shared dict and the string inside it are memo references.
    const SHARED: &[u8] = b"\x80\x04\x95\x1e\x00\x00\x00\x00\x00\x00\x00]\x94(}\x94\x8c\x04name\x94\x8c\nemptyCache\x94sh\x01e.";

    #[test]
    fn shared_containers_decode_every_time_they_are_referenced() {
        let p = decode(SHARED).unwrap();
        let items = p.as_list(p.root()).unwrap();
        assert_eq!(items.len(), 2);
        for &item in items {
            let d = p.as_dict(item).unwrap();
            assert_eq!(
                p.get(d, "name").and_then(|v| p.as_str(v)),
                Some("emptyCache")
            );
        }
    }

    #[test]
    fn big_ints_are_exact_up_to_128_bits() {
        // LONG1 of 2^64 (9 bytes) and of -1 (1 byte).
        let bytes = b"\x80\x02(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8a\x01\xfft.";
        let p = decode(bytes).unwrap();
        let items = p.as_list(p.root()).unwrap();
        assert_eq!(items[0], PyValue::Int(1 << 64));
        assert_eq!(items[1], PyValue::Int(-1));
    }

    /// The first of a LONG1's little-endian bytes is the lowest: only the last one's top bit
    /// makes it negative (a stream pointer or address whose low byte is 0x80 or more stays
    /// positive), and LONG1 of no bytes is 0, as Python reads them.
    #[test]
    fn long_ints_take_their_sign_from_the_last_byte() {
        let bytes =
            b"\x80\x02(\x8a\x02\x80\x00\x8a\x06\xf0\xff\xff\xff\xff\x7f\x8a\x02\x00\x80\x8a\x00t.";
        let p = decode(bytes).unwrap();
        let items = p.as_list(p.root()).unwrap();
        assert_eq!(
            items,
            [
                PyValue::Int(0x80),
                PyValue::Int(0x7fff_ffff_fff0),
                PyValue::Int(-0x8000),
                PyValue::Int(0)
            ]
        );
    }

    /// Protocol 5 is Python's highest (`pickle.HIGHEST_PROTOCOL`): a snapshot pickled again
    /// with it reads; a later one is refused by number.
    #[test]
    fn protocol_5_is_read_and_later_ones_are_named() {
        assert_eq!(decode(b"\x80\x05K\x07.").unwrap().root(), PyValue::Int(7));
        assert_eq!(
            decode(b"\x80\x06K\x07.").unwrap_err(),
            "unsupported pickle protocol 6"
        );
    }

    /// Protocol 0 writes booleans as `I01`/`I00` and ints beyond 32 bits as `L…L`, as
    /// `pickle.dumps(x, protocol=0)` does.
    #[test]
    fn protocol_0_booleans_and_longs_are_read_as_python_writes_them() {
        let p = decode(b"(I01\nI00\nI-7\nL140737488355328L\nF0.5\nt.").unwrap();
        let items = p.as_list(p.root()).unwrap();
        assert_eq!(
            items,
            [
                PyValue::Bool(true),
                PyValue::Bool(false),
                PyValue::Int(-7),
                PyValue::Int(140_737_488_355_328),
                PyValue::Float(0.5)
            ]
        );
    }

    /// A dict's key repeated in the stream keeps its last value, as Python's dict does; a
    /// SETITEMS with a key and no value is an error, not a silently shorter dict; DUP copies
    /// the top of the stack.
    #[test]
    fn dict_items_are_kept_as_python_builds_them() {
        let p = decode(b"}(\x8c\x01aK\x01\x8c\x01aK\x02u.").unwrap();
        let d = p.as_dict(p.root()).unwrap();
        assert_eq!(p.get(d, "a"), Some(PyValue::Int(2)));
        let err = decode(b"}(\x8c\x01aK\x01\x8c\x01bu.").unwrap_err();
        assert_eq!(err, "odd number of dict items at byte 11");
        let p = decode(b"K\x092\x86.").unwrap();
        let pair = p.as_list(p.root()).unwrap();
        assert_eq!(pair, [PyValue::Int(9), PyValue::Int(9)]);
    }

    /// A float in a message is written as Python writes it.
    #[test]
    fn values_are_described_as_python_writes_them() {
        let p = decode(b"G?\xf0\x00\x00\x00\x00\x00\x00.").unwrap();
        assert_eq!(p.describe(p.root()), "float 1.0");
        let p = decode(b"G?\xf8\x00\x00\x00\x00\x00\x00.").unwrap();
        assert_eq!(p.describe(p.root()), "float 1.5");
    }

    #[test]
    fn objects_and_garbage_are_errors_not_panics() {
        assert!(decode(b"").is_err());
        assert!(decode(b"\x80\x04").unwrap_err().contains("truncated"));
        assert!(
            decode(b"cos\nsystem\n.")
                .unwrap_err()
                .contains("Python object")
        );
        assert!(decode(b"\x80\x04X\xff\xff\xff\x7f").is_err());
        assert!(decode(b"h\x05.").unwrap_err().contains("memo"));
        assert!(decode(b"a.").is_err());
        assert!(decode(b"(e.").is_err());
        // Every prefix of a valid pickle, and a deterministic stream of pseudo-random bytes.
        for n in 0..SHARED.len() {
            assert!(decode(&SHARED[..n]).is_err());
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let len = (x % 64) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn a_truncated_pickle_says_where_the_file_ends() {
        // The FRAME opcode's 8-byte length, 4 bytes of it present.
        let err = decode(&SHARED[..7]).unwrap_err();
        assert_eq!(
            err,
            "truncated: the file ends at byte 7, inside the 8-byte argument at byte 3"
        );
        let err = decode(b"\x80\x02\x8c\x0aabc").unwrap_err();
        assert!(err.contains("the file ends at byte 7, inside the 10-byte argument at byte 4"));
        let err = decode(b"Vname").unwrap_err();
        assert!(err.contains("the file ends at byte 5, inside the text argument at byte 1"));
    }

    #[test]
    fn the_start_of_a_pickle_is_told_from_bytes_that_cannot_begin_one() {
        for n in 0..=SHARED.len() {
            assert_eq!(check_start(&SHARED[..n]), Ok(()), "{n} bytes of a pickle");
        }
        for not_pickle in [&[0u8; 4096][..], b"\x80\x07", b"hello\n", b"a."] {
            assert!(check_start(not_pickle).is_err(), "{not_pickle:?}");
        }
    }
}
