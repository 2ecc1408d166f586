//! Many rows in one statement: the `VALUES` lists and `IN` lists of the
//! batched writes, written so that the statement's text does not depend on
//! how many rows a batch has.
//!
//! Why: a statement whose text changes with the batch size is a new
//! statement to PostgreSQL for every size. Each one is parsed and planned
//! again (no cached plan ever applies), costs the client a Parse round
//! trip, and evicts another from the connection's statement cache (100 per
//! connection). Measured in `stagehand bench` (docs/BENCHMARKS.md §9): the
//! planning alone was a fifth of PostgreSQL's statement time. So on
//! PostgreSQL the rows travel as one JSON array in one parameter and are
//! unpacked by `jsonb_array_elements`: one text per statement, prepared
//! once per connection, planned generically after a few runs.
//!
//! A generic plan is made once per connection, early, while the tables are
//! small, and kept until the table is analyzed. It must therefore find a
//! batch's rows by their keys whatever the table's size then: the row
//! sources tell the planner they hold one row (see [`ValueRows::source`]),
//! so joins with them probe the key's index. Guessing the 100 rows
//! PostgreSQL assumes for a set-returning function, a plan made on a young
//! table read the whole table for every batch, and kept doing so as it
//! grew: half a millisecond per statement at 3,000 rows, most of the
//! statements' time at a paced 200/s (docs/BENCHMARKS.md §11).
//!
//! SQLite plans in process and keeps its own `VALUES` lists: the rows are
//! bound one placeholder per cell, as before (its JSON functions would
//! parse floats with their own rounding).

use sea_orm::sea_query::{Expr, SimpleExpr};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityName, EntityTrait,
    IdenStatic, Iterable, Statement, Value,
};

/// The SQL type of a column of [`ValueRows`] (the cast PostgreSQL applies to
/// the JSON text of the cell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SqlType {
    Text,
    BigInt,
    Int,
    Double,
    Bool,
}

impl SqlType {
    /// The type of a value as sea-orm carries it (a NULL keeps its type).
    pub(crate) fn of(value: &Value) -> SqlType {
        match value {
            Value::Bool(_) => SqlType::Bool,
            Value::TinyInt(_) | Value::SmallInt(_) | Value::Int(_) => SqlType::Int,
            Value::BigInt(_)
            | Value::TinyUnsigned(_)
            | Value::SmallUnsigned(_)
            | Value::Unsigned(_)
            | Value::BigUnsigned(_) => SqlType::BigInt,
            Value::Float(_) | Value::Double(_) => SqlType::Double,
            _ => SqlType::Text,
        }
    }

    fn postgres(self) -> &'static str {
        match self {
            SqlType::Text => "text",
            SqlType::BigInt => "int8",
            SqlType::Int => "int4",
            SqlType::Double => "float8",
            SqlType::Bool => "boolean",
        }
    }
}

/// ValueRows of values of the same columns, row by row.
#[derive(Debug, Clone)]
pub(crate) struct ValueRows {
    types: Vec<SqlType>,
    cells: Vec<Value>,
}

impl ValueRows {
    pub(crate) fn new(types: &[SqlType]) -> ValueRows {
        ValueRows {
            types: types.to_vec(),
            cells: Vec::new(),
        }
    }

    /// Adds one row; it must have one value per column.
    pub(crate) fn push(&mut self, row: impl IntoIterator<Item = Value>) {
        let before = self.cells.len();
        self.cells.extend(row);
        debug_assert_eq!(
            self.cells.len() - before,
            self.types.len(),
            "one value per column"
        );
    }

    pub(crate) fn len(&self) -> usize {
        self.cells.len() / self.types.len().max(1)
    }

    /// The rows as `VALUES (?, ?), ...` with anonymous placeholders, their
    /// values appended to `values`: for a statement whose only parameters
    /// these are (SQLite; see [`insert_models`]).
    pub(crate) fn anonymous_values(self, values: &mut Vec<Value>) -> String {
        let width = self.types.len();
        let row = format!("({})", vec!["?"; width].join(", "));
        let rows = vec![row; self.len()];
        values.extend(self.cells);
        format!("VALUES {}", rows.join(", "))
    }

    /// The rows as a row source for `WITH v(...) AS (<source>)`,
    /// `INSERT INTO t (...) <source>` or `IN (<source>)`, its placeholders
    /// numbered from `$first`; their values are appended to `values`.
    /// SQLite: `VALUES ($first, ...), (...)`. PostgreSQL: one placeholder
    /// holding the rows as a JSON array of arrays, with a condition every
    /// row meets (each is an array) whose selectivity the planner guesses
    /// at 0.5 %: it then expects one row, not 100, and probes indexes.
    pub(crate) fn source(
        self,
        backend: DbBackend,
        first: usize,
        values: &mut Vec<Value>,
    ) -> String {
        match backend {
            DbBackend::Postgres => {
                let width = self.types.len();
                let rows: Vec<serde_json::Value> = self
                    .cells
                    .chunks(width.max(1))
                    .map(|row| serde_json::Value::Array(row.iter().map(json_of).collect()))
                    .collect();
                values.push(serde_json::Value::Array(rows).to_string().into());
                let columns: Vec<String> = self
                    .types
                    .iter()
                    .enumerate()
                    .map(|(i, t)| format!("(r->>{i})::{}", t.postgres()))
                    .collect();
                format!(
                    "SELECT {} FROM jsonb_array_elements(${first}::jsonb) AS r \
                     WHERE jsonb_typeof(r) = 'array'",
                    columns.join(", ")
                )
            }
            _ => {
                let width = self.types.len();
                let rows = self.len();
                values.extend(self.cells);
                let rows: Vec<String> = (0..rows)
                    .map(|r| {
                        let row: Vec<String> = (0..width)
                            .map(|c| format!("${}", first + r * width + c))
                            .collect();
                        format!("({})", row.join(", "))
                    })
                    .collect();
                format!("VALUES {}", rows.join(", "))
            }
        }
    }
}

/// `IN (...)` over `ids`, its placeholders numbered from `$first`; their
/// values are appended to `values`. PostgreSQL: `IN` the one-column row
/// source of [`ValueRows::source`] (one placeholder, one text whatever the
/// number of ids, and an index probe per id even in a generic plan made
/// on a young table, which `= ANY(ARRAY(SELECT ...))` is not).
pub(crate) fn in_list(
    backend: DbBackend,
    first: usize,
    ids: impl IntoIterator<Item = String>,
    values: &mut Vec<Value>,
) -> String {
    let ids: Vec<String> = ids.into_iter().collect();
    match backend {
        DbBackend::Postgres => {
            let mut rows = ValueRows::new(&[SqlType::Text]);
            for id in ids {
                rows.push([id.into()]);
            }
            format!("IN ({})", rows.source(backend, first, values))
        }
        _ => {
            let placeholders: Vec<String> =
                (0..ids.len()).map(|k| format!("${}", first + k)).collect();
            values.extend(ids.into_iter().map(Value::from));
            format!("IN ({})", placeholders.join(", "))
        }
    }
}

/// `column IN (ids)` as a sea-orm condition, written as [`in_list`] is.
pub(crate) fn column_in<C: ColumnTrait>(
    backend: DbBackend,
    column: C,
    ids: impl IntoIterator<Item = String>,
) -> SimpleExpr {
    match backend {
        DbBackend::Postgres => {
            let mut values = Vec::new();
            let condition = in_list(backend, 1, ids, &mut values);
            Expr::cust_with_values(
                format!(
                    "\"{}\".\"{}\" {condition}",
                    column.entity_name(),
                    column.as_str()
                ),
                values,
            )
        }
        _ => column.is_in(ids),
    }
}

/// Inserts `models` in one statement (on PostgreSQL one text whatever
/// their number). Every model sets the same columns as the first.
pub(crate) async fn insert_models<C, A>(conn: &C, models: Vec<A>) -> Result<(), DbErr>
where
    C: ConnectionTrait,
    A: ActiveModelTrait,
{
    if let Some(insert) = insert_statement(conn.get_database_backend(), models) {
        conn.execute_raw(insert).await?;
    }
    Ok(())
}

/// The statement [`insert_models`] runs (None: no models).
pub(crate) fn insert_statement<A: ActiveModelTrait>(
    backend: DbBackend,
    models: Vec<A>,
) -> Option<Statement> {
    let first = models.first()?;
    let columns: Vec<<A::Entity as EntityTrait>::Column> =
        <<A::Entity as EntityTrait>::Column as Iterable>::iter()
            .filter(|c| first.get(*c).is_set())
            .collect();
    let types: Vec<SqlType> = columns
        .iter()
        .map(|c| {
            first
                .get(*c)
                .into_value()
                .as_ref()
                .map_or(SqlType::Text, SqlType::of)
        })
        .collect();
    let mut rows = ValueRows::new(&types);
    for model in &models {
        rows.push(
            columns
                .iter()
                .map(|c| model.get(*c).into_value().unwrap_or(Value::String(None))),
        );
    }
    let mut values = Vec::new();
    // SQLite: anonymous `?`s. Numbered ones (`?NNN`) are looked up by
    // number in a list when sqlx binds them, one walk per parameter: a
    // batch of 256 sagas (8,700 parameters) spent more CPU there than in
    // the insert itself.
    let source = match backend {
        DbBackend::Postgres => rows.source(backend, 1, &mut values),
        _ => rows.anonymous_values(&mut values),
    };
    let names: Vec<String> = columns
        .iter()
        .map(|c| format!("\"{}\"", c.as_str()))
        .collect();
    let table = <A::Entity as Default>::default().table_name().to_owned();
    Some(Statement::from_sql_and_values(
        backend,
        format!("INSERT INTO \"{table}\" ({}) {source}", names.join(", ")),
        values,
    ))
}

/// Writes of one transaction that do not depend on each other's effects,
/// sent together; the rows each touched, in order. PostgreSQL: one
/// statement, each write a data-modifying `WITH` of it ([`together`]), so
/// a batch pays one round trip where it paid one per write (under load a
/// round trip costs about a millisecond). SQLite: one query of several
/// statements, each followed by `SELECT changes()` ([`in_sequence`]): SQLite
/// is in process, but every statement sent on its own is a hop to the
/// connection's worker thread and back (two thread wake-ups), and on the
/// write gate every hop is waited for by the writers queued behind.
pub(crate) async fn execute_together<C: ConnectionTrait>(
    conn: &C,
    writes: Vec<Statement>,
) -> Result<Vec<u64>, DbErr> {
    let backend = conn.get_database_backend();
    let count = writes.len();
    if count < 2 || !matches!(backend, DbBackend::Postgres | DbBackend::Sqlite) {
        let mut touched = Vec::with_capacity(count);
        for write in writes {
            touched.push(conn.execute_raw(write).await?.rows_affected());
        }
        return Ok(touched);
    }
    let counts: Vec<i64> = if backend == DbBackend::Postgres {
        let row = conn
            .query_one_raw(together(writes))
            .await?
            .ok_or_else(|| DbErr::Custom("writes sent together returned no counts".into()))?;
        (0..count)
            .map(|i| row.try_get_by_index::<i64>(i))
            .collect::<Result<_, _>>()?
    } else {
        conn.query_all_raw(in_sequence(writes))
            .await?
            .iter()
            .map(|row| row.try_get_by_index::<i64>(0))
            .collect::<Result<_, _>>()?
    };
    if counts.len() != count {
        return Err(DbErr::Custom(format!(
            "{count} writes sent together returned {} counts",
            counts.len()
        )));
    }
    Ok(counts.into_iter().map(|n| n as u64).collect())
}

/// SQLite writes as one query: `<write>; SELECT changes(); ...`. sqlx runs
/// every statement of a query in turn, binding anonymous `?`s from one
/// list with a running offset, so each write's placeholders are made
/// anonymous ([`anonymous_placeholders`]) and its values follow the ones
/// before.
fn in_sequence(writes: Vec<Statement>) -> Statement {
    let mut values: Vec<Value> = Vec::new();
    let mut parts = Vec::with_capacity(writes.len());
    for write in writes {
        let own = write.values.map(|v| v.0).unwrap_or_default();
        let sql = anonymous_placeholders(
            write.sql.trim_end().trim_end_matches(';'),
            &own,
            &mut values,
        );
        parts.push(format!("{sql}; SELECT changes()"));
    }
    Statement::from_sql_and_values(DbBackend::Sqlite, parts.join("; "), values)
}

/// `sql` with each SQLite placeholder outside quotes written as an
/// anonymous `?`, the value it stands for pushed to `out` in order: `?NNN`
/// takes `values[NNN - 1]` (once per use), a bare `?` the next of
/// `values`.
fn anonymous_placeholders(sql: &str, values: &[Value], out: &mut Vec<Value>) -> String {
    let mut next = 0;
    map_placeholders(sql, '?', |number, written| {
        let index = number.map_or_else(
            || {
                next += 1;
                next - 1
            },
            |n| n.saturating_sub(1),
        );
        out.push(values.get(index).cloned().unwrap_or(Value::String(None)));
        written.push('?');
    })
}

/// PostgreSQL writes as one statement: `WITH w0 AS (<write> RETURNING 1),
/// ... SELECT (SELECT COUNT(*) FROM w0), ...`, each write's placeholders
/// moved past the ones before it. Every write runs to completion whether
/// or not its count is read, and all of them see the snapshot the
/// statement started with (so none may depend on another's effect); a
/// write must not have its own `RETURNING`.
fn together(writes: Vec<Statement>) -> Statement {
    let count = writes.len();
    let (with, values) = write_clauses(writes);
    let counts: Vec<String> = (0..count)
        .map(|i| format!("(SELECT COUNT(*) FROM w{i})"))
        .collect();
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!("{with} SELECT {}", counts.join(", ")),
        values,
    )
}

/// `WITH w0 AS (<write> RETURNING 1), ...` of [`together`] and
/// [`all_or_nothing`], and its values.
fn write_clauses(writes: Vec<Statement>) -> (String, Vec<Value>) {
    let mut values: Vec<Value> = Vec::new();
    let mut parts = Vec::with_capacity(writes.len());
    for (i, write) in writes.into_iter().enumerate() {
        debug_assert!(
            !write.sql.contains("RETURNING"),
            "a write sent together has its own RETURNING: {}",
            write.sql
        );
        parts.push(format!(
            "w{i} AS ({} RETURNING 1)",
            shift_placeholders(&write.sql, values.len())
        ));
        values.extend(write.values.map(|v| v.0).unwrap_or_default());
    }
    (format!("WITH {}", parts.join(", ")), values)
}

/// What the error of an [`all_or_nothing`] statement whose counts were not
/// met says (inside PostgreSQL's "invalid input syntax for type integer").
const NOT_ALL_WRITTEN: &str = "stagehand: writes sent all or nothing touched other rows";

/// PostgreSQL writes that take effect only together, each touching exactly
/// the rows given with it (None: any number): true when they were
/// written, false when a count was not met and nothing was written. One
/// statement and no transaction around it, so one round trip: the
/// statement is atomic on its own, and when a count is not met it fails
/// (casting a text that names the counts to a number: PostgreSQL has no
/// `RAISE` outside a function), which undoes every write of it. For writes
/// decided on rows read without their locks: each write re-checks its
/// rows under their locks (the `WHERE` of an `UPDATE` is evaluated again
/// on a row another transaction changed meanwhile), and a count tells
/// whether the rows were still as read.
pub(crate) async fn execute_all_or_nothing<C: ConnectionTrait>(
    conn: &C,
    writes: Vec<(Statement, Option<u64>)>,
) -> Result<bool, DbErr> {
    debug_assert_eq!(conn.get_database_backend(), DbBackend::Postgres);
    if writes.is_empty() {
        return Ok(true);
    }
    match conn.execute_raw(all_or_nothing(writes)).await {
        Ok(_) => Ok(true),
        Err(e) if e.to_string().contains(NOT_ALL_WRITTEN) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The statement of [`execute_all_or_nothing`]: the writes of
/// [`together`], then `SELECT CASE WHEN <every count met> THEN 0 ELSE
/// CAST(<text> AS integer) END`. The text is read from the writes' counts,
/// so PostgreSQL cannot fold the cast into an error while planning; the
/// counts wanted are parameters, so the statement's text depends only on
/// which writes it holds.
fn all_or_nothing(writes: Vec<(Statement, Option<u64>)>) -> Statement {
    let (writes, wanted): (Vec<Statement>, Vec<Option<u64>>) = writes.into_iter().unzip();
    let (with, mut values) = write_clauses(writes);
    let mut checks = Vec::new();
    for (i, wanted) in wanted.iter().enumerate() {
        if let Some(rows) = wanted {
            values.push((*rows as i64).into());
            checks.push(format!("(SELECT COUNT(*) FROM w{i}) = ${}", values.len()));
        }
    }
    if checks.is_empty() {
        checks.push("true".to_owned());
    }
    let counts: Vec<String> = (0..wanted.len())
        .map(|i| format!("' w{i}=' || (SELECT COUNT(*) FROM w{i})"))
        .collect();
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        format!(
            "{with} SELECT CASE WHEN {} THEN 0 \
             ELSE CAST('{NOT_ALL_WRITTEN}:' || {} AS integer) END",
            checks.join(" AND "),
            counts.join(" || ")
        ),
        values,
    )
}

/// `sql` with each placeholder `$n` outside quoted text renumbered `$(n + by)`.
fn shift_placeholders(sql: &str, by: usize) -> String {
    map_placeholders(sql, '$', |number, written| {
        written.push('$');
        if let Some(n) = number {
            written.push_str(&(n + by).to_string());
        }
    })
}

/// `sql` with each placeholder outside quoted text (`marker` and the
/// number after it, if any) replaced by what `placeholder` writes for its
/// number (no allocation per placeholder: a batch insert has thousands).
fn map_placeholders(
    sql: &str,
    marker: char,
    mut placeholder: impl FnMut(Option<usize>, &mut String),
) -> String {
    let mut written = String::with_capacity(sql.len() + 8);
    let mut chars = sql.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if c == marker && !quoted {
            let mut digits = String::new();
            while let Some(d) = chars.next_if(char::is_ascii_digit) {
                digits.push(d);
            }
            placeholder(digits.parse::<usize>().ok(), &mut written);
            continue;
        }
        if c == '\'' {
            quoted = !quoted;
        }
        written.push(c);
    }
    written
}

/// A cell as JSON: its text, number or boolean, or null.
fn json_of(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::String(Some(s)) => J::from(s.as_str()),
        Value::Char(Some(c)) => J::from(c.to_string()),
        Value::Bool(Some(b)) => J::from(*b),
        Value::TinyInt(Some(n)) => J::from(*n),
        Value::SmallInt(Some(n)) => J::from(*n),
        Value::Int(Some(n)) => J::from(*n),
        Value::BigInt(Some(n)) => J::from(*n),
        Value::TinyUnsigned(Some(n)) => J::from(*n),
        Value::SmallUnsigned(Some(n)) => J::from(*n),
        Value::Unsigned(Some(n)) => J::from(*n),
        Value::BigUnsigned(Some(n)) => J::from(*n),
        Value::Float(Some(f)) => J::from(f64::from(*f)),
        Value::Double(Some(f)) => J::from(*f),
        Value::Json(Some(j)) => J::from(j.to_string()),
        other => {
            debug_assert!(!other.is_some(), "a cell of an unexpected type: {other:?}");
            J::Null
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_rows() -> ValueRows {
        let mut rows = ValueRows::new(&[SqlType::Text, SqlType::BigInt, SqlType::Double]);
        rows.push(["a".into(), 1i64.into(), 0.1f64.into()]);
        rows.push([Option::<String>::None.into(), 2i64.into(), 2.5f64.into()]);
        rows
    }

    #[test]
    fn sqlite_binds_a_placeholder_per_cell() {
        let mut values = vec![Value::from(0i64)];
        let sql = two_rows().source(DbBackend::Sqlite, 2, &mut values);
        assert_eq!(sql, "VALUES ($2, $3, $4), ($5, $6, $7)");
        assert_eq!(values.len(), 7);
    }

    #[test]
    fn postgres_sees_one_text_whatever_the_rows() {
        let mut values = Vec::new();
        let sql = two_rows().source(DbBackend::Postgres, 3, &mut values);
        assert_eq!(
            sql,
            "SELECT (r->>0)::text, (r->>1)::int8, (r->>2)::float8 \
             FROM jsonb_array_elements($3::jsonb) AS r WHERE jsonb_typeof(r) = 'array'"
        );
        assert_eq!(values, vec![Value::from(r#"[["a",1,0.1],[null,2,2.5]]"#)]);
        let mut one = ValueRows::new(&[SqlType::Text, SqlType::BigInt, SqlType::Double]);
        one.push(["b".into(), 3i64.into(), 1.0f64.into()]);
        assert_eq!(one.source(DbBackend::Postgres, 3, &mut Vec::new()), sql);
    }

    #[test]
    fn anonymous_values_bind_in_order() {
        let mut values = Vec::new();
        assert_eq!(
            two_rows().anonymous_values(&mut values),
            "VALUES (?, ?, ?), (?, ?, ?)"
        );
        assert_eq!(values.len(), 6);
        assert_eq!(values[3], Value::String(None));
    }

    #[test]
    fn placeholders_move_past_the_writes_before_outside_quotes() {
        assert_eq!(
            shift_placeholders("UPDATE t SET a = $1, b = '$2' WHERE c = $12", 3),
            "UPDATE t SET a = $4, b = '$2' WHERE c = $15"
        );
        assert_eq!(shift_placeholders("SELECT $1", 0), "SELECT $1");
    }

    #[test]
    fn sqlite_writes_in_sequence_bind_their_own_values() {
        let numbered = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "UPDATE t SET a = ?2, b = '?1' WHERE c = ?1 OR d = ?2;",
            vec!["one".into(), 2i64.into()],
        );
        let anonymous = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "INSERT INTO u (x, y) VALUES (?, ?), (?, ?)",
            vec![3i64.into(), 4i64.into(), 5i64.into(), 6i64.into()],
        );
        let together = in_sequence(vec![numbered, anonymous]);
        assert_eq!(
            together.sql,
            "UPDATE t SET a = ?, b = '?1' WHERE c = ? OR d = ?; SELECT changes(); \
             INSERT INTO u (x, y) VALUES (?, ?), (?, ?); SELECT changes()"
        );
        let values = together.values.unwrap().0;
        let expected: Vec<Value> = vec![
            2i64.into(),
            "one".into(),
            2i64.into(),
            3i64.into(),
            4i64.into(),
            5i64.into(),
            6i64.into(),
        ];
        assert_eq!(values, expected);
    }

    #[test]
    fn writes_together_are_one_statement_with_a_count_each() {
        let write = |sql: &str, values: Vec<Value>| {
            Statement::from_sql_and_values(DbBackend::Postgres, sql, values)
        };
        let one = together(vec![
            write(
                "UPDATE a SET x = $1 WHERE id = $2",
                vec![1.into(), "p".into()],
            ),
            write("INSERT INTO b (y) VALUES ($1)", vec![2.into()]),
        ]);
        assert_eq!(
            one.sql,
            "WITH w0 AS (UPDATE a SET x = $1 WHERE id = $2 RETURNING 1), \
             w1 AS (INSERT INTO b (y) VALUES ($3) RETURNING 1) \
             SELECT (SELECT COUNT(*) FROM w0), (SELECT COUNT(*) FROM w1)"
        );
        assert_eq!(
            one.values.unwrap().0,
            vec![Value::from(1), Value::from("p"), Value::from(2)]
        );
    }

    #[test]
    fn writes_all_or_nothing_fail_when_a_count_is_not_met() {
        let write = |sql: &str, values: Vec<Value>| {
            Statement::from_sql_and_values(DbBackend::Postgres, sql, values)
        };
        let one = all_or_nothing(vec![
            (write("UPDATE a SET x = $1", vec![1.into()]), Some(2)),
            (write("UPDATE b SET y = $1", vec![3.into()]), None),
        ]);
        assert_eq!(
            one.sql,
            format!(
                "WITH w0 AS (UPDATE a SET x = $1 RETURNING 1), \
                 w1 AS (UPDATE b SET y = $2 RETURNING 1) \
                 SELECT CASE WHEN (SELECT COUNT(*) FROM w0) = $3 THEN 0 \
                 ELSE CAST('{NOT_ALL_WRITTEN}:' || ' w0=' || (SELECT COUNT(*) FROM w0) \
                 || ' w1=' || (SELECT COUNT(*) FROM w1) AS integer) END"
            )
        );
        assert_eq!(
            one.values.unwrap().0,
            vec![Value::from(1), Value::from(3), Value::from(2i64)]
        );
    }

    #[test]
    fn in_lists_follow_the_backend() {
        let ids = || ["x".to_owned(), "y".to_owned()];
        let mut values = Vec::new();
        assert_eq!(
            in_list(DbBackend::Sqlite, 4, ids(), &mut values),
            "IN ($4, $5)"
        );
        assert_eq!(values.len(), 2);
        let mut values = Vec::new();
        assert_eq!(
            in_list(DbBackend::Postgres, 4, ids(), &mut values),
            "IN (SELECT (r->>0)::text FROM jsonb_array_elements($4::jsonb) AS r \
             WHERE jsonb_typeof(r) = 'array')"
        );
        assert_eq!(values, vec![Value::from(r#"[["x"],["y"]]"#)]);
    }
}
