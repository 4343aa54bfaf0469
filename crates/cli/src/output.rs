//! How the shell prints a result: a boxed table for people, CSV and JSON for
//! programs that read the shell's output, Markdown for documents.
//!
//! CSV and JSON come from arrow's own writers, so values read back exactly as
//! Arrow writes them elsewhere; the table is arrow's pretty printer; Markdown
//! is a few lines here (arrow has none).

use anyhow::Result;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::arrow::util::pretty::pretty_format_batches_with_schema;

/// An output mode of the shell (`--format`, `\pset format`, `.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A boxed table with a header (the default).
    Table,
    /// Comma-separated values with a header line (RFC 4180 quoting).
    Csv,
    /// A JSON array with an object per row.
    Json,
    /// A GitHub-flavoured Markdown table; numbers right-aligned.
    Markdown,
}

impl Format {
    /// The mode named `name`, as `\pset format` and `.mode` take it.
    pub fn parse(name: &str) -> Option<Format> {
        match name.to_ascii_lowercase().as_str() {
            "table" | "box" | "aligned" => Some(Format::Table),
            "csv" => Some(Format::Csv),
            "json" => Some(Format::Json),
            "markdown" | "md" => Some(Format::Markdown),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Table => "table",
            Format::Csv => "csv",
            Format::Json => "json",
            Format::Markdown => "markdown",
        }
    }
}

/// `batches` (all of `schema`) in `format`, ending with a newline.
pub fn render(format: Format, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<String> {
    let mut out = Vec::new();
    match format {
        Format::Table => {
            out.extend_from_slice(pretty_format_batches_with_schema(schema.clone(), batches)?.to_string().as_bytes());
            out.push(b'\n');
        }
        Format::Csv => {
            let mut writer = datafusion::arrow::csv::WriterBuilder::new().with_header(true).build(&mut out);
            // An empty batch still writes the header line.
            writer.write(&RecordBatch::new_empty(schema.clone()))?;
            for batch in batches {
                writer.write(batch)?;
            }
        }
        Format::Json => {
            // A NULL is written as null, not left out: every row has every column.
            let mut writer = datafusion::arrow::json::WriterBuilder::new().with_explicit_nulls(true).build::<_, datafusion::arrow::json::writer::JsonArray>(&mut out);
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
            if out.is_empty() {
                out.extend_from_slice(b"[]");
            }
            out.push(b'\n');
        }
        Format::Markdown => out.extend_from_slice(markdown(schema, batches)?.as_bytes()),
    }
    Ok(String::from_utf8(out)?)
}

fn markdown(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<String> {
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::new();
    let header: Vec<String> = schema.fields().iter().map(|f| cell(f.name())).collect();
    out.push_str(&format!("| {} |\n", header.join(" | ")));
    let rules: Vec<&str> = schema.fields().iter().map(|f| if f.data_type().is_numeric() { "---:" } else { "---" }).collect();
    out.push_str(&format!("|{}|\n", rules.join("|")));
    let options = FormatOptions::default().with_null("NULL");
    for batch in batches {
        let formatters = batch.columns().iter().map(|c| ArrayFormatter::try_new(c.as_ref(), &options)).collect::<Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = formatters.iter().map(|f| cell(&f.value(row).to_string())).collect();
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{ArrayRef, Decimal128Array, Int32Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn sample() -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("price", DataType::Decimal128(12, 2), true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![Some(1), None])),
            Arc::new(StringArray::from(vec![Some("a, \"b\""), Some("x|y")])),
            Arc::new(Decimal128Array::from(vec![Some(150), Some(-5)]).with_precision_and_scale(12, 2).unwrap()),
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        (schema, vec![batch])
    }

    #[test]
    fn each_format_writes_every_row_and_quotes_what_it_must() {
        let (schema, batches) = sample();
        assert_eq!(render(Format::Csv, &schema, &batches).unwrap(), "id,name,price\n1,\"a, \"\"b\"\"\",1.50\n,x|y,-0.05\n");
        let json: serde_json::Value = serde_json::from_str(&render(Format::Json, &schema, &batches).unwrap()).unwrap();
        assert_eq!(json[0]["name"], "a, \"b\"");
        assert_eq!(json[1].get("id"), Some(&serde_json::Value::Null), "a NULL is written, not left out");
        assert_eq!(json.as_array().unwrap().len(), 2);
        assert_eq!(
            render(Format::Markdown, &schema, &batches).unwrap(),
            "| id | name | price |\n|---:|---|---:|\n| 1 | a, \"b\" | 1.50 |\n| NULL | x\\|y | -0.05 |\n"
        );
        let table = render(Format::Table, &schema, &batches).unwrap();
        assert!(table.contains("| id | name") && table.contains("| 1.50  |"), "{table}");
    }

    #[test]
    fn empty_results_keep_their_header() {
        let (schema, _) = sample();
        assert_eq!(render(Format::Csv, &schema, &[]).unwrap(), "id,name,price\n");
        assert_eq!(render(Format::Json, &schema, &[]).unwrap(), "[]\n");
        assert_eq!(render(Format::Markdown, &schema, &[]).unwrap(), "| id | name | price |\n|---:|---|---:|\n");
        assert!(render(Format::Table, &schema, &[]).unwrap().contains("| id | name | price |"));
    }
}
