//! Columns a claim reads beyond the outbox's own: the additional fields of
//! Debezium's router (`table.fields.additional.placement`) and a
//! `route.by.field` column other than the three it knows. Each is read as
//! JSON text (a string, number, boolean or `null`), named `extra_<n>` in
//! the claim's result, into [`OutboxRecord::extra`](crate::record::OutboxRecord::extra).

use sqlx::{AssertSqlSafe, Database, Pool};

/// The most extra columns a claim reads.
pub const MAX: usize = 16;

/// The names of the extra columns in a claim's result.
pub const NAMES: [&str; MAX] = [
    "extra_0", "extra_1", "extra_2", "extra_3", "extra_4", "extra_5", "extra_6", "extra_7",
    "extra_8", "extra_9", "extra_10", "extra_11", "extra_12", "extra_13", "extra_14", "extra_15",
];

/// The extra columns asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraColumns {
    /// Column names, in the order of [`OutboxRecord::extra`](crate::record::OutboxRecord::extra).
    pub columns: Vec<String>,
    /// A column the outbox does not have stops the relay at start
    /// (`table.fields.additional.error.on.missing`, default true); else
    /// it reads as NULL.
    pub error_on_missing: bool,
}

/// The select items reading the extra columns, each as `, <expr> AS
/// extra_<n>` (empty without extra columns), and their names as `,
/// extra_<n>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraSelect {
    /// `, <json of column> AS extra_0, ...`.
    pub items: String,
    /// `, extra_0, ...`.
    pub names: String,
}

/// How a database writes a column's value as JSON text.
pub struct JsonOf {
    /// A quoted identifier.
    pub quote: fn(&str) -> String,
    /// The JSON text of a quoted column.
    pub json: fn(&str) -> String,
}

/// PostgreSQL.
pub const POSTGRES: JsonOf = JsonOf {
    quote: |name| format!("\"{name}\""),
    json: |column| format!("to_jsonb({column})::text"),
};
/// MariaDB/MySQL.
pub const MYSQL: JsonOf = JsonOf {
    quote: |name| format!("`{name}`"),
    json: |column| format!("CAST(JSON_EXTRACT(JSON_ARRAY({column}), '$[0]') AS CHAR)"),
};
/// SQLite: backquotes, since a double-quoted name no column has is taken
/// for a string literal there.
pub const SQLITE: JsonOf = JsonOf {
    quote: |name| format!("`{name}`"),
    json: |column| format!("json_quote({column})"),
};

/// Whether `name` is a plain column name: letters, digits and `_`, not
/// starting with a digit.
pub fn is_column_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The select items of `extra` on the outbox of `pool`: a column the table
/// lacks fails with one line, or reads as NULL without
/// `error_on_missing`.
pub async fn select<DB: Database>(
    pool: &Pool<DB>,
    extra: &ExtraColumns,
    dialect: &JsonOf,
) -> Result<ExtraSelect, sqlx::Error>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    select_of(pool, extra, dialect, "").await
}

/// [`select`] for a statement in which the outbox is aliased `alias`.
pub async fn select_of<DB: Database>(
    pool: &Pool<DB>,
    extra: &ExtraColumns,
    dialect: &JsonOf,
    alias: &str,
) -> Result<ExtraSelect, sqlx::Error>
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let mut select = ExtraSelect::default();
    for (n, column) in extra.columns.iter().enumerate() {
        let quoted = (dialect.quote)(column);
        let probe = format!("SELECT {quoted} FROM outbox WHERE 1 = 0");
        let expr = match sqlx::raw_sql(AssertSqlSafe(probe)).execute(pool).await {
            Ok(_) if alias.is_empty() => (dialect.json)(&quoted),
            Ok(_) => (dialect.json)(&format!("{alias}.{quoted}")),
            Err(sqlx::Error::Database(_)) if !extra.error_on_missing => "NULL".to_owned(),
            Err(sqlx::Error::Database(_)) => {
                return Err(sqlx::Error::Configuration(
                    format!(
                        "the outbox table has no column `{column}` (named by a router option: \
                         route.by.field, table.fields.additional.placement or table.field.event.*); \
                         add it, or set table.fields.additional.error.on.missing=false"
                    )
                    .into(),
                ));
            }
            Err(other) => return Err(other),
        };
        select.items.push_str(&format!(", {expr} AS extra_{n}"));
        select.names.push_str(&format!(", extra_{n}"));
    }
    Ok(select)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_names_are_plain_identifiers() {
        for good in ["tenant", "tenant_id", "_x", "Col2"] {
            assert!(is_column_name(good), "{good}");
        }
        for bad in ["", "2col", "a-b", "a b", "a\"b", "a;drop"] {
            assert!(!is_column_name(bad), "{bad}");
        }
    }
}
