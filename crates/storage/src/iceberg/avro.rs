//! Avro object container files, as Iceberg's manifests and manifest lists
//! are stored: the few Avro types those files use, written and read back.
//!
//! Why no crate: apache-avro 0.22 drops `"logicalType":"map"` from array
//! schemas when it parses them, which makes DuckDB 1.5.5 abort on the
//! manifests it writes (docs/notes/2026-11-28-issue47-research.md §1), and
//! its schema JSON is re-serialised rather than kept as given. Iceberg's
//! readers match fields by the `field-id` attributes of the schema in the
//! file's header, so the header must hold our schema text verbatim. The
//! encoding itself (zig-zag varints, length-prefixed strings, union
//! branch indexes, one block) is a page of code.

use serde_json::Value as Json;

/// An Avro schema, reduced to the types Iceberg's metadata files use.
#[derive(Debug, Clone, PartialEq)]
pub enum Schema {
    Null,
    Boolean,
    Int,
    Long,
    String,
    Bytes,
    Record(Vec<(String, Schema)>),
    Array(Box<Schema>),
    Union(Vec<Schema>),
}

/// An Avro value of a [`Schema`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Boolean(bool),
    Int(i32),
    Long(i64),
    String(String),
    Bytes(Vec<u8>),
    /// Field values in the schema's order.
    Record(Vec<Value>),
    Array(Vec<Value>),
    /// The index of the union's branch, and the value.
    Union(usize, Box<Value>),
}

impl Value {
    /// `["null", T]` with a value.
    pub fn some(v: Value) -> Value {
        Value::Union(1, Box::new(v))
    }

    /// `["null", T]` without one.
    pub fn none() -> Value {
        Value::Union(0, Box::new(Value::Null))
    }

    /// The long of a `long` or of a non-null `["null","long"]`.
    pub fn as_long(&self) -> Option<i64> {
        match self {
            Value::Long(v) => Some(*v),
            Value::Int(v) => Some(i64::from(*v)),
            Value::Union(_, v) => v.as_long(),
            _ => None,
        }
    }

    /// The text of a `string` or of a non-null `["null","string"]`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            Value::Union(_, v) => v.as_str(),
            _ => None,
        }
    }
}

/// Why an Avro file or schema could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AvroError {
    #[error("not an Avro schema this reader knows: {0}")]
    Schema(String),
    #[error("damaged Avro file: {0}")]
    Damaged(&'static str),
    #[error("a value does not match its Avro schema: {0}")]
    Mismatch(String),
}

/// Parses the JSON text of a schema (record fields' attributes such as
/// `field-id` are left to the text, which the file keeps verbatim).
pub fn parse_schema(text: &str) -> Result<Schema, AvroError> {
    let json: Json = serde_json::from_str(text).map_err(|e| AvroError::Schema(e.to_string()))?;
    schema_of(&json)
}

fn schema_of(json: &Json) -> Result<Schema, AvroError> {
    Ok(match json {
        Json::String(name) => match name.as_str() {
            "null" => Schema::Null,
            "boolean" => Schema::Boolean,
            "int" => Schema::Int,
            "long" => Schema::Long,
            "string" => Schema::String,
            "bytes" => Schema::Bytes,
            other => return Err(AvroError::Schema(format!("type '{other}'"))),
        },
        Json::Array(branches) => Schema::Union(branches.iter().map(schema_of).collect::<Result<_, _>>()?),
        Json::Object(o) => match o.get("type") {
            Some(Json::String(t)) if t == "record" => {
                let fields = o.get("fields").and_then(Json::as_array).ok_or_else(|| AvroError::Schema("a record without fields".into()))?;
                Schema::Record(
                    fields
                        .iter()
                        .map(|f| {
                            let name = f.get("name").and_then(Json::as_str).ok_or_else(|| AvroError::Schema("a field without a name".into()))?;
                            Ok((name.to_string(), schema_of(f.get("type").unwrap_or(&Json::Null))?))
                        })
                        .collect::<Result<_, AvroError>>()?,
                )
            }
            Some(Json::String(t)) if t == "array" => Schema::Array(Box::new(schema_of(o.get("items").unwrap_or(&Json::Null))?)),
            Some(inner) => schema_of(inner)?,
            None => return Err(AvroError::Schema("an object without a type".into())),
        },
        other => return Err(AvroError::Schema(other.to_string())),
    })
}

const MAGIC: &[u8; 4] = b"Obj\x01";

/// An object container file of `records` of `schema` (whose JSON text is
/// `schema_text`), with `metadata` in its header, uncompressed, in one
/// block. `sync` is the file's 16-byte sync marker: derived from the
/// file's name by callers, so that the same content always gives the same
/// bytes.
pub fn write_file(schema_text: &str, schema: &Schema, metadata: &[(&str, String)], records: &[Value], sync: [u8; 16]) -> Result<Vec<u8>, AvroError> {
    let mut out = Vec::with_capacity(1024 + 256 * records.len());
    out.extend_from_slice(MAGIC);
    let mut entries: Vec<(&str, &[u8])> = vec![("avro.schema", schema_text.as_bytes()), ("avro.codec", b"null")];
    entries.extend(metadata.iter().map(|(k, v)| (*k, v.as_bytes())));
    long(&mut out, entries.len() as i64);
    for (k, v) in entries {
        bytes(&mut out, k.as_bytes());
        bytes(&mut out, v);
    }
    long(&mut out, 0);
    out.extend_from_slice(&sync);
    if !records.is_empty() {
        let mut block = Vec::new();
        for r in records {
            encode(&mut block, schema, r)?;
        }
        long(&mut out, records.len() as i64);
        long(&mut out, block.len() as i64);
        out.extend_from_slice(&block);
        out.extend_from_slice(&sync);
    }
    Ok(out)
}

/// Reads an uncompressed object container file of the types above (as
/// [`write_file`] writes them): its header metadata and its records,
/// decoded by the schema its header holds.
pub fn read_file(data: &[u8]) -> Result<(Vec<(String, Vec<u8>)>, Vec<Value>), AvroError> {
    let mut r = Reader { data, at: 0 };
    if r.take(4)? != MAGIC {
        return Err(AvroError::Damaged("no Avro magic"));
    }
    let mut metadata = Vec::new();
    loop {
        let n = r.block_count()?;
        if n == 0 {
            break;
        }
        for _ in 0..n {
            let k = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| AvroError::Damaged("a header key is not UTF-8"))?;
            metadata.push((k, r.bytes()?.to_vec()));
        }
    }
    if metadata.iter().any(|(k, v)| k == "avro.codec" && v.as_slice() != b"null") {
        return Err(AvroError::Damaged("a compressed Avro file (only uncompressed files are read)"));
    }
    let text = metadata.iter().find(|(k, _)| k == "avro.schema").map(|(_, v)| v.as_slice()).ok_or(AvroError::Damaged("no avro.schema in the header"))?;
    let schema = parse_schema(std::str::from_utf8(text).map_err(|_| AvroError::Damaged("a schema that is not UTF-8"))?)?;
    let schema = &schema;
    let sync = r.take(16)?.to_vec();
    let mut records = Vec::new();
    while r.at < data.len() {
        let count = r.long()?;
        let _size = r.long()?;
        for _ in 0..count {
            records.push(decode(&mut r, schema)?);
        }
        if r.take(16)? != sync.as_slice() {
            return Err(AvroError::Damaged("a block's sync marker does not match the header's"));
        }
    }
    Ok((metadata, records))
}

fn long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    long(out, b.len() as i64);
    out.extend_from_slice(b);
}

fn encode(out: &mut Vec<u8>, schema: &Schema, value: &Value) -> Result<(), AvroError> {
    match (schema, value) {
        (Schema::Null, Value::Null) => {}
        (Schema::Boolean, Value::Boolean(b)) => out.push(u8::from(*b)),
        (Schema::Int, Value::Int(v)) => long(out, i64::from(*v)),
        (Schema::Long, Value::Long(v)) => long(out, *v),
        (Schema::String, Value::String(s)) => bytes(out, s.as_bytes()),
        (Schema::Bytes, Value::Bytes(b)) => bytes(out, b),
        (Schema::Record(fields), Value::Record(values)) if fields.len() == values.len() => {
            for ((_, s), v) in fields.iter().zip(values) {
                encode(out, s, v)?;
            }
        }
        (Schema::Array(items), Value::Array(values)) => {
            if !values.is_empty() {
                long(out, values.len() as i64);
                for v in values {
                    encode(out, items, v)?;
                }
            }
            long(out, 0);
        }
        (Schema::Union(branches), Value::Union(i, v)) if *i < branches.len() => {
            long(out, *i as i64);
            encode(out, &branches[*i], v)?;
        }
        (s, v) => return Err(AvroError::Mismatch(format!("{v:?} for {s:?}"))),
    }
    Ok(())
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], AvroError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.data.len()).ok_or(AvroError::Damaged("cut short"))?;
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn long(&mut self) -> Result<i64, AvroError> {
        let mut z: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
            }
        }
        Err(AvroError::Damaged("a varint longer than 10 bytes"))
    }

    /// The item count of a map's or array's block (0 ends it); a negative
    /// count is followed by the block's size in bytes.
    fn block_count(&mut self) -> Result<i64, AvroError> {
        let n = self.long()?;
        if n < 0 {
            self.long()?;
        }
        Ok(n.checked_abs().ok_or(AvroError::Damaged("a block count out of range"))?)
    }

    fn bytes(&mut self) -> Result<&'a [u8], AvroError> {
        let n = self.long()?;
        let n = usize::try_from(n).map_err(|_| AvroError::Damaged("a negative length"))?;
        self.take(n)
    }
}

fn decode(r: &mut Reader<'_>, schema: &Schema) -> Result<Value, AvroError> {
    Ok(match schema {
        Schema::Null => Value::Null,
        Schema::Boolean => Value::Boolean(r.take(1)?[0] != 0),
        Schema::Int => Value::Int(i32::try_from(r.long()?).map_err(|_| AvroError::Damaged("an int out of range"))?),
        Schema::Long => Value::Long(r.long()?),
        Schema::String => Value::String(String::from_utf8(r.bytes()?.to_vec()).map_err(|_| AvroError::Damaged("a string is not UTF-8"))?),
        Schema::Bytes => Value::Bytes(r.bytes()?.to_vec()),
        Schema::Record(fields) => Value::Record(fields.iter().map(|(_, s)| decode(r, s)).collect::<Result<_, _>>()?),
        Schema::Array(items) => {
            let mut values = Vec::new();
            loop {
                let n = r.block_count()?;
                if n == 0 {
                    break;
                }
                for _ in 0..n {
                    values.push(decode(r, items)?);
                }
            }
            Value::Array(values)
        }
        Schema::Union(branches) => {
            let i = usize::try_from(r.long()?).ok().filter(|i| *i < branches.len()).ok_or(AvroError::Damaged("a union branch out of range"))?;
            Value::Union(i, Box::new(decode(r, &branches[i])?))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_back_as_written_and_varints_are_zig_zag() {
        let text = r#"{"type":"record","name":"r","fields":[{"name":"a","type":"long","field-id":1},{"name":"b","type":["null","string"]},{"name":"c","type":{"type":"array","items":"int"}},{"name":"d","type":"bytes"},{"name":"e","type":"boolean"}]}"#;
        let schema = parse_schema(text).unwrap();
        let records = vec![
            Value::Record(vec![Value::Long(-1), Value::some(Value::String("x".into())), Value::Array(vec![Value::Int(300)]), Value::Bytes(vec![1, 2]), Value::Boolean(true)]),
            Value::Record(vec![Value::Long(i64::MAX), Value::none(), Value::Array(vec![]), Value::Bytes(vec![]), Value::Boolean(false)]),
        ];
        let file = write_file(text, &schema, &[("k", "v".into())], &records, [7; 16]).unwrap();
        // -1 zig-zags to 1; 300 to 600 = 0xd8 0x04.
        let mut v = Vec::new();
        long(&mut v, -1);
        long(&mut v, 300);
        assert_eq!(v, [1, 0xd8, 0x04]);
        let (meta, back) = read_file(&file).unwrap();
        assert_eq!(back, records);
        assert!(meta.contains(&("avro.schema".into(), text.as_bytes().to_vec())));
        assert!(meta.contains(&("k".into(), b"v".to_vec())));
        // A value of the wrong type is refused, not written.
        let bad = Value::Record(vec![Value::Int(1), Value::none(), Value::Array(vec![]), Value::Bytes(vec![]), Value::Boolean(false)]);
        assert!(matches!(write_file(text, &schema, &[], &[bad], [0; 16]), Err(AvroError::Mismatch(_))));
        // A cut file is named damaged.
        assert!(matches!(read_file(&file[..file.len() - 3]), Err(AvroError::Damaged(_))));
    }
}
