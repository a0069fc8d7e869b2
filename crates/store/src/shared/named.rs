//! Whole SQL texts with named parameters, bound from one struct (issue 28).
//!
//! A statement is written as one text (a `.sql` file read with `include_str!`), top to
//! bottom, with `:name` parameters and `{part}` places where a shared rule's own text
//! stands (the queue join of docs/conformance.md#fair-share, the task columns, …: each rule written once). Its
//! values are bound by name from one struct ([`Binder::bind`]); the binder numbers the
//! parameters in the order they are bound (`$1`, `$2`, … in the text sent, which both
//! PostgreSQL and SQLite read by number, SQLite across the statements of one query too)
//! and hands back a [`sql::Statement`](crate::shared::sql::Statement), run like every
//! other statement through [`Exec`](crate::shared::sql::Exec): one way to bind and run.
//!
//! The agreement of text and binds is checked, not trusted: the first use of a statement
//! compiles its text for the names as bound, refusing a name bound twice, a bound name
//! the text does not use and a name of the text not bound
//! ([`StoreError::Database`]); every later use checks that it binds the same names in
//! the same order (pointer-cheap: the names are `&'static str`). Each binder binds its
//! names in groups, each group a constant list it must bind exactly ([`Binder::group`]),
//! so each statement's unit test lists its binder's groups and checks them against the
//! text without a database ([`check_binds`]): a disagreement fails a unit test first.

use crate::shared::sql::{Arg, Statement};
use crate::{StoreError, StoreResult};
use std::sync::OnceLock;

/// A statement's text with its named parameters and parts, compiled on first use.
pub(crate) struct NamedStatement {
    /// What the errors name.
    name: &'static str,
    source: &'static str,
    parts: &'static [Parts],
    compiled: OnceLock<Result<Compiled, String>>,
}

/// Named texts a statement's `{part}` places are filled from (a statement takes a list
/// of such groups, so statements share theirs).
pub(crate) type Parts = &'static [(&'static str, &'static str)];

/// A statement as sent: `$n` placeholders, and the names they stand for, in order.
#[derive(Debug)]
struct Compiled {
    text: String,
    names: Vec<&'static str>,
}

/// A piece of a statement's text: literal SQL or a parameter's name.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Sql(String),
    Name(String),
}

impl NamedStatement {
    /// `source` with `:name` parameters and `{part}` places filled from `parts`.
    pub(crate) const fn new(
        name: &'static str,
        source: &'static str,
        parts: &'static [Parts],
    ) -> NamedStatement {
        NamedStatement {
            name,
            source,
            parts,
            compiled: OnceLock::new(),
        }
    }

    /// Starts binding this statement's values.
    pub(crate) fn binder(&'static self) -> Binder {
        Binder {
            statement: self,
            args: Vec::new(),
            names: Vec::new(),
            failed: None,
        }
    }

    /// The names the text uses, each once, in order of first use.
    #[cfg(test)]
    pub(crate) fn names(&self) -> StoreResult<Vec<String>> {
        let mut names: Vec<String> = Vec::new();
        for piece in self.pieces()? {
            if let Piece::Name(n) = piece
                && !names.contains(&n)
            {
                names.push(n);
            }
        }
        Ok(names)
    }

    fn error(&self, what: impl std::fmt::Display) -> StoreError {
        StoreError::Database(format!("statement {}: {what}", self.name))
    }

    fn pieces(&self) -> StoreResult<Vec<Piece>> {
        let mut out = Vec::new();
        split(self.source, self.parts, &mut out, 0).map_err(|e| self.error(e))?;
        Ok(out)
    }

    /// The text for `names` (the order bound), compiled once; later calls check that
    /// they bind the same names in the same order.
    fn text(&'static self, names: &[&'static str]) -> StoreResult<&'static str> {
        let compiled = self.compiled.get_or_init(|| self.compile(names));
        let compiled = compiled.as_ref().map_err(|e| self.error(e))?;
        if compiled.names.as_slice() != names {
            return Err(self.error(format!(
                "bound {names:?}, but it was first bound as {:?}",
                compiled.names
            )));
        }
        Ok(compiled.text.as_str())
    }

    fn compile(&self, names: &[&'static str]) -> Result<Compiled, String> {
        let pieces = self.pieces().map_err(|e| e.to_string())?;
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(format!(":{n} is bound twice"));
            }
            if !pieces.iter().any(|p| *p == Piece::Name((*n).to_owned())) {
                return Err(format!(":{n} is bound but the text does not use it"));
            }
        }
        let mut text = String::with_capacity(self.source.len());
        for piece in pieces {
            match piece {
                Piece::Sql(s) => text.push_str(&s),
                Piece::Name(n) => {
                    let Some(at) = names.iter().position(|b| *b == n) else {
                        return Err(format!(":{n} is used but not bound"));
                    };
                    text.push('$');
                    text.push_str(&(at + 1).to_string());
                }
            }
        }
        Ok(Compiled {
            text,
            names: names.to_vec(),
        })
    }
}

/// Splits `source` into SQL and names: `'…'` literals are kept whole, `--` comments
/// dropped, `::` casts kept, `{part}` replaced by its text (split in turn).
fn split(source: &str, parts: &[Parts], out: &mut Vec<Piece>, depth: usize) -> Result<(), String> {
    if depth > 4 {
        return Err("parts nest too deep".into());
    }
    let bytes = source.as_bytes();
    let mut sql = String::new();
    let mut i = 0;
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'\'' {
            let end = source[i + 1..]
                .find('\'')
                .map(|e| i + 1 + e)
                .ok_or("an unterminated string literal")?;
            sql.push_str(&source[i..=end]);
            i = end + 1;
        } else if source[i..].starts_with("--") {
            i = source[i..].find('\n').map_or(bytes.len(), |e| i + e);
        } else if source[i..].starts_with("::") {
            sql.push_str("::");
            i += 2;
        } else if c == b':' && bytes.get(i + 1).is_some_and(|b| b.is_ascii_alphabetic()) {
            let end = source[i + 1..]
                .find(|ch: char| !ident(ch as u8) || !ch.is_ascii())
                .map_or(bytes.len(), |e| i + 1 + e);
            out.push(Piece::Sql(std::mem::take(&mut sql)));
            out.push(Piece::Name(source[i + 1..end].to_owned()));
            i = end;
        } else if c == b'{' {
            let end = source[i..]
                .find('}')
                .map(|e| i + e)
                .ok_or("an unclosed {part}")?;
            let name = &source[i + 1..end];
            let (_, text) = parts
                .iter()
                .flat_map(|group| group.iter())
                .find(|(n, _)| *n == name)
                .ok_or_else(|| format!("no part {{{name}}}"))?;
            out.push(Piece::Sql(std::mem::take(&mut sql)));
            split(text, parts, out, depth + 1)?;
            i = end + 1;
        } else {
            let len = source[i..].chars().next().map_or(1, char::len_utf8);
            sql.push_str(&source[i..i + len]);
            i += len;
        }
    }
    out.push(Piece::Sql(sql));
    Ok(())
}

/// A statement's values as they are bound, by name.
pub(crate) struct Binder {
    statement: &'static NamedStatement,
    args: Vec<Arg>,
    names: Vec<&'static str>,
    failed: Option<String>,
}

impl Binder {
    /// Binds `:name` (numbered in the order bound).
    pub(crate) fn bind(&mut self, name: &'static str, value: impl Into<Arg>) -> &mut Self {
        self.args.push(value.into());
        self.names.push(name);
        self
    }

    /// Binds a group of names with `bind`, which must bind exactly `names`, in that order
    /// (each binder's names are a constant, so tests enumerate a statement's binds
    /// without a database: [`check_binds`]); otherwise the statement is refused.
    pub(crate) fn group(
        &mut self,
        names: &'static [&'static str],
        bind: impl FnOnce(&mut Self),
    ) -> &mut Self {
        let start = self.names.len();
        bind(self);
        if self.names[start..] != *names {
            let bound = self.names[start..].to_vec();
            self.failed
                .get_or_insert_with(|| format!("bound {bound:?} for the group {names:?}"));
        }
        self
    }

    /// The statement to run, once every name is bound (see the module's checks).
    pub(crate) fn statement(self) -> StoreResult<Statement> {
        if let Some(e) = self.failed {
            return Err(self.statement.error(e));
        }
        let text = self.statement.text(&self.names)?;
        Ok(Statement {
            text: text.into(),
            args: self.args,
        })
    }
}

/// What tests check of every statement: its text splits (each `{part}` is given, each
/// literal closed) and names at least one parameter. Which names are bound is checked
/// at every use ([`Binder::statement`]), so every test that runs the statement checks it.
#[cfg(test)]
pub(crate) fn check_text(statement: &'static NamedStatement) {
    let names = statement.names().expect("the statement splits");
    assert!(!names.is_empty(), "{}: no parameter", statement.name);
}

/// What tests check of every statement and its binder, without a database: the names
/// its binder binds (`groups`, the constants of the groups it binds, in order) are
/// exactly the names its text uses, none missing, none extra, none twice.
#[cfg(test)]
pub(crate) fn check_binds(statement: &'static NamedStatement, groups: &[&[&'static str]]) {
    check_text(statement);
    let bound: Vec<&'static str> = groups.iter().flat_map(|g| g.iter().copied()).collect();
    if let Err(e) = statement.compile(&bound) {
        panic!("statement {}: {e}", statement.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static CAST: NamedStatement = NamedStatement::new(
        "cast",
        "-- a comment with :not_a_name\nSELECT :a::BIGINT, ':b', {p} WHERE x = :a",
        &[&[("p", "COALESCE(:c, 0)")]],
    );

    #[test]
    fn names_skip_casts_literals_and_comments_and_fill_parts() {
        assert_eq!(CAST.names().unwrap(), vec!["a".to_owned(), "c".to_owned()]);
        let compiled = CAST.compile(&["c", "a"]).unwrap();
        assert_eq!(
            compiled.text,
            "\nSELECT $2::BIGINT, ':b', COALESCE($1, 0) WHERE x = $2"
        );
    }

    #[test]
    fn disagreements_are_refused() {
        assert!(CAST.compile(&["a"]).unwrap_err().contains(":c is used"));
        assert!(
            CAST.compile(&["a", "c", "a"])
                .unwrap_err()
                .contains("twice")
        );
        assert!(
            CAST.compile(&["a", "c", "d"])
                .unwrap_err()
                .contains(":d is bound")
        );
        static MISSING: NamedStatement = NamedStatement::new("missing", "SELECT {nope}", &[]);
        assert!(MISSING.names().is_err());
    }

    #[test]
    fn a_group_binds_exactly_its_names() {
        let mut b = CAST.binder();
        b.group(&["a", "c"], |b| {
            b.bind("a", 1_i64).bind("c", 2_i64);
        });
        let s = b.statement().expect("every name bound once");
        assert_eq!(
            s.text,
            "\nSELECT $1::BIGINT, ':b', COALESCE($2, 0) WHERE x = $1"
        );
        assert_eq!(s.args, vec![Arg::Int(Some(1)), Arg::Int(Some(2))]);
        let mut b = CAST.binder();
        b.group(&["a", "c"], |b| {
            b.bind("a", 1_i64);
        })
        .bind("c", 2_i64);
        let e = b
            .statement()
            .expect_err("a group that binds less is refused");
        assert!(e.to_string().contains("for the group"), "{e}");
    }

    #[test]
    fn a_later_use_must_bind_in_the_first_order() {
        static ONCE: NamedStatement = NamedStatement::new("once", "SELECT :a, :b", &[]);
        let mut b = ONCE.binder();
        b.bind("a", 1_i64).bind("b", 2_i64);
        assert!(b.statement().is_ok());
        let mut b = ONCE.binder();
        b.bind("b", 2_i64).bind("a", 1_i64);
        let e = b.statement().expect_err("another order is refused");
        assert!(e.to_string().contains("first bound as"), "{e}");
    }

    #[test]
    #[should_panic(expected = ":c is used but not bound")]
    fn check_binds_fails_on_a_missing_name() {
        check_binds(&CAST, &[&["a"]]);
    }

    #[test]
    #[should_panic(expected = ":d is bound but the text does not use it")]
    fn check_binds_fails_on_an_extra_name() {
        check_binds(&CAST, &[&["a", "c"], &["d"]]);
    }
}
