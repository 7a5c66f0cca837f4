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
#[derive(Debug)]
pub struct Decoder {
    outbox_oid: u32,
    columns: Option<Vec<String>>,
}

impl Decoder {
    /// A decoder for the outbox table with this `pg_class` oid.
    pub fn new(outbox_oid: u32) -> Self {
        Self {
            outbox_oid,
            columns: None,
        }
    }

    /// Reads one message; returns the row of an insert into the outbox
    /// table, `None` for every other message.
    pub fn decode(&mut self, message: &[u8]) -> Result<Option<OutboxRecord>, DecodeError> {
        let mut reader = Reader(message);
        match reader.u8()? {
            b'R' => {
                let oid = reader.u32()?;
                let _namespace = reader.string()?;
                let _name = reader.string()?;
                let _replica_identity = reader.u8()?;
                let count = reader.u16()?;
                let mut columns = Vec::with_capacity(usize::from(count));
                for _ in 0..count {
                    let _flags = reader.u8()?;
                    columns.push(reader.string()?);
                    let _type_oid = reader.u32()?;
                    let _type_modifier = reader.u32()?;
                }
                if oid == self.outbox_oid {
                    self.columns = Some(columns);
                }
                Ok(None)
            }
            b'I' => {
                if reader.u32()? != self.outbox_oid {
                    return Ok(None);
                }
                if reader.u8()? != b'N' {
                    return Err(DecodeError("an insert without a new tuple".into()));
                }
                let columns = self.columns.as_ref().ok_or_else(|| {
                    DecodeError("an insert into the outbox table before its relation".into())
                })?;
                let values = reader.tuple()?;
                if values.len() != columns.len() {
                    return Err(DecodeError(format!(
                        "an insert with {} values for {} columns",
                        values.len(),
                        columns.len()
                    )));
                }
                record(columns, values).map(Some)
            }
            _ => Ok(None),
        }
    }
}

/// The record of an inserted row, from its columns' text values.
fn record(columns: &[String], values: Vec<Option<String>>) -> Result<OutboxRecord, DecodeError> {
    let mut row: std::collections::HashMap<&str, Option<String>> =
        columns.iter().map(String::as_str).zip(values).collect();
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
    })
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

    /// A Relation message describing table `oid` with `columns` (all `text`).
    pub(crate) fn relation(oid: u32, columns: &[&str]) -> Vec<u8> {
        let mut message = vec![b'R'];
        message.extend(oid.to_be_bytes());
        message.extend(b"public\0outbox\0");
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
    use super::encode::{OUTBOX_COLUMNS as COLUMNS, insert, relation};
    use super::*;

    const OUTBOX: u32 = 16_400;

    #[test]
    fn an_insert_into_the_outbox_becomes_a_record() {
        let mut decoder = Decoder::new(OUTBOX);
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
        let mut decoder = Decoder::new(OUTBOX);
        decoder.decode(&relation(OUTBOX, COLUMNS)).unwrap();
        decoder.decode(&relation(99, &["id"])).unwrap();
        assert_eq!(decoder.decode(&insert(99, &[Some("x")])).unwrap(), None);
        // Update, delete, truncate, type and origin messages.
        for tag in [b'U', b'D', b'T', b'Y', b'O'] {
            assert_eq!(decoder.decode(&[tag, 0, 0, 0x40, 0x10]).unwrap(), None);
        }
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let mut decoder = Decoder::new(OUTBOX);
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
