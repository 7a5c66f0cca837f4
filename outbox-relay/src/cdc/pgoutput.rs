//! Decoding the `pgoutput` plugin's change messages into outbox records.
//!
//! The replication client hands over transaction boundaries (Begin, Commit)
//! itself; what remains are Relation messages, which describe a table's
//! columns before its first change in a session (and again after it was
//! altered), and the changes. Only inserts into the outbox table become
//! records; updates, deletes, truncates and other tables are ignored.
//!
//! Values arrive in their text form, the same text the polling relay reads
//! with `payload::text`, so both modes publish byte-identical messages.

use outbox_contract::table::column;

use crate::record::OutboxRecord;

/// A message the decoder could not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode a pgoutput message: {0}")]
pub struct DecodeError(String);

/// Turns the change messages of one replication session into records.
///
/// The outbox is the relation named `outbox` in its schema, whatever its
/// oid: converting a plain outbox into a partitioned one (`migrate
/// --partitioned`) gives the table a new oid, and rows committed before
/// the conversion still arrive under the old one, named `outbox` as it was
/// then.
#[derive(Debug)]
pub struct Decoder {
    table: OutboxTable,
    /// The columns of each relation that is the outbox (name and type
    /// oid), by oid.
    outbox: std::collections::HashMap<u32, Vec<(String, u32)>>,
}

/// The outbox table a CDC relay reads: its schema, and its oid when the
/// relay started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTable {
    /// The schema the search path finds it in.
    pub schema: String,
    /// Its `pg_class` oid.
    pub oid: u32,
    /// The extra columns to read (see [`crate::source::extra`]).
    pub extra: Vec<String>,
}

impl Decoder {
    /// A decoder for `table`.
    pub fn new(table: OutboxTable) -> Self {
        Self {
            table,
            outbox: std::collections::HashMap::new(),
        }
    }

    /// Reads one message; returns the row of an insert into the outbox
    /// table, `None` for every other message.
    pub fn decode(&mut self, message: &[u8]) -> Result<Option<OutboxRecord>, DecodeError> {
        let mut reader = Reader(message);
        match reader.u8()? {
            b'R' => {
                let oid = reader.u32()?;
                let namespace = reader.string()?;
                let name = reader.string()?;
                let _replica_identity = reader.u8()?;
                let count = reader.u16()?;
                let mut columns = Vec::with_capacity(usize::from(count));
                for _ in 0..count {
                    let _flags = reader.u8()?;
                    let name = reader.string()?;
                    columns.push((name, reader.u32()?));
                    let _type_modifier = reader.u32()?;
                }
                if namespace == self.table.schema && name == outbox_contract::table::OUTBOX {
                    self.outbox.insert(oid, columns);
                } else {
                    self.outbox.remove(&oid);
                }
                Ok(None)
            }
            b'I' => {
                // An insert comes after its relation's Relation message in
                // the session.
                let oid = reader.u32()?;
                let Some(columns) = self.outbox.get(&oid) else {
                    if oid == self.table.oid {
                        return Err(DecodeError(
                            "an insert into the outbox table before its relation".into(),
                        ));
                    }
                    return Ok(None);
                };
                if reader.u8()? != b'N' {
                    return Err(DecodeError("an insert without a new tuple".into()));
                }
                let values = reader.tuple()?;
                if values.len() != columns.len() {
                    return Err(DecodeError(format!(
                        "an insert with {} values for {} columns",
                        values.len(),
                        columns.len()
                    )));
                }
                record(columns, values, &self.table.extra).map(Some)
            }
            _ => Ok(None),
        }
    }
}

/// The record of an inserted row, from its columns' text values; the
/// `extra` columns as JSON text, by their types.
fn record(
    columns: &[(String, u32)],
    values: Vec<Option<String>>,
    extra: &[String],
) -> Result<OutboxRecord, DecodeError> {
    let types: std::collections::HashMap<&str, u32> = columns
        .iter()
        .map(|(name, oid)| (name.as_str(), *oid))
        .collect();
    let extra = extra
        .iter()
        .map(|name| {
            let text = values
                .get(columns.iter().position(|(column, _)| column == name)?)?
                .as_deref()?;
            Some(json_of(text, types[name.as_str()]))
        })
        .collect();
    let mut row: std::collections::HashMap<&str, Option<String>> = columns
        .iter()
        .map(|(name, _)| name.as_str())
        .zip(values)
        .collect();
    let mut take = |name: &str| row.remove(name).flatten();
    let required = |name: &str, value: Option<String>| {
        value.ok_or_else(|| DecodeError(format!("the outbox row has no `{name}`")))
    };
    let number = |name: &str, value: Option<String>| -> Result<Option<i64>, DecodeError> {
        value
            .map(|text| {
                text.parse::<i64>()
                    .map_err(|_| DecodeError(format!("`{name}` is not a number: {text:?}")))
            })
            .transpose()
    };
    let event_version = number(column::EVENT_VERSION, take(column::EVENT_VERSION))?.unwrap_or(1);
    Ok(OutboxRecord {
        id: required(column::ID, take(column::ID))?,
        aggregate_type: required(column::AGGREGATE_TYPE, take(column::AGGREGATE_TYPE))?,
        aggregate_id: required(column::AGGREGATE_ID, take(column::AGGREGATE_ID))?,
        event_type: required(column::EVENT_TYPE, take(column::EVENT_TYPE))?,
        payload: take(column::PAYLOAD),
        event_version: i32::try_from(event_version)
            .map_err(|_| DecodeError(format!("`event_version` {event_version} is too large")))?,
        aggregate_seq: number(column::AGGREGATE_SEQ, take(column::AGGREGATE_SEQ))?,
        traceparent: take(column::TRACEPARENT),
        seq: number(column::SEQ, take(column::SEQ))?.unwrap_or_default(),
        attempts: 0,
        age_at_claim: 0.0,
        created_at: take(column::CREATED_AT),
        partition: None,
        ctid: None,
        extra,
    })
}

/// A column's text value as JSON, as the polling relay reads it
/// (`to_jsonb`): numbers, booleans and JSON as themselves, anything else
/// a string.
fn json_of(text: &str, type_oid: u32) -> String {
    const BOOL: u32 = 16;
    const NUMBERS: [u32; 6] = [20, 21, 23, 700, 701, 1700];
    const JSON: [u32; 2] = [114, 3802];
    match type_oid {
        BOOL => (if text == "t" { "true" } else { "false" }).to_owned(),
        oid if NUMBERS.contains(&oid) && text.parse::<f64>().is_ok_and(f64::is_finite) => {
            text.to_owned()
        }
        oid if JSON.contains(&oid) => text.to_owned(),
        _ => serde_json::Value::String(text.to_owned()).to_string(),
    }
}

/// A cursor over a message's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < count {
            return Err(DecodeError("the message ends early".into()));
        }
        let (head, tail) = self.0.split_at(count);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let bytes = self.take(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let bytes = self.take(4)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// A NUL-terminated string.
    fn string(&mut self) -> Result<String, DecodeError> {
        let end = self
            .0
            .iter()
            .position(|&byte| byte == 0)
            .ok_or_else(|| DecodeError("a string without its terminator".into()))?;
        let text = text(self.take(end)?)?;
        self.take(1)?;
        Ok(text)
    }

    /// TupleData: each column's text value, `None` for NULL.
    fn tuple(&mut self) -> Result<Vec<Option<String>>, DecodeError> {
        let count = self.u16()?;
        (0..count)
            .map(|_| match self.u8()? {
                b'n' => Ok(None),
                b't' => {
                    let length = self.u32()? as usize;
                    text(self.take(length)?).map(Some)
                }
                b'u' => Err(DecodeError("an unchanged TOAST value in an insert".into())),
                kind => Err(DecodeError(format!(
                    "a column value of unknown kind {:?}",
                    char::from(kind)
                ))),
            })
            .collect()
    }
}

fn text(bytes: &[u8]) -> Result<String, DecodeError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError("a value is not UTF-8".into()))
}

#[cfg(test)]
pub(crate) mod encode {
    //! pgoutput messages as the server sends them, for tests.

    /// A Relation message describing table `public.outbox`, oid `oid`,
    /// with `columns` (all `text`).
    pub(crate) fn relation(oid: u32, columns: &[&str]) -> Vec<u8> {
        relation_named(oid, "outbox", columns)
    }

    /// A Relation message describing table `public.<name>`.
    pub(crate) fn relation_named(oid: u32, name: &str, columns: &[&str]) -> Vec<u8> {
        let mut message = vec![b'R'];
        message.extend(oid.to_be_bytes());
        message.extend(format!("public\0{name}\0").as_bytes());
        message.push(b'd');
        message.extend((columns.len() as u16).to_be_bytes());
        for column in columns {
            message.push(0);
            message.extend(column.as_bytes());
            message.push(0);
            message.extend(25u32.to_be_bytes());
            message.extend((-1i32).to_be_bytes());
        }
        message
    }

    /// An Insert message into table `oid` with `values` in text form.
    pub(crate) fn insert(oid: u32, values: &[Option<&str>]) -> Vec<u8> {
        let mut message = vec![b'I'];
        message.extend(oid.to_be_bytes());
        message.push(b'N');
        message.extend((values.len() as u16).to_be_bytes());
        for value in values {
            match value {
                None => message.push(b'n'),
                Some(text) => {
                    message.push(b't');
                    message.extend((text.len() as u32).to_be_bytes());
                    message.extend(text.as_bytes());
                }
            }
        }
        message
    }

    /// The outbox table's columns, in table order.
    pub(crate) const OUTBOX_COLUMNS: &[&str] = &[
        "id",
        "aggregatetype",
        "aggregateid",
        "type",
        "payload",
        "seq",
        "event_version",
        "aggregate_seq",
        "traceparent",
        "created_at",
        "published_at",
    ];
}

#[cfg(test)]
mod tests {
    use super::encode::{OUTBOX_COLUMNS as COLUMNS, insert, relation, relation_named};
    use super::*;

    const OUTBOX: u32 = 16_400;

    fn table() -> OutboxTable {
        OutboxTable {
            extra: Vec::new(),
            schema: "public".into(),
            oid: OUTBOX,
        }
    }

    #[test]
    fn inserts_under_any_oid_of_the_outbox_are_read() {
        // A conversion to a partitioned table: rows written before it come
        // under the plain table's oid, later ones under the new table's.
        let mut decoder = Decoder::new(table());
        decoder.decode(&relation(16_001, COLUMNS)).unwrap();
        decoder.decode(&relation(OUTBOX, COLUMNS)).unwrap();
        let values = [
            Some("0190a7e8-0000-7000-8000-000000000001"),
            Some("Order"),
            Some("42"),
            Some("OrderPlaced"),
            None,
            Some("7"),
            Some("1"),
            None,
            None,
            Some("2026-11-29 17:00:00+00"),
            None,
        ];
        for oid in [16_001, OUTBOX] {
            let record = decoder.decode(&insert(oid, &values)).unwrap();
            assert_eq!(record.map(|r| r.seq), Some(7), "oid {oid}");
        }
        // A relation renamed away from `outbox` is no longer read.
        decoder
            .decode(&relation_named(16_001, "outbox_unpartitioned", COLUMNS))
            .unwrap();
        assert_eq!(decoder.decode(&insert(16_001, &values)).unwrap(), None);
    }

    #[test]
    fn an_insert_into_the_outbox_becomes_a_record() {
        let mut decoder = Decoder::new(table());
        assert_eq!(decoder.decode(&relation(OUTBOX, COLUMNS)).unwrap(), None);
        let row = insert(
            OUTBOX,
            &[
                Some("0190a7e8-0000-7000-8000-000000000001"),
                Some("Order"),
                Some("42"),
                Some("OrderPlaced"),
                Some(r#"{"order_id": 42}"#),
                Some("7"),
                Some("2"),
                Some("3"),
                None,
                Some("2026-11-29 17:00:00+00"),
                None,
            ],
        );
        let record = decoder.decode(&row).unwrap().expect("a record");
        assert_eq!(record.id, "0190a7e8-0000-7000-8000-000000000001");
        assert_eq!(
            (record.aggregate_type.as_str(), record.aggregate_id.as_str()),
            ("Order", "42")
        );
        assert_eq!(record.event_type, "OrderPlaced");
        assert_eq!(record.payload.as_deref(), Some(r#"{"order_id": 42}"#));
        assert_eq!(
            (record.seq, record.event_version, record.aggregate_seq),
            (7, 2, Some(3))
        );
        assert_eq!(record.traceparent, None);
    }

    #[test]
    fn other_tables_and_other_changes_are_ignored() {
        let mut decoder = Decoder::new(table());
        decoder.decode(&relation(OUTBOX, COLUMNS)).unwrap();
        decoder
            .decode(&relation_named(99, "outbox_other", &["id"]))
            .unwrap();
        assert_eq!(decoder.decode(&insert(99, &[Some("x")])).unwrap(), None);
        // Never described in this session: not the outbox.
        assert_eq!(decoder.decode(&insert(98, &[Some("x")])).unwrap(), None);
        // Update, delete, truncate, type and origin messages.
        for tag in [b'U', b'D', b'T', b'Y', b'O'] {
            assert_eq!(decoder.decode(&[tag, 0, 0, 0x40, 0x10]).unwrap(), None);
        }
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let mut decoder = Decoder::new(table());
        let row = insert(OUTBOX, &[Some("x")]);
        assert!(
            decoder
                .decode(&row)
                .unwrap_err()
                .0
                .contains("before its relation")
        );
        decoder.decode(&relation(OUTBOX, COLUMNS)).unwrap();
        assert!(decoder.decode(&row).unwrap_err().0.contains("1 values"));
        let mut truncated = insert(OUTBOX, &[Some("abc")]);
        truncated.truncate(truncated.len() - 1);
        assert!(decoder.decode(&truncated).is_err());
        assert!(decoder.decode(&[]).is_err());
        let nameless = relation(OUTBOX, &["aggregatetype"]);
        decoder.decode(&nameless).unwrap();
        let error = decoder
            .decode(&insert(OUTBOX, &[Some("Order")]))
            .unwrap_err();
        assert!(error.0.contains("`id`"), "{error}");
    }
}
